import { spawn } from 'node:child_process';
import { chown, lstat, mkdir } from 'node:fs/promises';
import { describe, expect, it } from 'vitest';
import { DEFAULT_SOCKET_ROOT, socketRootOf } from '../../src/contract/site-config.js';
import { DEMO_USER } from '../../tools/demo/demo-options.js';
import { DEMO_MODES } from '../../tools/demo/stack.js';
import { ensureUser, OTHER_USER } from '../../tools/sandbox/users.js';

/** `npm run demo` as a person runs it (tools/demo/main.ts under tsx, outside the package): one run per carrier mode. */
const DEMO = new URL('../../tools/demo/main.ts', import.meta.url).pathname;
/** tsx by path: the run as another user starts in /tmp, where `--import tsx` would not resolve. */
const TSX = new URL('../../node_modules/tsx/dist/loader.mjs', import.meta.url).href;

interface Run {
  code: number | null;
  stdout: string;
  stderr: string;
  ms: number;
}

function run(args: string[], options: { uid?: number; gid?: number; timeoutMs?: number } = {}): Promise<Run> {
  const started = Date.now();
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, ['--import', TSX, DEMO, ...args], {
      stdio: ['ignore', 'pipe', 'pipe'],
      ...(options.uid === undefined ? {} : { uid: options.uid, gid: options.gid ?? options.uid, cwd: '/tmp' }),
    });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d: Buffer) => {
      stdout += d.toString();
    });
    child.stderr.on('data', (d: Buffer) => {
      stderr += d.toString();
    });
    // SIGINT, as a person would press Ctrl-C: the demo still cleans up.
    const timer = setTimeout(() => child.kill('SIGINT'), options.timeoutMs ?? 150_000);
    child.on('error', reject);
    child.on('close', (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr, ms: Date.now() - started });
    });
  });
}

describe('npm run demo', () => {
  it.each(DEMO_MODES)('--mode %s runs end to end, prints the service answer and exits 0', async (mode) => {
    // What an earlier demo leaves when its user's uid is another user's by now: the job user's socket
    // root, owned by someone else. The job would refuse it; the demo removes it, and its own at the end.
    const socketRoot = socketRootOf(DEFAULT_SOCKET_ROOT, DEMO_USER);
    const other = await ensureUser(OTHER_USER);
    await mkdir(socketRoot, { recursive: true, mode: 0o700 });
    await chown(socketRoot, other.uid, other.gid);
    const { code, stdout, stderr, ms } = await run(['--mode', mode]);
    expect(code, `${stdout}\n${stderr}`).toBe(0);
    expect(stdout).toContain(`removed ${socketRoot}, left by an earlier user ${DEMO_USER} (uid ${other.uid})`);
    expect(await lstat(socketRoot).catch(() => 'gone'), stdout).toBe('gone');
    expect(stdout).toContain(
      'GET http://minio.demo.svc.cluster.local:9000/ -> 200 Hello from minio.demo.svc.cluster.local:9000, a service inside the cluster',
    );
    expect(stdout).toMatch(/GET \/demo\/results\.bin -> 200, 8388608 bytes, identical to what it sent/);
    // Two Services on one port, each reached by its name and the unchanged port, at its own address.
    const reached = [
      ...stdout.matchAll(/workload: (pg-[ab])\.demo\.svc\.cluster\.local:5432 \((127[.\d]+)\) -> (.*)$/gm),
    ];
    expect(
      reached.map((m) => `${m[1]} -> ${m[3]}`),
      stdout,
    ).toEqual(['pg-a -> pg-a: SELECT current_database()', 'pg-b -> pg-b: SELECT current_database()']);
    expect(reached[0]?.[2]).not.toBe(reached[1]?.[2]);
    expect(stdout).toMatch(/FORWARDS_READY +establishingForwards → active/);
    expect(stdout).toMatch(/POD_DELETED +active → tearingDown/);
    expect(stdout).not.toContain('✗');
    expect(stdout).toContain(`Summary (mode ${mode})`);
    // For people: no JSON log lines on the terminal.
    expect(`${stdout}${stderr}`).not.toMatch(/"level":\d+/);
    // A demo run should take well under a minute; leave room for a busy 2-core machine.
    expect(ms).toBeLessThan(90_000);
    process.stdout.write(`backhaul demo --mode ${mode}: ${(ms / 1000).toFixed(1)} s\n`);
  }, 180_000);

  it('refuses to run without root, saying why, and exits 1', async () => {
    const other = await ensureUser(OTHER_USER);
    const { code, stdout, stderr } = await run(['--redis', 'redis://127.0.0.1:1'], {
      uid: other.uid,
      gid: other.gid,
      timeoutMs: 60_000,
    });
    expect(code).toBe(1);
    expect(stdout).toContain('✗ the demo failed in phase [1/9] Checking this machine');
    expect(stderr).toMatch(/backhaul: the demo failed in phase \[1\/9\] Checking this machine: .*needs root/);
  }, 90_000);
});
