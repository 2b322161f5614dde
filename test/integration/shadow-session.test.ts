import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { chown, mkdtemp, readFile, rm, stat } from 'node:fs/promises';
import { createServer, type Server } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { renderPrelude } from '../../src/render/prelude.js';
import { renderSessionPlan, type SessionPlan } from '../../src/render/session-plan.js';
import { ANNOTATION } from '../../src/spec/annotations.js';
import { parseReverseRequest } from '../../src/spec/reverse-request.js';
import { parseSiteConfig, type SiteConfig } from '../../src/spec/site-config.js';
import { type ShadowEnd, type ShadowPhase, ShadowSession } from '../../src/ssh/shadow-session.js';
import { openSiteAccess, type SiteAccess } from '../../src/ssh/site-access.js';
import { type LoopbackSite, startLoopbackSite } from '../fixtures/loopback-site.js';
import { cancelSubmittedJobs, jobState, sbatch, scancel, stepsOf, waitForState } from '../fixtures/slurm.js';

const PYTHON = '/usr/bin/python3';
const MiB = 1024 * 1024;

/** A TCP echo server on the cluster side (the "in-cluster Service"). */
async function echoServer(): Promise<{ server: Server; port: number }> {
  const server = createServer({ allowHalfOpen: true }, (socket) => socket.pipe(socket));
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const address = server.address();
  if (!address || typeof address === 'string') throw new Error('no port');
  return { server, port: address.port };
}

/**
 * The workload inside the job, as the job user: sends `bytes` of seeded pseudo-random data to
 * the bind address and compares the sha256 of what comes back with what it sent.
 */
function workload(port: number, bytes: number): string {
  return `${PYTHON} - <<'PYEOF'
import hashlib, os, socket, sys, threading
addr = os.environ['BACKHAUL_BIND_ADDRESS']
total = ${bytes}
s = socket.create_connection((addr, ${port}), timeout=120)
sent = hashlib.sha256()
got = hashlib.sha256()
block = os.urandom(1 << 20)
def reader():
    n = 0
    while True:
        b = s.recv(1 << 18)
        if not b:
            break
        got.update(b)
        n += len(b)
    reader.n = n
t = threading.Thread(target=reader)
t.start()
left = total
while left > 0:
    chunk = block[: min(len(block), left)]
    s.sendall(chunk)
    sent.update(chunk)
    left -= len(chunk)
s.shutdown(socket.SHUT_WR)
t.join()
print('workload', total, reader.n, sent.hexdigest() == got.hexdigest(), flush=True)
PYEOF
`;
}

interface Harness {
  site: LoopbackSite;
  config: SiteConfig;
  access: SiteAccess;
  workdir: string;
}

async function harness(nodeForwarding: 'allowed' | 'refused', reverse: Record<string, unknown>): Promise<Harness> {
  const site = await startLoopbackSite({ nodeForwarding });
  const config = parseSiteConfig({
    Network: {
      SSH: {
        ...site.siteConfig.Network.SSH,
        Reverse: { ...site.siteConfig.Network.SSH.Reverse, PythonPath: PYTHON, WaitForForwards: '60s', ...reverse },
      },
    },
    Backhaul: { KeepaliveInterval: '1s', SocketCheckInterval: '1s' },
  });
  const access = await openSiteAccess(config);
  const workdir = await mkdtemp(join(tmpdir(), 'bh-shadow-'));
  await chown(workdir, site.user.uid, site.user.gid);
  return { site, config, access, workdir };
}

function planFor(h: Harness, uid: string, forwards: string, extra: Record<string, string> = {}): SessionPlan {
  const annotations = { [ANNOTATION.forwards]: forwards, ...extra };
  const request = parseReverseRequest(annotations, {
    reverse: h.config.Network.SSH.Reverse,
    podNamespace: 'user',
    clusterDomain: 'cluster.local',
  });
  if (!request) throw new Error('no request');
  return renderSessionPlan(
    { uid, namespace: 'user', name: `pod-${uid.slice(0, 8)}`, nodeName: undefined, annotations },
    request,
    h.config,
  );
}

function jobScript(h: Harness, plan: SessionPlan, body: string): string {
  const request = { forwards: plan.forwards.map((f) => ({ listenPort: f.listenPort, names: f.names })) };
  return `#!/bin/bash\n${renderPrelude(request, h.config.Network.SSH.Reverse)}${body}`;
}

function startSession(h: Harness, plan: SessionPlan) {
  const phases: ShadowPhase[] = [];
  const warnings: string[] = [];
  const session = new ShadowSession({
    plan,
    pool: h.access.pool,
    site: h.access.carrier,
    onPhase: (p) => phases.push(p),
    log: { warn: (m) => warnings.push(m), info: () => undefined },
    nodeWaitTimeoutMs: 60_000,
    jobPollMs: 200,
    socketCheckMs: 1_000,
  });
  const ended: Promise<ShadowEnd> = session.run();
  return { session, phases, warnings, ended };
}

async function waitFor<T>(
  what: string,
  fn: () => Promise<T | undefined> | T | undefined,
  timeoutMs = 30_000,
): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await fn();
    if (value !== undefined && value !== false) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

async function exists(path: string): Promise<boolean> {
  return stat(path).then(
    () => true,
    () => false,
  );
}

