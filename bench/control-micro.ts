/**
 * Where the control plane's time goes, piece by piece, in this process (bench/control.ts):
 *
 *   machine   the pure part of one transition as the worker does it: parse the event (zod), restore the
 *             stored snapshot (JSON + zod + resolveState), applyEvent (XState transition), persistPod
 *             (structuredClone) and JSON.stringify — each timed alone and all together;
 *   store     SnapshotStore.applyWithRetry with a fixed write (one HGETALL + one EVALSHA per call), one at a
 *             time (latency) and 32 at a time (throughput); then applyPodEvent (machine + store) for whole
 *             pod lifecycles without any queue, with and without runEffects (the step/deadline jobs);
 *   events    events sent (sendEvent: one XADD) and read by an EventConsumer with a no-op handler (concurrency 32),
 *             beside bare BullMQ jobs with the options events had as jobs, added and processed by a no-op Worker;
 *   batching  k events of one pod applied with one load and one compare-and-set instead of k (experiment).
 */

import { Queue, Worker } from 'bullmq';
import type { Redis } from 'ioredis';
import { transition } from 'xstate';
import { parseSiteConfig } from '../src/contract/site-config.js';
import { silentLogger } from '../src/log.js';
import {
  applyEvent,
  type PodEvent,
  type PodSnapshot,
  parsePodEvent,
  persistPod,
  podMachine,
  restorePod,
  startPod,
} from '../src/machines/pod-machine.js';
import { EventStream } from '../src/pods/event-stream.js';
import { type FleetDeps, fleetDeps, podLimits } from '../src/pods/fleet-deps.js';
import { sendEvent } from '../src/pods/queues.js';
import { RedisKeys } from '../src/store/keys.js';
import { createRedis } from '../src/store/redis.js';
import { preloadScripts } from '../src/store/scripts.js';
import { runEffects } from '../src/workers/effects.js';
import { EventConsumer } from '../src/workers/event-consumer.js';
import { applyPodEvent } from '../src/workers/pod-events.js';
import { renderPlan } from '../src/workers/pod-plan.js';
import { eventsUpTo } from '../tools/sandbox/control-only.js';
import { NO_CLUSTER_CHECKS } from '../tools/sandbox/loopback-site.js';
import { say, selfCpuSeconds, sleep } from './control-common.js';

const ANNOTATIONS = {
  'interlink.eu/reverse-forwards':
    '9000:minio.user.svc.cluster.local:9000 6379:redis.user.svc.cluster.local:6379 6443:kubernetes.default.svc.cluster.local:443',
};

export const benchConfig = (url: string) =>
  parseSiteConfig({
    Network: {
      SSH: {
        LoginHost: '127.0.0.1',
        User: 'bhjob',
        KeyFile: '/nonexistent/bench-control-key',
        InsecureAcceptAnyHostKey: true,
        Reverse: { Enabled: true },
      },
    },
    Backhaul: { Redis: { URL: url }, PhaseTimeout: '30m', Kubernetes: NO_CLUSTER_CHECKS },
  });

/** The plan render stores with a pod of these annotations (so the snapshots carry it, as the fleet's do). */
const PLAN = renderPlan(
  startPod(
    { uid: 'u-0', namespace: 'user', name: 'bench', annotations: ANNOTATIONS, ...podLimits(benchConfig('redis://x')) },
    0,
  ).snapshot.context,
  benchConfig('redis://x'),
);

/** The events of one pod's healthy lifecycle after POD_UPSERT (8 of them; POD_UPSERT makes the 9th). */
export function lifecycle(at: number): PodEvent[] {
  return [
    ...eventsUpTo('active', at)
      .slice(1)
      .map((e) => (e.type === 'STEP_DONE' && e.step === 'render' ? { ...e, plan: PLAN } : e)),
    { type: 'TEARDOWN', reason: 'bench', at },
    { type: 'STEP_DONE', step: 'teardown', generation: 1, at },
  ];
}

const upsert = (i: number, at: number): PodEvent => ({
  type: 'POD_UPSERT',
  namespace: 'user',
  name: `bench-${i}`,
  annotations: ANNOTATIONS,
  at,
});

export interface MachineFigures {
  /** µs per transition. */
  parseEvent: number;
  restore: number;
  applyEvent: number;
  persist: number;
  json: number;
  /** XState's own pure transition(), which builds an inert actor per call (what applyEvent did before). */
  xstateTransition: number;
  /** All of the above (with applyEvent), as the worker's decide() does them, per transition. */
  total: number;
  snapshotBytes: number;
}

