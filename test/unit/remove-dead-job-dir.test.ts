import { execFile, spawn, spawnSync } from 'node:child_process';
import { mkdir, mkdtemp, rm, stat, symlink, writeFile } from 'node:fs/promises';
import { createServer, type Server } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  DEAD_JOB_DIR_REMOVED,
  JOB_SHELL_PID_FILE,
  RELAY_PIDS_FILE,
  renderRemoveDeadJobDir,
} from '../../src/render/node-scripts.js';

/** Runs the script as the session host does (`/bin/sh -s`, script on stdin). */
async function sh(script: string): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    const child = execFile('/bin/sh', ['-s'], (err, stdout, stderr) =>
      resolve({ code: (err as { code?: number } | null)?.code ?? 0, stdout, stderr }),
    );
    child.stdin?.end(script);
  });
}

async function exists(path: string): Promise<boolean> {
  return stat(path).then(
    () => true,
    () => false,
  );
}

/** A pid that certainly ran and has ended: a child reaped before this returns. */
function deadPid(): number {
  const child = spawnSync('/bin/sh', ['-c', 'echo $$'], { encoding: 'utf8' });
  return Number(child.stdout.trim());
}

/**
 * What a job leaves: the prelude's files, its shell's pid (dead unless given: killed without its trap;
 * null: an older prelude that did not write it) and the relay's pids.
 */
async function leftover(dir: string, pids: readonly number[], shell: number | null = deadPid()): Promise<void> {
  await mkdir(dir, { mode: 0o700 });
  if (shell !== null) await writeFile(join(dir, JOB_SHELL_PID_FILE), `${shell}\n`);
  await writeFile(join(dir, 'hosts'), '127.0.0.1 localhost\n');
  await writeFile(join(dir, 'relay.py'), '# relay\n');
  await writeFile(join(dir, 'relay.ready'), 'ready 127.1.2.3\n');
  await writeFile(join(dir, RELAY_PIDS_FILE), `${pids.join(' ')}\n`);
}

describe("the dead job's socket dir, removed by the session's teardown", () => {
  let root: string;
  const servers: Server[] = [];
  beforeAll(async () => {
    root = await mkdtemp(join(tmpdir(), "bh-dead-job's dir "));
  });
  afterAll(async () => {
    for (const server of servers) server.close();
    await rm(root, { recursive: true, force: true });
  });

  it('removes the leftovers of a job whose relay processes are all gone', async () => {
    const dir = join(root, 'bh-dead');
    await leftover(dir, [deadPid(), deadPid()]);
    const result = await sh(renderRemoveDeadJobDir(dir));
    expect(result).toEqual({ code: 0, stdout: `${DEAD_JOB_DIR_REMOVED}\n`, stderr: '' });
    expect(await exists(dir)).toBe(false);
  });

  it.each([
    ["its shell's pid written (the shell alive while the trap runs)", 'bh-trap-in-flight', process.pid],
    ['no shell pid (an older prelude): the 2 s wait alone', 'bh-trap-in-flight-old', null],
  ])("leaves a dir that its job's trap removes meanwhile (scancel: the relay killed, the trap a moment later), %s: no claim", async (_, name, shell) => {
    const dir = join(root, name);
    await leftover(dir, [deadPid()], shell);
    // The trap's rm -rf, 300 ms after the script starts (what CI caught: the claim was made in between).
    const trap = new Promise<void>((resolve) =>
      setTimeout(() => rm(dir, { recursive: true, force: true }).then(resolve), 300),
    );
    const result = await sh(renderRemoveDeadJobDir(dir));
    await trap;
    expect(result).toEqual({ code: 0, stdout: '', stderr: '' });
    expect(await exists(dir)).toBe(false);
  });

  it("keeps the dir while the job's shell lives (a workload that ignores TERM until KillWait: the trap is still to come), relay gone", async () => {
    const dir = join(root, 'bh-shell-waits');
    const shell = spawn('/bin/sh', ['-c', 'sleep 30'], { stdio: 'ignore' });
    try {
      await leftover(dir, [deadPid()], shell.pid ?? 0);
      expect(await sh(renderRemoveDeadJobDir(dir))).toEqual({ code: 0, stdout: '', stderr: '' });
      expect(await exists(join(dir, 'hosts'))).toBe(true);
    } finally {
      shell.kill('SIGKILL');
    }
    // Killed (KillWait's SIGKILL, the trap never ran): now it is a dead job's dir.
    await new Promise((resolve) => shell.once('exit', resolve));
    expect(await sh(renderRemoveDeadJobDir(dir))).toEqual({ code: 0, stdout: `${DEAD_JOB_DIR_REMOVED}\n`, stderr: '' });
    expect(await exists(dir)).toBe(false);
  });

  it('the shell killed (no trap) while its relay lives a moment longer: waits for the relay, then removes and claims', async () => {
    const dir = join(root, 'bh-relay-follows');
    // The relay sees its shell gone within half a second and exits.
    const relay = spawn('/bin/sh', ['-c', 'sleep 0.5'], { stdio: 'ignore' });
    await leftover(dir, [deadPid(), relay.pid ?? 0]);
    expect(await sh(renderRemoveDeadJobDir(dir))).toEqual({ code: 0, stdout: `${DEAD_JOB_DIR_REMOVED}\n`, stderr: '' });
    expect(await exists(dir)).toBe(false);
  });

  it('removes a dir without a pids file (the job died before its relay wrote one)', async () => {
    const dir = join(root, 'bh-early');
    await mkdir(dir, { mode: 0o700 });
    await writeFile(join(dir, 'hosts'), '');
    expect((await sh(renderRemoveDeadJobDir(dir))).code).toBe(0);
    expect(await exists(dir)).toBe(false);
  });

  it("without the shell's pid (an older prelude), keeps the dir while a relay process of it lives (the job is ending: its own trap is still to come)", async () => {
    const dir = join(root, 'bh-ending');
    await leftover(dir, [deadPid(), process.pid], null);
    expect(await sh(renderRemoveDeadJobDir(dir))).toEqual({ code: 0, stdout: '', stderr: '' });
    expect(await exists(join(dir, 'hosts'))).toBe(true);
  });

  it("keeps the dir while a socket is left in it (another session's, of a newer job)", async () => {
    const dir = join(root, 'bh-successor');
    await leftover(dir, [deadPid()]);
    const server = createServer();
    servers.push(server);
    await new Promise<void>((resolve) => server.listen(join(dir, '5432.sock'), resolve));
    expect((await sh(renderRemoveDeadJobDir(dir))).code).toBe(0);
    expect(await exists(join(dir, '5432.sock'))).toBe(true);
    expect(await exists(join(dir, 'hosts'))).toBe(true);
  });

  it('never follows a symbolic link, and does nothing where nothing is', async () => {
    const target = join(root, 'bh-target');
    await leftover(target, [deadPid()]);
    const link = join(root, 'bh-link');
    await symlink(target, link);
    expect((await sh(renderRemoveDeadJobDir(link))).code).toBe(0);
    expect(await exists(join(target, 'hosts'))).toBe(true);
    expect(await exists(link)).toBe(true);
    expect(await sh(renderRemoveDeadJobDir(join(root, 'bh-missing')))).toEqual({ code: 0, stdout: '', stderr: '' });
  });
});
