import { readFileSync } from 'node:fs';
import { shellQuote } from './shell-quote.js';

/**
 * The job's shell lives as real files in src/job (checked by sh -n, dash, bash -n and shellcheck as
 * files); this fills them in, with one rule for every value:
 *
 * - `@NAME@` becomes the value through shellQuote: one single-quoted word, whatever the value holds. A
 *   list becomes one quoted word per entry, separated by blanks (an empty list: nothing).
 * - `#@if FLAG`, `#@else`, `#@end` keep or drop the lines between them (they nest).
 * - Comment lines and blank lines are dropped (what travels to the node, or sits in a pod's annotation,
 *   is code only), except the `#!` line and `# shellcheck disable=` directives, and all of them with
 *   `keepComments`. Trailing comments stay: the file's author decides what must travel.
 *
 * A value the file does not use, a placeholder without a value and a branch left open are errors
 * naming the file and line, so a renamed placeholder fails in the unit tests, not on a compute node.
 */
export type JobValue = string | number | readonly (string | number)[];

export interface JobTemplateInput {
  values?: Readonly<Record<string, JobValue>>;
  flags?: Readonly<Record<string, boolean>>;
  keepComments?: boolean;
}

const PLACEHOLDER = /@([A-Z][A-Z0-9_]*)@/g;
const DIRECTIVE = /^\s*#@(if|else|end)\b\s*(.*)$/;

export function renderJobFile(file: string, input: JobTemplateInput = {}): string {
  return fillJobTemplate(jobFileText(file), file, input);
}

export function fillJobTemplate(text: string, file: string, input: JobTemplateInput = {}): string {
  const values = input.values ?? {};
  const flags = input.flags ?? {};
  const usedValues = new Set<string>();
  const usedFlags = new Set<string>();
  // Each open #@if: whether its lines are kept, and whether the branch around it was.
  const open: { keep: boolean; outer: boolean; line: number; elsed: boolean }[] = [];
  const out: string[] = [];
  const lines = text.split('\n');
  if (lines.at(-1) === '') lines.pop();
  const fail = (n: number, problem: string): never => {
    throw new Error(`src/job/${file}:${n}: ${problem}`);
  };
  lines.forEach((line, index) => {
    const n = index + 1;
    const directive = DIRECTIVE.exec(line);
    if (directive) {
      const [, word, rest = ''] = directive;
      const top = open.at(-1);
      if (word === 'if') {
        const flag = rest.trim();
        if (!/^[A-Z][A-Z0-9_]*$/.test(flag)) fail(n, `#@if needs one FLAG name, got ${JSON.stringify(rest)}`);
        const value = flags[flag];
        if (value === undefined) fail(n, `no value for the flag ${flag}`);
        usedFlags.add(flag);
        const outer = top ? top.keep : true;
        open.push({ keep: outer && value === true, outer, line: n, elsed: false });
      } else if (!top) {
        fail(n, `#@${word} without #@if`);
      } else if (word === 'else') {
        if (top.elsed) fail(n, `a second #@else for the #@if of line ${top.line}`);
        top.elsed = true;
        top.keep = top.outer && !top.keep;
      } else {
        open.pop();
      }
      return;
    }
    if (open.length > 0 && !open.at(-1)?.keep) {
      // Placeholders of a dropped branch still count as used: the value belongs to the other branch.
      for (const [, name] of line.matchAll(PLACEHOLDER)) if (name) usedValues.add(name);
      return;
    }
    const code = line.trimStart();
    const isComment = code.startsWith('#') && !(n === 1 && code.startsWith('#!'));
    if (!input.keepComments && (code === '' || (isComment && !code.startsWith('# shellcheck disable=')))) return;
    out.push(
      line.replace(PLACEHOLDER, (_, name: string) => {
        const value = values[name];
        if (value === undefined) return fail(n, `no value for @${name}@`);
        usedValues.add(name);
        return typeof value === 'string' || typeof value === 'number'
          ? shellQuote(value)
          : value.map((v) => shellQuote(v)).join(' ');
      }),
    );
  });
  const unclosed = open.at(-1);
  if (unclosed) fail(unclosed.line, '#@if without #@end');
  for (const name of Object.keys(values)) {
    if (!usedValues.has(name)) throw new Error(`src/job/${file}: the value ${name} is not used`);
  }
  for (const name of Object.keys(flags)) {
    if (!usedFlags.has(name)) throw new Error(`src/job/${file}: the flag ${name} is not used`);
  }
  return `${out.join('\n')}\n`;
}

const cache = new Map<string, string>();

/** A file of src/job as it is (the build copies the folder to dist/job, beside dist/render). */
export function jobFileText(file: string): string {
  let text = cache.get(file);
  if (text === undefined) {
    text = readFileSync(new URL(`../job/${file}`, import.meta.url), 'utf8');
    cache.set(file, text);
  }
  return text;
}
