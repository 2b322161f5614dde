import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Worker } from 'bullmq';
import type { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { silentLogger } from '../../src/log.js';
import type { PodEvent } from '../../src/machines/pod-machine.js';
import { type FleetDeps, fleetDeps } from '../../src/pods/fleet-deps.js';
import { QUEUE_NAMES, type SessionJobData, sendEvent } from '../../src/pods/queues.js';
import { createRedis } from '../../src/store/redis.js';
import { ControlWorker } from '../../src/workers/control-worker.js';
import { controlOnlyConfig, FORWARDS } from '../../tools/sandbox/control-only.js';
import { waitFor } from '../../tools/sandbox/shadow-harness.js';
import { freePort } from '../../tools/sandbox/sshd.js';
import { RedisServer } from '../fixtures/redis-server.js';

/**
 * What the control plane costs Redis (issue 28: at most 25 commands per stored transition), counted
 * exactly on a Redis of its own by INFO commandstats, Lua's inner commands included: a control worker
 * takes PODS pods from POD_UPSERT to done, this test playing the session host (it takes each session
 * job and the lease, reports the four phases, each once the one before is stored, and tears the pod
 * down), as bench:control does with worker processes.
 */
const PODS = 200;
const TRANSITIONS_PER_POD = 9;
const AIM = 25;

let server: RedisServer;
let redis: Redis;
let deps: FleetDeps;
let control: ControlWorker;

async function calls(): Promise<Map<string, number>> {
  const info = await redis.info('commandstats');
  return new Map([...info.matchAll(/^cmdstat_([\w|]+):calls=(\d+)/gm)].map((m) => [m[1] as string, Number(m[2])]));
}

beforeAll(async () => {
  server = new RedisServer(await freePort(), await mkdtemp(join(tmpdir(), 'bh-redis-')));
  await server.start();
  redis = createRedis(server.url);
  const config = controlOnlyConfig(0, { Redis: { URL: server.url } });
  deps = fleetDeps(config, redis, silentLogger());
  control = new ControlWorker(deps, { events: redis, steps: redis });
}, 30_000);

afterAll(async () => {
  await control?.close();
  await deps?.queues.close();
  redis?.disconnect();
  await server?.crash();
  if (server) await rm(server.dir, { recursive: true, force: true });
});

describe('the control plane’s cost in Redis', () => {
  it(`takes ${PODS} pods through their ${TRANSITIONS_PER_POD} transitions in at most ${AIM} commands each`, async () => {
    // Each stored transition appends to the pod's history: its keyspace notification says so without a
    // command (polling would be counted).
    await redis.config('SET', 'notify-keyspace-events', 'Kt');
    const subscriber = redis.duplicate();
    const stored = new Map<string, number>();
    const waiters = new Map<string, { above: number; resolve: () => void }>();
    const prefix = deps.keys.history('');
    subscriber.on('pmessage', (_p: string, channel: string, op: string) => {
      if (op !== 'xadd') return;
      const uid = channel.slice(channel.indexOf(prefix) + prefix.length);
      const n = (stored.get(uid) ?? 0) + 1;
      stored.set(uid, n);
      const waiter = waiters.get(uid);
      if (waiter && n > waiter.above) {
        waiters.delete(uid);
        waiter.resolve();
      }
    });
    await subscriber.psubscribe(`__keyspace@0__:${prefix}*`);
    const history = async (uid: string) => redis.xlen(deps.keys.history(uid));
    /** Sends EVENT once the pod's last transition is stored, and waits for the one it makes. */
    const report = async (uid: string, event: PodEvent) => {
      const above = stored.get(uid) ?? 0;
      const next = new Promise<void>((resolve, reject) => {
        waiters.set(uid, { above, resolve });
        setTimeout(() => reject(new Error(`${uid}: ${event.type} stored no transition in 20 s`)), 20_000).unref();
      });
      await sendEvent(deps.queues, uid, event);
      await next;
    };
    const hostConn = redis.duplicate();
    const host = new Worker<SessionJobData>(
      QUEUE_NAMES.sessions,
      async (job) => {
        const { uid, generation } = job.data;
        const lease = await deps.leases.acquire(uid, 'cost-host', generation, 600_000);
        if (!lease.ok) throw new Error(`${uid}: lease ${lease.reason}`);
        const reports: PodEvent[] = [
          { type: 'SHADOW_UP', host: 'cost-host', generation, at: Date.now() },
          { type: 'BATCH_HOST', batchHost: 'n1', jobId: '7', generation, at: Date.now() },
          { type: 'CARRIER_OPEN', generation, at: Date.now() },
          { type: 'FORWARDS_READY', generation, at: Date.now() },
        ];
        for (const phase of reports) await report(uid, { ...phase, lease: lease.lease.token } as PodEvent);
        await sendEvent(deps.queues, uid, { type: 'TEARDOWN', reason: 'cost', at: Date.now() });
        return 'held';
      },
      { connection: hostConn, concurrency: PODS },
    );
    try {
      const uids = Array.from(
        { length: PODS },
        (_, i) => `c0575000-0000-4000-8000-${(i + 1).toString(16).padStart(12, '0')}`,
      );
      // Everything the workers do while idle is counted too (a blocking read now and then): it is part
      // of what they cost, and small beside the run.
      const before = await calls();
      const t0 = Date.now();
      await Promise.all(
        uids.map((uid, i) =>
          sendEvent(deps.queues, uid, {
            type: 'POD_UPSERT',
            namespace: 'user',
            name: `cost-${i}`,
            annotations: FORWARDS,
            at: Date.now(),
          }),
        ),
      );
      const all = () => [...stored.values()].reduce((a, b) => a + b, 0);
      await waitFor('every transition stored', () => (all() >= PODS * TRANSITIONS_PER_POD ? true : undefined), 120_000);
      await waitFor(
        'every pod forgotten',
        async () => ((await deps.store.list()).length === 0 ? true : undefined),
        30_000,
      );
      const after = await calls();
      const seconds = (Date.now() - t0) / 1000;
      const transitions = (await Promise.all(uids.map(history))).reduce((a, b) => a + b, 0);
      // Less the commands of this count (xlen of the histories above is after `after`).
      const used = [...after].map(([cmd, n]) => [cmd, n - (before.get(cmd) ?? 0)] as const).filter(([, n]) => n > 0);
      const total = used.reduce((a, [, n]) => a + n, 0);
      const perTransition = total / transitions;
      const top = used
        .sort((a, b) => b[1] - a[1])
        .slice(0, 12)
        .map(([cmd, n]) => `${cmd} ${(n / transitions).toFixed(2)}`)
        .join(', ');
      console.log(
        `${transitions} transitions in ${seconds.toFixed(1)} s: ${perTransition.toFixed(1)} Redis commands each (${top})`,
      );
      expect(transitions).toBe(PODS * TRANSITIONS_PER_POD);
      expect(perTransition, top).toBeLessThanOrEqual(AIM);
    } finally {
      await host.close();
      hostConn.disconnect();
      subscriber.disconnect();
    }
  }, 180_000);
});