/** CPU µs of each pure piece per transition, over `rounds` lifecycles (8 events after POD_UPSERT each). */
export function benchMachine(rounds: number): MachineFigures {
  const limits = podLimits(benchConfig('redis://127.0.0.1:6379/9'));
  const at = Date.now();
  // Build the stored form of every step of a lifecycle once.
  const stored: string[] = [];
  const events = lifecycle(at);
  let snap = startPod(
    { uid: 'u-0', namespace: 'user', name: 'bench', annotations: ANNOTATIONS, ...limits },
    at,
  ).snapshot;
  stored.push(JSON.stringify(persistPod(snap)));
  for (const event of events) {
    const step = applyEvent(snap, event);
    if (!step.changed) throw new Error(`lifecycle: ${event.type} was ignored in ${step.from}`);
    snap = step.snapshot;
    stored.push(JSON.stringify(persistPod(snap)));
  }
  const eventJson = events.map((e) => JSON.parse(JSON.stringify(e)) as unknown);
  const n = rounds * events.length;
  // CPU time of this process, not wall time: the machine is shared, and these loops never wait. The best
  // of 5 rounds: a neighbour's load still slows a core down (caches, frequency), never speeds it up.
  const time = (fn: () => void): number => {
    for (let r = 0; r < Math.min(200, rounds); r += 1) fn(); // warm up the JIT
    let best = Number.POSITIVE_INFINITY;
    for (let k = 0; k < 5; k += 1) {
      const c0 = selfCpuSeconds();
      for (let r = 0; r < rounds; r += 1) fn();
      best = Math.min(best, ((selfCpuSeconds() - c0) * 1e6) / n);
    }
    return best;
  };
  // Restored snapshots to apply events to.
  const restored: PodSnapshot[] = stored.slice(0, events.length).map((s) => {
    const r = restorePod(JSON.parse(s));
    if (!r.ok) throw r.error;
    return r.snapshot;
  });
  const next: PodSnapshot[] = restored.map((s, i) => applyEvent(s, events[i] as PodEvent).snapshot);
  let sink = 0;
  const parseEvent = time(() => {
    for (const e of eventJson) sink += parsePodEvent(e).ok ? 1 : 0;
  });
  const restore = time(() => {
    for (let i = 0; i < events.length; i += 1) sink += restorePod(JSON.parse(stored[i] as string)).ok ? 1 : 0;
  });
  const apply = time(() => {
    for (let i = 0; i < events.length; i += 1)
      sink += applyEvent(restored[i] as PodSnapshot, events[i] as PodEvent).actions.length;
  });
  const xstateTransition = time(() => {
    for (let i = 0; i < events.length; i += 1) {
      sink += transition(podMachine, restored[i] as PodSnapshot, events[i] as PodEvent)[1].length;
    }
  });
  const persist = time(() => {
    for (const s of next) sink += persistPod(s).version;
  });
  const persisted = next.map((s) => persistPod(s));
  const json = time(() => {
    for (const p of persisted) sink += JSON.stringify(p).length;
  });
  const total = time(() => {
    for (let i = 0; i < events.length; i += 1) {
      const parsed = parsePodEvent(eventJson[i]);
      if (!parsed.ok) throw new Error(parsed.message);
      const r = restorePod(JSON.parse(stored[i] as string));
      if (!r.ok) throw r.error;
      const step = applyEvent(r.snapshot, parsed.event);
      sink += JSON.stringify(persistPod(step.snapshot)).length;
    }
  });
  if (sink === 42) say('');
  return {
    parseEvent,
    restore,
    applyEvent: apply,
    xstateTransition,
    persist,
    json,
    total,
    snapshotBytes: Math.round(stored.reduce((a, s) => a + s.length, 0) / stored.length),
  };
}

async function pool<T>(items: readonly T[], concurrency: number, fn: (item: T) => Promise<void>): Promise<void> {
  let next = 0;
  await Promise.all(
    Array.from({ length: Math.min(concurrency, items.length) }, async () => {
      while (next < items.length) {
        const item = items[next] as T;
        next += 1;
        await fn(item);
      }
    }),
  );
}

export interface Rate {
  ops: number;
  seconds: number;
  perSecond: number;
  /** CPU ms of this process per op. */
  cpuMsPerOp: number;
  /** Mean latency per op (ms) where meaningful. */
  latencyMs?: number;
}

