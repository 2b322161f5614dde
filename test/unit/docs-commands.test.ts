import { readdirSync, readFileSync } from 'node:fs';
import { join, relative } from 'node:path';
import type { Command } from 'commander';
import { describe, expect, it } from 'vitest';
import { buildProgram } from '../../src/cli/main.js';
import { sourceFiles } from '../fixtures/source-files.js';

/**
 * Every `backhaul` command a reader is told to run in README.md and docs/OPERATING.md: it parses with the
 * real command line (its command and options exist), and a test or the demo runs that command with
 * those options (a file under test/ or tools/ names the command and each option as the argv it passes).
 */

const ROOT = join(import.meta.dirname, '../..');
const DOCS = ['README.md', 'docs/OPERATING.md'];

interface DocCommand {
  doc: string;
  line: string;
  argv: string[];
}

/** Splits a shell line into words (single and double quotes; no expansion). */
function words(line: string): string[] {
  const out: string[] = [];
  const re = /'([^']*)'|"((?:[^"\\]|\\.)*)"|(\S+)/g;
  for (const m of line.matchAll(re)) out.push(m[1] ?? m[2] ?? m[3] ?? '');
  return out;
}

function docCommands(): DocCommand[] {
  const found: DocCommand[] = [];
  for (const doc of DOCS) {
    const text = readFileSync(join(ROOT, doc), 'utf8');
    for (const block of text.matchAll(/^( *)```(?:sh|bash|shell)\n([\s\S]*?)^\1```/gm)) {
      for (const raw of (block[2] ?? '').split('\n')) {
        const line = raw.replace(/\s+#.*$/, '').trim();
        // `backhaul …`, `node bin/backhaul.js …`, and `kubectl … exec … -- backhaul …`.
        const m = /(?:^|\s--\s+|^node\s+bin\/)backhaul(?:\.js)?\s+(.*)$/.exec(line);
        if (m?.[1]) found.push({ doc, line, argv: words(m[1]) });
      }
    }
  }
  return found;
}

interface Parsed {
  path: string[];
  /** The options given, as their flags (`--json`, or `-w|--watch` for one with a short form). */
  options: { long: string; short?: string }[];
}

function leaves(cmd: Command): Command[] {
  return cmd.commands.length === 0 ? [cmd] : cmd.commands.flatMap(leaves);
}

/** Parses ARGV with the real program, each command's action replaced by a recorder. */
async function parse(argv: string[]): Promise<Parsed> {
  const program = buildProgram();
  let parsed: Parsed | undefined;
  for (const leaf of leaves(program)) {
    leaf.configureOutput({ writeErr: () => undefined, writeOut: () => undefined });
    leaf.action(() => {
      const path: string[] = [];
      for (let c: Command | null = leaf; c && c !== program; c = c.parent) path.unshift(c.name());
      const options = leaf.options
        .filter((o) => leaf.getOptionValueSource(o.attributeName()) === 'cli')
        .map((o) => ({ long: o.long ?? '', ...(o.short ? { short: o.short } : {}) }));
      parsed = { path, options };
    });
  }
  program.configureOutput({ writeErr: () => undefined, writeOut: () => undefined });
  await program.parseAsync(argv, { from: 'user' });
  if (!parsed) throw new Error(`no command ran for ${argv.join(' ')}`);
  return parsed;
}

const sources = [...sourceFiles(join(ROOT, 'test')), ...sourceFiles(join(ROOT, 'tools'))]
  .filter((f) => !f.endsWith('docs-commands.test.ts'))
  .map((f) => ({ file: relative(ROOT, f), text: readFileSync(f, 'utf8') }));

/** The files that pass the command's words and each of its options as argv strings. */
function runners(p: Parsed): string[] {
  const quoted = (word: string) => [`'${word}'`, `"${word}"`, `\`${word}\``];
  return sources
    .filter(({ text }) => p.path.every((w) => quoted(w).some((q) => text.includes(q))))
    .filter(({ text }) =>
      p.options.every((o) =>
        [o.long, o.short].filter(Boolean).some((f) => quoted(f as string).some((q) => text.includes(q))),
      ),
    )
    .map((s) => s.file);
}

const commands = docCommands();

describe('the backhaul commands the docs show', () => {
  it('finds them (a broken extraction would pass everything)', () => {
    const perDoc = Object.fromEntries(DOCS.map((d) => [d, commands.filter((c) => c.doc === d).length]));
    expect(perDoc['README.md']).toBeGreaterThanOrEqual(2);
    expect(perDoc['docs/OPERATING.md']).toBeGreaterThanOrEqual(10);
    expect(commands.some((c) => c.line.startsWith('kubectl') && c.argv[0] === 'status')).toBe(true);
  });

  it.each(commands.map((c) => [`${c.doc}: ${c.line}`, c] as const))('%s', async (_label, c) => {
    const parsed = await parse(c.argv);
    const by = runners(parsed);
    expect(
      by,
      `no test or demo runs \`backhaul ${parsed.path.join(' ')}\` with ${parsed.options.map((o) => o.long).join(' ') || 'no option'}`,
    ).not.toEqual([]);
  });

  it('the checker refuses an option the command does not have, and a command no test runs', async () => {
    await expect(parse(['status', '--no-such-option'])).rejects.toThrow(/unknown option/);
    expect(runners({ path: ['status'], options: [{ long: '--never-passed-by-any-test' }] })).toEqual([]);
  });
});

describe('the docs themselves', () => {
  it('keep README.md short enough for a newcomer (at most 150 lines)', () => {
    expect(readFileSync(join(ROOT, 'README.md'), 'utf8').trimEnd().split('\n').length).toBeLessThanOrEqual(150);
  });

  it('link only to files that exist (relative links of README, CONTRIBUTING, CHANGELOG and docs/)', () => {
    const pages = [
      'README.md',
      'CONTRIBUTING.md',
      'CHANGELOG.md',
      'deploy/README.md',
      ...readdirSync(join(ROOT, 'docs'))
        .filter((f) => f.endsWith('.md'))
        .map((f) => `docs/${f}`),
    ];
    const broken: string[] = [];
    for (const page of pages) {
      const text = readFileSync(join(ROOT, page), 'utf8');
      for (const m of text.matchAll(/\]\(([^)\s#]+)(?:#[^)]*)?\)/g)) {
        const target = m[1] ?? '';
        if (/^[a-z]+:/.test(target)) continue;
        try {
          readdirSync(join(ROOT, page, '..', target));
        } catch (err) {
          if ((err as NodeJS.ErrnoException).code === 'ENOENT') broken.push(`${page}: ${target}`);
        }
      }
    }
    expect(broken).toEqual([]);
  });
});
