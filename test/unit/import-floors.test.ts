import { readdirSync, readFileSync } from 'node:fs';
import { dirname, join, normalize, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { sourceFiles } from '../fixtures/source-files.js';

/**
 * The floors of src/ (docs/ARCHITECTURE.md, "What may import what"), bottom first. A file may import its own directory and
 * the floors below; two directories on one floor do not import each other.
 */
const FLOORS: readonly (readonly string[])[] = [
  ['contract', 'machines', 'log.ts'],
  ['render', 'store', 'metrics'],
  ['ssh'],
  ['site'],
  ['pods'],
  ['workers', 'cluster'],
  ['fleet'],
  ['cli'],
];

const SRC = fileURLToPath(new URL('../../src/', import.meta.url));

/** Every relative module a file names: `import … from`, `export … from`, `import()`, type-only included. */
function importsOf(file: string): string[] {
  const text = readFileSync(file, 'utf8');
  const specs = [...text.matchAll(/(?:from\s+|import\s*\(\s*|import\s+)'(\.[^']+)'/g)].map((m) => m[1] as string);
  return specs.map((spec) => normalize(join(dirname(file), spec)).replace(/\.js$/, '.ts'));
}

/** The floor directory of a file under src/: its first path segment (`log.ts` for src/log.ts). */
const unitOf = (file: string) => relative(SRC, file).split('/')[0] as string;
const floorOf = (unit: string) => FLOORS.findIndex((floor) => floor.includes(unit));

const files = sourceFiles(SRC);
const graph = new Map(files.map((file) => [file, importsOf(file)]));

describe('the import graph of src/', () => {
  it('puts every directory of src/ on a floor', () => {
    const units = [...new Set(files.map(unitOf))].sort();
    expect(units.filter((unit) => floorOf(unit) < 0)).toEqual([]);
  });

  it('has no arrow back up and none sideways between two directories of one floor', () => {
    const wrong: string[] = [];
    for (const [file, targets] of graph) {
      for (const target of targets) {
        if (!target.startsWith(SRC)) {
          wrong.push(`${relative(SRC, file)} → ${target} (outside src/)`);
          continue;
        }
        const from = unitOf(file);
        const to = unitOf(target);
        if (from === to) continue;
        if (floorOf(to) >= floorOf(from)) wrong.push(`${relative(SRC, file)} → ${relative(SRC, target)}`);
      }
    }
    expect(wrong).toEqual([]);
  });

  it('has no cycle between files', () => {
    const cycles: string[] = [];
    const state = new Map<string, 'open' | 'done'>();
    const stack: string[] = [];
    const visit = (file: string) => {
      state.set(file, 'open');
      stack.push(file);
      for (const target of graph.get(file) ?? []) {
        if (!graph.has(target)) continue;
        const seen = state.get(target);
        if (seen === 'open') {
          cycles.push(
            stack
              .slice(stack.indexOf(target))
              .concat(target)
              .map((f) => relative(SRC, f))
              .join(' → '),
          );
        } else if (seen === undefined) visit(target);
      }
      stack.pop();
      state.set(file, 'done');
    };
    for (const file of graph.keys()) if (!state.has(file)) visit(file);
    expect(cycles).toEqual([]);
  });

  it('restores stored pods in one place: src/pods/pod-reader.ts', () => {
    const callers = files.filter(
      (file) => /\brestorePod\(/.test(readFileSync(file, 'utf8')) && !file.endsWith('machines/pod-persistence.ts'),
    );
    expect(callers.map((file) => relative(SRC, file))).toEqual(['pods/pod-reader.ts']);
  });

  it('keeps metrics in a registry per fleet member: prom-client only in src/metrics/, and no metric made at module scope', () => {
    const wrong: string[] = [];
    for (const file of files) {
      const text = readFileSync(file, 'utf8');
      const where = relative(SRC, file);
      if (/from 'prom-client'/.test(text) && !where.startsWith('metrics/')) wrong.push(`${where} imports prom-client`);
      if (
        /^(?:export )?(?:const|let) \w+ = new (?:Counter|Gauge|Histogram|Summary|Registry)\b|^new (?:Counter|Gauge|Histogram|Summary)\b/m.test(
          text,
        )
      )
        wrong.push(`${where} makes a metric at module scope`);
    }
    expect(wrong).toEqual([]);
  });

  it('reads the wall clock in one place, src/pods/clock.ts (the fleet passes it on as FleetDeps.now)', () => {
    const readers = files.filter((file) => {
      const code = readFileSync(file, 'utf8').replace(/\/\*[\s\S]*?\*\/|\/\/.*$/gm, '');
      return /\bDate\.now\b|\bnew Date\(\s*\)/.test(code);
    });
    expect(readers.map((file) => relative(SRC, file))).toEqual(['pods/clock.ts']);
  });

  it('lists in ARCHITECTURE.md\'s map ("Directories") exactly the folders src/ has', () => {
    const doc = readFileSync(new URL('../../docs/ARCHITECTURE.md', import.meta.url), 'utf8');
    const start = doc.indexOf('### 2.1 Directories');
    const table = doc.slice(start, doc.indexOf('\n### ', start + 1));
    const mapped = [...new Set([...table.matchAll(/^\| `src\/([a-z-]+)\//gm)].map((m) => m[1] as string))].sort();
    const folders = readdirSync(SRC, { withFileTypes: true })
      .filter((entry) => entry.isDirectory())
      .map((entry) => entry.name)
      .sort();
    expect(start).toBeGreaterThan(0);
    expect(mapped).toEqual(folders);
  });

  it('cites the design only as docs/ARCHITECTURE.md, by the names of sections that exist, never by number', () => {
    const doc = readFileSync(new URL('../../docs/ARCHITECTURE.md', import.meta.url), 'utf8');
    const sections = new Set([...doc.matchAll(/^#{2,3} \d+(?:\.\d+)? (.+)$/gm)].map((m) => (m[1] as string).trim()));
    const roots = ['src', 'tools', 'test', 'bench'].map((dir) =>
      fileURLToPath(new URL(`../../${dir}/`, import.meta.url)),
    );
    const cited: string[] = [];
    const dangling: string[] = [];
    for (const file of roots.flatMap((root) => sourceFiles(root))) {
      const text = readFileSync(file, 'utf8');
      if (/DESIGN(\.md)? ?§/.test(text)) dangling.push(`${file}: cites DESIGN`);
      if (/ARCHITECTURE(\.md)? ?§/.test(text)) dangling.push(`${file}: cites ARCHITECTURE.md by number`);
      for (const m of text.matchAll(/ARCHITECTURE\.md((?:, "[^"\n]+")+)/g)) {
        for (const name of (m[1] as string).matchAll(/"([^"\n]+)"/g)) {
          cited.push(name[1] as string);
          if (!sections.has(name[1] as string)) dangling.push(`${file}: "${name[1]}"`);
        }
      }
    }
    expect(dangling).toEqual([]);
    expect(cited.length).toBeGreaterThan(20);
  });

  it('keeps the test support in one place: tools/ and bench/ never import test/, test/fixtures re-exports nothing', () => {
    const root = fileURLToPath(new URL('../../', import.meta.url));
    const test = join(root, 'test');
    const wrong: string[] = [];
    for (const dir of ['tools', 'bench']) {
      for (const file of sourceFiles(join(root, dir))) {
        for (const target of importsOf(file)) {
          if (target.startsWith(`${test}/`)) wrong.push(`${relative(root, file)} → ${relative(root, target)}`);
        }
      }
    }
    for (const file of sourceFiles(join(test, 'fixtures'))) {
      if (/^export \* from /m.test(readFileSync(file, 'utf8'))) wrong.push(`${relative(root, file)} is a re-export`);
    }
    expect(wrong).toEqual([]);
    expect(sourceFiles(join(root, 'bench')).length).toBeGreaterThan(10);
  });

  it('reads the imports it judges (a check that finds none would pass anything)', () => {
    const workerImports = [...graph.entries()]
      .filter(([file]) => unitOf(file) === 'workers')
      .flatMap(([, targets]) => targets.map(unitOf));
    expect(workerImports).toContain('pods');
    expect(workerImports).toContain('machines');
    expect(files.length).toBeGreaterThan(80);
  });
});
