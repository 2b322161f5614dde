import { randomBytes } from 'node:crypto';
import { chown, readFile, rm } from 'node:fs/promises';
import { createServer, type Server } from 'node:net';
import { join } from 'node:path';
import ssh2 from 'ssh2';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { bindAddress } from '../../src/contract/derivations.js';
import { FleetMetrics } from '../../src/metrics/fleet-metrics.js';
import { dataPlane } from '../../src/ssh/data-plane-meter.js';
import { openSiteAccess } from '../../src/ssh/site-access.js';
import {
  echoServer,
  type Harness,
  harness,
  jobScript,
  PYTHON,
  planFor,
  startSession,
  uid,
  waitFor,
  waitForForwards,
} from '../../tools/sandbox/shadow-harness.js';
import { cancelSubmittedJobs, sbatch, scancel, waitForState } from '../../tools/sandbox/slurm.js';
import { runAs } from '../../tools/sandbox/users.js';

/** A server that answers every connection with its own name: shows which endpoint a socket reached. */
async function nameServer(name: string): Promise<{ server: Server; port: number }> {
  const server = createServer((socket) => {
    socket.on('error', () => undefined);
    socket.end(`${name}\n`);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const address = server.address();
  if (!address || typeof address === 'string') throw new Error('no port');
  return { server, port: address.port };
}

const servers: Server[] = [];
const harnesses: Harness[] = [];

async function site(
  forwarding: 'allowed' | 'refused',
  reverse: Record<string, unknown> = {},
  backhaul: Record<string, unknown> = {},
): Promise<Harness> {
  const h = await harness(forwarding, reverse, {}, backhaul);
  harnesses.push(h);
  return h;
}

afterEach(async () => {
  await cancelSubmittedJobs();
});

afterAll(async () => {
  for (const s of servers) s.close();
  for (const h of harnesses) {
    h.access.pool.close();
    await h.site.stop();
    await rm(h.workdir, { recursive: true, force: true });
  }
});

describe('shadow session failures on the loopback site', () => {
  let allowed: Harness;
  let echo: { server: Server; port: number };

  beforeAll(async () => {
    allowed = await site('allowed', { AllowSocks: true });
    echo = await echoServer();
    servers.push(echo.server);
  });

  it('a node sshd that refuses forwarding fails the session with the server’s own reason, permanently', async () => {
    const h = await site('refused');
    const podUid = uid();
    const plan = planFor(h, podUid, `15100:127.0.0.1:${echo.port}`);
    await sbatch(h.site.user, jobScript(h, plan, 'sleep 600\n'), { jobName: podUid });
    const { phases, ended } = startSession(h, plan);
    const end = await ended;
    expect(end).toMatchObject({ type: 'SESSION_FAILED', error: { kind: 'forwarding-refused', permanent: true } });
    if (end.type !== 'SESSION_FAILED') throw new Error('unreachable');
    expect(end.error.message).toContain(plan.forwards[0]?.socketPath);
    expect(end.error.message).toContain('Server has disabled streamlocal forwarding');
    expect(phases.map((p) => p.type)).toEqual(['SHADOW_UP', 'BATCH_HOST', 'CARRIER_OPEN', 'SESSION_FAILED']);
  }, 90_000);

  it('the user-space sshd carrier works where the node sshd refuses forwarding', async () => {
    const h = await site('refused', { Sshd: 'userspace' });
    const podUid = uid();
    const plan = planFor(h, podUid, `15101:127.0.0.1:${echo.port}`);
    const jobId = await sbatch(h.site.user, jobScript(h, plan, 'sleep 600\n'), { jobName: podUid });
    const started = startSession(h, plan);
    const { session } = started;
    await waitForForwards(started, jobId);
    await session.close('test');
  }, 90_000);

  it('a wrong login host key is refused before anything is sent', async () => {
    const h = await site('allowed');
    // Pin another key for the login host: the login sshd must see no authentication attempt.
    const known = await readFile(h.site.knownHostsPath, 'utf8');
    const wrong = ssh2.utils.generateKeyPairSync('ed25519').public;
    const loginName = `[127.0.0.1]:${h.site.loginPort}`;
    const text = known
      .split('\n')
      .map((line) => (line.startsWith(loginName) ? `${loginName} ${wrong}` : line))
      .join('\n');
    const path = join(h.workdir, 'known_hosts.wrong');
    await import('node:fs/promises').then((fs) => fs.writeFile(path, text));
    await chown(path, 0, 0);
    const config = { ...h.config, Network: { SSH: { ...h.config.Network.SSH, KnownHostsFile: path } } };
    const access = await openSiteAccess(config);
    const plan = planFor(h, uid(), `15102:127.0.0.1:${echo.port}`);
    const before = h.site.login.readLog();
    const { ended } = startSession({ ...h, access }, plan);
    const end = await ended;
    access.pool.close();
    expect(end).toMatchObject({ type: 'SESSION_FAILED', error: { kind: 'host-key-mismatch', permanent: true } });
    if (end.type === 'SESSION_FAILED') expect(end.error.message).toMatch(/presented SHA256:/);
    await new Promise((r) => setTimeout(r, 300));
    const log = h.site.login.readLog().slice(before.length);
    expect(log).not.toMatch(/Accepted publickey|Failed publickey|Postponed publickey/);
  }, 60_000);

  it('an unreachable login node is reported as such (and may be retried)', async () => {
    const h = allowed;
    const closed = createServer();
    await new Promise<void>((resolve) => closed.listen(0, '127.0.0.1', resolve));
    const port = (closed.address() as { port: number }).port;
    await new Promise<void>((resolve) => closed.close(() => resolve()));
    const config = { ...h.config, Network: { SSH: { ...h.config.Network.SSH, Port: port } } };
    const access = await openSiteAccess(config);
    const { ended } = startSession({ ...h, access }, planFor(h, uid(), `15103:127.0.0.1:${echo.port}`));
    expect(await ended).toMatchObject({
      type: 'SESSION_FAILED',
      error: { kind: 'login-unreachable', permanent: false },
    });
    access.pool.close();
  }, 60_000);

  it('a job that never starts ends the wait with job-not-running', async () => {
    const { ended } = startSession(allowed, planFor(allowed, uid(), `15104:127.0.0.1:${echo.port}`), {
      nodeWaitTimeoutMs: 1_500,
    });
    const end = await ended;
    expect(end).toMatchObject({ type: 'SESSION_FAILED', error: { kind: 'job-not-running' } });
  }, 30_000);

  // KeepaliveInterval 2 s, three unanswered: the first tick after the stop may still see data that
  // arrived just before it (and sends nothing, as OpenSSH's ServerAliveInterval), so 8–10 s, plus the
  // timers' lag on a loaded machine (10.96 s seen on 2 cores under Node 24).
  it('a SIGSTOPped node sshd is reported as carrier lost within 12 s', async () => {
    const h = allowed;
    const podUid = uid();
    const plan = planFor(h, podUid, `15105:127.0.0.1:${echo.port}`);
    const jobId = await sbatch(h.site.user, jobScript(h, plan, 'sleep 600\n'), { jobName: podUid });
    const before = new Set(h.site.node.processes());
    const started = startSession(h, plan);
    const { session, ended } = started;
    await waitForForwards(started, jobId);
    // Stop the node sshd processes serving this session (not the listener's other clients).
    const ours = h.site.node.processes().filter((pid) => !before.has(pid));
    expect(ours.length).toBeGreaterThan(0);
    const stoppedAt = Date.now();
    for (const pid of ours) process.kill(pid, 'SIGSTOP');
    try {
      const end = await ended;
      const noticedMs = Date.now() - stoppedAt;
      console.log(`carrier lost ${noticedMs} ms after the node sshd was stopped`);
      expect(end.type).toBe('CARRIER_LOST');
      expect(noticedMs, `noticed after ${noticedMs} ms`).toBeLessThan(12_000);
    } finally {
      for (const pid of ours) {
        try {
          process.kill(pid, 'SIGCONT');
        } catch {
          // already gone
        }
      }
    }
    await session.close('test');
  }, 90_000);

  it('each socket reaches only its declared endpoint', async () => {
    const h = allowed;
    const alpha = await nameServer('alpha');
    const beta = await nameServer('beta');
    servers.push(alpha.server, beta.server);
    const podUid = uid();
    const plan = planFor(h, podUid, `15106:127.0.0.1:${alpha.port} 15107:127.0.0.1:${beta.port}`);
    const out = join(h.workdir, `${podUid}.out`);
    const script = jobScript(
      h,
      plan,
      `for p in 15106 15107; do ${PYTHON} -c "import os,socket; s=socket.create_connection((os.environ['BACKHAUL_BIND_ADDRESS'], $p)); print($p, s.recv(100).decode().strip())"; done\n`,
    );
    const jobId = await sbatch(h.site.user, script, { jobName: podUid, output: out });
    const { session, ended } = startSession(h, plan);
    await waitForState(jobId, ['COMPLETED'], 60_000);
    expect(await readFile(out, 'utf8')).toContain('15106 alpha\n15107 beta\n');
    await ended;
    await session.close('done');
  }, 90_000);

  it('SOCKS5 CONNECT through the relay works for the job where the site allows it, and for nobody else', async () => {
    const h = allowed;
    const podUid = uid();
    const socksPort = 20000 + (randomBytes(2).readUInt16BE(0) % 20000);
    const plan = planFor(h, podUid, `15108:127.0.0.1:${echo.port}`, {
      'interlink.eu/reverse-socks-port': String(socksPort),
    });
    expect(plan.socks).toBe(socksPort);
    const out = join(h.workdir, `${podUid}.out`);
    // A minimal SOCKS5 client (no auth, CONNECT by IPv4) inside the job, at the relay's SOCKS address.
    const client = `${PYTHON} - <<'PYEOF'
import os, socket, struct
proxy = os.environ['BACKHAUL_SOCKS_PROXY']
assert proxy == 'socks5h://%s:${socksPort}' % os.environ['BACKHAUL_BIND_ADDRESS'], proxy
s = socket.create_connection((os.environ['BACKHAUL_BIND_ADDRESS'], ${socksPort}), timeout=30)
s.sendall(b'\\x05\\x01\\x00')
assert s.recv(2) == b'\\x05\\x00'
s.sendall(b'\\x05\\x01\\x00\\x01' + socket.inet_aton('127.0.0.1') + struct.pack('>H', ${echo.port}))
reply = s.recv(10)
assert reply[1] == 0, reply
s.sendall(b'through socks')
s.shutdown(socket.SHUT_WR)
data = b''
while True:
    b = s.recv(100)
    if not b:
        break
    data += b
print('socks', data.decode(), flush=True)
PYEOF
sleep 30
`;
    const jobId = await sbatch(h.site.user, jobScript(h, plan, client), { jobName: podUid, output: out });
    const { session } = startSession(h, plan);
    await waitFor(
      'the job through SOCKS',
      async () => ((await readFile(out, 'utf8').catch(() => '')).includes('socks through socks') ? true : undefined),
      60_000,
    );
    // Nothing listens on the node's 127.0.0.1 for it any more, and the job's user from outside the job
    // is refused at the relay's SOCKS address like at a forward's.
    const address = bindAddress(podUid, 0);
    const outside = await runAs(h.site.user, PYTHON, [
      '-c',
      `import socket\nfor host in ('127.0.0.1', '${address}'):\n    try:\n        s = socket.create_connection((host, ${socksPort}), timeout=5)\n        s.sendall(b'\\x05\\x01\\x00')\n        print(host, repr(s.recv(2)))\n    except OSError as exc:\n        print(host, exc.__class__.__name__)`,
    ]);
    expect(outside.stdout, outside.stderr).toContain('127.0.0.1 ConnectionRefusedError');
    // Closed at once by the relay (an empty read, or a reset when the greeting was still in flight).
    expect(outside.stdout, outside.stderr).toMatch(
      new RegExp(`^${address.replaceAll('.', '\\.')} (b''|ConnectionResetError)$`, 'm'),
    );
    expect(await readFile(out, 'utf8')).toMatch(
      new RegExp(
        `backhaul-relay: refused .* -> ${address.replaceAll('.', '\\.')}:${socksPort}: pid \\d+ \\(python3\\) is not a process of job \\d+`,
      ),
    );
    await scancel(jobId);
    await session.close('done');
  }, 90_000);
  it('the endpoint policy at dial time: a name that resolves to loopback, SOCKS to loopback or the fleet namespace: refused, nothing dialled', async () => {
    // The default policy (own namespace and the API; loopback never), and minio.user resolving to
    // 127.0.0.1, as a hostile DNS answer or ExternalName Service would.
    const strict = await site(
      'allowed',
      { AllowSocks: true },
      { EndpointPolicy: {}, HostAliases: { 'minio.user.svc.cluster.local': '127.0.0.1' } },
    );
    let dialled = 0;
    // The data plane's meter on this thread, emptied first (earlier tests' connections).
    dataPlane.flush();
    const target = await nameServer('fleet-loopback');
    target.server.on('connection', () => {
      dialled += 1;
    });
    servers.push(target.server);
    const podUid = uid();
    const socksPort = 20000 + (randomBytes(2).readUInt16BE(0) % 20000);
    // `minio` passes the names check (a Service of the pod's namespace).
    const plan = planFor(strict, podUid, `15109:minio:${target.port}`, {
      'interlink.eu/reverse-socks-port': String(socksPort),
    });
    const out = join(strict.workdir, `${podUid}.out`);
    const client = `${PYTHON} - <<'PYEOF'
import os, socket, struct
s = socket.create_connection((os.environ['BACKHAUL_BIND_ADDRESS'], 15109), timeout=30)
print('forward', repr(s.recv(100)))
def socks(atyp, addr, port):
    s = socket.create_connection((os.environ['BACKHAUL_BIND_ADDRESS'], ${socksPort}), timeout=30)
    s.sendall(b'\\x05\\x01\\x00')
    assert s.recv(2) == b'\\x05\\x00'
    s.sendall(b'\\x05\\x01\\x00' + atyp + addr + struct.pack('>H', port))
    return s.recv(10)[1]
print('socks-ip', socks(b'\\x01', socket.inet_aton('127.0.0.1'), ${target.port}))
name = b'backhaul-redis.backhaul.svc.cluster.local'
print('socks-name', socks(b'\\x03', bytes([len(name)]) + name, 6379))
print('socks-metadata', socks(b'\\x01', socket.inet_aton('169.254.169.254'), 80))
PYEOF
`;
    const jobId = await sbatch(strict.site.user, jobScript(strict, plan, client), { jobName: podUid, output: out });
    const { session, warnings } = startSession(strict, plan);
    await waitForState(jobId, ['COMPLETED', 'FAILED'], 60_000);
    const text = await readFile(out, 'utf8');
    // The job's connection closed at once (nothing reached), SOCKS answered 2: not allowed by ruleset.
    expect(text, text).toContain("forward b''");
    expect(text, text).toContain('socks-ip 2\nsocks-name 2\nsocks-metadata 2\n');
    expect(dialled).toBe(0);
    expect(warnings).toContain('endpoint refused by the endpoint policy');
    expect(warnings).toContain('socks target refused by the endpoint policy');
    // The refusal is a dial failure of that Service, reason policy, in /metrics.
    const metrics = new FleetMetrics();
    const report = dataPlane.flush();
    if (report) metrics.dataPlane.apply(report);
    const failures =
      (await metrics.registry.getSingleMetric('backhaul_forward_dial_failures_total')?.get())?.values ?? [];
    expect(
      failures.filter((v) => v.labels.namespace === 'user' && v.labels.service === 'minio'),
      JSON.stringify(failures),
    ).toEqual([expect.objectContaining({ value: 1, labels: expect.objectContaining({ reason: 'policy' }) })]);
    await session.close('done');
  }, 90_000);
});
