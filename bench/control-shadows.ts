/**
 * Heap per idle shadow (ARCHITECTURE.md, "Aims (what good looks like)": under 256 KiB), on the loopback site (real login sshd, real node
 * sshd, real Slurm, the real prelude and relay in every job). Run by bench/control.ts as a child:
 *
 *   node --expose-gc --import tsx bench/control-shadows.ts --mode raw|session --shadows N [--warm 10]
 *        [--wave 20] [--idle-ms 15000] [--jobs-file PATH] [--redis URL]
 *
 * Each shadow needs its own Slurm job (named after the pod UID: the prelude derives the socket dir from
 * it and starts the relay there). All N + warm jobs are submitted first (`prelude; sleep`) and must be
 * RUNNING; then:
 *   raw      N ShadowSessions in this process (src/ssh/shadow-session.ts), sharing one SiteAccess;
 *   session  the session role in this process (startFleet roles [session], as `backhaul worker` runs it)
 *            and a `backhaul worker --roles control` process; pods are sent POD_UPSERT and each becomes a
 *            SessionHost job holding its ShadowSession, lease renewal and all.
 *   takeover as session, but the session role is a `backhaul worker --roles session` process (host A);
 *            once every shadow is up, a second one (host B) starts, A is killed with SIGKILL, and the time
 *            until every pod is active again on B is measured (heap figures are then the bench's own).
 * Shadows start in waves (the single login connection must not get more exec channels at once than the
 * login sshd's MaxSessions). `warm` shadows are established first and the baseline heap taken after them
 * (one-time costs: the login connection, ssh2's crypto, BullMQ's worker), then N more; after `idle-ms`
 * of idling (keepalives, socket checks, lease renewals) the heap of every thread (this one and the session
 * host's tunnel threads) is read after full GCs.
 * Every forward's socket is checked on the node. Prints `RESULT <json>` and cleans up after itself.
 */

