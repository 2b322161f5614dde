import { STEP_OF_STATE, stateHasTag } from '../machines/pod-machine.js';
import type { FleetDeps } from '../pods/fleet-deps.js';
import { loadPodRecords } from '../pods/pod-reader.js';
import { jobIds, sendEvent } from '../pods/queues.js';
import { forgetPod, queueStep } from './effects.js';

export const REAPER_JOB = 'bh-reaper';

/** A shadow whose lease expired this long ago, with no session job running, is gone for good. */
const LEASE_GRACE_MS = 20_000;
/** A pod that sat this long in a step's state lost its step (or the step's report): run it again. */
const STEP_GRACE_MS = 60_000;

/**
 * Level-triggered repair, run periodically: whatever an effect failed to do (a Redis hiccup between
 * storing a state and queueing its effect, a session host that vanished with its job) is redone from
 * the state stored. (Deadlines need no repair: they are stored with the state; see DeadlineClock.) Every action here is one the machine tolerates twice.
 */
export async function reap(deps: FleetDeps): Promise<number> {
  let repaired = 0;
  const now = deps.now();
  const uids = await deps.store.list();
  for (const record of await loadPodRecords(deps.store, uids)) {
    if (!record?.ok) continue;
    const { uid, updatedAt } = record.stored;
    const { state, context } = record;
    if (state === 'done') {
      await forgetPod(deps, uid, context.generation);
      repaired += 1;
      continue;
    }
    // Not the launch: it waits out its backoff in its delay, and a lost shadow is handled below.
    const step = stateHasTag(state, 'shadow') ? undefined : STEP_OF_STATE[state];
    if (step && updatedAt + STEP_GRACE_MS < now) {
      // The step's own id: a no-op while its job still waits or retries, run again once it has finished.
      await queueStep(deps, uid, step, context.generation);
      repaired += 1;
    }
    if (stateHasTag(state, 'shadowRunning') && context.generation > 0) {
      const lease = await deps.leases.get(uid);
      const job = await deps.queues.sessions.getJob(jobIds.session(uid, context.generation));
      const jobState = job ? await job.getState() : 'missing';
      // A lease that is missing altogether counts from the pod's last change: a session that ended on its
      // own (sockets vanished, job ended) releases its lease just after queueing its report, and that
      // report, not a CARRIER_LOST sent in between, must decide what happens to the pod.
      const leaseGone = lease ? lease.expiresAt + LEASE_GRACE_MS < now : updatedAt + LEASE_GRACE_MS < now;
      if (leaseGone && jobState !== 'active' && jobState !== 'waiting' && jobState !== 'delayed') {
        await sendEvent(deps.queues, uid, {
          type: 'CARRIER_LOST',
          reason: 'the shadow has no session host (its lease expired and its job is gone)',
          generation: context.generation,
          at: now,
        });
        repaired += 1;
      }
    }
  }
  await deps.hosts.prune().catch(() => []);
  return repaired;
}
