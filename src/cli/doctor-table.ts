import type { CheckResult, CheckStatus } from '../site/doctor/check-result.js';

export interface TableStyle {
  /** ANSI colours for the status column (only on a terminal). */
  colour: boolean;
  /** Wrap the detail column to this many columns (a terminal's width); no wrapping when absent. */
  width?: number | undefined;
}

const COLOUR: Readonly<Record<CheckStatus, string>> = { PASS: '\x1b[32m', FAIL: '\x1b[31m', SKIP: '\x1b[33m' };
const RESET = '\x1b[0m';
const GAP = '  ';

/**
 * The doctor's results as an aligned table: CHECK, STATUS, DETAIL, and under a failure's detail its
 * fix, indented to the detail column. Plain text unless `style.colour`.
 */
export function renderDoctorTable(results: readonly CheckResult[], style: TableStyle): string {
  const checkWidth = Math.max('CHECK'.length, ...results.map((r) => r.check.length));
  const statusWidth = 'STATUS'.length;
  const indent = checkWidth + GAP.length + statusWidth + GAP.length;
  const room = style.width !== undefined ? Math.max(30, style.width - indent) : undefined;
  const pad = ' '.repeat(indent);

  const lines = [`${'CHECK'.padEnd(checkWidth)}${GAP}${'STATUS'.padEnd(statusWidth)}${GAP}DETAIL`];
  for (const r of results) {
    const fill = ' '.repeat(statusWidth - r.status.length);
    const shown = style.colour ? `${COLOUR[r.status]}${r.status}${RESET}${fill}` : `${r.status}${fill}`;
    const [first = '', ...rest] = wrap(r.detail, room);
    lines.push(`${r.check.padEnd(checkWidth)}${GAP}${shown}${GAP}${first}`);
    for (const line of rest) lines.push(`${pad}${line}`);
    if (r.fix) {
      // A hanging indent, so the fix reads as one block under its label.
      const [head = '', ...tail] = wrap(r.fix, room === undefined ? undefined : room - 5);
      lines.push(`${pad}fix: ${head}`);
      for (const line of tail) lines.push(`${pad}     ${line}`);
    }
  }
  const count = (s: CheckStatus) => results.filter((r) => r.status === s).length;
  lines.push('', `${count('PASS')} passed, ${count('FAIL')} failed, ${count('SKIP')} skipped`);
  return `${lines.join('\n')}\n`;
}

/** Greedy word wrap; a word longer than the room gets a line of its own. */
function wrap(text: string, room: number | undefined): string[] {
  if (room === undefined || text.length <= room) return [text];
  const out: string[] = [];
  let line = '';
  for (const word of text.split(' ')) {
    if (line !== '' && line.length + 1 + word.length > room) {
      out.push(line);
      line = word;
    } else {
      line = line === '' ? word : `${line} ${word}`;
    }
  }
  if (line !== '') out.push(line);
  return out;
}
