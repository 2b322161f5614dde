import { type PodAction, STEPS, type StepName } from '../machines/pod-machine.js';
import type { FleetDeps } from '../pods/fleet-deps.js';
import { jobIds, jobState, KEEP_JOBS } from '../pods/queues.js';
import { stopShadow } from './shadow-stop.js';
import { runStep } from './step-runner.js';

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
        // Run here when it is quick, which saves a step job (about 45 Redis commands): launch only queues
        // the shadow's session job (which has retries of its own); teardown of a shadow whose session is
        // no longer running only revokes the lease and reports. runStep checks the pod's state and
        // generation first, as a step job would, so a run from the outbox after the pod moved on is
        // stale. A delayed one (a backoff), or the teardown of a running session (it waits up to 20 s
        // for the session to close), is a step job.
        // If it fails here, the step job takes over, with its retries and the report when they run out.
        const quick = step === 'launch' || (step === 'teardown' && !(await sessionRunning(deps, uid, generation)));
        if (!delayMs && quick) {
          const ran = await runStep(deps, uid, step, generation).catch((err: unknown) => {
            deps.log.warn({ err, uid, step }, 'step failed where it was asked for; queued as a job');
            return undefined;
          });
          if (ran !== undefined) break;
        }
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

async function sessionRunning(deps: FleetDeps, uid: string, generation: number): Promise<boolean> {
  return (await jobState(deps.redis, deps.queues.sessions, jobIds.session(uid, generation))) === 'active';
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
  const state = await jobState(deps.redis, deps.queues.steps, jobId);
  if (state === 'completed' || state === 'failed') await deps.queues.steps.remove(jobId);
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
 * A finished pod leaves only its history, which expires (ARCHITECTURE.md, "Aims (what good looks like)": no stale Redis key after
 * teardown). The jobs named after it go first — kept step jobs, failed shadows — then its record,
 * indexes (its deadline among them) and lease. (In this order, a POD_UPSERT racing with the removal meets the `done`
 * record and is ignored, instead of creating a machine whose first job would then be removed.) A job
 * still running cannot be removed: the teardown step that reported done is removed as it completes.
 */
export async function forgetPod(deps: FleetDeps, uid: string, generation: number): Promise<void> {
  const { steps, sessions } = deps.queues;
  const named: { queue: typeof steps | typeof sessions; id: string }[] = [];
  for (let g = 0; g <= generation; g += 1) {
    for (const step of STEPS) named.push({ queue: steps, id: jobIds.step(uid, step, g) });
    named.push({ queue: sessions, id: jobIds.session(uid, g) });
  }
  // Usually none of these exists (validate and render run inline, launch with the effects; teardown and
  // shadow jobs go when they complete): one EXISTS of them all says so. Otherwise one pipelined EXISTS
  // each, and BullMQ's removal (about 19 commands) only for those that do.
  const keys = named.map(({ queue, id }) => queue.toKey(id));
  let removals: Promise<unknown>[] = [];
  if ((await deps.redis.exists(...keys)) > 0) {
    const pipeline = deps.redis.pipeline();
    for (const key of keys) pipeline.exists(key);
    const exists = (await pipeline.exec()) ?? [];
    removals = named.filter((_, i) => exists[i]?.[1] !== 0).map(({ queue, id }) => queue.remove(id));
  }
  removals.push(deps.queues.events.forgetDead(uid));
  await Promise.all(removals.map((removal) => removal.catch(() => 0)));
  await deps.store.remove(uid, Math.ceil(deps.config.Backhaul.HistoryTTL / 1000));
}
