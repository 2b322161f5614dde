import type { FleetDeps } from '../pods/fleet-deps.js';
import { jobIds, jobState } from '../pods/queues.js';

/**
 * Takes the shadow of `generation` (and older) away: its lease is deleted, which its session host sees
 * at the next renewal and closes the session; a session job not started yet is removed.
 */
export async function stopShadow(deps: FleetDeps, uid: string, generation: number): Promise<void> {
  await deps.leases.revoke(uid, generation);
  for (let g = Math.max(1, generation - 1); g <= generation; g += 1) {
    const id = jobIds.session(uid, g);
    const state = await jobState(deps.redis, deps.queues.sessions, id);
    if (state === 'waiting' || state === 'delayed' || state === 'prioritized') {
      await deps.queues.sessions.remove(id).catch(() => undefined);
    }
  }
}
