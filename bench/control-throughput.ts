/**
 * End-to-end transitions per second of the control plane (ARCHITECTURE.md, "Aims (what good looks like)"), driven the way the cluster drives it:
 *
 *   bench (pod watcher)   POD_UPSERT ×N ─────────────► bh:events ─► control worker process(es)
 *                                                                   validate, render, launch steps (bh-steps)
 *   bench (session host)  ◄── session job (bh-sessions) queued by the launch step
 *                         SHADOW_UP → BATCH_HOST → CARRIER_OPEN → FORWARDS_READY, each sent when the one
 *                         before is stored (closed loop per pod, all pods at once: the bench hears of each
 *                         stored transition from Redis's keyspace notification of the pod's history
 *                         stream, which costs no command), then completes the
 *                         session job and sends TEARDOWN ─► teardown step ─► done (record forgotten).
 *
 * No SSH, no Slurm: the bench plays the session host (it takes the session job and the lease, as a real
 * one does, so the reaper sees a live shadow), so what is measured is the control path only: the events
 * stream, the load → transition → compare-and-set loop, the effects (step and session jobs).
 *
 * Each pod stores 9 transitions: (new)→validating, →rendering, →launchingShadow, →waitingBatchHost,
 * →openingCarrier, →establishingForwards, →active, →tearingDown, →done. They are counted from the
 * pods' history streams, and timed on the Redis clock from just before the first enqueue to the
 * stream id of the last history entry written.
 */
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { QueueEvents, Worker } from 'bullmq';
import type { Redis } from 'ioredis';
import type { PodEvent } from '../src/machines/pod-machine.js';
import { openQueues, QUEUE_NAMES, type SessionJobData, sendEvent } from '../src/pods/queues.js';
import { RedisKeys } from '../src/store/keys.js';
import { LeaseStore } from '../src/store/lease-store.js';
import { createRedis, redisTimeMs } from '../src/store/redis.js';
import {
  type Child,
  commandCalls,
  diffCalls,
  machineCpu,
  onCleanup,
  procCpuSeconds,
  redisCpuSeconds,
  say,
  selfCpuSeconds,
  sleep,
  spawnChild,
} from './control-common.js';

const ROOT = fileURLToPath(new URL('..', import.meta.url));
export const TRANSITIONS_PER_POD = 9;

/** How the control workers are run. */
export type WorkerSpec =
  | { kind: 'cli' }
  /** bench/control-worker-variant.ts with these arguments (see there), of this checkout or of `root`. */
  | { kind: 'variant'; label: string; args: string[]; root?: string };

export function describeSpec(spec: WorkerSpec): string {
  if (spec.kind === 'cli') return 'backhaul worker --roles control';
  return spec.label;
}

/** The site configuration the control workers run with: no SSH is ever made by the control role. */
export function writeControlConfig(dir: string, url: string): string {
  const path = join(dir, 'control-site.yaml');
  writeFileSync(
    path,
    [
      '# backhaul bench/control.ts: control role only; the key file is never read by it.',
      'Network:',
      '  SSH:',
      '    LoginHost: 127.0.0.1',
      '    Port: 22',
      '    User: bhjob',
      '    KeyFile: /nonexistent/bench-control-key',
      '    InsecureAcceptAnyHostKey: true',
      '    Reverse:',
      '      Enabled: true',
      'Backhaul:',
      '  Redis:',
      `    URL: ${url}`,
      // Long enough that no deadline of a benchmark run falls due.
      '  PhaseTimeout: 30m',
      // No cluster here: the control role starts machines itself (as `backhaul submit` does), which a site
      // with cluster checks refuses ("only the watch role may start machines on this site").
      '  Kubernetes:',
      '    NamespaceLabel: ""',
      '    NetworkPolicies: false',
      '',
    ].join('\n'),
  );
  return path;
}

export interface StartWorkersOptions {
  spec: WorkerSpec;
  count: number;
  configPath: string;
  url: string;
  logDir: string;
  /** node --cpu-prof into this directory. */
  cpuProfDir?: string;
}

