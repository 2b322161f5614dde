import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { podDetail } from '../../src/cli/pod-status.js';
import { formatDetail } from '../../src/cli/status-format.js';
import { silentLogger } from '../../src/log.js';
import type { PodEvent } from '../../src/machines/pod-machine.js';
import { type FleetDeps, fleetDeps } from '../../src/pods/fleet-deps.js';
import { jobIds } from '../../src/pods/queues.js';
import { forgetPod } from '../../src/workers/effects.js';
import { OutboxSweeper } from '../../src/workers/outbox-sweeper.js';
import { applyPodEvent } from '../../src/workers/pod-events.js';
import { reap } from '../../src/workers/reaper.js';
import { runStep } from '../../src/workers/step-runner.js';
import { controlOnlyConfig, drive, eventsUpTo, FORWARDS } from '../../tools/sandbox/control-only.js';
import { privateRedis } from '../fixtures/fleet-harness.js';

/** Repairs and guards of the control plane against real Redis and BullMQ: the reaper, stale events. */
const DB = 5;
const config = controlOnlyConfig(DB);

let redis: Awaited<ReturnType<typeof privateRedis>>;
let deps: FleetDeps;
let n = 0;
const uid = () => `rp${process.pid.toString(16)}-0000-4000-8000-${(n++).toString(16).padStart(12, '0')}`;

beforeAll(async () => {
  redis = await privateRedis(DB);
  deps = fleetDeps(config, redis.redis, silentLogger(), { keyPrefix: 'rp:', bullPrefix: 'rp' });
});
afterAll(async () => {
  await deps?.queues.close();
  await redis?.close();
});

/** An active pod with neither lease nor session job: its session ended, or its host vanished. */
async function activePod(): Promise<string> {
  const podUid = uid();
  await drive(deps, podUid, eventsUpTo('active', Date.now(), podUid.slice(0, 12)));
  expect((await deps.store.load(podUid))?.state).toBe('active');
  return podUid;
}

async function carrierLostFor(podUid: string): Promise<string[]> {
  const events = (await deps.queues.events.waiting(podUid)).map((e) => JSON.parse(e.event) as { type: string });
  return events.filter((e) => e.type === 'CARRIER_LOST').map((e) => e.type);
}

describe('reaper: a shadow without a session host', () => {
  it('a missing lease counts from the pod’s last change: no CARRIER_LOST at once, one after the grace', async () => {
    const podUid = await activePod();
    await reap(deps, { full: false });
    // The session's own report (sent just before it released its lease) must decide, not the reaper.
    expect(await carrierLostFor(podUid)).toEqual([]);
    await reap({ ...deps, now: () => Date.now() + 25_000 }, { full: false });
    expect(await carrierLostFor(podUid)).toEqual(['CARRIER_LOST']);
  });

  it('a live lease keeps it; an expired one past the grace does not', async () => {
    const podUid = await activePod();
    expect((await deps.leases.acquire(podUid, 'live-host', 1, 60_000)).ok).toBe(true);
    await reap({ ...deps, now: () => Date.now() + 25_000 }, { full: false });
    expect(await carrierLostFor(podUid)).toEqual([]);
    await reap({ ...deps, now: () => Date.now() + 85_000 }, { full: false });
    expect(await carrierLostFor(podUid)).toEqual(['CARRIER_LOST']);
  });

  it('a released lease has the pod looked at once the grace is over', async () => {
    const podUid = await activePod();
    const lease = await deps.leases.acquire(podUid, 'ending-host', 1, 60_000);
    if (!lease.ok) throw new Error('no lease');
    // Its first look: the lease is live, so nothing until the lease says otherwise.
    await reap({ ...deps, now: () => Date.now() + 25_000 }, { full: false });
    expect(await redis.redis.zscore(deps.keys.review(), podUid)).toBeNull();
    const releasedAt = Date.now();
    expect(await deps.leases.release(podUid, lease.lease.token)).toBe(true);
    const due = Number(await redis.redis.zscore(deps.keys.review(), podUid));
    expect(due).toBeGreaterThanOrEqual(releasedAt + 19_000);
    expect(due).toBeLessThanOrEqual(Date.now() + 21_000);
    await reap({ ...deps, now: () => Date.now() + 25_000 }, { full: false });
    expect(await carrierLostFor(podUid)).toEqual(['CARRIER_LOST']);
  });
});

