import { type PodStateName, STEP_OF_STATE, stateHasTag } from '../machines/pod-machine.js';
import type { FleetDeps } from '../pods/fleet-deps.js';
import { loadPodRecords, type PodRecord } from '../pods/pod-reader.js';
import { jobIds, jobState, sendEvent } from '../pods/queues.js';
import { LEASE_GRACE_MS } from '../store/lease-store.js';
import { forgetPod, queueStep } from './effects.js';

/** A pod that sat this long in a step's state lost its step (or the step's report): run it again. */
const STEP_GRACE_MS = 60_000;
/** Pods looked at per run, at most; the rest are due still and are taken by the next run. */
const BATCH = 500;

/**
 * When a pod in STATE should be looked at again, counted from when the state was stored (ms), or null
 * when only a new state can make it need anything: the step states (and `done`, whose record the
 * forget effect removes) after STEP_GRACE_MS; a shadow that has reported, after LEASE_GRACE_MS, to check
 * its lease (an expired lease is found by the lease index, a released one by lease-release setting the
 * review). `launchingShadow` has its own deadline, which relaunches it.
 */
export function reviewAfter(state: PodStateName): number | null {
  if (state === 'done') return STEP_GRACE_MS;
  if (stateHasTag(state, 'shadowRunning')) return LEASE_GRACE_MS;
  if (STEP_OF_STATE[state] && !stateHasTag(state, 'shadow')) return STEP_GRACE_MS;
  return null;
}

export interface ReapOptions {
  /** Look at every pod, not only the due ones (the convergence loop asks for it at start and every 10 minutes). */
  full?: boolean;
}

/**
 * Level-triggered repair: whatever an effect failed to do (a Redis hiccup between storing a state and
 * queueing its effect, a session host that vanished with its job) is redone from the state stored.
 * (Deadlines need no repair: they are stored with the state; see DeadlineClock.) Every action here is
 * one the machine tolerates twice.
 *
 * A run reads only what is due: the review index (each stored state says when its pod needs a look,
 * redis/pod-cas.lua) and the lease index (leases past their grace). Pods that wait for nothing — an
 * active pod whose session host renews its lease — cost nothing, however many there are. `full` looks
 * at every pod, as a controller's resync does.
 */
export async function reap(deps: FleetDeps, opts: ReapOptions = {}): Promise<number> {
  const now = deps.now();
  const uids = opts.full
    ? await deps.store.list()
    : [
        ...new Set([
          ...(await deps.store.dueForReview(now, BATCH)),
          ...(await deps.leases.expiredBefore(now - LEASE_GRACE_MS, BATCH)),
        ]),
      ];
  let repaired = 0;
  const records = await loadPodRecords(deps.store, uids);
  for (const [i, record] of records.entries()) {
    if (!record) {
      // Forgotten: an index entry left by a race with forgetPod.
      await deps.store.setReview(uids[i] ?? '', 0, null);
      continue;
    }
    if (!record.ok) continue; // `status` shows it; nothing here can help
    const { repairs, next } = await repair(deps, record, now);
    repaired += repairs;
    if (record.state !== 'done') await deps.store.setReview(record.stored.uid, record.stored.gen, next);
  }
  await deps.hosts.prune().catch(() => []);
  return repaired;
}

/** What one pod needs now, and when to look at it again (null: when a new state says so). */
async function repair(
  deps: FleetDeps,
  record: PodRecord & { ok: true },
  now: number,
): Promise<{ repairs: number; next: number | null }> {
  const { state, context } = record;
  const { uid, updatedAt } = record.stored;
  if (state === 'done') {
    await forgetPod(deps, uid, context.generation);
    return { repairs: 1, next: null };
  }
  // Not the launch: it waits out its backoff in its delay, and its deadline relaunches a lost one.
  const step = stateHasTag(state, 'shadow') ? undefined : STEP_OF_STATE[state];
  if (step) {
    if (updatedAt + STEP_GRACE_MS >= now) return { repairs: 0, next: updatedAt + STEP_GRACE_MS };
    // The step's own id: a no-op while its job still waits or retries, run again once it has finished.
    await queueStep(deps, uid, step, context.generation);
    return { repairs: 1, next: now + STEP_GRACE_MS };
  }
  if (!stateHasTag(state, 'shadowRunning') || context.generation === 0) {
    // An expired lease of a shadow the pod no longer waits for: nothing will renew it.
    const lease = await deps.leases.get(uid);
    if (lease && lease.expiresAt + LEASE_GRACE_MS < now) await deps.leases.revoke(uid, lease.generation);
    return { repairs: 0, next: null };
  }
  const lease = await deps.leases.get(uid);
  // A lease that is missing altogether counts from the pod's last change: a session that ended on its
  // own releases its lease just after queueing its report, and that report must decide.
  const goneSince = lease ? lease.expiresAt : updatedAt;
  if (lease && lease.expiresAt > now) return { repairs: 0, next: null }; // its expiry is indexed
  if (goneSince + LEASE_GRACE_MS >= now) return { repairs: 0, next: goneSince + LEASE_GRACE_MS };
  const job = await jobState(deps.redis, deps.queues.sessions, jobIds.session(uid, context.generation));
  if (job === 'active' || job === 'waiting' || job === 'delayed') {
    return { repairs: 0, next: now + LEASE_GRACE_MS };
  }
  await sendEvent(deps.queues, uid, {
    type: 'CARRIER_LOST',
    reason: 'the shadow has no session host (its lease expired and its job is gone)',
    generation: context.generation,
    at: now,
  });
  // The event changes the pod's state, which sets its next look; if it is lost, look again.
  return { repairs: 1, next: now + LEASE_GRACE_MS };
}