import { execFile } from 'node:child_process';
import { readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { mkdtemp, rm, stat } from 'node:fs/promises';
import { freemem, tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs, promisify } from 'node:util';
import { stringify as toYaml } from 'yaml';
import { parseSiteConfig, type SiteConfig } from '../src/contract/site-config.js';
import { type RunningFleet, startFleet } from '../src/fleet/fleet.js';
import { silentLogger } from '../src/log.js';
import { type FleetQueues, openQueues, sendEvent } from '../src/pods/queues.js';
import type { SessionPlan } from '../src/render/session-plan.js';
import { dialRulesOf } from '../src/ssh/endpoint-dial.js';
import type { ShadowEnd, ShadowPhase } from '../src/ssh/shadow-session.js';
import { ShadowSession } from '../src/ssh/shadow-session.js';
import { openSiteAccess, type SiteAccess } from '../src/ssh/site-access.js';
import { RedisKeys } from '../src/store/keys.js';
import { createRedis } from '../src/store/redis.js';
import { LOOPBACK_ENDPOINT_POLICY, NO_CLUSTER_CHECKS, startLoopbackSite } from '../tools/sandbox/loopback-site.js';
import { echoServer, jobScript, planFor } from '../tools/sandbox/shadow-harness.js';
import { sbatch } from '../tools/sandbox/slurm.js';
import { descendantsOf } from '../tools/sandbox/sshd.js';
import { type Child, cleanupAll, onCleanup, say, sleep, spawnChild } from './control-common.js';
import { cancelRun, runPrefix, uidOf } from './control-slurm.js';

const execFileAsync = promisify(execFile);
const ROOT = new URL('..', import.meta.url).pathname;

const { values } = parseArgs({
  options: {
    mode: { type: 'string', default: 'raw' },
    shadows: { type: 'string', default: '100' },
    warm: { type: 'string', default: '10' },
    wave: { type: 'string', default: '10' },
    'idle-ms': { type: 'string', default: '15000' },
    /** The pauses after the warm shadows (3 s) and before the second heap reading (5 s); the CI smoke shortens both. */
    'pause-ms': { type: 'string' },
    'jobs-file': { type: 'string' },
    redis: { type: 'string', default: 'redis://127.0.0.1:6379/9' },
    run: { type: 'string' },
  },
});
const MODE = values.mode === 'session' || values.mode === 'takeover' ? values.mode : 'raw';
const N = Number(values.shadows);
const WARM = Number(values.warm);
const WAVE = Number(values.wave);
const JOB_BATCH = 10;
const IDLE_MS = Number(values['idle-ms']);
const PAUSE_MS = values['pause-ms'] === undefined ? undefined : Number(values['pause-ms']);
const URL_ = values.redis ?? 'redis://127.0.0.1:6379/9';
const gc = (globalThis as { gc?: () => void }).gc;
if (!gc) throw new Error('run with node --expose-gc');

/**
 * The heap of every thread after full GCs: this one's and, in session mode, the session host's tunnel
 * threads', where the carriers and forwards live (they run with this process's --expose-gc).
 */
async function heapNow(): Promise<{
  /** Open file descriptors of the whole process (every thread's sockets). */
  fds: number;
  heapUsed: number;
  threadsHeapUsed: number;
  rss: number;
  external: number;
  arrayBuffers: number;
}> {
  for (let i = 0; i < 4; i += 1) gc?.();
  const threads = (await fleet?.session?.tunnelHeapUsed(true)) ?? [];
  const threadsHeapUsed = threads.reduce((a, b) => a + b, 0);
  const m = process.memoryUsage();
  return {
    fds: readdirSync('/proc/self/fd').length,
    heapUsed: m.heapUsed + threadsHeapUsed,
    threadsHeapUsed,
    rss: m.rss,
    external: m.external,
    arrayBuffers: m.arrayBuffers,
  };
}

/** MemAvailable of the machine (bytes): what the node side (sshd, relay, slurmstepd) costs shows here. */
function memAvailable(): number {
  const m = /MemAvailable:\s+(\d+) kB/.exec(readFileSync('/proc/meminfo', 'utf8'));
  return m ? Number(m[1]) * 1024 : freemem();
}

const started = Date.now();
const elapsed = () => `${((Date.now() - started) / 1000).toFixed(0)} s`;

const site = await startLoopbackSite({ nodeForwarding: 'allowed' });
onCleanup('loopback site (sshds)', () => site.stop());
const echo = await echoServer();
onCleanup('echo server', () => echo.server.close());
const workdir = await mkdtemp(join(tmpdir(), 'bh-bench-shadows-'));
onCleanup('work dir', () => rm(workdir, { recursive: true, force: true }));

// The site's defaults (keepalive 2 s, socket check 3 s, lease TTL 5 s): an idle shadow as it idles in production.
const configData = {
  Network: {
    SSH: {
      ...site.siteConfig.Network.SSH,
      Reverse: { ...site.siteConfig.Network.SSH.Reverse, PythonPath: '/usr/bin/python3', WaitForForwards: '60m' },
    },
  },
  Backhaul: {
    EndpointPolicy: LOOPBACK_ENDPOINT_POLICY,
    Kubernetes: NO_CLUSTER_CHECKS,
    Redis: { URL: URL_ },
    SessionCapacity: N + WARM + 10,
    PhaseTimeout: '10m',
  },
};
const config: SiteConfig = parseSiteConfig(configData);
const access: SiteAccess = await openSiteAccess(config);
onCleanup('login pool', () => access.pool.close());
const h = { site, config, access, workdir };

/** The pods' UIDs are <run>-0000-4000-8000-<n>: the jobs are found (and cancelled) by that prefix. */
const run = values.run ?? runPrefix();
const total = WARM + N;
const forwards = `9000:127.0.0.1:${echo.port} 6379:127.0.0.1:${echo.port}`;
const uids = Array.from({ length: total }, (_, i) => uidOf(run, i));
const plans = new Map<string, SessionPlan>(uids.map((uid) => [uid, planFor(h, uid, forwards)]));

// ---- the jobs: prelude + sleep, named after the pods
const jobIds: string[] = [];
let cleaning = false;
onCleanup('Slurm jobs and socket dirs', async () => {
  cleaning = true;
  await cancelRun(run, site.user.name, config.Network.SSH.Reverse.SocketRoot, total);
});
say(`shadows(${MODE}): submitting ${total} jobs (prelude + sleep) as ${site.user.name}, ${JOB_BATCH} at a time`);
const jobOf = new Map<string, string>();
/**
 * Jobs go in small batches, each RUNNING before the next is submitted: on this shared 2-core machine a
 * burst of 100+ batch launches made slurmd time out ("Could not confirm batch launch") and requeue or
 * hold jobs, for other test runs too. A job held after a failed launch is released.
 */
async function waitRunning(list: readonly string[], timeoutMs: number): Promise<number> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const { stdout } = await execFileAsync('squeue', ['-h', '-u', site.user.name, '-o', '%j|%T|%r']);
    const states = new Map<string, { state: string; reason: string }>();
    for (const line of stdout.split('\n')) {
      const [name, state, reason] = line.trim().split('|');
      if (name && state) states.set(name, { state, reason: reason ?? '' });
    }
    const running = list.filter((u) => states.get(u)?.state === 'RUNNING').length;
    if (running === list.length || Date.now() > deadline) return running;
    for (const uid of list) {
      const s = states.get(uid);
      const id = jobOf.get(uid);
      if (id && s && /held/i.test(s.reason)) await execFileAsync('scontrol', ['release', id]).catch(() => undefined);
    }
    await sleep(1_000);
  }
}
for (let i = 0; i < uids.length; i += JOB_BATCH) {
  const batch = uids.slice(i, i + JOB_BATCH);
  for (const uid of batch) {
    if (cleaning) break;
    const plan = plans.get(uid) as SessionPlan;
    const id = await sbatch(site.user, jobScript(h, plan, 'sleep 86400\n'), { jobName: uid });
    jobIds.push(id);
    jobOf.set(uid, id);
    if (values['jobs-file']) writeFileSync(values['jobs-file'], `${jobIds.join('\n')}\n`);
  }
  const running = await waitRunning(batch, 180_000);
  if (running < batch.length) say(`shadows(${MODE}): only ${running}/${batch.length} of a batch RUNNING after 180 s`);
  if ((i / JOB_BATCH) % 5 === 4) say(`shadows(${MODE}): ${i + batch.length}/${total} jobs submitted (${elapsed()})`);
}
{
  const running = await waitRunning(uids, 300_000);
  if (running < total) throw new Error(`only ${running}/${total} jobs RUNNING`);
}
say(`shadows(${MODE}): all ${total} jobs RUNNING (${elapsed()})`);

