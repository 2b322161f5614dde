import type { HistoryEntry } from '../../src/store/snapshot-store.js';
import type { Check } from './leftovers.js';

/** The demo's terminal output: phases as headings, indented lines under them, no JSON. */
export class Printer {
  private phase = 0;

  constructor(
    private readonly total: number,
    private readonly write: (text: string) => void = (text) => process.stdout.write(text),
  ) {}

  heading(title: string): void {
    this.phase += 1;
    this.write(`\n[${this.phase}/${this.total}] ${title}\n`);
  }

  line(text = ''): void {
    this.write(text === '' ? '\n' : `    ${text}\n`);
  }

  ok(text: string): void {
    this.write(`  ✓ ${text}\n`);
  }

  bad(text: string): void {
    this.write(`  ✗ ${text}\n`);
  }

  raw(text: string): void {
    this.write(text);
  }

  checks(results: readonly Check[]): void {
    for (const c of results) {
      if (c.problems.length === 0) this.ok(c.what);
      else this.bad(`${c.what}:\n${c.problems.map((p) => `        ${p}`).join('\n')}`);
    }
  }
}

/** `12:03:04.567` (local time). */
export function clock(at: number): string {
  const d = new Date(at);
  const two = (n: number) => String(n).padStart(2, '0');
  return `${two(d.getHours())}:${two(d.getMinutes())}:${two(d.getSeconds())}.${String(d.getMilliseconds()).padStart(3, '0')}`;
}

export function seconds(ms: number): string {
  return `${(ms / 1000).toFixed(2)} s`;
}

export function bytes(n: number): string {
  if (n >= 1024 * 1024) return `${(n / (1024 * 1024)).toFixed(1)} MiB`;
  if (n >= 1024) return `${(n / 1024).toFixed(1)} KiB`;
  return `${n} B`;
}

/** One live line per transition of the pod's machine, timed from T0. */
export function stateLine(t0: number): (h: HistoryEntry) => string {
  return (h) => {
    const offset = `+${((h.at - t0) / 1000).toFixed(2)}s`.padStart(8);
    const detail = h.detail ? `  (${h.detail})` : '';
    return `    ${clock(h.at)} ${offset}  ${h.event.padEnd(15)} ${(h.from || '·').padStart(20)} → ${h.to}${detail}\n`;
  };
}
