import { readFileSync } from 'node:fs';

/**
 * The job's Python, read from next to this module (the build copies both .py files into dist/render).
 * The relay is what the fleet delivers over the carrier; the boot is what every prelude carries.
 */
const cache = new Map<string, string>();

function source(file: string): string {
  let text = cache.get(file);
  if (text === undefined) {
    text = readFileSync(new URL(`./${file}`, import.meta.url), 'utf8');
    cache.set(file, text);
  }
  return text;
}

/** The relay (relay.py) the session host writes into the job's socket dir (ARCHITECTURE.md §3.5). */
export function relaySource(): string {
  return source('relay.py');
}

/** The hand-off the boot names in `relay.want` and the relay above takes: `serve … --listen=FD:SOCKET`. */
export const RELAY_HANDOFF = 'handoff 1';

/**
 * The boot (relay-boot.py) as the prelude carries it: without comments and blank lines, one space per
 * indentation level. Python reads it the same (the file keeps no multi-line strings, which this would
 * change).
 */
export function bootSource(): string {
  return compactPython(source('relay-boot.py'));
}

export function compactPython(text: string): string {
  const lines: string[] = [];
  for (const line of text.split('\n')) {
    const code = line.trimStart();
    if (code === '' || code.startsWith('#')) continue;
    const indent = line.length - code.length;
    // Trailing comments start with two spaces and "# ", which no string of the boot holds (a test
    // compares the syntax trees of both texts).
    lines.push(' '.repeat(Math.floor(indent / 4) + (indent % 4)) + code.replace(/ {2}# .*$/, '').trimEnd());
  }
  return lines.join('\n');
}