describe('reaper: reads only what is due', () => {
  it('200 active pods with live leases: looked at once each, then no run reads any of them', async () => {
    const pods: string[] = [];
    for (let i = 0; i < 200; i += 1) {
      const podUid = await activePod();
      expect((await deps.leases.acquire(podUid, 'busy-host', 1, 600_000)).ok).toBe(true);
      pods.push(podUid);
    }
    const read: string[] = [];
    const counting: FleetDeps = {
      ...deps,
      store: Object.assign(Object.create(deps.store), {
        loadMany: (uids: readonly string[]) => {
          read.push(...uids);
          return deps.store.loadMany(uids);
        },
      }),
    };
    // Each stored state asked for a look after the lease grace: the first due run reads each pod once.
    await reap({ ...counting, now: () => Date.now() + 25_000 }, { full: false });
    const mine = (uids: string[]) => uids.filter((u) => pods.includes(u));
    expect(mine(read).sort()).toEqual([...pods].sort());
    expect(await carrierLostFor(pods[0] ?? '')).toEqual([]);
    // Steady state: nothing of them is due, so nothing of them is read.
    read.length = 0;
    await reap({ ...counting, now: () => Date.now() + 120_000 }, { full: false });
    expect(mine(read)).toEqual([]);
    // A full pass (a worker's first, and every ten minutes) still reads all of them.
    await reap({ ...counting, now: () => Date.now() + 120_000 }, { full: true });
    expect(mine(read).sort()).toEqual([...pods].sort());
    for (const podUid of pods) await forgetPod(deps, podUid, 1);
  }, 60_000);

  it('a step whose job was lost is asked for again after the grace, and its pod looked at again after that', async () => {
    const podUid = uid();
    await drive(deps, podUid, eventsUpTo('launchingShadow', Date.now(), podUid.slice(0, 12)).slice(0, 2));
    expect((await deps.store.load(podUid))?.state).toBe('rendering');
    const stepJob = jobIds.step(podUid, 'render', 0);
    await deps.queues.steps.remove(stepJob);
    await reap({ ...deps, now: () => Date.now() + 30_000 }, { full: false });
    expect(await deps.queues.steps.getJob(stepJob)).toBeUndefined();
    await reap({ ...deps, now: () => Date.now() + 65_000 }, { full: false });
    expect((await deps.queues.steps.getJob(stepJob))?.data).toMatchObject({ uid: podUid, step: 'render' });
    // Run as a job, render is the same function the control worker runs inline: its result is the event.
    expect(await runStep(deps, podUid, 'render', 0)).toBe('done');
    const reported = (await deps.queues.events.waiting(podUid)).map((e) => JSON.parse(e.event) as { type: string });
    expect(reported.map((e) => ({ type: e.type, step: (e as { step?: string }).step }))).toContainEqual({
      type: 'STEP_DONE',
      step: 'render',
    });
    const next = Number(await redis.redis.zscore(deps.keys.review(), podUid));
    expect(next).toBeGreaterThan(Date.now() + 60_000);
    await forgetPod(deps, podUid, 0);
    expect(await redis.redis.zscore(deps.keys.review(), podUid)).toBeNull();
  });
});

describe('events that arrive after their pod is gone', () => {
  it('a POD_UPSERT older than the pod’s end starts no machine; one sent after it (a resubmission) does', async () => {
    const podUid = await activePod();
    const upsertAt = Date.now();
    const t = upsertAt + 10;
    await applyPodEvent(deps, podUid, { type: 'TEARDOWN', reason: 'test', at: t });
    const done = await applyPodEvent(deps, podUid, { type: 'STEP_DONE', step: 'teardown', generation: 1, at: t + 1 });
    expect(done).toMatchObject({ kind: 'applied', to: 'done' });
    await forgetPod(deps, podUid, 1);
    expect(await deps.store.load(podUid)).toBeNull();

    const upsert = (at: number): PodEvent => ({
      type: 'POD_UPSERT',
      namespace: 'user',
      name: 'late',
      annotations: FORWARDS,
      at,
    });
    // Queued by the watcher before the deletion went through, taken after it.
    expect(await applyPodEvent(deps, podUid, upsert(upsertAt))).toEqual({ kind: 'ignored', state: 'done' });
    expect(await deps.store.load(podUid)).toBeNull();
    expect((await deps.store.history(podUid)).at(-1)?.to).toBe('done');
    // The same pod submitted again later is a new life.
    expect(await applyPodEvent(deps, podUid, upsert(t + 5_000))).toMatchObject({ kind: 'applied', to: 'validating' });
    await deps.store.remove(podUid, 1);
  });
});

