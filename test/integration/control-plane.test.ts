import type { Server } from 'node:net';
import type { Queue } from 'bullmq';
import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type PodDetail, podDetail } from '../../src/cli/pod-status.js';
import { formatDetail } from '../../src/cli/status-format.js';
import { parseSiteConfig, type SiteConfig } from '../../src/contract/site-config.js';
import type { RunningFleet } from '../../src/fleet/fleet.js';
import { silentLogger } from '../../src/log.js';
import type { PodAction, PodEvent } from '../../src/machines/pod-machine.js';
import { type FleetDeps, fleetDeps } from '../../src/pods/fleet-deps.js';
import { jobIds, sendEvent } from '../../src/pods/queues.js';
import { runEffects } from '../../src/workers/effects.js';
import { type ApplyResult, applyPodEvent } from '../../src/workers/pod-events.js';
import { parseStoredPlan, renderPlan, siteDigest } from '../../src/workers/pod-plan.js';
import { runStep } from '../../src/workers/step-runner.js';
import { keysNaming, queueEntriesNaming } from '../../tools/demo/leftovers.js';
import {
  LOOPBACK_ENDPOINT_POLICY,
  type LoopbackSite,
  NO_CLUSTER_CHECKS,
  startLoopbackSite,
} from '../../tools/sandbox/loopback-site.js';
import {
  echoServer,
  exists,
  type Harness,
  jobScript,
  PYTHON,
  planFor,
  uid,
  waitFor,
} from '../../tools/sandbox/shadow-harness.js';
import { cancelSubmittedJobs, sbatch, scancel } from '../../tools/sandbox/slurm.js';
import { inProcessFleet, privateRedis, upsert, waitForPodState } from '../fixtures/fleet-harness.js';

const DB = 6;
const ALL_STATES = ['wait', 'waiting', 'active', 'delayed', 'prioritized', 'completed', 'failed'] as const;

/** Every job of QUEUE that belongs to pod UID, oldest first. */
async function jobsOf<T extends { uid: string }>(queue: Queue<T>, podUid: string) {
  const jobs = (await queue.getJobs([...ALL_STATES], 0, -1, true)).filter((j) => j?.data?.uid === podUid);
  const unique = new Map(jobs.map((j) => [j.id, j]));
  return [...unique.values()].sort((a, b) => a.timestamp - b.timestamp || Number(a.id) - Number(b.id));
}

function siteConfig(site: LoopbackSite, redisUrl: string): SiteConfig {
  return parseSiteConfig({
    Network: {
      SSH: {
        ...site.siteConfig.Network.SSH,
        Reverse: { ...site.siteConfig.Network.SSH.Reverse, PythonPath: PYTHON, WaitForForwards: '60s' },
      },
    },
    Backhaul: {
      EndpointPolicy: LOOPBACK_ENDPOINT_POLICY,
      Kubernetes: NO_CLUSTER_CHECKS,
      Redis: { URL: redisUrl },
      KeepaliveInterval: '1s',
      SocketCheckInterval: '1s',
      LeaseTTL: '3s',
      RetryBackoff: '200ms',
    },
  });
}

let redis: Awaited<ReturnType<typeof privateRedis>>;
let site: LoopbackSite;
let config: SiteConfig;

beforeAll(async () => {
  redis = await privateRedis(DB);
  site = await startLoopbackSite({ nodeForwarding: 'allowed' });
  config = siteConfig(site, redis.url);
}, 120_000);

afterAll(async () => {
  await cancelSubmittedJobs().catch(() => undefined);
  await site?.stop();
  await redis?.close();
});

/**
 * Without workers: the test plays the control worker (apply an event, run its effects) and runs every
 * step job twice, in a row and at once, checking that the second run is stale or changes nothing.
 * Keys and queues under their own prefixes, so the live fleet below never sees them.
 */
