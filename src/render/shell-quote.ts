/**
 * POSIX shell quoting. Every value that reaches a generated script goes through here: inside single
 * quotes nothing is special, so the only character to handle is the quote itself ('\'' closes the
 * quoted string, adds an escaped quote, and reopens it). This holds for sh, dash, bash and busybox.
 */

export function shellQuote(value: string | number): string {
  const text = String(value);
  // A NUL cannot be part of a shell word or an argv entry: it would silently truncate the value.
  if (text.includes('\0')) throw new Error('a shell value cannot contain a NUL byte');
  return `'${text.replaceAll("'", "'\\''")}'`;
}

/** Characters that are literal in sh, bash, csh and tcsh alike (no globbing, expansion or history). */
const PLAIN_WORD = /^[A-Za-z0-9._/+:,@=-]+$/;

/**
 * A word for a command line that may be read by a login shell other than sh (csh, tcsh): plain when
 * that is safe in every shell, single-quoted otherwise.
 */
export function shellWord(value: string | number): string {
  const text = String(value);
  return PLAIN_WORD.test(text) ? text : shellQuote(text);
}

export function isPlainWord(value: string): boolean {
  return PLAIN_WORD.test(value);
}