async function rate(ops: number, fn: () => Promise<void>): Promise<Rate> {
  const c0 = selfCpuSeconds();
  const t0 = performance.now();
  await fn();
  const seconds = (performance.now() - t0) / 1000;
  return { ops, seconds, perSecond: ops / seconds, cpuMsPerOp: ((selfCpuSeconds() - c0) * 1000) / ops };
}

function newDeps(url: string, redis: Redis): FleetDeps {
  return fleetDeps(benchConfig(url), redis, silentLogger());
}

export interface StoreFigures {
  casSequential: Rate;
  casConcurrent: Rate;
  applyPodEvent: Rate;
  applyPodEventWithEffects: Rate;
}

/** applyWithRetry alone, then the whole control path minus the queues. */
export async function benchStore(url: string, pods: number): Promise<StoreFigures> {
  const redis = createRedis(url, { connectionName: 'bench-micro-store' });
  try {
    await redis.flushdb();
    await preloadScripts(redis);
    const deps = newDeps(url, redis);
    const limits = podLimits(deps.config);
    const snapshot = persistPod(
      startPod({ uid: 'u', namespace: 'user', name: 'bench', annotations: ANNOTATIONS, ...limits }, Date.now())
        .snapshot,
    );
    const write = (i: number) => ({
      snapshot,
      version: 1,
      state: 'validating',
      namespace: 'user',
      name: `cas-${i}`,
      history: { at: Date.now(), event: 'BENCH', from: 'a', to: 'b', generation: 0 },
    });
    const casUids = Array.from({ length: 200 }, (_, i) => `cas-${i}`);
    for (const [i, uid] of casUids.entries()) await deps.store.create(uid, write(i));
    const seqOps = 2_000;
    const casSequential = await rate(seqOps, async () => {
      for (let i = 0; i < seqOps; i += 1) {
        await deps.store.applyWithRetry(casUids[i % casUids.length] as string, () => ({ write: write(i), value: 0 }));
      }
    });
    casSequential.latencyMs = (casSequential.seconds * 1000) / seqOps;
    const conOps = 10_000;
    const items = Array.from({ length: conOps }, (_, i) => i);
    const casConcurrent = await rate(conOps, () =>
      pool(items, 32, async (i) => {
        // 32 in flight over 200 pods: few conflicts, like 32 event jobs of different pods.
        await deps.store.applyWithRetry(casUids[i % casUids.length] as string, () => ({ write: write(i), value: 0 }));
      }),
    );
    await redis.flushdb();

    const lifecycleRun = async (withEffects: boolean, prefix: string): Promise<Rate> => {
      const uids = Array.from({ length: pods }, (_, i) => `${prefix}-${i}`);
      const r = await rate(pods * 9, () =>
        pool(uids, 32, async (uid) => {
          const at = Date.now();
          for (const event of [upsert(1, at), ...lifecycle(at)]) {
            const result = await applyPodEvent(deps, uid, event);
            if (result.kind !== 'applied') throw new Error(`${uid}: ${event.type}: ${result.kind}`);
            if (withEffects) await runEffects(deps, uid, result.actions);
          }
        }),
      );
      await redis.flushdb();
      return r;
    };
    const applyPodEventRate = await lifecycleRun(false, 'ape');
    const withEffects = await lifecycleRun(true, 'apx');
    await deps.queues.close();
    return { casSequential, casConcurrent, applyPodEvent: applyPodEventRate, applyPodEventWithEffects: withEffects };
  } finally {
    await redis.flushdb().catch(() => undefined);
    redis.disconnect();
  }
}

export interface BullFigures {
  add: Rate;
  process: Rate;
}

/** The BullMQ job options events had before they went through a stream (the baseline). */
const EVENT_JOB_OPTIONS = {
  removeOnComplete: true,
  attempts: 10,
  backoff: { type: 'exponential', delay: 200 },
} as const;

/**
 * Bare BullMQ in this process, as events were sent before the stream: jobs with those options, and a
 * no-op Worker with concurrency 32. The baseline of benchEventStream.
 */