// ---- the shadows
const failures: string[] = [];
/** Shadows that failed before FORWARDS_READY and were started again. */
const retries: string[] = [];

async function socketsPresent(list: readonly string[]): Promise<number> {
  let n = 0;
  for (const uid of list) {
    for (const f of plans.get(uid)?.forwards ?? []) {
      if ((await stat(f.socketPath).catch(() => undefined))?.isSocket()) n += 1;
    }
  }
  return n;
}

let startShadows: (list: readonly string[]) => Promise<void>;
/** Takeover mode: kills session host A and measures how soon host B holds every pod. */
let takeoverPhase: (() => Promise<Record<string, number | null>>) | undefined;
const sessionHosts: Child[] = [];
/** `backhaul worker --roles session` as host `bench-host-<name>` (takeover mode). */
function startSessionHost(name: string, configPath: string): Child {
  const child = spawnChild(
    `session host ${name}`,
    process.execPath,
    [
      join(ROOT, 'bin', 'backhaul.js'),
      'worker',
      '--roles',
      'session',
      '--config',
      configPath,
      '--redis',
      URL_,
      '--host-id',
      `bench-host-${name}`,
    ],
    {
      env: { ...process.env, BACKHAUL_LOG_LEVEL: 'warn' },
      logFile: join(tmpdir(), `bh-bench-shadows-host-${name}-${run}.log`),
    },
  );
  onCleanup(`session host ${name}`, () => child.stop());
  return child;
}
let stopAll: () => Promise<void>;
let fleet: RunningFleet | undefined;
const sessions = new Map<string, { session: ShadowSession; ended: Promise<ShadowEnd> }>();

