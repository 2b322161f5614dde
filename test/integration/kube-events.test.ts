import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { EventRecorder } from '../../src/cluster/event-recorder.js';
import { KUBE_API_ACCESS } from '../../src/cluster/kube-api.js';
import { ANNOTATION } from '../../src/contract/annotations.js';
import { type RunningFleet, startFleet } from '../../src/fleet/fleet.js';
import { silentLogger } from '../../src/log.js';
import type { PodEvent } from '../../src/machines/pod-machine.js';
import { sendEvent } from '../../src/pods/queues.js';
import { EVENT_REASONS } from '../../src/render/kube-events.js';
import { createRedis } from '../../src/store/redis.js';
import type { Obj } from '../fixtures/fake-apiserver.js';
import { privateRedis } from '../fixtures/fleet-harness.js';
import { type KubeHarness, kubeHarness, kubeSite, waitFor } from '../fixtures/kube-harness.js';

const DB = 11;
const pod = (name: string) => ({ uid: `uid-${name}`, namespace: 'user', name });

type EventObj = Obj & {
  type: string;
  reason: string;
  message: string;
  count: number;
  involvedObject: Record<string, string>;
  source: Record<string, string>;
  firstTimestamp: string;
  lastTimestamp: string;
};

describe('Kubernetes Events: the recorder against the fake API server', () => {
  let kube: KubeHarness;
  let clock = Date.parse('2030-01-01T00:00:00Z');
  const eventsOf = (name: string) =>
    kube.api.listEvents('user').filter((e) => (e.involvedObject as { name?: string }).name === name) as EventObj[];
  const recorder = (opts: ConstructorParameters<typeof EventRecorder>[1] extends infer O ? Partial<O> : never = {}) =>
    EventRecorder.fromKubeConfig(kube.kubeConfig(), {
      log: silentLogger(),
      instance: 'fleet-0',
      now: () => clock,
      ...opts,
    });

  beforeAll(async () => {
    kube = await kubeHarness();
  });

  afterAll(async () => {
    await kube?.close();
  });

  it('creates an Event with the reason, type, message and involved pod', async () => {
    const r = recorder();
    r.record(pod('a'), 'Normal', 'ReverseForwardsReady', '2 reverse forward(s) established on node cn01');
    await r.flush();
    const [event, ...more] = eventsOf('a');
    expect(more).toEqual([]);
    expect(event).toMatchObject({
      type: 'Normal',
      reason: 'ReverseForwardsReady',
      message: '2 reverse forward(s) established on node cn01',
      count: 1,
      involvedObject: { apiVersion: 'v1', kind: 'Pod', namespace: 'user', name: 'a', uid: 'uid-a' },
      source: { component: 'backhaul', host: 'fleet-0' },
      reportingComponent: 'backhaul',
      reportingInstance: 'fleet-0',
    });
    expect(event?.metadata.name).toMatch(/^a\.[0-9a-f]+$/);
    expect(event?.firstTimestamp).toBe('2030-01-01T00:00:00.000Z');
  });

  it('aggregates repeats into one Event (count, lastTimestamp) with patches instead of creates', async () => {
    const r = recorder();
    const creates = () => kube.api.calls.filter((c) => c.resource === 'events' && c.verb === 'create').length;
    const before = creates();
    for (let i = 0; i < 5; i += 1) {
      clock += 1_000;
      r.record(pod('b'), 'Warning', 'ReverseSessionFailed', 'carrier lost: connection reset');
      await r.flush();
    }
    const [event, ...more] = eventsOf('b');
    expect(more).toEqual([]);
    expect(event?.count).toBe(5);
    expect(Date.parse(event?.lastTimestamp ?? '') - Date.parse(event?.firstTimestamp ?? '')).toBe(4_000);
    expect(creates() - before).toBe(1);
    expect(
      kube.api.calls.filter((c) => c.resource === 'events' && c.verb === 'patch' && c.name === event?.metadata.name),
    ).toHaveLength(4);
    // Another reason is another Event.
    r.record(pod('b'), 'Normal', 'ReverseForwardsReady', 'ready');
    await r.flush();
    expect(eventsOf('b')).toHaveLength(2);
  });

  it('sends a burst of repeats as few calls carrying the full count', async () => {
    const r = recorder();
    const calls = () => kube.api.calls.filter((c) => c.resource === 'events').length;
    const before = calls();
    for (let i = 0; i < 50; i += 1) r.record(pod('c'), 'Warning', 'ReverseSessionFailed', 'flapping');
    await r.flush();
    expect(eventsOf('c')[0]?.count).toBe(50);
    expect(calls() - before).toBeLessThanOrEqual(3);
  });

  it('combines many different messages of one reason, and holds a flooding pod back (spam filter)', async () => {
    const r = recorder({ similarLimit: 3, burst: 5, refillMs: 60_000 });
    const calls = () => kube.api.calls.filter((c) => c.resource === 'events').length;
    const before = calls();
    for (let i = 0; i < 8; i += 1) {
      r.record(pod('d'), 'Warning', 'ReverseSessionFailed', `failure number ${i}`);
      await r.flush();
    }
    const events = eventsOf('d');
    // 3 distinct messages, then one combined Event; the spam filter allowed 5 calls in all.
    expect(events).toHaveLength(4);
    const combined = events.find((e) => e.message.startsWith('(combined from similar events): '));
    expect(combined?.message).toBe('(combined from similar events): failure number 4');
    expect(combined?.count).toBe(2);
    expect(calls() - before).toBe(5);
    // Held back, not lost: once the bucket refills, the next call carries every occurrence.
    clock += 120_000;
    r.record(pod('d'), 'Warning', 'ReverseSessionFailed', 'failure number 9');
    await r.flush();
    expect(eventsOf('d').find((e) => e.message.startsWith('(combined'))?.count).toBe(6);
  });

  it('starts a new Event after the aggregation window, and when the old one expired on the server', async () => {
    const r = recorder({ aggregateWindowMs: 60_000 });
    r.record(pod('e'), 'Normal', 'ReverseForwardsClosed', 'closed');
    await r.flush();
    clock += 120_000;
    r.record(pod('e'), 'Normal', 'ReverseForwardsClosed', 'closed');
    await r.flush();
    expect(eventsOf('e').map((e) => e.count)).toEqual([1, 1]);
    // The API server drops Events after its TTL: the next repeat creates one again.
    for (const e of eventsOf('e')) kube.api.events.delete(`user/${e.metadata.name}`);
    clock += 1_000;
    r.record(pod('e'), 'Normal', 'ReverseForwardsClosed', 'closed');
    await r.flush();
    expect(eventsOf('e').map((e) => e.count)).toEqual([2]);
  });

  it('never throws when the API server fails', async () => {
    const r = recorder();
    kube.api.failNext(500, 1, (c) => c.resource === 'events');
    r.record(pod('f'), 'Normal', 'ReverseForwardsReady', 'ready');
    await r.flush();
    expect(eventsOf('f')).toEqual([]);
    r.record(pod('f'), 'Normal', 'ReverseForwardsReady', 'ready');
    await r.flush();
    expect(eventsOf('f')[0]?.count).toBe(2);
  });
});