function userProcesses(user: string, pattern: string): Promise<string[]> {
  return new Promise((resolve) => {
    execFile('pgrep', ['-a', '-u', user, '-f', pattern], (err, stdout) =>
      resolve(err ? [] : stdout.trim().split('\n').filter(Boolean)),
    );
  });
}

const uid = () => `${randomBytes(4).toString('hex')}-0000-4000-8000-${randomBytes(6).toString('hex')}`;

describe.each([
  ['node', {}],
  ['userspace', { Sshd: 'userspace' }],
  ['srun', { Sshd: 'userspace', NodeExec: 'srun' }],
] as const)('shadow session, %s carrier, on the loopback site', (mode, reverse) => {
  let h: Harness;
  let echo: { server: Server; port: number };

  beforeAll(async () => {
    h = await harness('allowed', reverse);
    echo = await echoServer();
  });

  afterAll(async () => {
    await cancelSubmittedJobs();
    h?.access.pool.close();
    echo?.server.close();
    await h?.site.stop();
    if (h) await rm(h.workdir, { recursive: true, force: true });
  });

  it('establishes the forwards and carries 100 MiB both ways byte-identical for a client in the job', async () => {
    const podUid = uid();
    const plan = planFor(h, podUid, `15000:127.0.0.1:${echo.port}`);
    expect(plan.carrier.mode).toBe(mode);
    const out = join(h.workdir, `${podUid}.out`);
    const jobId = await sbatch(h.site.user, jobScript(h, plan, workload(15000, 100 * MiB)), {
      jobName: podUid,
      output: out,
    });
    const { session, phases, ended } = startSession(h, plan);
    await waitForState(jobId, ['COMPLETED', 'FAILED', 'CANCELLED'], 120_000);
    const text = await readFile(out, 'utf8');
    expect(text).toContain(`workload ${100 * MiB} ${100 * MiB} True`);
    expect(phases.map((p) => p.type).slice(0, 4)).toEqual([
      'SHADOW_UP',
      'BATCH_HOST',
      'CARRIER_OPEN',
      'FORWARDS_READY',
    ]);
    expect(phases[1]).toMatchObject({ type: 'BATCH_HOST', batchHost: 'bhnode1', jobId });
    // The job ended: its trap removed the socket dir, and the session noticed.
    const end = await ended;
    expect(end.type).toBe('JOB_ENDED');
    expect(session.stats?.bytesToCluster).toBe(100 * MiB);
    expect(await exists(plan.socketDir)).toBe(false);
  }, 180_000);

  it('reports the job ended within 10 s of scancel and leaves no socket, process or step', async () => {
    const podUid = uid();
    const plan = planFor(h, podUid, `15001:127.0.0.1:${echo.port}`);
    const jobId = await sbatch(h.site.user, jobScript(h, plan, 'sleep 600\n'), { jobName: podUid });
    const { session, phases, ended } = startSession(h, plan);
    await waitFor('forwards', () => phases.some((p) => p.type === 'FORWARDS_READY'), 60_000);
    for (const f of plan.forwards) expect((await stat(f.socketPath)).isSocket()).toBe(true);
    const cancelledAt = Date.now();
    await scancel(jobId);
    const end = await ended;
    expect(['JOB_ENDED', 'SOCKETS_VANISHED']).toContain(end.type);
    expect(Date.now() - cancelledAt).toBeLessThan(10_000);
    await session.close('test');
    for (const f of plan.forwards) expect(await exists(f.socketPath)).toBe(false);
    await waitFor('no steps', async () => ((await stepsOf(jobId)).length === 0 ? true : undefined), 10_000);
    await waitFor(
      'no job processes',
      async () => ((await userProcesses(h.site.user.name, plan.socketDir)).length === 0 ? true : undefined),
      10_000,
    );
    expect((await jobState(jobId)).state).not.toBe('RUNNING');
  }, 120_000);

  it('close() twice is harmless and leaves no socket files, no steps and no carrier processes', async () => {
    const podUid = uid();
    const plan = planFor(h, podUid, `15002:127.0.0.1:${echo.port} 15003:127.0.0.1:${echo.port}`);
    const jobId = await sbatch(h.site.user, jobScript(h, plan, 'sleep 600\n'), { jobName: podUid });
    const { session, phases, ended } = startSession(h, plan);
    await waitFor('forwards', () => phases.some((p) => p.type === 'FORWARDS_READY'), 60_000);
    await Promise.all([session.close('operator'), session.close('again')]);
    await session.close('third');
    expect(await ended).toEqual({ type: 'CLOSED', reason: 'operator' });
    for (const f of plan.forwards) expect(await exists(f.socketPath)).toBe(false);
    // The job goes on; only the carrier is gone.
    expect((await jobState(jobId)).state).toBe('RUNNING');
    await waitFor(
      'no carrier steps',
      async () => ((await stepsOf(jobId)).filter((s) => !/\.(batch|extern)$/.test(s)).length === 0 ? true : undefined),
      10_000,
    );
    await waitFor(
      'no user-space sshd',
      async () => ((await userProcesses(h.site.user.name, 'sshd -i')).length === 0 ? true : undefined),
      10_000,
    );
    await scancel(jobId);
  }, 120_000);
});
