import { spawn } from 'node:child_process';
import { closeSync, fstatSync, openSync, readdirSync, readFileSync, readlinkSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';

/**
 * scripts/slurm-up.sh starts daemons that outlive it: they must keep nothing of their caller. Once a
 * CI runner's lock stayed held for 28 minutes by a munged and a slurmctld that had inherited it, and a
 * daemon holding the caller's stdout pipe makes a caller that waits for EOF wait for as long as the
 * daemon lives. The daemons are restarted here with a lock file and pipes open in the caller.
 */

const ROOT = new URL('../..', import.meta.url).pathname;
const PIDS = { munged: '/run/munge/munged.pid', slurmctld: '/run/slurmctld.pid', slurmd: '/run/slurmd.pid' };

function run(script: string, extraFd: number): Promise<{ code: number | null; out: string; pipeInode: number }> {
  return new Promise((resolve, reject) => {
    const child = spawn(join(ROOT, 'scripts', script), [], {
      stdio: ['ignore', 'pipe', 'pipe', extraFd],
      env: { ...process.env, BH_SLURM_QUIET: '' },
    });
    const handle = (child.stdout as unknown as { _handle?: { fd?: number } })._handle;
    const pipeInode = handle?.fd !== undefined ? fstatSync(handle.fd).ino : -1;
    let out = '';
    child.stdout?.on('data', (d: Buffer) => {
      out += d.toString();
    });
    child.stderr?.on('data', (d: Buffer) => {
      out += d.toString();
    });
    // 'close' waits for every holder of the pipes: a daemon keeping them would time this out.
    const timer = setTimeout(() => reject(new Error(`${script}: pipes still open after 90 s; said: ${out}`)), 90_000);
    child.once('close', (code) => {
      clearTimeout(timer);
      resolve({ code, out, pipeInode });
    });
  });
}

function openFiles(pid: number): string[] {
  return readdirSync(`/proc/${pid}/fd`).map((fd) => {
    try {
      return readlinkSync(`/proc/${pid}/fd/${fd}`);
    } catch {
      return '?';
    }
  });
}

const lockPath = join(tmpdir(), `bh-fd-probe-${process.pid}.lock`);

afterAll(() => rmSync(lockPath, { force: true }));

describe('scripts/slurm-up.sh', () => {
  it("starts munged, slurmctld and slurmd with none of the caller's descriptors", async () => {
    const lock = openSync(lockPath, 'w');
    try {
      const down = await run('slurm-down.sh', lock);
      expect(down.code, down.out).toBe(0);
      const up = await run('slurm-up.sh', lock);
      expect(up.code, up.out).toBe(0);
      for (const [daemon, pidFile] of Object.entries(PIDS)) {
        const pid = Number(readFileSync(pidFile, 'utf8').trim());
        const files = openFiles(pid);
        expect(files, `${daemon} (pid ${pid}) holds the caller's lock: ${files.join(', ')}`).not.toContain(lockPath);
        expect(files, `${daemon} (pid ${pid}) holds the caller's stdout pipe`).not.toContain(`pipe:[${up.pipeInode}]`);
      }
    } finally {
      closeSync(lock);
    }
  }, 180_000);
});
