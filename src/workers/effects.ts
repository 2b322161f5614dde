import { type PodAction, STEPS, type StepName } from '../machines/pod-machine.js';
import type { FleetDeps } from '../pods/fleet-deps.js';
import { jobIds, KEEP_JOBS } from '../pods/queues.js';

/** Steps retry a few times on transient errors (Redis, the login node), backing off. */
const STEP_RETRY = { attempts: 5, backoff: { type: 'exponential', delay: 1_000 } } as const;

/**
 * Runs the effects a transition asked for. Each is safe to run twice: steps have ids made of the pod
 * UID, the step and the generation, so asking again is a no-op while the first job waits or runs (a
 * finished step job is replaced: see queueStep). Deadlines are not effects: the store indexes them with
 * the state (DeadlineClock).
 */
export async function runEffects(deps: FleetDeps, uid: string, actions: readonly PodAction[]): Promise<void> {
  for (const action of actions) {
    switch (action.type) {
      case 'runStep': {
        const { step, generation, delayMs } = action.params;
        await queueStep(deps, uid, step, generation, delayMs ?? 0);
        break;
      }
      case 'stopShadow': {
        await stopShadow(deps, uid, action.params.generation);
        break;
      }
    }
  }
}

/**
 * Queues one step job. Its id is made of the pod, the step and the generation, so asking again while
 * the job waits or runs is a no-op. A job with that id that has already finished (completed jobs are
 * kept for `status`) is replaced: either the pod entered the step's state again at the same generation
 * (RETRY after a failed validate or teardown), which must run the step again, or the request is a late
 * copy, and a step run late is stale (runStep checks the state first). Keeping the old job instead would
 * leave the pod waiting for the reaper.
 */
export async function queueStep(
  deps: FleetDeps,
  uid: string,
  step: StepName,
  generation: number,
  delayMs = 0,
): Promise<void> {
  const jobId = jobIds.step(uid, step, generation);
  const existing = await deps.queues.steps.getJob(jobId);
  if (existing?.finishedOn) await deps.queues.steps.remove(jobId);
  await deps.queues.steps.add(
    step,
    { uid, step, generation },
    {
      jobId,
      delay: delayMs,
      ...STEP_RETRY,
      ...KEEP_JOBS,
      // The pod is forgotten as soon as its teardown is done: that job must not outlive it.
      ...(step === 'teardown' ? { removeOnComplete: true } : {}),
    },
  );
}

/**
 * A finished pod leaves only its history, which expires (ARCHITECTURE.md §7: no stale Redis key after
 * teardown). The jobs named after it go first — kept step jobs, failed shadows — then its record,
 * indexes (its deadline among them) and lease. (In this order, a POD_UPSERT racing with the removal meets the `done`
 * record and is ignored, instead of creating a machine whose first job would then be removed.) A job
 * still running cannot be removed: the teardown step that reported done is removed as it completes.
 */
export async function forgetPod(deps: FleetDeps, uid: string, generation: number): Promise<void> {
  const { steps, sessions } = deps.queues;
  const removals: Promise<unknown>[] = [];
  for (let g = 0; g <= generation; g += 1) {
    for (const step of STEPS) removals.push(steps.remove(jobIds.step(uid, step, g)));
    removals.push(sessions.remove(jobIds.session(uid, g)));
  }
  removals.push(deps.queues.events.forgetDead(uid));
  await Promise.all(removals.map((removal) => removal.catch(() => 0)));
  await deps.store.remove(uid, Math.ceil(deps.config.Backhaul.HistoryTTL / 1000));
}

/**
 * Takes the shadow of `generation` (and older) away: its lease is deleted, which its session host sees
 * at the next renewal and closes the session; a session job not started yet is removed.
 */
export async function stopShadow(deps: FleetDeps, uid: string, generation: number): Promise<void> {
  await deps.leases.revoke(uid, generation);
  for (let g = Math.max(1, generation - 1); g <= generation; g += 1) {
    const job = await deps.queues.sessions.getJob(jobIds.session(uid, g));
    if (!job) continue;
    const state = await job.getState();
    if (state === 'waiting' || state === 'delayed' || state === 'prioritized')
      await job.remove().catch(() => undefined);
  }
}
