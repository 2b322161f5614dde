/**
 * Text from a pod (an annotation, a name) as messages show it: logs, terminals, Kubernetes Events and
 * admission refusals. Every code point that could restyle or forge what a reader sees is written as an
 * escape instead: controls (C0, DEL, C1), line and paragraph separators, format characters (bidi
 * overrides and isolates, zero-width joiners, the BOM, soft hyphen), lone surrogates, private-use and
 * unassigned code points, and every space but U+0020. Backslash and double quote are escaped too, so
 * the result in quotes reads back unambiguously.
 */

const UNSAFE = /[\p{C}\p{Zl}\p{Zp}\p{Zs}\\"]/u;
const UNSAFE_ALL = /[\p{C}\p{Zl}\p{Zp}\p{Zs}\\"]/gu;

function escaped(ch: string): string {
  if (ch === ' ') return ' ';
  if (ch === '\\') return '\\\\';
  if (ch === '"') return '\\"';
  const code = ch.codePointAt(0) ?? 0;
  return code > 0xffff
    ? `\\u{${code.toString(16).toUpperCase()}}`
    : `\\u${code.toString(16).toUpperCase().padStart(4, '0')}`;
}

/** VALUE with every unsafe code point escaped (`\u202E`, `\u{E0001}`), the rest as it is. */
export function displayText(value: string): string {
  // The common case (plain host names, ports) costs one test.
  if (!UNSAFE.test(value)) return value;
  // Lone surrogates are matched by \p{Cs} one at a time, a pair as one code point.
  return value.replace(UNSAFE_ALL, escaped);
}

/** Longest part of a user's value repeated in a message, in code points. */
export const QUOTE_MAX = 100;

/**
 * A user's value as a message shows it: in double quotes, escaped for display, and cut after QUOTE_MAX
 * code points (never inside a surrogate pair) with its full length said.
 */
export function quote(value: string): string {
  const points = Array.from(value);
  if (points.length <= QUOTE_MAX) return `"${displayText(value)}"`;
  return `"${displayText(points.slice(0, QUOTE_MAX).join(''))}"… (${points.length} characters)`;
}
