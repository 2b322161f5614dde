/**
 * The Slurm side of bench/control-shadows.ts, shared with bench/control.ts (which cleans up after a child
 * that died): the pods of one run are named <run>-0000-4000-8000-<n>, so their jobs are found by name.
 */
import { execFile } from 'node:child_process';
import { rm } from 'node:fs/promises';
import { promisify } from 'node:util';
import { socketDir } from '../src/contract/derivations.js';
import { scancel } from '../tools/sandbox/slurm.js';
import { sleep } from './control-common.js';

const execFileAsync = promisify(execFile);

export const uidOf = (run: string, i: number) => `${run}-0000-4000-8000-${(i + 1).toString(16).padStart(12, '0')}`;

export function runPrefix(): string {
  return Math.floor(Math.random() * 0xffffffff)
    .toString(16)
    .padStart(8, '0');
}

/**
 * Cancels every job of this run (found by name, so a job submitted while cleaning up is not missed), waits
 * for them to end, and removes socket dirs their preludes left: a batch script killed before its EXIT
 * trap ran (scancel's KillWait is 5 s, and a loaded machine misses it) keeps its dir.
 */
/** How long cancelRun may take: 1,010 jobs cancelled at once took this machine's Slurm over a minute to end. */
export function cancelRunMs(count: number): number {
  return 90_000 + count * 100;
}

export async function cancelRun(run: string, user: string, socketRoot: string, count: number): Promise<void> {
  const prefix = `${run}-0000-4000-8000-`;
  const ours = async () => {
    const { stdout } = await execFileAsync('squeue', ['-h', '-u', user, '-o', '%i %j']).catch(() => ({ stdout: '' }));
    return stdout
      .split('\n')
      .map((l) => l.trim().split(' '))
      .filter(([id, name]) => id && name?.startsWith(prefix))
      .map(([id]) => id as string);
  };
  const deadline = Date.now() + cancelRunMs(count) - 30_000;
  for (let ids = await ours(); ids.length > 0 && Date.now() < deadline; ids = await ours()) {
    for (let i = 0; i < ids.length; i += 200) await scancel(ids.slice(i, i + 200)).catch(() => undefined);
    await sleep(2_000);
  }
  for (let i = 0; i < count; i += 1) {
    await rm(socketDir(socketRoot, uidOf(run, i)), { recursive: true, force: true }).catch(() => undefined);
  }
}
