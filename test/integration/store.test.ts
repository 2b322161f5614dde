import { randomUUID } from 'node:crypto';
import { setImmediate as yieldToLoop } from 'node:timers/promises';
import type { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  applyEvent,
  MACHINE_VERSION,
  type PodAction,
  type PodEvent,
  persistPod,
  restorePod,
  startPod,
  stateOf,
} from '../../src/machines/pod-machine.js';
import { HostRegistry } from '../../src/store/host-registry.js';
import { RedisKeys } from '../../src/store/keys.js';
import { LeaseStore } from '../../src/store/lease-store.js';
import { createRedis } from '../../src/store/redis.js';
import { RedisEpoch } from '../../src/store/redis-epoch.js';
import { LuaScript, preloadScripts, SCRIPT_NAMES, script, scripts } from '../../src/store/scripts.js';
import { type PodWrite, SnapshotStore, type StoredPod } from '../../src/store/snapshot-store.js';

const REDIS_URL = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';
/** Every key of this run lives under this prefix; each test takes its own sub-prefix. */
const RUN_PREFIX = `bh-test:${process.pid}-${randomUUID().slice(0, 8)}:`;
let testCount = 0;
const freshKeys = () => new RedisKeys(`${RUN_PREFIX}${++testCount}:`);

const connections: Redis[] = [];
function connect(): Redis {
  const redis = createRedis(REDIS_URL, { connectionName: 'backhaul-store-test' });
  connections.push(redis);
  return redis;
}
let redis: Redis;

