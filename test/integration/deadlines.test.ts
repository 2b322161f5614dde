import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { silentLogger } from '../../src/log.js';
import type { PodEvent } from '../../src/machines/pod-machine.js';
import { backoffDelay } from '../../src/machines/pod-rules.js';
import { type FleetDeps, fleetDeps } from '../../src/pods/fleet-deps.js';
import { jobIds, sendEvent } from '../../src/pods/queues.js';
import { ControlWorker } from '../../src/workers/control-worker.js';
import { DeadlineClock } from '../../src/workers/deadline-clock.js';
import { applyPodEvent } from '../../src/workers/pod-events.js';
import { controlOnlyConfig, drive, eventsUpTo, FORWARDS } from '../../tools/sandbox/control-only.js';
import { privateRedis, waitForPodState } from '../fixtures/fleet-harness.js';

/**
 * Deadlines are stored with the state that holds them (redis/pod-cas.lua indexes context.deadline) and
 * delivered by the control role's DeadlineClock; step jobs that use up their retries are reported to
 * the machine. The control role only: no SSH is made (the session host is played by the test).
 */
const DB = 8;
const config = controlOnlyConfig(DB, { PhaseTimeout: '2s', RetryBackoff: '100ms' });

let redis: Awaited<ReturnType<typeof privateRedis>>;
let n = 0;
const uid = () => `dl${process.pid.toString(16)}-0000-4000-8000-${(n++).toString(16).padStart(12, '0')}`;

beforeAll(async () => {
  redis = await privateRedis(DB);
});
afterAll(async () => {
  await redis?.close();
});

describe('deadline index and clock', () => {
  let deps: FleetDeps;
  beforeAll(() => {
    deps = fleetDeps(config, redis.redis, silentLogger(), { keyPrefix: 'dlc:', bullPrefix: 'dlc' });
  });
  afterAll(async () => {
    await deps?.queues.close();
  });

  it('a due deadline is claimed by one of two clocks, once, and claimed again only after its claim ran out', async () => {
    const podUid = uid();
    const past = Date.now() - 60_000;
    const result = await drive(deps, podUid, eventsUpTo('launchingShadow', past));
    expect(result).toMatchObject({ kind: 'applied', to: 'launchingShadow' });
    expect(Number(await redis.redis.zscore(deps.keys.deadlines(), podUid))).toBe(past + 2_000);

    const a = new DeadlineClock(deps, 1_500);
    const b = new DeadlineClock(deps, 1_500);
    const sent = await Promise.all([a.tick(), b.tick()]);
    expect(sent.sort()).toEqual([0, 1]);
    const events = (await deps.queues.events.waiting(podUid)).map((e) => JSON.parse(e.event) as PodEvent);
    expect(events).toEqual([{ type: 'DEADLINE', name: 'launchingShadow', generation: 1, at: expect.any(Number) }]);
    // Not answered (the event is still queued): delivered again once the claim runs out, not before.
    expect(await a.tick()).toBe(0);
    await new Promise((r) => setTimeout(r, 1_600));
    expect(await b.tick()).toBe(1);

    // Delivered: the machine relaunches, and the new state's deadline replaces the old in the index.
    const relaunched = await applyPodEvent(deps, podUid, events[0]!);
    expect(relaunched).toMatchObject({ kind: 'applied', to: 'launchingShadow' });
    const context = relaunched.kind === 'applied' ? relaunched.context : undefined;
    expect(context?.generation).toBe(2);
    expect(Number(await redis.redis.zscore(deps.keys.deadlines(), podUid))).toBe(context?.deadline?.at);
    // A DEADLINE of the generation before is stale: no transition.
    expect((await applyPodEvent(deps, podUid, events[0]!)).kind).toBe('ignored');
    await deps.queues.events.drop((await deps.queues.events.waiting(podUid)).map((e) => e.id));
  });

  it('a deadline withdrawn by a new state is never delivered, and a forgotten pod leaves no entry', async () => {
    const podUid = uid();
    const past = Date.now() - 60_000;
    await drive(deps, podUid, eventsUpTo('waitingBatchHost', past));
    expect(await redis.redis.zscore(deps.keys.deadlines(), podUid)).not.toBeNull();
    // active holds no deadline.
    const active = await drive(deps, podUid, [
      { type: 'BATCH_HOST', batchHost: 'n1', jobId: '1', generation: 1, at: past },
      { type: 'CARRIER_OPEN', generation: 1, at: past },
      { type: 'FORWARDS_READY', generation: 1, at: past },
    ]);
    expect(active).toMatchObject({ kind: 'applied', to: 'active' });
    expect(await redis.redis.zscore(deps.keys.deadlines(), podUid)).toBeNull();
    expect(await new DeadlineClock(deps).tick()).toBe(0);

    const other = uid();
    await drive(deps, other, eventsUpTo('launchingShadow', Date.now()));
    expect(await redis.redis.zscore(deps.keys.deadlines(), other)).not.toBeNull();
    await deps.store.remove(other, 1);
    expect(await redis.redis.zscore(deps.keys.deadlines(), other)).toBeNull();
    await deps.store.remove(podUid, 1);
  });
});