if (MODE === 'raw') {
  /** One shadow until FORWARDS_READY; a failure before that is retried (a session host's machine would relaunch). */
  const establish = async (uid: string): Promise<void> => {
    for (let attempt = 1; ; attempt += 1) {
      let resolveReady: () => void = () => undefined;
      let rejectReady: (e: Error) => void = () => undefined;
      const ready = new Promise<void>((resolve, reject) => {
        resolveReady = resolve;
        rejectReady = reject;
      });
      const session = new ShadowSession({
        plan: plans.get(uid) as SessionPlan,
        pool: access.pool,
        site: access.carrier,
        nodeWaitTimeoutMs: config.Network.SSH.NodeWaitTimeout,
        socketCheckMs: config.Backhaul.SocketCheckInterval,
        dialRules: dialRulesOf(config),
        log: { warn: () => undefined, info: () => undefined },
        onPhase: (phase: ShadowPhase) => {
          if (phase.type === 'FORWARDS_READY') resolveReady();
          else if (!['SHADOW_UP', 'BATCH_HOST', 'CARRIER_OPEN'].includes(phase.type)) {
            rejectReady(new Error(`${uid}: ${JSON.stringify(phase)}`));
          }
        },
      });
      const ended = session.run();
      void ended.then((end) => rejectReady(new Error(`${uid} ended: ${JSON.stringify(end)}`)));
      sessions.set(uid, { session, ended });
      const timer = setTimeout(() => rejectReady(new Error(`${uid}: not ready within 180 s`)), 180_000);
      try {
        await ready;
        clearTimeout(timer);
        return;
      } catch (err) {
        clearTimeout(timer);
        retries.push((err as Error).message);
        await session.close('retry');
        if (attempt >= 5) {
          failures.push((err as Error).message);
          return;
        }
        await sleep(500 * attempt);
      }
    }
  };
  startShadows = async (list) => {
    await Promise.all(list.map((uid) => establish(uid)));
  };
  stopAll = async () => {
    await Promise.all([...sessions.values()].map((s) => s.session.close('bench done')));
  };
} else {
  const redis = createRedis(URL_, { connectionName: 'bench-shadows' });
  await redis.flushdb();
  onCleanup('redis db', async () => {
    await redis.flushdb().catch(() => undefined);
    redis.disconnect();
  });
  const configPath = join(workdir, 'site.yaml');
  writeFileSync(configPath, toYaml(configData));
  const control: Child = spawnChild(
    'control worker',
    process.execPath,
    [join(ROOT, 'bin', 'backhaul.js'), 'worker', '--roles', 'control', '--config', configPath, '--redis', URL_],
    {
      env: { ...process.env, BACKHAUL_LOG_LEVEL: 'warn' },
      logFile: join(tmpdir(), `bh-bench-shadows-control-${run}.log`),
    },
  );
  onCleanup('control worker', () => control.stop());
  await sleep(3_000);
  let queues: FleetQueues;
  if (MODE === 'session') {
    const hostConn = createRedis(URL_, { connectionName: 'bench-session-host' });
    fleet = await startFleet(config, hostConn, silentLogger(), { roles: ['session'], hostId: 'bench-session-host' });
    queues = fleet.deps.queues;
    onCleanup('session host', async () => {
      await fleet?.stop();
      hostConn.disconnect();
    });
  } else {
    sessionHosts.push(startSessionHost('a', configPath));
    queues = openQueues(redis, new RedisKeys());
    onCleanup('queues', () => queues.close());
    await sleep(3_000);
  }
  if (MODE === 'takeover')
    takeoverPhase = async () => {
      const holder = async (uid: string) => (await redis.hget(`bh:lease:${uid}`, 'holder')) ?? '';
      const b = startSessionHost('b', configPath);
      sessionHosts.push(b);
      await sleep(5_000);
      const a = sessionHosts[0] as Child;
      const onA = (await Promise.all(uids.map(holder))).filter((h) => h === 'bench-host-a').length;
      say(`shadows(takeover): ${onA}/${uids.length} shadows on host A; SIGKILL to it`);
      const killedAt = Date.now();
      process.kill(a.pid, 'SIGKILL');
      const back = new Map<string, number>();
      const deadline = killedAt + 30 * 60_000;
      let told = 0;
      while (back.size < uids.length && Date.now() < deadline) {
        for (const uid of uids) {
          if (back.has(uid)) continue;
          if ((await stateOf(uid)) === 'active' && (await holder(uid)) === 'bench-host-b')
            back.set(uid, Date.now() - killedAt);
        }
        if (back.size >= told + 100) {
          told = back.size;
          say(
            `shadows(takeover): ${back.size}/${uids.length} active on B, ${((Date.now() - killedAt) / 1000).toFixed(1)} s after the kill`,
          );
        }
        await sleep(250);
      }
      const times = [...back.values()].sort((x, y) => x - y);
      const at = (q: number) =>
        times.length ? (times[Math.min(times.length - 1, Math.floor(q * times.length))] ?? 0) / 1000 : null;
      return {
        shadows: uids.length,
        onHostA: onA,
        backOnB: times.length,
        firstSeconds: at(0),
        medianSeconds: at(0.5),
        p90Seconds: at(0.9),
        allSeconds: times.length === uids.length ? at(1) : null,
        socketsAfter: await socketsPresent(uids),
      };
    };
  const stateOf = async (uid: string) => (await redis.hget(`bh:pod:${uid}`, 'state')) ?? '(none)';
  startShadows = async (list) => {
    await Promise.all(
      list.map((uid, i) =>
        sendEvent(queues, uid, {
          type: 'POD_UPSERT',
          namespace: 'user',
          name: `idle-${i}-${uid.slice(-6)}`,
          annotations: { 'interlink.eu/reverse-forwards': forwards },
          at: Date.now(),
        }),
      ),
    );
    const deadline = Date.now() + 180_000;
    const pending = new Set(list);
    while (pending.size > 0 && Date.now() < deadline) {
      for (const uid of [...pending]) {
        const s = await stateOf(uid);
        if (s === 'active') pending.delete(uid);
        else if (s === 'failed') {
          pending.delete(uid);
          failures.push(`${uid}: failed`);
        }
      }
      await sleep(250);
    }
    for (const uid of pending) failures.push(`${uid}: still ${await stateOf(uid)}`);
    for (const uid of list) {
      const hist = await redis.xrange(`bh:hist:${uid}`, '-', '+');
      for (const [, fields] of hist) {
        const type = fields[fields.indexOf('event') + 1] ?? '';
        if (type === 'CARRIER_LOST' || type === 'SESSION_FAILED' || type === 'DEADLINE') {
          retries.push(`${uid}: ${type} ${fields[fields.indexOf('detail') + 1] ?? ''}`);
        }
      }
    }
  };
  stopAll = async () => {
    // The real teardown path: TEARDOWN → teardown step revokes the lease → the session closes.
    for (const uid of uids) {
      await sendEvent(queues, uid, {
        type: 'TEARDOWN',
        reason: 'bench done',
        at: Date.now(),
      });
    }
    const deadline = Date.now() + 120_000;
    while ((await redis.zcard('bh:pods')) > 0 && Date.now() < deadline) await sleep(500);
  };
}
onCleanup('shadows', () => stopAll());

