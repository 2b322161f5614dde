import { type ChildProcess, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { once } from 'node:events';
import * as fs from 'node:fs';
import * as fsp from 'node:fs/promises';
import * as net from 'node:net';
import * as path from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { parseSiteConfigYaml } from '../../src/contract/site-config.js';
import { type LoopbackSite, startLoopbackSite } from '../../tools/sandbox/loopback-site.js';
import {
  cancelSubmittedJobs,
  ensureSlurm,
  jobState,
  runSlurmUp,
  SLURM_NODE,
  SLURM_PRIVATE_NODE,
  SLURM_PRIVATE_PARTITION,
  sbatch,
  scancel,
  srunInJob,
  stepsOf,
  waitForState,
} from '../../tools/sandbox/slurm.js';
import { isAlive, knownHostsText, startSshd } from '../../tools/sandbox/sshd.js';
import {
  ensureUser,
  JOB_USER,
  OTHER_USER,
  type RunResult,
  runAs,
  spawnAs,
  type TestUser,
} from '../../tools/sandbox/users.js';

/**
 * The loopback test site itself (test/fixtures/{slurm,sshd,loopback-site}.ts): real Slurm, real
 * OpenSSH sshds as root on loopback ports, real ssh clients.
 */

const SLEEPER = '#!/bin/sh\nsleep 600\n';

function run(command: string, args: readonly string[], timeoutMs = 20_000): Promise<RunResult> {
  return new Promise((resolve, reject) => {
    const child = spawn(command, args, { stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.setEncoding('utf8').on('data', (d: string) => {
      stdout += d;
    });
    child.stderr.setEncoding('utf8').on('data', (d: string) => {
      stderr += d;
    });
    const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs);
    child.on('error', reject);
    child.on('close', (code, signal) => {
      clearTimeout(timer);
      resolve({ code, signal, stdout, stderr });
    });
  });
}

async function until<T>(
  what: string,
  probe: () => Promise<T | undefined> | T | undefined,
  timeoutMs = 10_000,
): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await probe();
    if (value !== undefined) return value;
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

/** Pids of USER's processes (pgrep -u) whose environment says they belong to Slurm job JOBID. */
async function jobProcesses(user: TestUser, jobId: string): Promise<number[]> {
  const { stdout } = await run('pgrep', ['-u', user.name]);
  const pids = stdout
    .split('\n')
    .filter((s) => s !== '')
    .map(Number);
  return pids.filter((pid) => {
    try {
      return fs.readFileSync(`/proc/${pid}/environ`, 'latin1').split('\0').includes(`SLURM_JOB_ID=${jobId}`);
    } catch {
      return false; // gone meanwhile
    }
  });
}

async function echoServer(): Promise<{ port: number; close(): Promise<void> }> {
  const sockets = new Set<net.Socket>();
  const server = net.createServer({ allowHalfOpen: true }, (socket) => {
    sockets.add(socket);
    socket.on('close', () => sockets.delete(socket));
    socket.on('error', () => socket.destroy());
    socket.pipe(socket);
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const address = server.address() as net.AddressInfo;
  return {
    port: address.port,
    close: async () => {
      for (const s of sockets) s.destroy();
      server.close();
      await once(server, 'close');
    },
  };
}

/** A socket directory in /tmp owned by the job user, 0700 (what the prelude makes). */
async function socketDir(user: TestUser): Promise<string> {
  const dir = await fsp.mkdtemp(path.join('/tmp', 'bh-lb-'));
  await fsp.chown(dir, user.uid, user.gid);
  await fsp.chmod(dir, 0o700);
  return dir;
}

function killChild(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve();
  const exited = once(child, 'exit').then(() => undefined);
  child.kill('SIGTERM');
  return exited;
}

describe('loopback site: Slurm', () => {
  let jobUser: TestUser;

  beforeAll(async () => {
    [jobUser] = await Promise.all([ensureUser(JOB_USER), ensureSlurm()]);
  });

  afterAll(async () => {
    await cancelSubmittedJobs();
  });

  test('a job of bhjob runs on bhnode1, takes srun steps, and scancel leaves no process or step behind', async () => {
    const jobId = await sbatch(jobUser, SLEEPER, { jobName: 'bh-lb-single' });
    const running = await waitForState(jobId, ['RUNNING'], 20_000);
    expect(running.batchHost).toBe(SLURM_NODE);
    const squeueB = await run('squeue', ['-h', '-j', jobId, '-o', '%B']);
    expect(squeueB.stdout.trim()).toBe('bhnode1');

    const hi = await srunInJob(jobUser, jobId, ['echo', 'hi']);
    expect(hi.stderr).toBe('');
    expect(hi.code).toBe(0);
    expect(hi.stdout).toBe('hi\n');

    // Another user may not step into bhjob's job.
    const other = await ensureUser(OTHER_USER);
    const denied = await srunInJob(other, jobId, ['echo', 'hi']);
    expect(denied.code).not.toBe(0);
    expect(denied.stdout).toBe('');

    // A long step, so that scancel has a step and a step's processes to end.
    const step = spawnAs(
      jobUser,
      'srun',
      [`--jobid=${jobId}`, '--overlap', '-u', '-N1', '-n1', '-w', SLURM_NODE, 'sleep', '600'],
      {
        cwd: jobUser.home,
        stdio: 'ignore',
      },
    );
    const stepExit = once(step, 'exit');
    await until('the sleep step', async () =>
      (await stepsOf(jobId)).some((s) => /^\d+\.\d+$/.test(s)) ? true : undefined,
    );
    expect(await stepsOf(jobId)).toContain(`${jobId}.batch`);
    // The batch script, its sleep and the step's sleep are bhjob's processes, tagged with the job id.
    const before = await until('the job processes', async () => {
      const pids = await jobProcesses(jobUser, jobId);
      return pids.length >= 3 ? pids : undefined;
    });

    await scancel(jobId);
    const cancelled = await waitForState(jobId, ['CANCELLED'], 10_000);
    expect(cancelled.state).toBe('CANCELLED');
    await until(
      'the job processes to end',
      async () => ((await jobProcesses(jobUser, jobId)).length === 0 ? true : undefined),
      10_000,
    );
    expect(before.filter(isAlive)).toEqual([]);
    expect(await stepsOf(jobId)).toEqual([]);
    await stepExit; // the client srun ends with its step
    expect(step.exitCode === null ? step.signalCode : step.exitCode).not.toBe(0);
  });

  test('20 jobs of bhjob run at once', async () => {
    const ids = await Promise.all(
      Array.from({ length: 20 }, (_, i) => sbatch(jobUser, SLEEPER, { jobName: `bh-lb-many-${i}` })),
    );
    expect(new Set(ids).size).toBe(20);
    await Promise.all(ids.map((id) => waitForState(id, ['RUNNING'], 30_000)));
    // All at the same moment, not one after the other.
    const { stdout } = await run('squeue', ['-h', '-t', 'RUNNING', '-j', ids.join(','), '-o', '%i %B']);
    const lines = stdout.trim().split('\n');
    expect(lines).toHaveLength(20);
    for (const line of lines) expect(line.split(' ')[1]).toBe(SLURM_NODE);

    await scancel(ids);
    for (const id of ids) expect((await waitForState(id, ['CANCELLED'], 10_000)).state).toBe('CANCELLED');
  });

  test('a job on the jobtmp node has a /tmp of its own: its steps share it, another job of the user and the user outside see none of it', async () => {
    const marker = `bh-lb-private-${randomBytes(4).toString('hex')}`;
    const script = `#!/bin/sh\necho mine > /tmp/${marker}\nsleep 600\n`;
    const args = ['-p', SLURM_PRIVATE_PARTITION];
    const [a, b] = await Promise.all([
      sbatch(jobUser, script, { jobName: 'bh-lb-private-a', args }),
      sbatch(jobUser, SLEEPER, { jobName: 'bh-lb-private-b', args }),
    ]);
    expect((await waitForState(a, ['RUNNING'])).batchHost).toBe(SLURM_PRIVATE_NODE);
    await waitForState(b, ['RUNNING']);
    const read = ['cat', `/tmp/${marker}`];
    const own = await until('the batch step to write its file', async () => {
      const r = await srunInJob(jobUser, a, read, { node: SLURM_PRIVATE_NODE });
      return r.code === 0 ? r : undefined;
    });
    expect(own.stdout).toBe('mine\n');
    const other = await srunInJob(jobUser, b, read, { node: SLURM_PRIVATE_NODE });
    expect(other.code, `${other.stdout}${other.stderr}`).not.toBe(0);
    expect(other.stderr).toContain('No such file or directory');
    const outside = await runAs(jobUser, 'cat', [`/tmp/${marker}`], { cwd: jobUser.home });
    expect(outside.code, `${outside.stdout}${outside.stderr}`).not.toBe(0);
    await scancel([a, b]);
  });

  test('slurm-up.sh run again is fast and harmless', async () => {
    const jobId = await sbatch(jobUser, SLEEPER, { jobName: 'bh-lb-rerun' });
    await waitForState(jobId, ['RUNNING']);
    const pidBefore = fs.readFileSync('/run/slurmctld.pid', 'utf8').trim();
    const timings: number[] = [];
    for (let i = 0; i < 2; i++) {
      const t0 = performance.now();
      const out = await runSlurmUp();
      timings.push(performance.now() - t0);
      expect(out).toContain('already up');
    }
    console.log(`slurm-up.sh when up: ${timings.map((t) => `${t.toFixed(0)} ms`).join(', ')}`);
    expect(Math.min(...timings)).toBeLessThan(1500);
    expect(fs.readFileSync('/run/slurmctld.pid', 'utf8').trim()).toBe(pidBefore);
    expect(await jobState(jobId)).toEqual({ state: 'RUNNING', batchHost: SLURM_NODE });
    const hosts = fs.readFileSync('/etc/hosts', 'utf8').split('\n');
    expect(hosts.filter((l) => /^127\.0\.0\.1\s.*\bbhnode1\b/.test(l))).toHaveLength(1);
    expect(hosts.filter((l) => /^127\.0\.0\.1\s.*\bbhnode2\b/.test(l))).toHaveLength(1);
    await scancel(jobId);
    await waitForState(jobId, ['CANCELLED']);
  });
});

describe('loopback site: sshd, node forwarding allowed', () => {
  let site: LoopbackSite;

  beforeAll(async () => {
    site = await startLoopbackSite({ nodeForwarding: 'allowed' });
  });

  afterAll(async () => {
    await site?.stop();
  });

  test('the site configuration parses with the project schema', () => {
    const cfg = parseSiteConfigYaml(site.siteConfigYaml);
    expect(cfg.Network.SSH.LoginHost).toBe('127.0.0.1');
    expect(cfg.Network.SSH.Port).toBe(site.loginPort);
    expect(cfg.Network.SSH.User).toBe('bhjob');
    expect(cfg.Network.SSH.KeyFile).toBe(site.keyFile);
    expect(cfg.Network.SSH.KnownHostsFile).toBe(site.knownHostsPath);
    expect(cfg.Network.SSH.Reverse.Enabled).toBe(true);
    expect(cfg.Network.SSH.Reverse.NodeSshPort).toBe(site.nodePort);
    expect(fs.readFileSync(site.siteConfigPath, 'utf8')).toBe(site.siteConfigYaml);
  });

  test('ssh -J through the login sshd reaches the node sshd as bhjob', async () => {
    const r = await run('ssh', [
      '-F',
      site.sshConfigPath,
      '-J',
      site.jumpSpec,
      '-i',
      site.keyFile,
      '-o',
      'StrictHostKeyChecking=yes',
      '-o',
      `UserKnownHostsFile=${site.knownHostsPath}`,
      '-o',
      'BatchMode=yes',
      '-p',
      String(site.nodePort),
      'bhjob@bhnode1',
      'id -un',
    ]);
    expect(r.stderr).toBe('');
    expect(r.code).toBe(0);
    expect(r.stdout).toBe('bhjob\n');
    expect(site.node.readLog()).toMatch(/Accepted publickey for bhjob from 127\.0\.0\.1/);
    expect(site.login.readLog()).toMatch(/Accepted publickey for bhjob from 127\.0\.0\.1/);
  });

  test('a wrong or missing known_hosts entry is refused', async () => {
    // The node's entry holds the login sshd's key instead of the node's.
    const wrong = path.join(site.dir, 'known_hosts.wrong');
    await fsp.writeFile(wrong, knownHostsText([{ host: 'bhnode1', port: site.nodePort, key: site.login.hostKeyPub }]));
    // The right key, but filed under the node's address instead of its name (CheckHostIP is off).
    // (An entry under the bare name `bhnode1` would be accepted: OpenSSH falls back to a key
    // "w/out port" for a non-standard port.)
    const missing = path.join(site.dir, 'known_hosts.missing');
    await fsp.writeFile(
      missing,
      knownHostsText([{ host: '127.0.0.1', port: site.nodePort, key: site.node.hostKeyPub }]),
    );
    for (const [file, reason] of [
      [wrong, /Host key for \[bhnode1\]:\d+ has changed and you have requested strict checking/],
      [missing, /No ED25519 host key is known for \[bhnode1\]:\d+ and you have requested strict checking/],
    ] as const) {
      const r = await run('ssh', [
        ...site.sshToNodeArgs(),
        '-o',
        `UserKnownHostsFile=${file}`,
        '-o',
        'StrictHostKeyChecking=yes',
        'id -un',
      ]);
      expect(r.code).toBe(255);
      expect(r.stdout).toBe('');
      expect(r.stderr).toMatch(reason);
      expect(r.stderr).toContain('Host key verification failed.');
    }
    // A login entry that does not match stops the jump itself.
    const badLogin = path.join(site.dir, 'ssh_config.badlogin');
    const badKnown = path.join(site.dir, 'known_hosts.badlogin');
    await fsp.writeFile(
      badKnown,
      knownHostsText([
        { host: '127.0.0.1', port: site.loginPort, key: site.node.hostKeyPub },
        { host: 'bhnode1', port: site.nodePort, key: site.node.hostKeyPub },
      ]),
    );
    await fsp.writeFile(badLogin, fs.readFileSync(site.sshConfigPath, 'utf8').replace(site.knownHostsPath, badKnown));
    const r = await run('ssh', [
      '-F',
      badLogin,
      '-J',
      site.jumpSpec,
      '-p',
      String(site.nodePort),
      'bhjob@bhnode1',
      'id -un',
    ]);
    expect(r.code).toBe(255);
    expect(r.stderr).toMatch(/Host key for \[127\.0\.0\.1\]:\d+ has changed/);
  });

  test('ssh -R of a unix socket on the node: bhjob-owned srw-------, data echoes through', async () => {
    const echo = await echoServer();
    const dir = await socketDir(site.user);
    const sock = path.join(dir, 'x.sock');
    const client = spawn(
      'ssh',
      [...site.sshToNodeArgs(), '-N', '-o', 'ExitOnForwardFailure=yes', '-R', `${sock}:127.0.0.1:${echo.port}`],
      { stdio: ['ignore', 'ignore', 'pipe'] },
    );
    let stderr = '';
    client.stderr?.setEncoding('utf8').on('data', (d: string) => {
      stderr += d;
    });
    try {
      const st = await until('the forwarded socket', () => {
        if (client.exitCode !== null) throw new Error(`ssh -R exited ${client.exitCode}: ${stderr}`);
        try {
          return fs.lstatSync(sock);
        } catch {
          return undefined;
        }
      });
      expect(st.isSocket()).toBe(true);
      expect(st.uid).toBe(site.user.uid);
      expect(st.mode & 0o777).toBe(0o600); // srw-------
      const ls = await run('ls', ['-l', sock]);
      expect(ls.stdout).toMatch(/^srw------- 1 bhjob bhjob /);

      // 256 KiB of random bytes there and back, half-closing our side.
      const payload = randomBytes(256 * 1024);
      const conn = net.connect({ path: sock, allowHalfOpen: true });
      const chunks: Buffer[] = [];
      conn.on('data', (c: Buffer) => chunks.push(c));
      await once(conn, 'connect');
      conn.end(payload);
      await once(conn, 'end');
      conn.destroy();
      expect(Buffer.concat(chunks).equals(payload)).toBe(true);

      // The socket's mode keeps other users out.
      const other = await ensureUser(OTHER_USER);
      const denied = await runAs(other, 'socat', ['-u', 'OPEN:/dev/null', `UNIX-CONNECT:${sock}`], { timeoutMs: 5000 });
      expect(denied.code).not.toBe(0);
      expect(denied.stderr).toMatch(/Permission denied/);
    } finally {
      await killChild(client);
      await echo.close();
      await fsp.rm(dir, { recursive: true, force: true }); // sshd never removes the socket file
    }
  });
});

describe('loopback site: sshd, node forwarding refused', () => {
  let site: LoopbackSite;

  beforeAll(async () => {
    site = await startLoopbackSite({ nodeForwarding: 'refused' });
  });

  afterAll(async () => {
    await site?.stop();
  });

  test('ssh -R of a unix socket fails and the client is told why', async () => {
    const dir = await socketDir(site.user);
    const sock = path.join(dir, 'x.sock');
    try {
      const r = await run('ssh', [
        '-v',
        ...site.sshToNodeArgs(),
        '-N',
        '-o',
        'ExitOnForwardFailure=yes',
        '-R',
        `${sock}:127.0.0.1:9`,
      ]);
      expect(r.code).toBe(255);
      expect(r.stderr).toContain(`Error: remote port forwarding failed for listen path ${sock}`);
      expect(r.stderr).toContain('Remote: Server has disabled streamlocal forwarding.');
      expect(fs.existsSync(sock)).toBe(false);
      // The plain session still works: only forwarding is refused.
      const id = await run('ssh', [...site.sshToNodeArgs(), 'id -un']);
      expect(id.stdout).toBe('bhjob\n');
    } finally {
      await fsp.rm(dir, { recursive: true, force: true });
    }
  });

  test('stream-local allowed but AllowTcpForwarding no: refused, and the sshd log says so', async () => {
    // A third sshd next to the site's node sshd, reached through the same login jump.
    const node = await startSshd({
      name: 'node-tcp-no',
      allowStreamLocal: true,
      allowTcpForwarding: 'no',
      authorizedKeys: [{ user: site.user.name, keys: [site.clientKey.publicKey] }],
    });
    const dir = await socketDir(site.user);
    const sock = path.join(dir, 'x.sock');
    try {
      const known = path.join(site.dir, 'known_hosts.tcp-no');
      await fsp.writeFile(known, knownHostsText([{ host: 'bhnode1', port: node.port, key: node.hostKeyPub }]));
      const r = await run('ssh', [
        '-v',
        '-F',
        site.sshConfigPath,
        '-J',
        site.jumpSpec,
        '-o',
        `UserKnownHostsFile=${known}`,
        '-p',
        String(node.port),
        '-N',
        '-o',
        'ExitOnForwardFailure=yes',
        '-R',
        `${sock}:127.0.0.1:9`,
        'bhjob@bhnode1',
      ]);
      expect(r.code).toBe(255);
      expect(r.stderr).toContain(`Error: remote port forwarding failed for listen path ${sock}`);
      expect(r.stderr).toContain('Remote: port forwarding refused');
      expect(node.readLog()).toContain(`to remote forward to path "${sock}", but the request was denied.`);
      expect(fs.existsSync(sock)).toBe(false);
    } finally {
      await node.stop();
      await fsp.rm(dir, { recursive: true, force: true });
    }
  });
});

describe('loopback site: stop', () => {
  test('stop() leaves no sshd process and no temp dir, even with a session open', async () => {
    const site = await startLoopbackSite({ nodeForwarding: 'allowed' });
    const session = spawn('ssh', [...site.sshToNodeArgs(), 'echo ready; exec sleep 600'], {
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '';
    session.stdout?.setEncoding('utf8').on('data', (d: string) => {
      out += d;
    });
    session.stderr?.resume();
    try {
      await until('the session', () => {
        if (session.exitCode !== null) throw new Error('ssh session ended early');
        return out.includes('ready') ? true : undefined;
      });
      const procs = [...site.login.processes(), ...site.node.processes()];
      // Both listeners and the connection processes (monitor, session, the user's sleep) are there.
      expect(procs).toContain(site.login.pid);
      expect(procs).toContain(site.node.pid);
      expect(procs.length).toBeGreaterThanOrEqual(5);
      const configs = [site.login.configPath, site.node.configPath];
      const dirs = [site.dir, site.login.dir, site.node.dir, site.clientKey.dir];
      for (const d of dirs) expect(fs.existsSync(d)).toBe(true);

      const t0 = performance.now();
      await site.stop();
      console.log(`site.stop() with a session open: ${(performance.now() - t0).toFixed(0)} ms`);
      expect(procs.filter(isAlive)).toEqual([]);
      for (const d of dirs) expect(fs.existsSync(d)).toBe(false);
      for (const cfg of configs) {
        const left = await run('pgrep', ['-f', cfg]);
        expect(left.stdout).toBe('');
      }
      await until('the ssh client to notice', () =>
        session.exitCode !== null || session.signalCode !== null ? true : undefined,
      );
      await site.stop(); // idempotent
    } finally {
      await killChild(session);
      await site.stop();
    }
  });
});
