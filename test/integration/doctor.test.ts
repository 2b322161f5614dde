import { execFile } from 'node:child_process';
import { once } from 'node:events';
import { chmod, copyFile, mkdtemp, readdir, rm, writeFile } from 'node:fs/promises';
import { createServer, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { stringify as toYaml } from 'yaml';
import { fingerprint } from '../../src/ssh/known-hosts.js';
import { type LoopbackSite, startLoopbackSite } from '../../tools/sandbox/loopback-site.js';
import { freePort, generateClientKey, knownHostsText } from '../../tools/sandbox/sshd.js';

/**
 * `backhaul doctor` against the loopback site (real sshds, real Slurm), run as the built command a
 * site admin runs (`npm run build` first, as for cli-render.test.ts).
 */

const BIN = new URL('../../bin/backhaul.js', import.meta.url).pathname;
const CHECKS = [
  'config',
  'crypto',
  'key',
  'known_hosts',
  'login',
  'slurm',
  'node',
  'forwarding',
  'python',
  'socket_root',
  'isolation',
];

interface Row {
  check: string;
  status: 'PASS' | 'FAIL' | 'SKIP';
  detail: string;
  fix: string | null;
}

interface Run {
  code: number;
  stdout: string;
  stderr: string;
}

function backhaul(args: string[]): Promise<Run> {
  return new Promise((resolve) => {
    execFile(
      'node',
      [BIN, ...args],
      { env: { ...process.env, BACKHAUL_CONFIG: '', NO_COLOR: '' }, timeout: 120_000 },
      (err, stdout, stderr) => {
        const code = err ? (typeof err.code === 'number' ? err.code : 1) : 0;
        resolve({ code, stdout, stderr });
      },
    );
  });
}

/** What a run printed, for the message of a failed assertion. */
function said(run: Run): string {
  return `exit ${run.code}\n--- stdout\n${run.stdout}\n--- stderr\n${run.stderr}`;
}

async function doctorJson(
  config: string,
  extra: string[] = [],
): Promise<{ run: Run; rows: Row[]; by: Map<string, Row> }> {
  const run = await backhaul(['doctor', '--config', config, '--json', ...extra]);
  let rows: Row[];
  try {
    rows = JSON.parse(run.stdout) as Row[];
  } catch {
    throw new Error(`doctor printed no JSON (exit ${run.code}): ${run.stdout}\n${run.stderr}`);
  }
  return { run, rows, by: new Map(rows.map((r) => [r.check, r])) };
}

/** The scratch dirs doctor makes on the node (the node is this machine: SocketRoot /tmp). */
/** Doctor's scratch dirs in /tmp and in the per-user roots under it (the default SocketRoot /tmp/backhaul-%u). */
async function scratchDirs(): Promise<Set<string>> {
  const names = await readdir('/tmp');
  const roots = names.filter((n) => n.startsWith('backhaul-')).map((n) => `/tmp/${n}`);
  const inRoots = await Promise.all(
    roots.map(async (root) => (await readdir(root).catch(() => [])).map((n) => `${root}/${n}`)),
  );
  return new Set([...names.map((n) => `/tmp/${n}`), ...inRoots.flat()].filter((p) => p.includes('/bh-doctor.')));
}

function keyFingerprint(pub: string): string {
  return fingerprint(Buffer.from(pub.trim().split(/\s+/)[1] ?? '', 'base64'));
}

let allowing: LoopbackSite;
let refusing: LoopbackSite;
let dir: string;

beforeAll(async () => {
  [allowing, refusing] = await Promise.all([
    startLoopbackSite({ nodeForwarding: 'allowed' }),
    startLoopbackSite({ nodeForwarding: 'refused' }),
  ]);
  dir = await mkdtemp(join(tmpdir(), 'bh-doctor-test-'));
});

afterAll(async () => {
  await Promise.all([allowing?.stop(), refusing?.stop()]);
  if (dir) await rm(dir, { recursive: true, force: true });
});

let configs = 0;
/** A site configuration file: the site's own, with SSH keys and Reverse keys replaced. */
async function siteConfig(
  site: LoopbackSite,
  ssh: Record<string, unknown> = {},
  reverse: Record<string, unknown> = {},
): Promise<string> {
  const base = site.siteConfig.Network.SSH;
  const data = { Network: { SSH: { ...base, ...ssh, Reverse: { ...base.Reverse, ...reverse } } } };
  configs += 1;
  const path = join(dir, `site-${configs}.yaml`);
  await writeFile(path, toYaml(data));
  return path;
}

describe('backhaul doctor', () => {
  it('passes every check on the allowing site (mode node) and exits 0', async () => {
    const before = await scratchDirs();
    const { run, rows } = await doctorJson(allowing.siteConfigPath);
    expect(rows.map((r) => r.check)).toEqual(CHECKS);
    for (const row of rows) expect(row, `${row.check}: ${row.detail}`).toMatchObject({ status: 'PASS', fix: null });
    expect(run.code, said(run)).toBe(0);
    expect(rows.find((r) => r.check === 'slurm')?.detail).toContain('partitions: debug');
    expect(rows.find((r) => r.check === 'node')?.detail).toContain('bhnode1');
    expect(rows.find((r) => r.check === 'forwarding')?.detail).toMatch(
      /granted a stream-local forward of \/tmp\/backhaul-[a-z]+\/bh-doctor\./,
    );
    expect(rows.find((r) => r.check === 'python')?.detail).toMatch(/Python 3\.\d+/);
    expect(await scratchDirs()).toEqual(before);
  });

  it('prints an aligned table without colour when stdout is not a terminal', async () => {
    const run = await backhaul(['doctor', '--config', allowing.siteConfigPath]);
    expect(run.code, said(run)).toBe(0);
    expect(run.stdout).not.toContain('\x1b[');
    const lines = run.stdout.split('\n');
    expect(lines[0]).toMatch(/^CHECK {8}STATUS {2}DETAIL$/);
    for (const [i, check] of CHECKS.entries()) {
      expect(lines[i + 1]).toMatch(new RegExp(`^${check.padEnd(11)}  PASS    \\S`));
    }
    expect(run.stdout).toContain('11 passed, 0 failed, 0 skipped');
    // What separates two pods of the site user on this site (linuxproc, no job_container, node carrier).
    expect(run.stdout).toMatch(
      /^isolation {4}PASS {4}relay per job \(the job's processes, by the descendants of its shell and its steps \(proctrack\/linuxproc\)\); sockets per user \(carrier node: the node's sshd binds them outside the job\)/m,
    );
  });

  it('fails the forwarding check on the refusing site with the server reason and the fix, leaving no scratch dir', async () => {
    const before = await scratchDirs();
    const { run, by } = await doctorJson(refusing.siteConfigPath);
    expect(run.code, said(run)).toBe(1);
    const forwarding = by.get('forwarding');
    expect(forwarding?.status).toBe('FAIL');
    expect(forwarding?.detail).toContain('Server has disabled streamlocal forwarding');
    expect(forwarding?.fix).toContain('AllowStreamLocalForwarding remote and AllowTcpForwarding remote');
    expect(forwarding?.fix).toContain('Sshd: userspace');
    // The other checks do not depend on forwarding.
    for (const check of ['login', 'slurm', 'node', 'python', 'socket_root']) expect(by.get(check)?.status).toBe('PASS');
    expect(await scratchDirs()).toEqual(before);

    const table = await backhaul(['doctor', '--config', refusing.siteConfigPath]);
    expect(table.code, said(table)).toBe(1);
    expect(table.stdout).toMatch(/^forwarding {3}FAIL {4}the sshd on bhnode1:\d+ refused/m);
    expect(table.stdout).toMatch(/^ {21}fix: set AllowStreamLocalForwarding remote/m);
    expect(table.stderr).toContain('1 of 11 checks failed');
    expect(await scratchDirs()).toEqual(before);
  });

  it('passes the user-space sshd checks where the node sshd refuses forwarding (Sshd: userspace)', async () => {
    const before = await scratchDirs();
    const config = await siteConfig(refusing, {}, { Sshd: 'userspace' });
    const { run, rows, by } = await doctorJson(config);
    for (const row of rows) expect(row, `${row.check}: ${row.detail}`).toMatchObject({ status: 'PASS' });
    expect(run.code, said(run)).toBe(0);
    expect(by.get('config')?.detail).toContain('carrier userspace');
    expect(by.get('forwarding')?.detail).toMatch(
      /user-space sshd \/usr\/sbin\/sshd on bhnode1: bootstrapped in .*sshd -t accepted/,
    );
    expect(await scratchDirs()).toEqual(before);
  });

  it('reports a login host key mismatch with the presented fingerprint and skips what depends on the login', async () => {
    // The login's name with another real key (the node's).
    const knownHosts = join(dir, 'known_hosts.wrong');
    await writeFile(
      knownHosts,
      knownHostsText([
        { host: '127.0.0.1', port: allowing.loginPort, key: allowing.node.hostKeyPub },
        { host: 'bhnode1', port: allowing.nodePort, key: allowing.node.hostKeyPub },
      ]),
    );
    const config = await siteConfig(allowing, { KnownHostsFile: knownHosts });
    const { run, by } = await doctorJson(config);
    expect(run.code, said(run)).toBe(1);
    expect(by.get('known_hosts')?.status).toBe('PASS');
    const login = by.get('login');
    expect(login?.status).toBe('FAIL');
    expect(login?.detail).toContain(`host key mismatch for [127.0.0.1]:${allowing.loginPort}`);
    expect(login?.detail).toContain(keyFingerprint(allowing.login.hostKeyPub));
    expect(login?.fix).toContain('ssh-keygen -R');
    for (const check of ['slurm', 'node', 'forwarding', 'python', 'socket_root', 'isolation']) {
      expect(by.get(check), check).toMatchObject({ status: 'SKIP', fix: null });
      expect(by.get(check)?.detail).toContain('login check failed');
    }
  });

  it('reports an unreachable login port', async () => {
    const port = await freePort();
    const config = await siteConfig(allowing, { Port: port });
    const { run, by } = await doctorJson(config, ['--timeout', '10s']);
    expect(run.code, said(run)).toBe(1);
    expect(by.get('known_hosts')).toMatchObject({ status: 'FAIL' });
    expect(by.get('known_hosts')?.fix).toContain(`ssh-keyscan -p ${port} 127.0.0.1 >> `);
    const login = by.get('login');
    expect(login?.status).toBe('FAIL');
    expect(login?.detail).toMatch(/^unreachable: 127\.0\.0\.1:\d+: .*ECONNREFUSED/);
    expect(login?.fix).toContain('Network.SSH.Port');
    expect(by.get('slurm')?.status).toBe('SKIP');
  });

  it('reports a login port that accepts but never speaks SSH as unreachable, within the time limit', async () => {
    const sockets: Socket[] = [];
    const silent = createServer((socket) => sockets.push(socket));
    silent.listen(0, '127.0.0.1');
    await once(silent, 'listening');
    const { port } = silent.address() as { port: number };
    try {
      const config = await siteConfig(allowing, { Port: port });
      const started = Date.now();
      const { run, by } = await doctorJson(config, ['--timeout', '3']);
      expect(Date.now() - started).toBeLessThan(15_000);
      expect(run.code, said(run)).toBe(1);
      expect(by.get('login')?.status).toBe('FAIL');
      expect(by.get('login')?.detail).toMatch(/^unreachable: 127\.0\.0\.1:\d+: .*handshake/i);
    } finally {
      for (const s of sockets) s.destroy();
      silent.close();
    }
  });

  it('reports a key the login node does not accept as auth refused', async () => {
    const stranger = await generateClientKey({ comment: 'bh-doctor-stranger' });
    try {
      const config = await siteConfig(allowing, { KeyFile: stranger.privateKeyPath });
      const { run, by } = await doctorJson(config);
      expect(run.code, said(run)).toBe(1);
      expect(by.get('key')?.status).toBe('PASS');
      const login = by.get('login');
      expect(login?.status).toBe('FAIL');
      expect(login?.detail).toMatch(/^auth refused: .* for user bhjob/);
      expect(login?.fix).toContain('authorized_keys on the login node');
    } finally {
      await stranger.remove();
    }
  });

  it('reports a compute node missing from known_hosts, with a [node]:port or wildcard fix', async () => {
    const knownHosts = join(dir, 'known_hosts.login-only');
    await writeFile(
      knownHosts,
      knownHostsText([{ host: '127.0.0.1', port: allowing.loginPort, key: allowing.login.hostKeyPub }]),
    );
    const config = await siteConfig(allowing, { KnownHostsFile: knownHosts });
    const { run, by } = await doctorJson(config);
    expect(run.code, said(run)).toBe(1);
    expect(by.get('login')?.status).toBe('PASS');
    const node = by.get('node');
    expect(node?.status).toBe('FAIL');
    expect(node?.detail).toContain(`unknown host: no known_hosts entry for [bhnode1]:${allowing.nodePort}`);
    expect(node?.detail).toContain(keyFingerprint(allowing.node.hostKeyPub));
    expect(node?.fix).toContain(`[bhnode*]:${allowing.nodePort}`);
    for (const check of ['forwarding', 'python', 'socket_root']) expect(by.get(check)?.status).toBe('SKIP');
  });

  it('fails a key readable by others with chmod 600, and still logs in with it', async () => {
    const key = join(dir, 'id_open');
    await copyFile(allowing.keyFile, key);
    await chmod(key, 0o644);
    const config = await siteConfig(allowing, { KeyFile: key });
    const { run, by } = await doctorJson(config);
    expect(run.code, said(run)).toBe(1);
    expect(by.get('key')).toMatchObject({ status: 'FAIL', fix: `chmod 600 ${key}` });
    expect(by.get('key')?.detail).toContain('mode 0644');
    expect(by.get('login')?.status).toBe('PASS');
  });

  it('skips the ssh-to-node checks in srun mode, saying why', async () => {
    const config = await siteConfig(allowing, {}, { Sshd: 'userspace', NodeExec: 'srun' });
    const { run, by } = await doctorJson(config);
    expect(run.code, said(run)).toBe(0);
    expect(by.get('slurm')?.status).toBe('PASS');
    for (const check of ['node', 'forwarding', 'python', 'socket_root']) {
      expect(by.get(check), check).toMatchObject({ status: 'SKIP' });
      expect(by.get(check)?.detail).toContain('srun mode does not ssh to nodes');
    }
    expect(by.get('isolation')?.detail).toContain(
      'sockets per user (JobContainerType is job_container/none, not job_container/tmpfs)',
    );
  });

  it('exits 2 naming the key of a bad configuration', async () => {
    const config = await siteConfig(allowing, {}, { Sshd: 'bogus' });
    const run = await backhaul(['doctor', '--config', config]);
    expect(run.code, said(run)).toBe(2);
    expect(run.stdout).toBe('');
    expect(run.stderr).toContain(`${config}: Network.SSH.Reverse.Sshd`);
    const usage = await backhaul(['doctor', '--config', config, '--node', 'not a host']);
    expect(usage.code, said(usage)).toBe(2);
    expect(usage.stderr).toContain('--node');
  });
});
