import { type PodContext, type PodStateName, restorePod, stateOf } from '../machines/pod-machine.js';
import type { FleetDeps } from './fleet-deps.js';

export interface PodView {
  state: PodStateName;
  context: PodContext;
}

/** The pod's current state and context, or null when it is unknown or cannot be restored. */
export async function readPod(deps: FleetDeps, uid: string): Promise<PodView | null> {
  const stored = await deps.store.load(uid);
  if (!stored) return null;
  const restored = restorePod(stored.snapshot);
  if (!restored.ok) return null;
  return { state: stateOf(restored.snapshot), context: restored.snapshot.context };
}