async function inWaves(list: readonly string[]): Promise<void> {
  for (let i = 0; i < list.length; i += WAVE) {
    await startShadows(list.slice(i, i + WAVE));
    say(`shadows(${MODE}): ${Math.min(i + WAVE, list.length)}/${list.length} established (${elapsed()})`);
  }
}

/**
 * Job-information RPCs slurmctld has answered (sdiag: REQUEST_JOB_INFO*, REQUEST_JOB_USER_INFO): what the
 * shadows' job lookups cost the site's controller while they are established.
 */
async function slurmJobRpcs(): Promise<number> {
  const { stdout } = await execFileAsync('sdiag').catch(() => ({ stdout: '' }));
  let count = 0;
  for (const m of stdout.matchAll(/^\s*REQUEST_JOB_(?:USER_)?INFO\S*\s+\(\s*\d+\)\s+count:(\d+)/gm))
    count += Number(m[1]);
  return count;
}

/** Proportional set size (KiB) of the node sshd's children: the carriers' sshd sessions and their shells. */
function carrierPssKiB(): number {
  let kib = 0;
  for (const pid of descendantsOf(site.node.pid)) {
    const m = /^Pss:\s+(\d+) kB/m.exec(readFileSafe(`/proc/${pid}/smaps_rollup`));
    if (m) kib += Number(m[1]);
  }
  return kib;
}
function readFileSafe(path: string): string {
  try {
    return readFileSync(path, 'utf8');
  } catch {
    return '';
  }
}