describe('outbox: effects stored with the state that asked for them', () => {
  const launchOf = (podUid: string) => jobIds.step(podUid, 'launch', 1);

  /** A pod brought to launchingShadow by applying events only: its launch effect is stored, not run. */
  async function launching(): Promise<{ podUid: string; gen: number }> {
    const podUid = uid();
    const last = await drive(deps, podUid, eventsUpTo('launchingShadow', Date.now(), podUid.slice(0, 12)));
    if (last.kind !== 'applied' || last.to !== 'launchingShadow') throw new Error(JSON.stringify(last));
    return { podUid, gen: last.gen };
  }

  it('a transition’s effects are in the record with it; clearing by an older gen does nothing', async () => {
    const { podUid, gen } = await launching();
    const stored = await deps.store.load(podUid);
    expect(stored?.gen).toBe(gen);
    expect(stored?.outbox).toEqual([{ type: 'runStep', params: { step: 'launch', generation: 1, delayMs: 0 } }]);
    expect(await redis.redis.zscore(deps.keys.outbox(), podUid)).not.toBeNull();
    // `status POD` shows what the pod waits for: its deadline and the effects not run yet.
    const detail = await podDetail(deps, podUid);
    expect(detail?.deadline).toEqual({ name: 'launchingShadow', at: expect.any(Number) });
    expect(detail?.pendingEffects?.since).toBeGreaterThan(Date.now() - 60_000);
    const text = formatDetail(detail as NonNullable<typeof detail>);
    expect(text).toMatch(/\ndeadline {4}launchingShadow in \d+[smh]\n/);
    expect(text).toMatch(/\neffects {5}runStep launch \(generation 1\), not run for \d+[smh]\n/);
    expect(await deps.store.clearOutbox(podUid, gen - 1)).toBe(false);
    expect(await deps.store.clearOutbox(podUid, gen)).toBe(true);
    expect(formatDetail((await podDetail(deps, podUid)) as NonNullable<typeof detail>)).toContain('\neffects     -\n');
    expect((await deps.store.load(podUid))?.outbox).toBeNull();
    expect(await redis.redis.zscore(deps.keys.outbox(), podUid)).toBeNull();
    // A transition without effects leaves no outbox.
    const up = await applyPodEvent(deps, podUid, { type: 'SHADOW_UP', host: 'h', generation: 1, at: Date.now() });
    expect(up).toMatchObject({ kind: 'applied', actions: [] });
    expect((await deps.store.load(podUid))?.outbox).toBeNull();
    await deps.store.remove(podUid, 1);
  });

  it('effects a dead worker left are run by one of two sweepers once they are old enough, then cleared', async () => {
    const { podUid } = await launching();
    // The worker "died" here: the state is stored, its launch step was never queued.
    expect(await deps.queues.steps.getJob(launchOf(podUid))).toBeUndefined();
    const a = new OutboxSweeper(deps, 300);
    const b = new OutboxSweeper(deps, 300);
    expect(await a.sweep()).toBe(0); // too fresh: its writer may still be running them
    await new Promise((r) => setTimeout(r, 400));
    expect((await Promise.all([a.sweep(), b.sweep()])).sort()).toEqual([0, 1]);
    // Launch ran with the swept effects: the shadow's session job is queued (no launch step job).
    expect(await deps.queues.steps.getJob(launchOf(podUid))).toBeUndefined();
    const job = await deps.queues.sessions.getJob(jobIds.session(podUid, 1));
    expect(job?.data).toMatchObject({ uid: podUid, generation: 1 });
    expect((await deps.store.load(podUid))?.outbox).toBeNull();
    expect(await redis.redis.zscore(deps.keys.outbox(), podUid)).toBeNull();
    await new Promise((r) => setTimeout(r, 400));
    expect(await a.sweep()).toBe(0);
    await job?.remove();
    await deps.store.remove(podUid, 1);
    expect(await redis.redis.zscore(deps.keys.outbox(), podUid)).toBeNull();
  });
});