async function keysUnder(prefix: string): Promise<string[]> {
  const found: string[] = [];
  let cursor = '0';
  do {
    const [next, batch] = await redis.scan(cursor, 'MATCH', `${prefix}*`, 'COUNT', 1000);
    cursor = next;
    found.push(...batch);
  } while (cursor !== '0');
  return found.sort();
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

beforeAll(async () => {
  redis = connect();
  await redis.ping();
});

afterAll(async () => {
  const left = await keysUnder(RUN_PREFIX);
  for (let i = 0; i < left.length; i += 500) await redis.unlink(...left.slice(i, i + 500));
  expect(await keysUnder(RUN_PREFIX)).toEqual([]);
  await Promise.all(connections.map((c) => c.quit()));
});

const write = (counter: number, extra: Partial<PodWrite> = {}): PodWrite => ({
  snapshot: { counter },
  version: 'test-1',
  state: counter % 2 === 0 ? 'even' : 'odd',
  namespace: 'user',
  name: 'pod',
  ...extra,
});

describe('Redis connections and scripts', () => {
  it('createRedis: workers wait for Redis (maxRetriesPerRequest null); commands fail fast', async () => {
    const worker = connect();
    expect(worker.options.maxRetriesPerRequest).toBeNull();
    const command = createRedis(REDIS_URL, { kind: 'command' });
    connections.push(command);
    expect(command.options.maxRetriesPerRequest).toBe(1);
    expect(await command.ping()).toBe('PONG');
  });

  it('reads every script once per process, with a KEYS header that matches its calls', () => {
    const first = scripts();
    expect(scripts()).toBe(first);
    expect([...first.keys()]).toEqual([...SCRIPT_NAMES]);
    for (const [name, lua] of first) {
      expect(script(name)).toBe(lua);
      expect(lua.source.startsWith(`-- ${name}:`)).toBe(true);
      expect(lua.numberOfKeys).toBeGreaterThan(0);
      expect(lua.source).toMatch(/^-- ARGV\[1\]/m);
    }
    expect(script('pod-cas').numberOfKeys).toBe(7);
    expect(script('pod-remove').numberOfKeys).toBe(9);
    expect(script('lease-acquire').numberOfKeys).toBe(4);
  });

  it('preloads all scripts into Redis, runs them by SHA, loads an unknown one on NOSCRIPT', async () => {
    await preloadScripts(redis);
    const shas = [...scripts().values()].map((s) => s.sha);
    expect(await redis.script('EXISTS', ...shas)).toEqual(shas.map(() => 1));
    // A script this server has never seen: EVALSHA fails with NOSCRIPT, run() loads it and retries.
    const fresh = new LuaScript('fresh', `-- fresh: echo\n-- KEYS[1] any\n-- ${randomUUID()}\nreturn ARGV[1]`);
    expect(await redis.script('EXISTS', fresh.sha)).toEqual([0]);
    expect(await fresh.run(redis, [`${RUN_PREFIX}x`], ['hello'])).toBe('hello');
    expect(await redis.script('EXISTS', fresh.sha)).toEqual([1]);
    await expect(fresh.run(redis, [], ['x'])).rejects.toThrow(/takes 1 keys, got 0/);
  });
});

describe('SnapshotStore', () => {
  it('does not create again a pod that finished after the creating event; does for a later event', async () => {
    const store = new SnapshotStore(redis, { keys: freshKeys() });
    const history = { at: 1_000, event: 'POD_UPSERT', from: '', to: 'validating', generation: 0 };
    expect(await store.create('u1', write(0, { history }))).toBe('created');
    const gen = (await store.load('u1'))?.gen ?? 0;
    const done = { at: 5_000, event: 'STEP_DONE', from: 'tearingDown', to: 'done', generation: 1 };
    expect((await store.compareAndSet('u1', gen, write(1, { history: done }))).ok).toBe(true);
    expect(await store.remove('u1', 60)).toBe('removed');
    // An event from before the end (taken late): refused, nothing written, the history untouched.
    expect(await store.create('u1', write(0, { history, createdBy: 4_000 }))).toBe('finished');
    expect(await store.create('u1', write(0, { history, createdBy: 5_000 }))).toBe('finished');
    expect(await store.load('u1')).toBeNull();
    expect((await store.history('u1')).map((h) => h.to)).toEqual(['validating', 'done']);
    // The same pod sent again after its end: a new life, its history continued.
    expect(await store.create('u1', write(0, { history: { ...history, at: 6_000 }, createdBy: 6_000 }))).toBe(
      'created',
    );
    expect((await store.history('u1')).map((h) => h.to)).toEqual(['validating', 'done', 'validating']);
  });

  it('creates a record only if absent, with gen 1, indexes and a first history entry', async () => {
    const store = new SnapshotStore(redis, { keys: freshKeys() });
    const history = { at: 1_000, event: 'POD_UPSERT', from: '', to: 'even', generation: 0 };
    expect(await store.create('u1', write(0, { history }))).toBe('created');
    expect(await store.create('u1', write(99, { namespace: 'x', name: 'y' }))).toBe('exists');
    const stored = await store.load('u1');
    expect(stored).toMatchObject({
      uid: 'u1',
      snapshot: { counter: 0 },
      version: 'test-1',
      gen: 1,
      state: 'even',
      namespace: 'user',
      name: 'pod',
    });
    expect(stored?.updatedAt).toBeGreaterThan(1_600_000_000_000);
    expect(await store.list()).toEqual(['u1']);
    expect(await store.uidByName('user', 'pod')).toBe('u1');
    expect(await store.uidByName('x', 'y')).toBeNull();
    expect(await store.history('u1')).toEqual([{ id: expect.any(String), ...history }]);
    expect(await store.load('nobody')).toBeNull();
  });

  it('compare-and-set: writes on the gen it read, reports a conflict or a missing record otherwise', async () => {
    const store = new SnapshotStore(redis, { keys: freshKeys() });
    await store.create('u1', write(0));
    expect(await store.compareAndSet('u1', 1, write(1))).toEqual({ ok: true, gen: 2 });
    // A second writer that also read gen 1 loses, and is told the current gen.
    expect(await store.compareAndSet('u1', 1, write(100))).toEqual({ ok: false, reason: 'conflict', gen: 2 });
    expect((await store.load('u1'))?.snapshot).toEqual({ counter: 1 });
    expect(await store.compareAndSet('u1', 2, write(2, { history: null }))).toEqual({ ok: true, gen: 3 });
    expect(await store.compareAndSet('ghost', 1, write(1))).toEqual({ ok: false, reason: 'missing' });
    expect(await store.load('ghost')).toBeNull();
  });

  it('the review index: each stored state sets or withdraws its pod’s next look; setReview only on the gen read', async () => {
    const keys = freshKeys();
    const store = new SnapshotStore(redis, { keys });
    const score = async () => redis.zscore(keys.review(), 'u1');
    const before = Date.now();
    await store.create('u1', write(0, { reviewAfterMs: 60_000 }));
    expect(Number(await score())).toBeGreaterThanOrEqual(before + 59_000);
    expect(await store.dueForReview(before + 30_000, 10)).toEqual([]);
    expect(await store.dueForReview(before + 120_000, 10)).toEqual(['u1']);
    await store.compareAndSet('u1', 1, write(1, { reviewAfterMs: 0 }));
    expect(await store.dueForReview(Date.now() + 1_000, 10)).toEqual(['u1']);
    await store.compareAndSet('u1', 2, write(2));
    expect(await score()).toBeNull();
    // Set by a looker only while the pod is as it read it.
    expect(await store.setReview('u1', 2, 123)).toBe(false);
    expect(await score()).toBeNull();
    expect(await store.setReview('u1', 3, 123)).toBe(true);
    expect(await score()).toBe('123');
    expect(await store.setReview('u1', 3, null)).toBe(true);
    expect(await score()).toBeNull();
    await store.setReview('u1', 3, 456);
    expect(await store.remove('u1', 60)).toBe('removed');
    expect(await score()).toBeNull();
    // A forgotten pod gets no entry back.
    expect(await store.setReview('u1', 3, 789)).toBe(false);
    expect(await score()).toBeNull();
  });

  it('indexes deadlines and effects with the state, and withdraws them: also for a record without deadlineAt', async () => {
    const keys = freshKeys();
    const store = new SnapshotStore(redis, { keys });
    const indexed = async () => ({
      deadline: await redis.zscore(keys.deadlines(), 'u1'),
      outbox: await redis.zscore(keys.outbox(), 'u1'),
      effects: (await store.load('u1'))?.outbox ?? null,
    });
    const effects = [{ type: 'runStep', params: { step: 'launch', generation: 1 } }] as PodWrite['effects'];
    await store.create('u1', write(0, { deadlineAt: 5_000, effects }));
    expect(await indexed()).toEqual({ deadline: '5000', outbox: expect.any(String), effects });
    await store.compareAndSet('u1', 1, write(1));
    expect(await indexed()).toEqual({ deadline: null, outbox: null, effects: null });
    await store.compareAndSet('u1', 2, write(2, { deadlineAt: 7_000 }));
    expect((await indexed()).deadline).toBe('7000');
    // A record written before the field (its deadline indexed, no `deadlineAt`): withdrawn all the same.
    await redis.hdel(keys.pod('u1'), 'deadlineAt');
    await store.compareAndSet('u1', 3, write(3));
    expect((await indexed()).deadline).toBeNull();
    // Nothing to withdraw: the next write touches neither index (one HMGET read what it had).
    await redis.zadd(keys.deadlines(), 9_000, 'u1');
    await store.compareAndSet('u1', 4, write(4));
    expect((await indexed()).deadline).toBe('9000');
  });

  it('moves the name index when a pod is renamed, and only its own entry', async () => {
    const store = new SnapshotStore(redis, { keys: freshKeys() });
    await store.create('u1', write(0));
    await store.compareAndSet('u1', 1, write(1, { namespace: 'team', name: 'renamed' }));
    expect(await store.uidByName('user', 'pod')).toBeNull();
    expect(await store.uidByName('team', 'renamed')).toBe('u1');
    // A newer pod took the old name; renaming u1 again must not remove the newer pod's entry.
    await store.create('u2', write(0, { namespace: 'team', name: 'renamed' }));
    await store.compareAndSet('u1', 2, write(2, { namespace: 'team', name: 'third' }));
    expect(await store.uidByName('team', 'renamed')).toBe('u2');
    expect(await store.uidByName('team', 'third')).toBe('u1');
  });

  it('8 concurrent appliers × 1,000 events over 50 pods lose no update', async () => {
    const keys = freshKeys();
    const appliers = Array.from({ length: 8 }, () => new SnapshotStore(connect(), { keys, historyMaxLen: 10_000 }));
    const uids = Array.from({ length: 50 }, (_, i) => `pod-${i}`);
    const sent = new Map<string, number>(uids.map((uid) => [uid, 0]));
    let conflicts = 0;
    const started = performance.now();
    await Promise.all(
      appliers.map(async (store, a) => {
        for (let i = 0; i < 1_000; i += 1) {
          // Each applier walks the pods in its own order, so they keep colliding on the same pods.
          const uid = uids[(i * 7 + a * 13 + (i % 3) * a) % uids.length] ?? 'pod-0';
          sent.set(uid, (sent.get(uid) ?? 0) + 1);
          const outcome = await store.applyWithRetry(uid, async (current: StoredPod | null) => {
            const counter = ((current?.snapshot as { counter?: number } | undefined)?.counter ?? 0) + 1;
            // Widen the window between load and write, as a real transition does.
            if ((i + a) % 2 === 0) await yieldToLoop();
            return {
              write: write(counter, {
                history: { at: Date.now(), event: 'TICK', from: '', to: '', generation: counter },
              }),
              value: counter,
            };
          });
          expect(outcome.written).toBe(true);
          conflicts += outcome.conflicts;
        }
      }),
    );
    const elapsed = performance.now() - started;
    const reader = new SnapshotStore(redis, { keys });
    const stored = await reader.loadMany(uids);
    const lastFive = await reader.historyMany(uids, 5);
    for (const [i, uid] of uids.entries()) {
      const expected = sent.get(uid) ?? 0;
      expect(stored[i]?.snapshot, uid).toEqual({ counter: expected });
      expect(stored[i]?.gen, uid).toBe(expected);
      const history = await reader.history(uid);
      expect(history.length, uid).toBe(expected);
      // Every counter value written exactly once, in order.
      expect(history.map((h) => h.generation)).toEqual(Array.from({ length: expected }, (_, k) => k + 1));
      // The pipelined read of many pods' last entries (`status`) gives the same tail, oldest first.
      expect(lastFive[i]).toEqual(history.slice(-5));
    }
    expect([...sent.values()].reduce((x, y) => x + y, 0)).toBe(8_000);
    expect(conflicts).toBeGreaterThan(0);
    console.log(
      `store: 8,000 applies over 50 pods by 8 connections in ${elapsed.toFixed(0)} ms ` +
        `(${((8_000 / elapsed) * 1000).toFixed(0)}/s), ${conflicts} CAS conflicts retried`,
    );
  });

  it('caps each history stream (XADD MAXLEN ~)', async () => {
    const store = new SnapshotStore(redis, { keys: freshKeys(), historyMaxLen: 50 });
    await store.create('u1', write(0));
    for (let gen = 1; gen <= 600; gen += 1) {
      const result = await store.compareAndSet(
        'u1',
        gen,
        write(gen, { history: { at: gen, event: 'E', from: 'a', to: 'b' } }),
      );
      expect(result.ok).toBe(true);
    }
    const length = await redis.xlen(store.keys.history('u1'));
    expect(length).toBeGreaterThanOrEqual(50);
    // Approximate trimming drops whole stream nodes (100 entries by default): never far above the cap.
    expect(length).toBeLessThanOrEqual(50 + 100);
    const last = await store.history('u1', 3);
    expect(last.map((h) => h.at)).toEqual([598, 599, 600]);
  });

  it('remove() leaves only the history stream, with a TTL', async () => {
    const keys = freshKeys();
    const store = new SnapshotStore(redis, { keys });
    const leases = new LeaseStore(redis, { keys });
    await store.create('u1', write(0, { history: { at: 1, event: 'POD_UPSERT', from: '', to: 'even' } }));
    await store.compareAndSet('u1', 1, write(1, { history: { at: 2, event: 'TICK', from: 'even', to: 'odd' } }));
    await store.create('u2', write(0, { name: 'other' }));
    expect((await leases.acquire('u1', 'host-a', 1, 5_000)).ok).toBe(true);

    // A remover that read an older gen does not remove.
    expect(await store.remove('u1', 3_600, 1)).toBe('conflict');
    expect(await store.load('u1')).not.toBeNull();

    expect(await store.remove('u1', 3_600, 2)).toBe('removed');
    const left = (await keysUnder(keys.prefix)).filter((key) => key.includes('u1') || key === keys.leases());
    expect(left).toEqual([keys.history('u1')]);
    const ttl = await redis.ttl(keys.history('u1'));
    expect(ttl).toBeGreaterThan(3_500);
    expect(ttl).toBeLessThanOrEqual(3_600);
    expect(await store.history('u1')).toHaveLength(2);
    expect(await store.list()).toEqual(['u2']);
    expect(await store.uidByName('user', 'pod')).toBeNull();
    expect(await store.uidByName('user', 'other')).toBe('u2');
    expect(await leases.get('u1')).toBeNull();
    // Removing again is harmless.
    expect(await store.remove('u1', 3_600)).toBe('absent');
  });

  it('drives the pod machine through the store: start, transitions, history, restore', async () => {
    const store = new SnapshotStore(redis, { keys: freshKeys() });
    const uid = randomUUID();
    const input = {
      uid,
      namespace: 'user',
      name: 'analysis',
      retryLimit: 3,
      backoffBaseMs: 1_000,
      backoffMaxMs: 30_000,
      nodeWaitTimeoutMs: 7_200_000,
      phaseTimeoutMs: 60_000,
    };
    const t0 = 1_700_000_000_000;
    const start = startPod(input, t0);
    expect(
      await store.create(uid, {
        snapshot: persistPod(start.snapshot),
        version: MACHINE_VERSION,
        state: stateOf(start.snapshot),
        namespace: 'user',
        name: 'analysis',
        history: { at: t0, event: 'POD_UPSERT', from: '', to: 'validating', generation: 0 },
      }),
    ).toBe('created');

    const apply = (event: PodEvent) =>
      store.applyWithRetry(uid, (current) => {
        if (!current) throw new Error('pod vanished');
        const restored = restorePod(current.snapshot);
        if (!restored.ok) throw restored.error;
        const result = applyEvent(restored.snapshot, event);
        if (!result.changed) return { value: [] as PodAction[] };
        return {
          value: result.actions,
          write: {
            snapshot: persistPod(result.snapshot),
            version: MACHINE_VERSION,
            state: result.to,
            namespace: result.snapshot.context.namespace,
            name: result.snapshot.context.name,
            history: {
              at: event.at,
              event: event.type,
              from: result.from,
              to: result.to,
              generation: result.snapshot.context.generation,
            },
          },
        };
      });

    await apply({ type: 'STEP_DONE', at: t0 + 1, step: 'validate' });
    const launch = await apply({ type: 'STEP_DONE', at: t0 + 2, step: 'render' });
    expect(launch.value[0]).toEqual({ type: 'runStep', params: { step: 'launch', generation: 1, delayMs: 0 } });
    const stale = await apply({ type: 'SHADOW_UP', at: t0 + 3, generation: 0, host: 'h' });
    expect(stale).toMatchObject({ written: false, value: [] });
    await apply({ type: 'SHADOW_UP', at: t0 + 3, generation: 1, host: 'h' });
    await apply({ type: 'BATCH_HOST', at: t0 + 4, generation: 1, batchHost: 'node-1', jobId: '77' });
    await apply({ type: 'CARRIER_OPEN', at: t0 + 5, generation: 1 });
    await apply({ type: 'FORWARDS_READY', at: t0 + 6, generation: 1 });

    const stored = await store.load(uid);
    expect(stored).toMatchObject({ state: 'active', version: String(MACHINE_VERSION), gen: 7 });
    const history = await store.history(uid);
    expect(history.map((h) => `${h.from}→${h.to}`)).toEqual([
      '→validating',
      'validating→rendering',
      'rendering→launchingShadow',
      'launchingShadow→waitingBatchHost',
      'waitingBatchHost→openingCarrier',
      'openingCarrier→establishingForwards',
      'establishingForwards→active',
    ]);
    const restored = restorePod(stored?.snapshot);
    expect(restored.ok && restored.snapshot.context.batchHost).toBe('node-1');

    // A record written by another machine version: status still has the state, restore says why.
    await store.compareAndSet(uid, 7, {
      snapshot: { version: 99, state: 'holdingShadow', context: {} },
      version: 99,
      state: 'holdingShadow',
      namespace: 'user',
      name: 'analysis',
    });
    const foreign = await store.load(uid);
    expect(foreign).toMatchObject({ state: 'holdingShadow', version: '99' });
    const refused = restorePod(foreign?.snapshot);
    expect(refused.ok).toBe(false);
    if (!refused.ok) expect(refused.error.kind).toBe('unknown-version');
  });
});

describe('LeaseStore', () => {
  it('acquire, renew and release with fencing tokens', async () => {
    const leases = new LeaseStore(redis, { keys: freshKeys(), retainMs: 30_000 });
    const first = await leases.acquire('u1', 'host-a', 1, 5_000);
    if (!first.ok) throw new Error('not granted');
    expect(first.lease).toMatchObject({ uid: 'u1', holder: 'host-a', generation: 1 });

    // Another host cannot take a live lease.
    const other = await leases.acquire('u1', 'host-b', 1, 5_000);
    expect(other).toMatchObject({ ok: false, reason: 'held', current: { holder: 'host-a', token: first.lease.token } });

    // The same holder again (a restarted session on the same host) gets a new token: the old one is fenced.
    const again = await leases.acquire('u1', 'host-a', 2, 5_000);
    if (!again.ok) throw new Error('not granted');
    expect(again.lease.token).toBeGreaterThan(first.lease.token);
    expect(await leases.renew('u1', first.lease.token, 5_000)).toEqual({ ok: false, reason: 'lost' });
    expect(await leases.release('u1', first.lease.token)).toBe(false);

    const renewed = await leases.renew('u1', again.lease.token, 10_000);
    if (!renewed.ok) throw new Error('not renewed');
    expect(renewed.expiresAt).toBeGreaterThan(again.lease.expiresAt);
    expect((await leases.get('u1'))?.expiresAt).toBe(renewed.expiresAt);
    // The key outlives the lease by retainMs, so the reaper sees expired leases.
    const pttl = await redis.pttl(leases.keys.lease('u1'));
    expect(pttl).toBeGreaterThan(30_000);
    expect(pttl).toBeLessThanOrEqual(40_000);

    // An older generation never takes the lease back.
    expect(await leases.acquire('u1', 'host-a', 1, 5_000)).toMatchObject({ ok: false, reason: 'older-generation' });

    expect(await leases.release('u1', again.lease.token)).toBe(true);
    expect(await leases.get('u1')).toBeNull();
    expect((await leases.list()).leases).toEqual([]);
    expect((await leases.acquire('u1', 'host-b', 2, 5_000)).ok).toBe(true);
  });

  it('after Redis lost its data: only re-assertions are granted in the recovery window, and a re-asserted lease turns a second host away', async () => {
    const keys = freshKeys();
    const leases = new LeaseStore(redis, { keys, retainMs: 30_000 });
    const hostEpoch = new RedisEpoch(redis, keys, 1_500);
    const watchEpoch = new RedisEpoch(redis, keys, 1_500);
    // The first look of a process learns the epoch: nothing can have been lost to it.
    expect(await hostEpoch.check()).toEqual({ lost: false, recoverUntil: 0 });
    expect(await watchEpoch.check()).toEqual({ lost: false, recoverUntil: 0 });
    const held = await leases.acquire('u1', 'host-a', 3, 5_000);
    if (!held.ok) throw new Error('not granted');
    // Outside a recovery a free lease is granted to anyone, re-asserting or not.
    expect((await leases.acquire('u0', 'host-b', 1, 5_000)).ok).toBe(true);

    // Redis loses everything (the test deletes this run's keys: a FLUSHALL would hit the other tests).
    const ours = await redis.keys(`${keys.prefix}*`);
    await redis.del(...ours);
    expect(await new RedisEpoch(redis, keys, 1_500).check()).toMatchObject({ lost: false });
    // Each process that knew the old epoch sees the loss once; the window is extended by each.
    const lost = await watchEpoch.check();
    expect(lost.lost).toBe(true);
    expect(await watchEpoch.check()).toMatchObject({ lost: false, recoverUntil: lost.recoverUntil });
    const seenByHost = await hostEpoch.check();
    expect(seenByHost.lost).toBe(true);
    expect(seenByHost.recoverUntil).toBeGreaterThanOrEqual(lost.recoverUntil);

    // The rebuilt record's launch, on another host, is held off while the window is open…
    expect(await leases.acquire('u1', 'host-b', 1, 5_000)).toMatchObject({ ok: false, reason: 'recovering' });
    // …while the host that kept the shadow takes its lease again, at the shadow's generation, with a new token.
    const back = await leases.acquire('u1', 'host-a', 3, 5_000, { reassert: true });
    if (!back.ok) throw new Error('not re-asserted');
    expect(back.lease).toMatchObject({ holder: 'host-a', generation: 3 });
    expect(back.lease.token).toBeGreaterThan(held.lease.token);
    // Another host given the pod's session job learns the shadow lives on (and stands down)…
    expect(await leases.acquire('u1', 'host-b', 3, 5_000)).toMatchObject({
      ok: false,
      reason: 'reasserted',
      current: { holder: 'host-a', generation: 3 },
    });
    // …and once the window closes, free leases are granted again, and a normal grant is not marked.
    await sleep(1_600);
    const fresh = await leases.acquire('u2', 'host-b', 1, 5_000);
    expect(fresh.ok).toBe(true);
    expect(await redis.hget(keys.lease('u2'), 'reasserted')).toBe('0');
    expect(await leases.acquire('u2', 'host-c', 1, 5_000)).toMatchObject({ ok: false, reason: 'held' });
  });

  it('expiry: an expired lease may be taken over and is listed for the reaper', async () => {
    const leases = new LeaseStore(redis, { keys: freshKeys(), retainMs: 30_000 });
    const a = await leases.acquire('u1', 'host-a', 1, 100);
    const b = await leases.acquire('u2', 'host-a', 1, 30_000);
    if (!a.ok || !b.ok) throw new Error('not granted');
    expect((await leases.listExpired()).leases).toEqual([]);
    await sleep(150);

    const expired = await leases.listExpired();
    expect(expired.leases).toEqual([{ ...a.lease, expired: true }]);
    expect(expired.now).toBeGreaterThanOrEqual(a.lease.expiresAt);
    const all = await leases.list();
    expect(all.leases.map((l) => [l.uid, l.expired])).toEqual([
      ['u1', true],
      ['u2', false],
    ]);
    expect([...(await leases.holders()).entries()].map(([h, ls]) => [h, ls.map((l) => l.uid)])).toEqual([
      ['host-a', ['u1', 'u2']],
    ]);

    const taken = await leases.acquire('u1', 'host-b', 1, 5_000);
    expect(taken.ok).toBe(true);
    expect(await leases.renew('u1', a.lease.token, 5_000)).toEqual({ ok: false, reason: 'lost' });
    expect((await leases.listExpired()).leases).toEqual([]);
  });

  it('never hands a token out twice, even after a failover lost the last grants (the counter rolled back)', async () => {
    const leases = new LeaseStore(redis, { keys: freshKeys(), retainMs: 30_000 });
    const counter = leases.keys.leaseToken();
    const before = await redis.get(counter);
    const lost = await leases.acquire('u1', 'host-a', 1, 5_000);
    if (!lost.ok) throw new Error('not granted');
    // What a promoted replica that never got this grant holds: no lease, the counter as it was.
    await redis.del(leases.keys.lease('u1'));
    if (before === null) await redis.del(counter);
    else await redis.set(counter, before);
    // The pod's session is started again elsewhere: its token must not be the lost grant's, or the lost
    // grant's session (still running, with that token) would go on renewing the new holder's lease.
    const next = await leases.acquire('u1', 'host-b', 2, 5_000);
    if (!next.ok) throw new Error('not granted');
    expect(next.lease.token, `lost ${lost.lease.token}, next ${next.lease.token}`).toBeGreaterThan(lost.lease.token);
    expect(await leases.renew('u1', lost.lease.token, 5_000)).toEqual({ ok: false, reason: 'lost' });
    expect(Number.isSafeInteger(next.lease.token)).toBe(true);
  });

  it('an expired lease nobody took is renewed by its own token (a Redis outage must not end a shadow)', async () => {
    const leases = new LeaseStore(redis, { keys: freshKeys(), retainMs: 30_000 });
    const a = await leases.acquire('u1', 'host-a', 1, 100);
    if (!a.ok) throw new Error('not granted');
    await sleep(150);
    expect((await leases.listExpired()).leases.map((l) => l.uid)).toEqual(['u1']);

    const renewed = await leases.renew('u1', a.lease.token, 5_000);
    if (!renewed.ok) throw new Error(`not renewed: ${renewed.reason}`);
    expect(renewed.expiresAt).toBeGreaterThan(a.lease.expiresAt + 5_000);
    const lease = await leases.get('u1');
    expect(lease).toEqual({ ...a.lease, expiresAt: renewed.expiresAt });
    expect((await leases.list()).leases).toEqual([{ ...a.lease, expiresAt: renewed.expiresAt, expired: false }]);
    expect((await leases.listExpired()).leases).toEqual([]);
    // Renewed, it is held again: another host cannot take it.
    expect(await leases.acquire('u1', 'host-b', 1, 5_000)).toMatchObject({ ok: false, reason: 'held' });
    // The key's TTL is set again too (ttl + retain).
    expect(await redis.pttl(leases.keys.lease('u1'))).toBeGreaterThan(30_000);
  });

  it('an expired lease taken by another host or revoked is lost to its old token', async () => {
    const leases = new LeaseStore(redis, { keys: freshKeys(), retainMs: 30_000 });
    const a = await leases.acquire('u1', 'host-a', 1, 100);
    const r = await leases.acquire('u2', 'host-a', 1, 100);
    if (!a.ok || !r.ok) throw new Error('not granted');
    await sleep(150);

    // Taken over while expired: the new token fences the old holder out for good.
    const taken = await leases.acquire('u1', 'host-b', 1, 5_000);
    if (!taken.ok) throw new Error('not taken over');
    expect(await leases.renew('u1', a.lease.token, 5_000)).toEqual({ ok: false, reason: 'lost' });
    expect(await leases.get('u1')).toEqual(taken.lease);

    // Revoked while expired: gone, so the old token renews nothing and nothing comes back.
    expect(await leases.revoke('u2', 1)).toBe(true);
    expect(await leases.renew('u2', r.lease.token, 5_000)).toEqual({ ok: false, reason: 'lost' });
    expect(await leases.get('u2')).toBeNull();
  });

  it('revoke: the control plane deletes a given-up generation’s lease; its holder then loses it', async () => {
    const leases = new LeaseStore(redis, { keys: freshKeys() });
    const held = await leases.acquire('u1', 'host-a', 3, 5_000);
    if (!held.ok) throw new Error('not granted');
    expect(await leases.revoke('u1', 2)).toBe(false);
    expect(await leases.revoke('u1', 3)).toBe(true);
    expect(await leases.renew('u1', held.lease.token, 5_000)).toEqual({ ok: false, reason: 'lost' });
    expect((await leases.acquire('u1', 'host-b', 4, 5_000)).ok).toBe(true);
    expect(await leases.revoke('nobody', 9)).toBe(false);
  });

  it('drops index entries of leases whose keys ran out', async () => {
    const keys = freshKeys();
    const leases = new LeaseStore(redis, { keys, retainMs: 1 });
    expect((await leases.acquire('u1', 'host-a', 1, 50)).ok).toBe(true);
    expect(await redis.zscore(keys.leases(), 'u1')).not.toBeNull();
    await sleep(120);
    expect(await redis.exists(keys.lease('u1'))).toBe(0);
    expect((await leases.list()).leases).toEqual([]);
    expect(await redis.zscore(keys.leases(), 'u1')).toBeNull();
  });
});

describe('HostRegistry', () => {
  it('register, heartbeat, list with staleness, prune, unregister', async () => {
    const hosts = new HostRegistry(redis, { keys: freshKeys(), staleAfterMs: 100 });
    const registeredAt = await hosts.register('host-a', 500, 0, { version: '0.1.0' });
    await hosts.register('host-b', 200);
    let listing = await hosts.list();
    expect(listing.hosts).toEqual([
      {
        id: 'host-a',
        capacity: 500,
        load: 0,
        meta: { version: '0.1.0' },
        startedAt: registeredAt,
        heartbeatAt: registeredAt,
        stale: false,
      },
      expect.objectContaining({ id: 'host-b', capacity: 200, meta: {}, stale: false }),
    ]);

    await sleep(150);
    expect(await hosts.heartbeat('host-a', 42)).toBe(true);
    listing = await hosts.list();
    const [a, b] = listing.hosts;
    expect(a).toMatchObject({ id: 'host-a', load: 42, stale: false, startedAt: registeredAt });
    expect(a?.heartbeatAt).toBeGreaterThan(registeredAt);
    expect(b).toMatchObject({ id: 'host-b', stale: true });

    expect(await hosts.prune()).toEqual(['host-b']);
    expect(await hosts.heartbeat('host-b', 1)).toBe(false);
    expect((await hosts.list()).hosts.map((h) => h.id)).toEqual(['host-a']);
    expect(await hosts.unregister('host-a')).toBe(true);
    expect(await hosts.unregister('host-a')).toBe(false);
    expect((await hosts.list()).hosts).toEqual([]);
  });
});