const warmUids = uids.slice(0, WARM);
const mainUids = uids.slice(WARM);
await inWaves(warmUids);
await sleep(PAUSE_MS ?? 3_000);
const before = await heapNow();
const memBefore = memAvailable();
const pssBefore = carrierPssKiB();
const rpcsBefore = await slurmJobRpcs();
await inWaves(mainUids);
const rpcsAfter = await slurmJobRpcs();
say(`shadows(${MODE}): idling ${IDLE_MS} ms`);
await sleep(IDLE_MS);
const after = await heapNow();
const memAfter = memAvailable();
const pssAfter = carrierPssKiB();
const sockets = await socketsPresent(mainUids);
const expectedSockets = mainUids.length * 2;
// Once more a little later: a steady heap, not one caught mid-allocation.
await sleep(PAUSE_MS ?? 5_000);
const later = await heapNow();

const takeover = takeoverPhase ? await takeoverPhase() : undefined;

const result = {
  mode: MODE,
  ...(takeover ? { takeover } : {}),
  shadows: N,
  warm: WARM,
  forwardsPerShadow: 2,
  failures: failures.length,
  failureSamples: failures.slice(0, 5),
  retries: retries.length,
  retrySamples: retries.slice(0, 5),
  sockets,
  expectedSockets,
  heapBefore: before.heapUsed,
  heapAfter: after.heapUsed,
  heapLater: later.heapUsed,
  heapPerShadowKiB: (after.heapUsed - before.heapUsed) / 1024 / Math.max(1, N - failures.length),
  heapPerShadowLaterKiB: (later.heapUsed - before.heapUsed) / 1024 / Math.max(1, N - failures.length),
  /** Of heapPerShadowKiB, what the tunnel threads hold (session mode). */
  threadsHeapPerShadowKiB: (after.threadsHeapUsed - before.threadsHeapUsed) / 1024 / Math.max(1, N - failures.length),
  externalPerShadowKiB: (after.external - before.external) / 1024 / Math.max(1, N),
  fdsPerShadow: (after.fds - before.fds) / Math.max(1, N - failures.length),
  rssPerShadowKiB: (after.rss - before.rss) / 1024 / Math.max(1, N),
  machineMemPerShadowMiB: (memBefore - memAfter) / 1024 / 1024 / Math.max(1, N),
  nodeCarrierPssPerShadowKiB: (pssAfter - pssBefore) / Math.max(1, N),
  /** While the N shadows were established (each looks its job up at least once). */
  slurmJobRpcs: rpcsAfter - rpcsBefore,
  loginConnections: access.pool.size,
  seconds: (Date.now() - started) / 1000,
};
process.stdout.write(`RESULT ${JSON.stringify(result)}\n`);
await cleanupAll();
process.exit(0);