describe('control plane: steps and effects run twice give the same result', () => {
  let deps: FleetDeps;

  beforeAll(() => {
    deps = fleetDeps(config, redis.redis, silentLogger(), { keyPrefix: 'bhx:', bullPrefix: 'bhx' });
  });
  afterAll(async () => {
    await deps?.queues.close();
  });

  /** Applies every waiting event of the pod, oldest first, as the events worker would (effects not run). */
  async function deliver(podUid: string): Promise<ApplyResult[]> {
    const results: ApplyResult[] = [];
    for (const entry of await deps.queues.events.waiting(podUid)) {
      results.push(await applyPodEvent(deps, podUid, JSON.parse(entry.event)));
      await deps.queues.events.drop([entry.id]);
    }
    return results;
  }

  async function apply(podUid: string, event: PodEvent): Promise<ApplyResult & { kind: 'applied' }> {
    const result = await applyPodEvent(deps, podUid, event);
    if (result.kind !== 'applied') throw new Error(`${event.type}: ${JSON.stringify(result)}`);
    return result;
  }

  /** The pod's entry in the deadline index (ms), or null. */
  async function deadlineOf(podUid: string): Promise<number | null> {
    const score = await redis.redis.zscore(deps.keys.deadlines(), podUid);
    return score === null ? null : Number(score);
  }

  /** runEffects with the same actions: twice in a row, then twice at once. */
  async function effectsFourTimes(podUid: string, actions: PodAction[]): Promise<void> {
    await runEffects(deps, podUid, actions);
    await runEffects(deps, podUid, actions);
    await Promise.all([runEffects(deps, podUid, actions), runEffects(deps, podUid, actions)]);
  }

  it('every launch serves the plan rendering stored; under another site configuration launch renders it again and says so', async () => {
    const podUid = uid();
    const annotations = { 'interlink.eu/reverse-forwards': '15401:minio.user.svc.cluster.local:9000' };
    const t0 = Date.now();
    const started = await apply(podUid, { type: 'POD_UPSERT', namespace: 'user', name: 'plan', annotations, at: t0 });
    await apply(podUid, { type: 'STEP_DONE', step: 'validate', generation: 0, at: t0 + 1 });
    // A plan told apart from one rendered now: the stored one must be what every launch serves.
    const rendered = renderPlan(started.context, config);
    const marked = { site: rendered.site, plan: { ...rendered.plan, name: 'as-stored' } };
    const launching = await apply(podUid, {
      type: 'STEP_DONE',
      step: 'render',
      generation: 0,
      plan: marked,
      at: t0 + 2,
    });
    expect(launching.to).toBe('launchingShadow');
    await runEffects(deps, podUid, launching.actions);
    const planOfSession = async (generation: number) =>
      (await jobsOf(deps.queues.sessions, podUid)).find((j) => j.id === jobIds.session(podUid, generation))?.data.plan;
    expect((await planOfSession(1))?.name).toBe('as-stored');

    // A relaunch (the carrier lost) serves the same plan.
    await apply(podUid, { type: 'SHADOW_UP', host: 'host-x', generation: 1, at: t0 + 3 });
    const second = await apply(podUid, { type: 'CARRIER_LOST', reason: 'test', generation: 1, at: t0 + 4 });
    expect(second.context.generation).toBe(2);
    expect(await runStep(deps, podUid, 'launch', 2)).toBe('done');
    expect((await planOfSession(2))?.name).toBe('as-stored');

    // The fleet restarted with a changed site file: the next launch renders for the site as it is now.
    const lines: string[] = [];
    const log = pino({ level: 'info' }, { write: (line: string) => lines.push(line) });
    const changed: SiteConfig = { ...config, Backhaul: { ...config.Backhaul, RetryBackoff: 300 } };
    const restarted = fleetDeps(changed, redis.redis, log, { keyPrefix: 'bhx:', bullPrefix: 'bhx' });
    try {
      await apply(podUid, { type: 'SHADOW_UP', host: 'host-x', generation: 2, at: t0 + 5 });
      await apply(podUid, { type: 'CARRIER_LOST', reason: 'test', generation: 2, at: t0 + 6 });
      expect(await runStep(restarted, podUid, 'launch', 3)).toBe('done');
      expect((await planOfSession(3))?.name, lines.join('')).toBe('plan');
      expect(lines.join(''), lines.join('')).toMatch(
        /launch renders the session plan again: the site configuration changed since the pod was rendered/,
      );
    } finally {
      await restarted.queues.close();
    }
    await apply(podUid, { type: 'TEARDOWN', reason: 'test', at: t0 + 7 });
  });

  it('validate, render, launch and teardown: the second run is stale or harmless, and no job is doubled', async () => {
    const podUid = uid();
    const annotations = { 'interlink.eu/reverse-forwards': '15400:minio.user.svc.cluster.local:9000' };
    const t0 = Date.now();

    // validating: one validate job however often it is asked for; each run reports, one report counts.
    const started = await apply(podUid, { type: 'POD_UPSERT', namespace: 'user', name: 'idem', annotations, at: t0 });
    expect(started.to).toBe('validating');
    await effectsFourTimes(podUid, started.actions);
    expect((await jobsOf(deps.queues.steps, podUid)).map((j) => j.id)).toEqual([jobIds.step(podUid, 'validate', 0)]);
    const validate = [
      await runStep(deps, podUid, 'validate', 0),
      await runStep(deps, podUid, 'validate', 0),
      ...(await Promise.all([runStep(deps, podUid, 'validate', 0), runStep(deps, podUid, 'validate', 0)])),
    ];
    expect(validate).toEqual(['done', 'done', 'done', 'done']);
    let delivered = await deliver(podUid);
    expect(delivered.map((r) => r.kind)).toEqual(['applied', 'ignored', 'ignored', 'ignored']);
    expect(await runStep(deps, podUid, 'validate', 0)).toBe('stale');

    // rendering
    const rendering = delivered[0] as ApplyResult & { kind: 'applied' };
    expect(rendering.to).toBe('rendering');
    await effectsFourTimes(podUid, rendering.actions);
    expect((await jobsOf(deps.queues.steps, podUid)).map((j) => j.id)).toEqual([
      jobIds.step(podUid, 'validate', 0),
      jobIds.step(podUid, 'render', 0),
    ]);
    expect(await Promise.all([runStep(deps, podUid, 'render', 0), runStep(deps, podUid, 'render', 0)])).toEqual([
      'done',
      'done',
    ]);
    delivered = await deliver(podUid);
    expect(delivered.map((r) => r.kind)).toEqual(['applied', 'ignored']);
    expect(await runStep(deps, podUid, 'render', 0)).toBe('stale');

    // launchingShadow: launch runs with the effects (no step job), its deadline indexed with the state,
    // and however often launch runs, one session job.
    const launching = delivered[0] as ApplyResult & { kind: 'applied' };
    expect(launching.to).toBe('launchingShadow');
    expect(launching.context.generation).toBe(1);
    await effectsFourTimes(podUid, launching.actions);
    expect((await jobsOf(deps.queues.steps, podUid)).map((j) => j.id)).not.toContain(jobIds.step(podUid, 'launch', 1));
    expect((await jobsOf(deps.queues.steps, podUid)).length).toBe(2);
    expect((await jobsOf(deps.queues.sessions, podUid)).map((j) => j.id)).toEqual([jobIds.session(podUid, 1)]);
    expect(await deadlineOf(podUid)).toBe(launching.context.deadline?.at);
    expect(launching.context.deadline?.name).toBe('launchingShadow');
    expect(await deps.queues.events.waiting(podUid)).toEqual([]);
    const launch = [
      await runStep(deps, podUid, 'launch', 1),
      await runStep(deps, podUid, 'launch', 1),
      ...(await Promise.all([runStep(deps, podUid, 'launch', 1), runStep(deps, podUid, 'launch', 1)])),
    ];
    expect(launch).toEqual(['done', 'done', 'done', 'done']);
    const sessions = await jobsOf(deps.queues.sessions, podUid);
    expect(sessions.map((j) => j.id)).toEqual([jobIds.session(podUid, 1)]);
    expect(await sessions[0]?.getState()).toBe('waiting');
    // The plan is the one rendering stored beside the pod (not in its snapshot), for the site it runs with.
    const stored = parseStoredPlan(await deps.store.plan(podUid));
    if (!stored || stored === 'unreadable') throw new Error(`no plan stored: ${JSON.stringify(stored)}`);
    expect(stored.site).toBe(siteDigest(deps.config));
    expect(sessions[0]?.data.plan).toEqual(stored.plan);
    expect(launching.context).not.toHaveProperty('plan');
    // Launch reports nothing (the shadow's own reports move the machine on): no event is queued.
    expect(await deliver(podUid)).toEqual([]);

    // The shadow comes up (a session host holds the lease); launch is now stale.
    const lease = await deps.leases.acquire(podUid, 'host-x', 1, 60_000);
    expect(lease.ok).toBe(true);
    const up = await apply(podUid, { type: 'SHADOW_UP', host: 'host-x', generation: 1, at: t0 + 10 });
    expect(up.to).toBe('waitingBatchHost');
    await effectsFourTimes(podUid, up.actions);
    expect(up.context.deadline?.name).toBe('waitingBatchHost');
    expect(await deadlineOf(podUid)).toBe(up.context.deadline?.at);
    expect(await deps.queues.events.waiting(podUid)).toEqual([]);
    expect(await runStep(deps, podUid, 'launch', 1)).toBe('stale');
    // The same report again is no transition, so no effects.
    expect(
      (await applyPodEvent(deps, podUid, { type: 'SHADOW_UP', host: 'host-x', generation: 1, at: t0 + 11 })).kind,
    ).toBe('ignored');

    // tearingDown: its session is not running (no host took the job), so teardown runs with the
    // effects (no step job), four times, then three times more as a job would: the same end state, no
    // error, one report each, of which one counts.
    const down = await apply(podUid, { type: 'TEARDOWN', reason: 'test', at: t0 + 20 });
    expect(down.to).toBe('tearingDown');
    await effectsFourTimes(podUid, down.actions);
    // Leaving the deadline state withdrew its deadline in the same write.
    expect(await deadlineOf(podUid)).toBeNull();
    expect((await deps.queues.events.waiting(podUid)).length).toBe(4);
    expect((await jobsOf(deps.queues.steps, podUid)).map((j) => j.id)).not.toContain(
      jobIds.step(podUid, 'teardown', 1),
    );
    expect((await jobsOf(deps.queues.steps, podUid)).length).toBe(2);
    const teardown = [
      ...(await Promise.all([runStep(deps, podUid, 'teardown', 1), runStep(deps, podUid, 'teardown', 1)])),
      await runStep(deps, podUid, 'teardown', 1),
    ];
    expect(teardown).toEqual(['done', 'done', 'done']);
    expect(await deps.leases.get(podUid)).toBeNull();
    expect(await jobsOf(deps.queues.sessions, podUid)).toEqual([]);
    delivered = await deliver(podUid);
    expect(delivered.map((r) => r.kind)).toEqual(['applied', ...Array(6).fill('ignored')]);
    expect((delivered[0] as ApplyResult & { kind: 'applied' }).to).toBe('done');
    expect(await runStep(deps, podUid, 'teardown', 1)).toBe('stale');
    expect(await deps.leases.get(podUid)).toBeNull();

    // One history entry per transition, however many reports arrived.
    const history = await deps.store.history(podUid);
    expect(history.map((h) => h.to)).toEqual([
      'validating',
      'rendering',
      'launchingShadow',
      'waitingBatchHost',
      'tearingDown',
      'done',
    ]);
  }, 60_000);
});