export async function startWorkers(opts: StartWorkersOptions): Promise<Child[]> {
  const children: Child[] = [];
  for (let i = 0; i < opts.count; i += 1) {
    const hostId = `bench-control-${i + 1}`;
    const nodeFlags = opts.cpuProfDir ? ['--cpu-prof', '--cpu-prof-dir', opts.cpuProfDir] : [];
    const args =
      opts.spec.kind === 'cli'
        ? [
            ...nodeFlags,
            join(ROOT, 'bin', 'backhaul.js'),
            'worker',
            '--roles',
            'control',
            '--config',
            opts.configPath,
            '--redis',
            opts.url,
            '--host-id',
            hostId,
          ]
        : [
            ...nodeFlags,
            '--import',
            'tsx',
            join(opts.spec.root ?? ROOT, 'bench', 'control-worker-variant.ts'),
            '--config',
            opts.configPath,
            '--redis',
            opts.url,
            ...opts.spec.args,
          ];
    const child = spawnChild(hostId, process.execPath, args, {
      cwd: ROOT,
      env: { ...process.env, BACKHAUL_LOG_LEVEL: 'info' },
      logFile: join(opts.logDir, `${hostId}.log`),
    });
    children.push(child);
  }
  await Promise.all(children.map((c) => c.waitFor(/fleet started/, 60_000)));
  return children;
}

export interface ThroughputResult {
  workers: number;
  spec: string;
  pods: number;
  transitions: number;
  expected: number;
  seconds: number;
  perSecond: number;
  /**
   * Events through the stream (XINFO's entries-added): all, those that stored no transition (sent minus
   * the transitions not made inline: validate and render are), and those buried.
   */
  events: { sent: number; ignored: number; dead: number };
  stepJobs: { completed: number; failed: number };
  /** CPU seconds during the run. */
  cpu: { workers: number[]; bench: number; redis: number; machineBusy: number; wall: number };
  /** Redis commands per stored transition (server-wide counts, other clients' rate before the run subtracted). */
  commandsPerTransition: Map<string, number>;
  extraEvents: Map<string, number>;
}

async function entriesAdded(redis: Redis, key: string): Promise<number> {
  const info = (await redis.xinfo('STREAM', key).catch(() => [])) as unknown[];
  const i = info.indexOf('entries-added');
  return i >= 0 ? Number(info[i + 1]) : 0;
}

function uidOf(run: number, i: number): string {
  const hex = (i + 1).toString(16).padStart(12, '0');
  return `be0c${run.toString(16).padStart(4, '0')}-0000-4000-8000-${hex}`;
}

const ANNOTATIONS = {
  'interlink.eu/reverse-forwards':
    '9000:minio.user.svc.cluster.local:9000 6379:redis.user.svc.cluster.local:6379 6443:kubernetes.default.svc.cluster.local:443',
};

/**
 * One measured run against running workers: flushes the database first (the workers keep their
 * connections), drives `pods` pods from POD_UPSERT to done, and reports.
 */
