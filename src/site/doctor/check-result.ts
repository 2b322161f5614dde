/**
 * One row of `backhaul doctor` (ARCHITECTURE.md, "The command line"): what was checked, how it went, what was seen, and for
 * a failure the concrete change that fixes it (a configuration key, an sshd option, a command).
 */

export type CheckStatus = 'PASS' | 'FAIL' | 'SKIP';

export type CheckName =
  | 'config'
  | 'crypto'
  | 'key'
  | 'known_hosts'
  | 'login'
  | 'slurm'
  | 'node'
  | 'forwarding'
  | 'python'
  | 'socket_root'
  | 'isolation';

export interface CheckResult {
  check: CheckName;
  status: CheckStatus;
  detail: string;
  /** Only for FAIL: one or two sentences saying what to change. */
  fix: string | null;
}

export const pass = (check: CheckName, detail: string): CheckResult => ({ check, status: 'PASS', detail, fix: null });

export const fail = (check: CheckName, detail: string, fix: string): CheckResult => ({
  check,
  status: 'FAIL',
  detail,
  fix,
});

export const skip = (check: CheckName, reason: string): CheckResult => ({
  check,
  status: 'SKIP',
  detail: reason,
  fix: null,
});

export class CheckTimeout extends Error {
  override readonly name = 'CheckTimeout';
}

/**
 * Waits for `work` at most `ms`. The work is not cancelled (a channel request cannot be), so a value
 * that arrives late is handed to `onLate` to be released (a connection closed, a carrier ended).
 */
export function bounded<T>(what: string, ms: number, work: Promise<T>, onLate?: (value: T) => void): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    let done = false;
    const timer = setTimeout(() => {
      done = true;
      reject(new CheckTimeout(`${what} did not finish within ${formatSeconds(ms)}`));
    }, ms);
    work.then(
      (value) => {
        if (done) {
          onLate?.(value);
          return;
        }
        done = true;
        clearTimeout(timer);
        resolve(value);
      },
      (err: unknown) => {
        if (done) return;
        done = true;
        clearTimeout(timer);
        reject(err);
      },
    );
  });
}

export function formatSeconds(ms: number): string {
  const s = ms / 1000;
  return `${Number.isInteger(s) ? s : s.toFixed(1)} s`;
}

export function errorMessage(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}

/** The last few lines a remote command wrote, on one line, for a detail column. */
export function lastLines(text: string, count = 2): string {
  return text
    .trim()
    .split('\n')
    .map((l) => l.trim())
    .filter((l) => l !== '')
    .slice(-count)
    .join(' | ');
}
