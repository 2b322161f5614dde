import { execFile } from 'node:child_process';
import { chmod, chown, copyFile, lstat, mkdir, mkdtemp, readFile, rm, symlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { renderEpilog, SLURM_JOB_FILE } from '../../src/render/epilog.js';
import { ensureUser, JOB_USER, OTHER_USER, type TestUser } from '../../tools/sandbox/users.js';

/**
 * `backhaul render epilog`: Slurm's Epilog (root, on the compute node, after the job; it gets the job's
 * id and user, not its name) removes the socket dir of the job that just ended when the prelude's trap
 * did not run. The boot's `prepare` records the job's id in the dir for it.
 */
const BOOT = new URL('../../src/job/relay-boot.py', import.meta.url).pathname;

let base = '';
let root = '';
let job: TestUser;
let other: TestUser;

function run(
  file: string,
  args: string[],
  env: Record<string, string>,
  uid?: number,
  gid?: number,
): Promise<{ code: number; out: string }> {
  return new Promise((resolve) => {
    execFile(
      file,
      args,
      { env: { PATH: '/usr/bin:/bin', ...env }, timeout: 20_000, ...(uid === undefined ? {} : { uid, gid }) },
      (err, stdout, stderr) =>
        resolve({ code: err ? (typeof err.code === 'number' ? err.code : 1) : 0, out: `${stdout}${stderr}` }),
    );
  });
}

async function epilog(env: Record<string, string>): Promise<{ code: number; out: string }> {
  const script = join(base, 'epilog.sh');
  await writeFile(script, renderEpilog({ user: JOB_USER, socketRoot: root }), { mode: 0o755 });
  return run('/bin/sh', [script], env);
}

/** A socket dir as the boot leaves it, made by the job user, naming job `jobId`. */
async function jobDir(name: string, jobId: string, owner = job): Promise<string> {
  const dir = join(root, name);
  await mkdir(dir, { mode: 0o700 });
  await writeFile(join(dir, SLURM_JOB_FILE), `${jobId}\n`);
  await writeFile(join(dir, 'hosts'), '127.0.0.1 localhost\n');
  for (const path of [dir, join(dir, SLURM_JOB_FILE), join(dir, 'hosts')]) await chown(path, owner.uid, owner.gid);
  return dir;
}

const exists = (path: string) =>
  lstat(path).then(
    () => true,
    () => false,
  );

beforeAll(async () => {
  job = await ensureUser(JOB_USER);
  other = await ensureUser(OTHER_USER);
  base = await mkdtemp(join(tmpdir(), 'bh-epilog-'));
  root = join(base, 'root');
  await mkdir(root, { mode: 0o700 });
  await chown(root, job.uid, job.gid);
  await chmod(base, 0o755); // the job user reaches the root through it, as through /tmp
});

afterAll(async () => {
  if (base) await rm(base, { recursive: true, force: true });
});

describe('the Slurm epilog (backhaul render epilog)', () => {
  it("the boot's prepare records the job's id in its socket dir", async () => {
    const bootCopy = join(base, 'relay-boot.py');
    await copyFile(BOOT, bootCopy);
    const uid = 'e9110900-0000-4000-8000-000000000001';
    const ran = await run(
      'python3',
      [bootCopy, 'prepare', `--uid=${uid}`, `--socket-root=${root}`, '--shell=1'],
      { SLURM_JOB_ID: '4242' },
      job.uid,
      job.gid,
    );
    expect(ran.code, ran.out).toBe(0);
    const dir = ran.out.trim();
    expect(await readFile(join(dir, SLURM_JOB_FILE), 'utf8')).toBe('4242\n');
    // That job ends without its trap: the epilog removes its dir.
    const done = await epilog({ SLURM_JOB_USER: JOB_USER, SLURM_JOB_ID: '4242' });
    expect(done, done.out).toEqual({ code: 0, out: `backhaul: removed ${dir} (job 4242 ended without its trap)\n` });
    expect(await exists(dir)).toBe(false);
  });

  it("removes only the ended job's own dir: not another job's, another user's, or what a link points to", async () => {
    const ended = await jobDir('bh-ended', '101');
    const running = await jobDir('bh-running', '102');
    const foreign = await jobDir('bh-foreign', '101', other);
    // A link in the root to a dir elsewhere that names the ended job too: never followed.
    const outside = join(base, 'outside');
    await mkdir(outside, { mode: 0o700 });
    await writeFile(join(outside, SLURM_JOB_FILE), '101\n');
    for (const path of [outside, join(outside, SLURM_JOB_FILE)]) await chown(path, job.uid, job.gid);
    await symlink(outside, join(root, 'bh-link'));
    const done = await epilog({ SLURM_JOB_USER: JOB_USER, SLURM_JOB_ID: '101' });
    expect(done, done.out).toEqual({ code: 0, out: `backhaul: removed ${ended} (job 101 ended without its trap)\n` });
    expect(await exists(ended)).toBe(false);
    expect(await exists(running)).toBe(true);
    expect(await exists(foreign)).toBe(true);
    expect(await exists(join(root, 'bh-link'))).toBe(true);
    expect(await exists(join(outside, SLURM_JOB_FILE))).toBe(true);
  });

  it('does nothing, and exits 0, for another user, a job id that is not one, or no socket root', async () => {
    const dir = await jobDir('bh-kept', '303');
    const envs: Record<string, string>[] = [
      { SLURM_JOB_USER: OTHER_USER, SLURM_JOB_ID: '303' },
      { SLURM_JOB_USER: JOB_USER, SLURM_JOB_ID: '303; rm -rf /' },
      { SLURM_JOB_USER: JOB_USER },
    ];
    for (const env of envs) {
      const done = await epilog(env);
      expect(done, JSON.stringify(env)).toEqual({ code: 0, out: '' });
      expect(await exists(dir)).toBe(true);
    }
    const script = renderEpilog({ user: JOB_USER, socketRoot: join(base, 'no-such-root') });
    await writeFile(join(base, 'epilog-nowhere.sh'), script, { mode: 0o755 });
    expect(
      await run('/bin/sh', [join(base, 'epilog-nowhere.sh')], { SLURM_JOB_USER: JOB_USER, SLURM_JOB_ID: '1' }),
    ).toEqual({
      code: 0,
      out: '',
    });
  });

  it('passes shellcheck, and quotes the site settings', async () => {
    const script = renderEpilog({ user: "o'brien", socketRoot: '/tmp/a b/$(id)' });
    const assignments = script.split('\n').filter((line) => /^(user|root)=/.test(line));
    const read = await run('/bin/sh', ['-c', `${assignments.join('\n')}\nprintf '%s|%s' "$user" "$root"`], {});
    expect(read).toEqual({ code: 0, out: "o'brien|/tmp/a b/$(id)" });
    const file = join(base, 'quoted.sh');
    await writeFile(file, script);
    const result = await run('shellcheck', ['-S', 'warning', '-s', 'sh', file], {});
    expect(result, result.out).toEqual({ code: 0, out: '' });
  });
});
