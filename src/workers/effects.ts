import type { PodAction } from '../machines/pod-machine.js';
import type { FleetDeps } from './fleet-deps.js';
import { jobIds, KEEP_JOBS } from './queues.js';

/** Steps retry a few times on transient errors (Redis, the login node), backing off. */
const STEP_RETRY = { attempts: 5, backoff: { type: 'exponential', delay: 1_000 } } as const;

/**
 * Runs the effects a transition asked for. Each is safe to run twice: steps and deadlines have ids
 * made of the pod UID, the step and the generation, so asking again is a no-op while the first exists.
 */
export async function runEffects(deps: FleetDeps, uid: string, actions: readonly PodAction[]): Promise<void> {
  for (const action of actions) {
    switch (action.type) {
      case 'runStep': {
        const { step, generation, delayMs } = action.params;
        await deps.queues.steps.add(
          step,
          { uid, step, generation },
          { jobId: jobIds.step(uid, step, generation), delay: delayMs ?? 0, ...STEP_RETRY, ...KEEP_JOBS },
        );
        break;
      }
      case 'scheduleDeadline': {
        const { name, at, generation } = action.params;
        await deps.queues.events.add(
          'DEADLINE',
          { uid, event: { type: 'DEADLINE', name, generation, at } },
          {
            jobId: jobIds.deadline(uid, name, generation),
            delay: Math.max(0, at - deps.now()),
            removeOnComplete: true,
            removeOnFail: true,
          },
        );
        break;
      }
      case 'cancelDeadline': {
        const { name, generation } = action.params;
        // A deadline already being delivered is ignored by the machine (it is no longer current).
        await deps.queues.events.remove(jobIds.deadline(uid, name, generation)).catch(() => 0);
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