describe('the control worker delivers deadlines and reports steps that used up their retries', () => {
  let deps: FleetDeps;
  let control: ControlWorker;
  beforeAll(() => {
    deps = fleetDeps(config, redis.redis, silentLogger(), { keyPrefix: 'dlw:', bullPrefix: 'dlw' });
    control = new ControlWorker(deps, { events: redis.redis, steps: redis.redis }, { convergence: { everyMs: 100 } });
  });
  afterAll(async () => {
    await control?.close();
    await deps?.queues.close();
  });

  it('a shadow that never comes up is relaunched at its phase deadline, until the budget is spent', async () => {
    const podUid = uid();
    const t0 = Date.now();
    await sendEvent(deps.queues, podUid, {
      type: 'POD_UPSERT',
      namespace: 'user',
      name: 'never-up',
      annotations: FORWARDS,
      at: t0,
    });
    // Nobody takes the session jobs: each launch's 2 s deadline relaunches, RetryLimit launches, then failed.
    await waitForPodState({ deps }, podUid, 'failed', 45_000);
    const history = await deps.store.history(podUid);
    const deadlines = history.filter((h) => h.event === 'DEADLINE');
    const limit = config.Backhaul.RetryLimit;
    expect(deadlines.map((h) => `${h.from}→${h.to}`)).toEqual([
      ...Array.from({ length: limit - 1 }, () => 'launchingShadow→launchingShadow'),
      'launchingShadow→failed',
    ]);
    // Delivered on time: each within 2 s of falling due (the clock polls every 100 ms; CI is busy). Each
    // launch's deadline counts from the end of its backoff.
    const launches = history.filter((h) => h.to === 'launchingShadow');
    for (const [i, d] of deadlines.entries()) {
      const due = launches[i]!.at + backoffDelay(i, 100, config.Backhaul.RetryBackoffMax) + 2_000;
      expect(d.at).toBeGreaterThanOrEqual(due);
      expect(d.at).toBeLessThan(due + 2_000);
    }
    expect(await redis.redis.zscore(deps.keys.deadlines(), podUid)).toBeNull();
    // The worker ran the effects of every transition and cleared them from the record itself (within a
    // second, where the outbox sweep would only take them after 5 s).
    const cleared = Date.now() + 1_000;
    while ((await redis.redis.zscore(deps.keys.outbox(), podUid)) !== null && Date.now() < cleared) {
      await new Promise((r) => setTimeout(r, 50));
    }
    expect(await redis.redis.zscore(deps.keys.outbox(), podUid)).toBeNull();
    expect((await deps.store.load(podUid))?.outbox).toBeNull();
    // What an operator's Prometheus sees of it.
    const text = await deps.metrics.registry.metrics();
    const sent = Number(/^backhaul_deadlines_sent_total\{name="launchingShadow"\} (\d+)$/m.exec(text)?.[1]);
    expect(sent).toBeGreaterThanOrEqual(limit);
    expect(text).toMatch(/^backhaul_transitions_total\{to="failed",event="DEADLINE"\} 1$/m);
    expect(text).toMatch(/^backhaul_pods\{state="failed"\} 1$/m);
    await sendEvent(deps.queues, podUid, { type: 'TEARDOWN', reason: 'test', at: Date.now() });
    await waitForPodState({ deps }, podUid, null, 30_000);
  }, 60_000);

  it('events of one pod taken together are applied in queue order, one at a time (no CAS conflict)', async () => {
    const podUid = uid();
    const conflictsBefore = (await deps.metrics.casConflicts.get()).values[0]?.value ?? 0;
    const names = Array.from({ length: 30 }, (_, i) => `renamed-${i}`);
    await control.events.pause();
    for (const name of names) {
      await sendEvent(deps.queues, podUid, {
        type: 'POD_UPSERT',
        namespace: 'user',
        name,
        annotations: FORWARDS,
        at: Date.now(),
      });
    }
    control.events.resume();
    const deadline = Date.now() + 15_000;
    while ((await deps.queues.events.waiting()).length > 0) {
      if (Date.now() > deadline) throw new Error('events not processed');
      await new Promise((r) => setTimeout(r, 50));
    }
    // The last one sent is the name stored: no earlier event was applied after it.
    expect((await deps.store.load(podUid))?.name).toBe('renamed-29');
    expect((await deps.metrics.casConflicts.get()).values[0]?.value ?? 0).toBe(conflictsBefore);
    await sendEvent(deps.queues, podUid, { type: 'TEARDOWN', reason: 'test', at: Date.now() });
    await waitForPodState({ deps }, podUid, null, 20_000);
  }, 30_000);

  it('a teardown step failing on every attempt fails the pod with its error; RETRY after the fix ends it', async () => {
    const podUid = uid();
    await sendEvent(deps.queues, podUid, {
      type: 'POD_UPSERT',
      namespace: 'user',
      name: 'bad-lease',
      annotations: FORWARDS,
      at: Date.now(),
    });
    await waitForPodState({ deps }, podUid, 'launchingShadow', 10_000);
    // A real Redis failure: the lease key holds a string, so revoking it (teardown's first act) errors.
    await redis.redis.set(deps.keys.lease(podUid), 'not a hash');
    await control.steps.pause();
    await sendEvent(deps.queues, podUid, { type: 'TEARDOWN', reason: 'test', at: Date.now() });
    await waitForPodState({ deps }, podUid, 'tearingDown', 10_000);
    // The queued teardown job, with fewer and quicker retries than the fleet's, so the test is short.
    const job = await deps.queues.steps.getJob(jobIds.step(podUid, 'teardown', 1));
    expect(job).toBeTruthy();
    await job!.remove();
    await deps.queues.steps.add(
      'teardown',
      { uid: podUid, step: 'teardown', generation: 1 },
      { jobId: jobIds.step(podUid, 'teardown', 1), attempts: 2, backoff: { type: 'fixed', delay: 100 } },
    );
    control.steps.resume();
    await waitForPodState({ deps }, podUid, 'failed', 15_000);
    const stored = await deps.store.load(podUid);
    const lastError = (stored?.snapshot as { context: { lastError: { kind: string; message: string } } }).context
      .lastError;
    expect(lastError.kind).toBe('step-failed');
    expect(lastError.message).toMatch(/^teardown failed 2 time\(s\): .*WRONGTYPE/);
    expect(await deps.metrics.registry.metrics()).toMatch(/^backhaul_steps_exhausted_total\{step="teardown"\} 1$/m);

    await redis.redis.del(deps.keys.lease(podUid));
    await sendEvent(deps.queues, podUid, { type: 'RETRY', at: Date.now() });
    await waitForPodState({ deps }, podUid, null, 20_000);
  }, 45_000);
});