describe('control plane on a live fleet (control + session roles)', () => {
  let fleet: RunningFleet & { redis: import('ioredis').Redis };
  let echo: { server: Server; port: number };
  let h: Harness;

  beforeAll(async () => {
    fleet = await inProcessFleet(config, redis.url, ['control', 'session'], 'cp-host');
    echo = await echoServer();
    h = { site, config } as unknown as Harness;
  }, 60_000);

  afterAll(async () => {
    await fleet?.stop();
    echo?.server.close();
  });

  it('does not crash on an event for a snapshot of an unknown machine version, and keeps serving other pods', async () => {
    const future = uid();
    const written = await fleet.deps.store.create(future, {
      snapshot: { version: 999, state: 'hovering', context: { uid: future, warp: 9 } },
      version: 999,
      state: 'hovering',
      namespace: 'user',
      name: 'future',
      history: { at: Date.now(), event: 'POD_UPSERT', from: '', to: 'hovering' },
    });
    expect(written).toBe('created');
    await sendEvent(fleet.deps.queues, future, { type: 'TEARDOWN', reason: 'test', at: Date.now() });
    const failed = await waitFor(
      'the event to be buried',
      async () => (await fleet.deps.queues.events.dead(future))[0],
      20_000,
    );
    expect(failed.reason).toContain('machine version 999');
    // Unrecoverable: buried at its first delivery, not tried ten times.
    expect(failed.delivery).toBe(1);
    expect(JSON.parse(failed.event)).toMatchObject({ type: 'TEARDOWN' });
    // `backhaul status` shows it, with why.
    const detail = await podDetail(fleet.deps, future);
    expect(detail?.deadEvents).toEqual([
      { at: expect.any(Number), type: 'TEARDOWN', reason: expect.stringContaining('machine version 999'), delivery: 1 },
    ]);
    expect(formatDetail(detail as PodDetail)).toMatch(
      /events not applied\n .* TEARDOWN +delivery 1: .*machine version 999/,
    );
    // The record is untouched and the fleet still takes other pods through their steps.
    expect((await fleet.deps.store.load(future))?.state).toBe('hovering');
    const other = uid();
    await upsert(fleet, other, 'after-future', { 'interlink.eu/reverse-forwards': 'kubernetes.default.svc:443' });
    await waitForPodState(fleet, other, 'failed', 20_000);
    expect(fleet.control?.events.isRunning()).toBe(true);
    await fleet.deps.store.remove(future, 1);
    await fleet.deps.store.remove(other, 1);
  }, 60_000);

  it('a pod without any reverse annotation fails at once as an invalid pod (not retried as if transient)', async () => {
    const podUid = uid();
    await upsert(fleet, podUid, 'no-annotations', {});
    // Treated as transient, the step would be retried for half a minute and the pod never fail.
    await waitForPodState(fleet, podUid, 'failed', 20_000);
    const stored = await fleet.deps.store.load(podUid);
    const context = (stored?.snapshot as { context: { lastError: { kind: string; message: string } } }).context;
    expect(context.lastError.kind).toBe('invalid-pod');
    expect(context.lastError.message).toContain('interlink.eu/reverse-');
    await fleet.deps.store.remove(podUid, 1);
  }, 30_000);

  it('a refused pod whose annotation is fixed is validated again at once, no RETRY needed (the first validate job does not block it)', async () => {
    const podUid = uid();
    await upsert(fleet, podUid, 'fixed', { 'interlink.eu/reverse-forwards': 'kubernetes.default.svc:443' });
    await waitForPodState(fleet, podUid, 'failed', 20_000);
    // The same pod again changes nothing: it stays failed.
    await upsert(fleet, podUid, 'fixed', { 'interlink.eu/reverse-forwards': 'kubernetes.default.svc:443' });
    await new Promise((r) => setTimeout(r, 500));
    expect((await fleet.deps.store.load(podUid))?.state).toBe('failed');
    // The owner fixes the annotation: the machine validates it again by itself.
    await upsert(fleet, podUid, 'fixed', { 'interlink.eu/reverse-forwards': '6443:kubernetes.default.svc:443' });
    // No job for it: the shadow waits for a batch host. (The reaper would re-run validate only after a minute.)
    await waitForPodState(fleet, podUid, 'waitingBatchHost', 25_000);
    expect(JSON.stringify(await fleet.deps.store.history(podUid))).not.toContain('RETRY');
    await sendEvent(fleet.deps.queues, podUid, { type: 'TEARDOWN', reason: 'test', at: Date.now() });
    await waitForPodState(fleet, podUid, null, 30_000);
  }, 60_000);

  it('on a live pod: launch again is stale (one shadow, same lease), teardown twice ends once and leaves nothing', async () => {
    const podUid = uid();
    const forwards = `15401:127.0.0.1:${echo.port}`;
    const plan = planFor(h, podUid, forwards);
    const jobId = await sbatch(site.user, jobScript(h, plan, 'sleep 600\n'), { jobName: podUid });
    await upsert(fleet, podUid, 'live', { 'interlink.eu/reverse-forwards': forwards });
    await waitForPodState(fleet, podUid, 'active', 60_000);
    const lease = await fleet.deps.leases.get(podUid);
    expect(lease?.holder).toBe('cp-host');

    // The step jobs of states already passed, run again by hand and through the queue.
    expect(await runStep(fleet.deps, podUid, 'validate', 0)).toBe('stale');
    expect(await runStep(fleet.deps, podUid, 'launch', 1)).toBe('stale');
    // Launch as an effect again (an outbox swept late): it finds the pod past launchingShadow; so does a
    // delayed one (a backoff), which waits as a step job.
    const launchAgain: PodAction[] = [{ type: 'runStep', params: { step: 'launch', generation: 1, delayMs: 0 } }];
    await Promise.all([runEffects(fleet.deps, podUid, launchAgain), runEffects(fleet.deps, podUid, launchAgain)]);
    const launchLater: PodAction[] = [{ type: 'runStep', params: { step: 'launch', generation: 1, delayMs: 10 } }];
    await runEffects(fleet.deps, podUid, launchLater);
    const rerun = await waitFor('the delayed launch job to run', async () => {
      const job = await fleet.deps.queues.steps.getJob(jobIds.step(podUid, 'launch', 1));
      return job?.finishedOn ? job : undefined;
    });
    expect(rerun.returnvalue).toBe('stale');
    await new Promise((r) => setTimeout(r, 1_000));
    const sessions = await jobsOf(fleet.deps.queues.sessions, podUid);
    expect(sessions.map((j) => j.id)).toEqual([jobIds.session(podUid, 1)]);
    expect(await sessions[0]?.getState()).toBe('active');
    expect((await fleet.deps.leases.get(podUid))?.token).toBe(lease?.token);
    expect((await fleet.deps.store.load(podUid))?.state).toBe('active');

    // Two teardowns at once: one transition, the same end, nothing left.
    const nodeProcesses = site.node.processes().length;
    expect(nodeProcesses).toBeGreaterThan(1);
    await Promise.all([
      sendEvent(fleet.deps.queues, podUid, { type: 'TEARDOWN', reason: 'one', at: Date.now() }),
      sendEvent(fleet.deps.queues, podUid, { type: 'TEARDOWN', reason: 'two', at: Date.now() }),
    ]);
    await waitForPodState(fleet, podUid, null, 30_000);
    const history = await fleet.deps.store.history(podUid);
    expect(history.filter((e) => e.to === 'tearingDown' && e.from !== 'tearingDown')).toHaveLength(1);
    expect(history.filter((e) => e.to === 'done')).toHaveLength(1);
    expect(await runStep(fleet.deps, podUid, 'teardown', 1)).toBe('stale');
    expect(await fleet.deps.leases.get(podUid)).toBeNull();
    expect(await exists(plan.forwards[0]?.socketPath ?? '')).toBe(false);
    await waitFor('the carrier to close on the node', () => site.node.processes().length === 1, 10_000);
    await waitFor('the session job to go', async () => (await jobsOf(fleet.deps.queues.sessions, podUid)).length === 0);
    expect(await keysNaming(redis.redis, podUid)).toEqual([`bh:hist:${podUid}`]);
    expect(await redis.redis.ttl(`bh:hist:${podUid}`)).toBeGreaterThan(0);
    expect(await queueEntriesNaming(redis.redis, podUid)).toEqual([]);
    await scancel(jobId);
  }, 120_000);
});
