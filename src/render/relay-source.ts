import { jobFileText } from './job-template.js';

/**
 * The job's Python (src/job; the build copies the folder into dist/job). The relay is what the fleet
 * delivers over the carrier; the boot is what every prelude carries.
 */
/** The relay (relay.py) the session host writes into the job's socket dir (ARCHITECTURE.md, "The relay"). */
export function relaySource(): string {
  return jobFileText('relay.py');
}

/** The hand-off the boot names in `relay.want` and the relay above takes: `serve … --listen=FD:SOCKET`. */
export const RELAY_HANDOFF = 'handoff 1';

/**
 * The boot (relay-boot.py) as the prelude carries it: without comments, blank lines and the spaces Python
 * does not need, one space per indentation level, each statement on one line. Python reads it the same
 * (a test compares the syntax trees; the file keeps no multi-line strings, which this would change).
 */
export function bootSource(): string {
  return compactPython(jobFileText('relay-boot.py'));
}

const WORD = /[A-Za-z0-9_]/;

export function compactPython(text: string): string {
  const lines: string[] = [];
  let depth = 0; // open brackets: the next physical line continues this statement
  let continued = false; // a backslash ended the last line
  for (const line of text.split('\n')) {
    const code = line.trimStart();
    if (code === '' || code.startsWith('#')) continue;
    const indent = line.length - code.length;
    const joins = depth > 0 || continued;
    let out = joins ? (lines.pop() ?? '') : ' '.repeat(Math.floor(indent / 4) + (indent % 4));
    let last = joins ? (out.at(-1) ?? '') : '';
    let quote = '';
    continued = false;
    for (let i = 0; i < code.length; i++) {
      const c = code[i] as string;
      if (quote !== '') {
        out += c;
        if (c === '\\') out += code[++i] ?? '';
        else if (c === quote) quote = '';
        last = c;
        continue;
      }
      if (c === '"' || c === "'") quote = c;
      else if (c === '#')
        break; // a trailing comment (no string of the boot holds a quote and then #)
      else if (c === '\\' && code.slice(i + 1).trim() === '') {
        continued = true;
        break;
      } else if (c === ' ') {
        // Kept only between two words: `not x`, `1 if`; never `x , y` or `f (`.
        const next = code.slice(i).trimStart()[0] ?? '';
        if (WORD.test(last) && WORD.test(next)) out += ' ';
        continue;
      } else if ('([{'.includes(c)) depth++;
      else if (')]}'.includes(c)) depth--;
      out += c;
      last = c;
    }
    lines.push(out);
  }
  return lines.join('\n');
}