export async function benchBullmq(url: string, jobs: number): Promise<BullFigures> {
  const redis = createRedis(url, { connectionName: 'bench-micro-bull' });
  const workerConn = createRedis(url, { connectionName: 'bench-micro-bull-worker' });
  const name = 'bench-events';
  const queue = new Queue(name, { connection: redis });
  try {
    await redis.flushdb();
    const at = Date.now();
    const items = Array.from({ length: jobs }, (_, i) => i);
    const add = await rate(jobs, () =>
      pool(items, 32, async (i) => {
        const event = { type: 'CARRIER_OPEN', generation: 1, at };
        await queue.add(event.type, { uid: `u-${i}`, event }, EVENT_JOB_OPTIONS);
      }),
    );
    let done = 0;
    let finished: () => void = () => undefined;
    const allDone = new Promise<void>((resolve) => {
      finished = resolve;
    });
    const worker = new Worker(
      name,
      async () => {
        done += 1;
        if (done === jobs) finished();
        return 'ok';
      },
      { connection: workerConn, concurrency: 32, autorun: false },
    );
    const processRate = await rate(jobs, async () => {
      void worker.run();
      await allDone;
    });
    await worker.close();
    await sleep(100);
    return { add, process: processRate };
  } finally {
    await queue.close().catch(() => undefined);
    await redis.flushdb().catch(() => undefined);
    redis.disconnect();
    workerConn.disconnect();
  }
}

/** The events stream in this process: sendEvent 32 at a time, and an EventConsumer (concurrency 32) with a no-op handler. */
export async function benchEventStream(url: string, events: number): Promise<BullFigures> {
  const redis = createRedis(url, { connectionName: 'bench-micro-stream' });
  const stream = new EventStream(redis, new RedisKeys('bench-stream:'));
  try {
    await redis.flushdb();
    await stream.ensureGroup();
    const at = Date.now();
    const items = Array.from({ length: events }, (_, i) => i);
    const add = await rate(events, () =>
      pool(items, 32, async (i) => {
        await sendEvent({ events: stream }, `u-${i}`, { type: 'CARRIER_OPEN', generation: 1, at });
      }),
    );
    let done = 0;
    let finished: () => void = () => undefined;
    const allDone = new Promise<void>((resolve) => {
      finished = resolve;
    });
    const consumer = new EventConsumer(
      stream,
      redis,
      async () => {
        done += 1;
        if (done === events) finished();
      },
      silentLogger(),
      { concurrency: 32 },
    );
    const processRate = await rate(events, async () => {
      consumer.start();
      await allDone;
    });
    await consumer.close();
    return { add, process: processRate };
  } finally {
    await redis.flushdb().catch(() => undefined);
    redis.disconnect();
  }
}

export interface BatchFigures {
  k: number;
  separate: Rate;
  batched: Rate;
}

/**
 * Experiment: the 4 session reports of a pod arriving together, applied as 4 load → transition → CAS
 * rounds, or as one load, 4 transitions and one CAS (the history then records only the last one here;
 * a real implementation would append all 4 in the same script).
 */
export async function benchBatching(url: string, pods: number): Promise<BatchFigures> {
  const redis = createRedis(url, { connectionName: 'bench-micro-batch' });
  try {
    await redis.flushdb();
    await preloadScripts(redis);
    const deps = newDeps(url, redis);
    const at = Date.now();
    const reports = lifecycle(at).slice(2, 6);
    const prepare = async (prefix: string) => {
      const uids = Array.from({ length: pods }, (_, i) => `${prefix}-${i}`);
      await pool(uids, 32, async (uid) => {
        for (const event of [upsert(1, at), ...lifecycle(at).slice(0, 2)]) await applyPodEvent(deps, uid, event);
      });
      return uids;
    };
    const sepUids = await prepare('sep');
    const separate = await rate(pods * reports.length, () =>
      pool(sepUids, 32, async (uid) => {
        for (const event of reports) {
          const r = await applyPodEvent(deps, uid, event);
          if (r.kind !== 'applied') throw new Error(`${uid}: ${event.type}: ${r.kind}`);
        }
      }),
    );
    const batUids = await prepare('bat');
    const batched = await rate(pods * reports.length, () =>
      pool(batUids, 32, async (uid) => {
        await deps.store.applyWithRetry(uid, (stored) => {
          const restored = restorePod(stored?.snapshot);
          if (!restored.ok) throw restored.error;
          let snap = restored.snapshot;
          let from = '';
          for (const event of reports) {
            const step = applyEvent(snap, event);
            if (!step.changed) throw new Error(`${uid}: ${event.type} ignored`);
            from ||= step.from;
            snap = step.snapshot;
          }
          const persisted = persistPod(snap);
          return {
            write: {
              snapshot: persisted,
              version: persisted.version,
              state: persisted.state,
              namespace: persisted.context.namespace,
              name: persisted.context.name,
              history: { at, event: 'FORWARDS_READY', from, to: persisted.state, generation: 1 },
            },
            value: 0,
          };
        });
      }),
    );
    await deps.queues.close();
    return { k: reports.length, separate, batched };
  } finally {
    await redis.flushdb().catch(() => undefined);
    redis.disconnect();
  }
}
