import { type ChildProcess, spawn } from 'node:child_process';
import { once } from 'node:events';
import { chown, lstat, mkdir, mkdtemp, readdir, rm, symlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { HopPipeServer, removeStalePipeDirs } from '../../src/ssh/hop-pipes.js';
import { ensureUser, OTHER_USER } from '../../tools/sandbox/users.js';

/**
 * A session host killed outright (kill -9, the OOM killer) never removes its pipe dir; the next one to
 * start on the machine does, and only what is provably a dead host's of this user.
 */

const HOP_PIPES = new URL('../../dist/ssh/hop-pipes.js', import.meta.url).href;

/** A pid no process has now: one that just exited. */
async function deadPid(): Promise<number> {
  const child = spawn('true');
  await once(child, 'exit');
  if (child.pid === undefined) throw new Error('no pid');
  return child.pid;
}

/** A process that starts a HopPipeServer in `root` (from dist, as a session host does) and prints its socket. */
async function pipeHost(root: string): Promise<{ child: ChildProcess; socketPath: string }> {
  const child = spawn(
    process.execPath,
    [
      '--input-type=module',
      '-e',
      `const { HopPipeServer } = await import(${JSON.stringify(HOP_PIPES)});
       const server = await HopPipeServer.start(process.argv[1]);
       process.stdout.write(server.path + '\\n');
       setInterval(() => {}, 1000);`,
      root,
    ],
    { stdio: ['ignore', 'pipe', 'inherit'] },
  );
  const [line] = (await once(child.stdout as NodeJS.ReadableStream, 'data')) as [Buffer];
  return { child, socketPath: line.toString().trim() };
}

describe('pipe dirs of session hosts that died without stopping', () => {
  let root: string;

  beforeAll(async () => {
    root = await mkdtemp(join(tmpdir(), 'bh-pipes-test-'));
  });

  afterAll(async () => {
    await rm(root, { recursive: true, force: true });
  });

  it('the next start removes the dir of a host killed with SIGKILL, and says so', async () => {
    const { child, socketPath } = await pipeHost(root);
    const dir = join(socketPath, '..');
    expect((await lstat(socketPath)).isSocket()).toBe(true);
    child.kill('SIGKILL');
    await once(child, 'exit');
    // What a killed host leaves: its dir and its socket.
    expect((await lstat(socketPath)).isSocket()).toBe(true);

    const next = await HopPipeServer.start(root);
    try {
      expect(next.staleRemoved, `left: ${(await readdir(root)).join(' ')}`).toEqual([dir]);
      expect(await lstat(dir).catch(() => 'gone')).toBe('gone');
      expect(next.path.startsWith(join(root, `bh-pipes-${process.pid}-`))).toBe(true);
    } finally {
      await next.close();
    }
    expect(await readdir(root)).toEqual([]);
  });

  it("leaves live hosts' dirs, other users', symbolic links, files and names it did not make", async () => {
    const dead = await deadPid();
    const other = await ensureUser(OTHER_USER);
    const live = await pipeHost(root);
    try {
      const entries = {
        deadOwn: join(root, `bh-pipes-${dead}-aB3dE9`),
        liveHost: join(live.socketPath, '..'),
        pid1: join(root, 'bh-pipes-1-xYz123'),
        deadOthers: join(root, `bh-pipes-${dead}-others`),
        deadLink: join(root, `bh-pipes-${dead}-link00`),
        deadFile: join(root, `bh-pipes-${dead}-file00`),
        oldName: join(root, 'bh-pipes-Qw12Er'),
        unrelated: join(root, `other-${dead}-aB3dE9`),
      };
      const target = join(root, 'target');
      for (const d of [entries.deadOwn, entries.pid1, entries.deadOthers, entries.oldName, entries.unrelated, target]) {
        await mkdir(d);
      }
      await writeFile(join(entries.deadOwn, 'hops.sock'), '');
      await chown(entries.deadOthers, other.uid, other.gid);
      await symlink(target, entries.deadLink);
      await writeFile(entries.deadFile, '');

      const removed = await removeStalePipeDirs(root);
      const left = (await readdir(root)).sort();
      expect(removed, left.join(' ')).toEqual([entries.deadOwn]);
      const kept = Object.entries(entries)
        .filter(([key]) => key !== 'deadOwn')
        .map(([, path]) => path.slice(root.length + 1));
      expect(left).toEqual([...kept, 'target'].sort());
    } finally {
      live.child.kill('SIGKILL');
      await once(live.child, 'exit');
    }
  });
});