describe('Kubernetes Events from the control role (onTransition)', () => {
  let kube: KubeHarness;
  let redis: Awaited<ReturnType<typeof privateRedis>>;
  let fleet: RunningFleet;
  let disconnect: () => void;
  const at = () => Date.now();
  const eventsOf = (uid: string) =>
    kube.api.listEvents('user').filter((e) => (e.involvedObject as { uid?: string }).uid === uid) as EventObj[];
  const waitReason = (uid: string, reason: string) =>
    waitFor(`Event ${reason} on ${uid}`, () => eventsOf(uid).find((e) => e.reason === reason));
  const upsert = (uid: string, name: string, annotations: Record<string, string>) =>
    sendEvent(fleet.deps.queues, uid, { type: 'POD_UPSERT', namespace: 'user', name, annotations, at: at() });
  const state = async (uid: string) => (await fleet.deps.store.load(uid))?.state;
  const send = (uid: string, event: PodEvent) => sendEvent(fleet.deps.queues, uid, event);

  beforeAll(async () => {
    kube = await kubeHarness();
    redis = await privateRedis(DB);
    const connection = createRedis(redis.url);
    disconnect = () => connection.disconnect();
    const config = kubeSite(redis.url, kube.kubeconfigFile);
    fleet = await startFleet(config, connection, silentLogger(), {
      roles: ['control'],
      bullPrefix: 'bhke',
      reaperEveryMs: 60_000,
    });
  });

  afterAll(async () => {
    await fleet?.stop();
    disconnect?.();
    await redis?.close();
    await kube?.close();
  });

  it('warns about SOCKS, then reports forwards established, torn down and closed', async () => {
    const uid = 'c0ffee00-0000-4000-8000-000000000001';
    await upsert(uid, 'socks-pod', {
      [ANNOTATION.forwards]: 'minio.storage.svc.cluster.local:9000',
      [ANNOTATION.socksPort]: '11080',
    });
    const socks = await waitReason(uid, EVENT_REASONS.socks);
    expect(socks).toMatchObject({
      type: 'Warning',
      involvedObject: { kind: 'Pod', namespace: 'user', name: 'socks-pod', uid },
    });
    expect(socks.message).toContain('11080');
    await waitFor('launchingShadow', async () => (await state(uid)) === 'launchingShadow');
    await send(uid, { type: 'BATCH_HOST', batchHost: 'cn01', jobId: '4242', generation: 1, at: at() });
    // Events are applied concurrently: let this one land before the next.
    await waitFor('openingCarrier', async () => (await state(uid)) === 'openingCarrier');
    await send(uid, { type: 'FORWARDS_READY', generation: 1, at: at() });
    const ready = await waitReason(uid, EVENT_REASONS.forwardsEstablished);
    expect(ready.type).toBe('Normal');
    expect(ready.message).toContain('cn01');
    expect(ready.message).toContain('4242');
    await send(uid, { type: 'POD_DELETED', at: at() });
    const tearing = await waitReason(uid, EVENT_REASONS.teardownStarted);
    expect(tearing).toMatchObject({ type: 'Normal' });
    expect(tearing.message).toContain('pod-deleted');
    expect(await waitReason(uid, EVENT_REASONS.tornDown)).toMatchObject({ type: 'Normal' });
  });

  it('warns when forwarding is refused', async () => {
    const uid = 'c0ffee00-0000-4000-8000-000000000002';
    await upsert(uid, 'bad-pod', { [ANNOTATION.forwards]: 'dns.kube-system.svc:53/udp' });
    const refused = await waitReason(uid, EVENT_REASONS.refused);
    expect(refused.type).toBe('Warning');
    expect(refused.message).toContain('TCP only');
    expect(refused.message).toContain(ANNOTATION.forwards);
  });

  it('warns when a session fails; the same failure again is the same Event, counted', async () => {
    const uid = 'c0ffee00-0000-4000-8000-000000000003';
    const generation = async () => {
      const stored = await fleet.deps.store.load(uid);
      return (stored?.snapshot as { context?: { generation?: number } } | undefined)?.context?.generation ?? 0;
    };
    await upsert(uid, 'flaky-pod', { [ANNOTATION.forwards]: 'minio.storage.svc.cluster.local:9000' });
    await waitFor('launchingShadow', async () => (await state(uid)) === 'launchingShadow');
    for (let g = 1; g <= 3; g += 1) {
      await waitFor(`generation ${g}`, async () => (await generation()) === g);
      await send(uid, {
        type: 'SESSION_FAILED',
        generation: g,
        error: { kind: 'carrier-lost', message: 'connection reset by login.example.org', permanent: false },
        at: at(),
      });
    }
    await waitFor('generation 4', async () => (await generation()) === 4);
    // Reports of an old generation are ignored by the machine: no transition, no Event.
    for (let i = 0; i < 5; i += 1) {
      await send(uid, { type: 'CARRIER_LOST', reason: 'stale report', generation: 1, at: at() });
    }
    await new Promise((r) => setTimeout(r, 500));
    await fleet.cluster.recorder?.flush();
    const failed = eventsOf(uid).filter((e) => e.reason === EVENT_REASONS.sessionFailed);
    expect(failed).toHaveLength(1);
    expect(failed[0]).toMatchObject({ type: 'Warning', count: 3 });
    expect(failed[0]?.message).toContain('connection reset');
    expect(failed[0]?.message).toContain('relaunching');
  });

  it('used only the calls its RBAC grants', () => {
    const granted = new Set(Object.entries(KUBE_API_ACCESS).flatMap(([r, verbs]) => verbs.map((v) => `${r}.${v}`)));
    for (const used of kube.api.usedAccess()) expect(granted).toContain(used);
  });
});