export async function driveOnce(opts: {
  url: string;
  pods: number;
  run: number;
  workers: Child[];
  spec: string;
  timeoutMs?: number;
}): Promise<ThroughputResult> {
  const { url, pods } = opts;
  const keys = new RedisKeys();
  const redis = createRedis(url, { connectionName: 'bench-driver' });
  const qeStepsConn = createRedis(url, { connectionName: 'bench-queue-events-steps' });
  const hostConn = createRedis(url, { connectionName: 'bench-session-host' });
  const subscriber = createRedis(url, { connectionName: 'bench-history-notifications' });
  const queues = openQueues(redis, keys);
  const leases = new LeaseStore(redis, { keys });
  let host: Worker<SessionJobData> | undefined;
  const stepEvents = new QueueEvents(QUEUE_NAMES.steps, { connection: qeStepsConn });
  const notifyBefore = ((await redis.config('GET', 'notify-keyspace-events')) as string[])[1] ?? '';
  const closeAll = onCleanup(`driver run ${opts.run}`, async () => {
    await Promise.allSettled([host?.close(true), stepEvents.close(), queues.close()]);
    await redis.config('SET', 'notify-keyspace-events', notifyBefore).catch(() => undefined);
    for (const c of [redis, qeStepsConn, hostConn, subscriber]) c.disconnect();
  });

  // Every stored transition appends to the pod's history stream: its keyspace notification tells the
  // closed loop, without a command of its own.
  await redis.config('SET', 'notify-keyspace-events', 'Kt');
  const stored = new Map<string, number>();
  const waiters = new Map<string, { above: number; resolve: (outcome: string) => void }>();
  const histPrefix = keys.history('');
  subscriber.on('pmessage', (_pattern: string, channel: string, op: string) => {
    if (op !== 'xadd') return;
    const uid = channel.slice(channel.indexOf(histPrefix) + histPrefix.length);
    const n = (stored.get(uid) ?? 0) + 1;
    stored.set(uid, n);
    const waiter = waiters.get(uid);
    if (waiter && n > waiter.above) {
      waiters.delete(uid);
      waiter.resolve('→');
    }
  });
  await subscriber.psubscribe(`__keyspace@${redis.options.db ?? 0}__:${histPrefix}*`);
  const stepJobs = { completed: 0, failed: 0 };
  stepEvents.on('completed', () => {
    stepJobs.completed += 1;
  });
  stepEvents.on('failed', () => {
    stepJobs.failed += 1;
  });
  await stepEvents.waitUntilReady();
  // QueueEvents reads from '$': give its first XREAD a moment to be in place.
  await sleep(200);

  /** Sends EVENT and resolves once it stored a transition ('→'), or after 60 s without one. */
  const applied = async (uid: string, event: PodEvent): Promise<string> => {
    const above = stored.get(uid) ?? 0;
    const outcome = new Promise<string>((resolve) => {
      waiters.set(uid, { above, resolve });
      setTimeout(() => {
        if (waiters.get(uid)?.resolve === resolve) waiters.delete(uid);
        resolve('no transition in 60 s');
      }, 60_000).unref();
    });
    await sendEvent(queues, uid, event);
    return outcome;
  };

  // The session host: one shadow per session job, reports in order, each once the one before is stored.
  let sessions = 0;
  let teardowns = 0;
  const problems: string[] = [];
  host = new Worker<SessionJobData>(
    QUEUE_NAMES.sessions,
    async (job) => {
      const { uid, generation } = job.data;
      const lease = await leases.acquire(uid, 'bench-host', generation, 600_000);
      if (!lease.ok) problems.push(`${uid}: lease ${lease.reason}`);
      const n = Number.parseInt(uid.slice(-12), 16);
      const reports: PodEvent[] = [
        { type: 'SHADOW_UP', host: 'bench-host', generation, at: Date.now() },
        { type: 'BATCH_HOST', batchHost: 'bhnode1', jobId: String(100_000 + n), generation, at: Date.now() },
        { type: 'CARRIER_OPEN', generation, at: Date.now() },
        { type: 'FORWARDS_READY', generation, at: Date.now() },
      ];
      for (const report of reports) {
        const outcome = await applied(uid, { ...report, at: Date.now() });
        if (!outcome.includes('→')) problems.push(`${uid}: ${report.type}: ${outcome}`);
      }
      return 'held';
    },
    { connection: hostConn, concurrency: pods, autorun: false },
  );
  host.on('completed', (job) => {
    sessions += 1;
    // The tunnel is up and its job done: an operator (or the watcher) tears the pod down.
    sendEvent(queues, job.data.uid, { type: 'TEARDOWN', reason: 'bench', at: Date.now() }).then(
      () => {
        teardowns += 1;
      },
      (err: Error) => problems.push(`${job.data.uid}: TEARDOWN: ${err.message}`),
    );
  });
  host.on('failed', (job, err) => problems.push(`session ${job?.id}: ${err.message}`));
  void host.run();

  const uids = Array.from({ length: pods }, (_, i) => uidOf(opts.run, i));
  // Other clients of this Redis (other test runs) are counted by INFO commandstats too: take their rate
  // over 2 s before the run and subtract it (approximate).
  const callsBg0 = await commandCalls(redis);
  const bgT0 = performance.now();
  await sleep(2_000);
  const calls0 = await commandCalls(redis);
  const background = diffCalls(callsBg0, calls0);
  const bgSeconds = (performance.now() - bgT0) / 1000;
  const cpu0 = {
    workers: opts.workers.map((w) => procCpuSeconds(w.pid)),
    bench: selfCpuSeconds(),
    redis: await redisCpuSeconds(redis),
    machine: machineCpu(),
  };
  const sent0 = await entriesAdded(redis, keys.events());
  const t0 = redisTimeMs((await redis.time()) as unknown as [string, string]);
  const wall0 = performance.now();

  // The pod watcher: every pod appears at once.
  await Promise.all(
    uids.map((uid, i) =>
      sendEvent(queues, uid, {
        type: 'POD_UPSERT',
        namespace: 'user',
        name: `bench-${i + 1}`,
        annotations: ANNOTATIONS,
        at: Date.now(),
      }),
    ),
  );

  const deadline = Date.now() + (opts.timeoutMs ?? 600_000);
  for (;;) {
    if (teardowns >= pods && (await redis.zcard(keys.pods())) === 0) break;
    if (Date.now() > deadline) {
      const states = new Map<string, number>();
      for (const uid of uids) {
        const s = (await redis.hget(keys.pod(uid), 'state')) ?? '(gone)';
        states.set(s, (states.get(s) ?? 0) + 1);
      }
      throw new Error(
        `run ${opts.run}: not finished in time: ${sessions} sessions, ${teardowns} teardowns; states ${JSON.stringify([...states])}; problems: ${problems.slice(0, 5).join('; ')}`,
      );
    }
    await sleep(50);
  }
  const wall = (performance.now() - wall0) / 1000;
  const cpu1 = {
    workers: opts.workers.map((w) => procCpuSeconds(w.pid)),
    bench: selfCpuSeconds(),
    redis: await redisCpuSeconds(redis),
    machine: machineCpu(),
  };
  const calls1 = await commandCalls(redis);
  const sent = (await entriesAdded(redis, keys.events())) - sent0;
  const dead = await redis.xlen(keys.deadEvents());

  // Count and time the stored transitions from the history streams.
  const pipe = redis.pipeline();
  for (const uid of uids) {
    pipe.xlen(keys.history(uid));
    pipe.xrevrange(keys.history(uid), '+', '-', 'COUNT', 1);
  }
  const replies = (await pipe.exec()) ?? [];
  let transitions = 0;
  let last = t0;
  for (let i = 0; i < uids.length; i += 1) {
    transitions += Number(replies[2 * i]?.[1] ?? 0);
    const entries = (replies[2 * i + 1]?.[1] ?? []) as [string, string[]][];
    const id = entries[0]?.[0];
    if (id) last = Math.max(last, Number(id.split('-')[0]));
  }
  // Events other than the 9 expected ones (CARRIER_LOST from the reaper, DEADLINE …) would show here.
  const extra = new Map<string, number>();
  const expectedEvents = new Set(['POD_UPSERT', 'STEP_DONE', 'SHADOW_UP', 'BATCH_HOST', 'CARRIER_OPEN']);
  for (const e of ['FORWARDS_READY', 'TEARDOWN']) expectedEvents.add(e);
  const histPipe = redis.pipeline();
  for (const uid of uids) histPipe.xrange(keys.history(uid), '-', '+');
  for (const [, entries] of (await histPipe.exec()) ?? []) {
    for (const [, fields] of (entries ?? []) as [string, string[]][]) {
      const type = fields[fields.indexOf('event') + 1] ?? '?';
      if (!expectedEvents.has(type)) extra.set(type, (extra.get(type) ?? 0) + 1);
    }
  }
  if (problems.length > 0) say(`run ${opts.run}: ${problems.length} problems, e.g. ${problems.slice(0, 3).join('; ')}`);

  const seconds = (last - t0) / 1000;
  const perTransition = new Map<string, number>();
  for (const [cmd, n] of diffCalls(calls0, calls1)) {
    const others = ((background.get(cmd) ?? 0) / bgSeconds) * wall;
    const ours = Math.max(0, n - others);
    if (ours > 0) perTransition.set(cmd, ours / Math.max(1, transitions));
  }
  await closeAll();
  return {
    workers: opts.workers.length,
    spec: opts.spec,
    pods,
    transitions,
    expected: pods * TRANSITIONS_PER_POD,
    seconds,
    perSecond: transitions / seconds,
    // Validate's and render's STEP_DONE are applied inline: two transitions per pod without an event.
    events: { sent, ignored: sent - (transitions - 2 * pods), dead },
    stepJobs,
    cpu: {
      workers: cpu1.workers.map((c, i) => c - (cpu0.workers[i] ?? 0)),
      bench: cpu1.bench - cpu0.bench,
      redis: cpu1.redis - cpu0.redis,
      machineBusy: cpu1.machine.busy - cpu0.machine.busy,
      wall,
    },
    commandsPerTransition: perTransition,
    extraEvents: extra,
  };
}

/** Flushes the benchmark's database. */
export async function flush(redis: Redis): Promise<void> {
  await redis.flushdb();
}
