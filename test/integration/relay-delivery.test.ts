import { type ChildProcess, execFile, spawn } from 'node:child_process';
import { openSync } from 'node:fs';
import { appendFile, copyFile, mkdir, mkdtemp, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { parseDelivery, renderDeliverRelay } from '../../src/render/relay-delivery.js';
import { relaySource } from '../../src/render/relay-source.js';
import { freePort } from '../../tools/sandbox/sshd.js';

/**
 * The script the session host runs in the job once its carrier is open (ShadowSession.deliverRelay), on
 * a socket dir of this machine: each outcome, from the files a boot (or an older prelude) leaves.
 */
const BOOT = new URL('../../src/job/relay-boot.py', import.meta.url).pathname;
const FORWARDS = [
  { listenPort: 6379, dialHost: 'redis.user.svc.cluster.local', names: ['redis.user.svc.cluster.local', 'redis'] },
  { listenPort: 9000, dialHost: 'minio.s.svc.cluster.local', names: ['minio.s.svc.cluster.local'] },
];

let root = '';
const children: ChildProcess[] = [];

beforeAll(async () => {
  root = await mkdtemp('/tmp/bh-delivery-test-');
});
afterEach(() => {
  for (const child of children.splice(0)) child.kill('SIGKILL');
});
afterAll(async () => {
  await rm(root, { recursive: true, force: true });
});

let count = 0;
async function socketDir(): Promise<string> {
  count += 1;
  const dir = join(root, `bh-${count}`);
  await mkdir(dir, { mode: 0o700 });
  return dir;
}

function deliver(dir: string): Promise<{ code: number; stdout: string; stderr: string }> {
  const script = renderDeliverRelay({ socketDir: dir, uid: 'pod-1', forwards: FORWARDS, relay: relaySource() });
  return new Promise((resolve) => {
    const child = execFile('/bin/sh', ['-s'], { timeout: 30_000 }, (err, stdout, stderr) =>
      resolve({ code: typeof err?.code === 'number' ? err.code : 0, stdout, stderr }),
    );
    child.stdin?.end(script);
  });
}

/** The boot as the prelude starts it: stdout to relay.ready, the ready line also on descriptor 3. */
async function startBoot(dir: string, ports: [number, number]): Promise<ChildProcess> {
  const a = `127.77.${count % 250}.1`;
  const b = `127.77.${count % 250}.2`;
  // From the socket dir, as the prelude runs it: the delivery signals only a boot of this dir.
  await copyFile(BOOT, join(dir, 'relay-boot.py'));
  const child = spawn(
    'python3',
    [
      join(dir, 'relay-boot.py'),
      'serve',
      '--uid=pod-1',
      `--socket-dir=${dir}`,
      `--forward=${ports[0]} 1:${ports[1]}`,
      `--bind=${a}`,
      `--bind=${b}`,
    ],
    { stdio: ['ignore', openSync(join(dir, 'relay.ready'), 'w'), 'pipe', 'pipe'] },
  );
  children.push(child);
  let out = '';
  child.stderr?.on('data', (c: Buffer) => {
    out += c.toString();
  });
  const deadline = Date.now() + 10_000;
  while (!(await stat(join(dir, 'relay.want')).catch(() => undefined))) {
    if (Date.now() > deadline) throw new Error(`the boot did not want the relay; stderr ${out}`);
    await new Promise((r) => setTimeout(r, 25));
  }
  return child;
}

describe('delivering the relay into a job', () => {
  it("writes the names on the boot's addresses, in place, and the relay, which the boot becomes", async () => {
    const dir = await socketDir();
    await writeFile(join(dir, 'hosts'), '127.0.0.1 localhost\n');
    const hostsInode = (await stat(join(dir, 'hosts'))).ino;
    const boot = await startBoot(dir, [await freePort(), await freePort()]);
    const ran = await deliver(dir);
    expect(ran, ran.stderr).toMatchObject({ code: 0 });
    expect(parseDelivery(ran.stdout)?.outcome, ran.stdout).toBe('delivered');
    const [a, b] = [`127.77.${count % 250}.1`, `127.77.${count % 250}.2`];
    const hosts = await readFile(join(dir, 'hosts'), 'utf8');
    expect(hosts).toContain(`${a} redis.user.svc.cluster.local redis\n`);
    expect(hosts).toContain(`${b} minio.s.svc.cluster.local\n`);
    expect(hosts).toContain('# backhaul: Services forwarded to pod pod-1');
    expect(hosts).toContain('localhost');
    // In place: a container that bound the file at its start sees the names.
    expect((await stat(join(dir, 'hosts'))).ino).toBe(hostsInode);
    const ready = await readFile(join(dir, 'relay.ready'), 'utf8');
    expect(ready).toMatch(/^ready 127\.77\.\d+\.1 127\.77\.\d+\.2\nisolation relay=user /);
    const pids = (await readFile(join(dir, 'relay.pids'), 'utf8')).trim().split(' ');
    expect(pids[0]).toBe(String(boot.pid));

    // A later session of the same job (a carrier lost and opened again): nothing to hand off again.
    const relayMtime = (await stat(join(dir, 'relay.py'))).mtimeMs;
    const again = await deliver(dir);
    expect(parseDelivery(again.stdout)?.outcome, again.stdout).toBe('delivered');
    expect((await stat(join(dir, 'relay.py'))).mtimeMs).toBe(relayMtime);
  });

  it('wakes the boot at once (it looks by itself only every 5 s); the relay it became ignores the signal', async () => {
    const dir = await socketDir();
    const boot = await startBoot(dir, [await freePort(), await freePort()]);
    // The boot is in its first 5-second wait now: without the signal it would exec the relay after it.
    const started = Date.now();
    const ran = await deliver(dir);
    const took = Date.now() - started;
    expect(parseDelivery(ran.stdout)?.outcome, ran.stdout + ran.stderr).toBe('delivered');
    expect(took, `the delivery took ${took} ms`).toBeLessThan(2_500);
    // A second session's delivery finds the relay running and sends nothing; a stray SIGUSR1 (the
    // signal of a delivery that raced with the exec) must not end it.
    process.kill(boot.pid as number, 'SIGUSR1');
    await new Promise((r) => setTimeout(r, 300));
    expect(boot.exitCode, 'the relay ended on SIGUSR1').toBeNull();
    expect(boot.signalCode).toBeNull();
  });

  it('signals only a boot of this socket dir: a pid in relay.pids that is now another process is left alone', async () => {
    const dir = await socketDir();
    // What a boot that died leaves, its pid since taken by another program of the user (here: sleep,
    // which SIGUSR1 would end).
    const other = spawn('sleep', ['30'], { stdio: 'ignore' });
    children.push(other);
    await writeFile(join(dir, 'relay-boot.py'), '');
    await writeFile(join(dir, 'relay.ready'), 'ready 127.77.0.9 127.77.0.10\n');
    await writeFile(join(dir, 'relay.pids'), `${other.pid}\n`);
    await writeFile(join(dir, 'relay.want'), 'handoff 1\n');
    const ran = deliver(dir);
    const deadline = Date.now() + 10_000;
    while (!(await stat(join(dir, 'relay.py')).catch(() => undefined)) && Date.now() < deadline) {
      await new Promise((r) => setTimeout(r, 25));
    }
    await new Promise((r) => setTimeout(r, 300));
    await appendFile(join(dir, 'relay.ready'), 'isolation relay=user sockets=user via=none\n');
    expect(parseDelivery((await ran).stdout)?.outcome).toBe('delivered');
    expect(other.exitCode, 'sleep ended').toBeNull();
    expect(other.signalCode, 'sleep was signalled').toBeNull();
  });

  it('leaves a prelude of before the boot alone: it carries its own relay and hosts file', async () => {
    const dir = await socketDir();
    await writeFile(join(dir, 'relay.py'), '# an embedded relay\n');
    await writeFile(join(dir, 'hosts'), 'its own\n');
    const ran = await deliver(dir);
    expect(parseDelivery(ran.stdout)?.outcome, ran.stdout + ran.stderr).toBe('embedded');
    expect(await readFile(join(dir, 'relay.py'), 'utf8')).toBe('# an embedded relay\n');
    expect(await readFile(join(dir, 'hosts'), 'utf8')).toBe('its own\n');
  });

  it('names a hand-off it does not speak (a prelude newer than the fleet) and writes nothing', async () => {
    const dir = await socketDir();
    await writeFile(join(dir, 'relay-boot.py'), '');
    await writeFile(join(dir, 'relay.ready'), 'ready 127.77.0.9\n');
    await writeFile(join(dir, 'relay.want'), 'handoff 9\n');
    const ran = await deliver(dir);
    expect(parseDelivery(ran.stdout)).toEqual({ outcome: 'unsupported', detail: 'handoff 9' });
    expect(await stat(join(dir, 'relay.py')).catch(() => 'none')).toBe('none');
  });

  it("stops waiting as soon as the job's boot is gone (scancel), and when the dir is", async () => {
    const dir = await socketDir();
    const boot = await startBoot(dir, [await freePort(), await freePort()]);
    boot.kill('SIGKILL');
    await new Promise((r) => boot.once('exit', r));
    const started = Date.now();
    const ran = await deliver(dir);
    expect(parseDelivery(ran.stdout)?.outcome, ran.stdout).toBe('gone');
    expect(Date.now() - started).toBeLessThan(3_000);
    const missing = await deliver(join(root, 'never-made'));
    expect(missing.code).toBe(10);
  });
});
