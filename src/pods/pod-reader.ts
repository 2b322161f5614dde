/**
 * The one place a stored pod is read back into the machine's terms (ARCHITECTURE.md, "The machine"): every role and
 * command reads pods through here, so what "a pod this build cannot read" means is decided once.
 */
import {
  type PodContext,
  type PodSnapshot,
  type PodStateName,
  type RestoreError,
  restorePod,
  stateOf,
} from '../machines/pod-machine.js';
import type { SnapshotStore, StoredPod } from '../store/snapshot-store.js';

export interface PodView {
  state: PodStateName;
  context: PodContext;
}

/** A stored pod, restored — or the reason it cannot be (another machine version, a bad snapshot). */
export type PodRecord =
  | ({ ok: true; stored: StoredPod; snapshot: PodSnapshot } & PodView)
  | { ok: false; stored: StoredPod; error: RestoreError };

export function podRecordOf(stored: StoredPod): PodRecord {
  const restored = restorePod(stored.snapshot);
  if (!restored.ok) return { ok: false, stored, error: restored.error };
  const { snapshot } = restored;
  return { ok: true, stored, snapshot, state: stateOf(snapshot), context: snapshot.context };
}

/** The pod's record, or null when it is unknown. */
export async function loadPodRecord(store: SnapshotStore, uid: string): Promise<PodRecord | null> {
  const stored = await store.load(uid);
  return stored ? podRecordOf(stored) : null;
}

/** The records of UIDS in their order, null for an unknown pod (one round trip). */
export async function loadPodRecords(store: SnapshotStore, uids: readonly string[]): Promise<(PodRecord | null)[]> {
  const stored = await store.loadMany(uids);
  return stored.map((record) => (record ? podRecordOf(record) : null));
}

/** The pod's current state and context, or null when it is unknown or cannot be restored. */
export async function readPod(deps: { store: SnapshotStore }, uid: string): Promise<PodView | null> {
  const record = await loadPodRecord(deps.store, uid);
  return record?.ok ? { state: record.state, context: record.context } : null;
}

/**
 * The pod is on its way out, or out: done, deleted, or torn down for a reason (a job that ended, an
 * operator, a refusal). Nothing sent to it can bring it back up.
 */
export function isEnding(pod: PodView): boolean {
  return pod.state === 'done' || pod.context.podDeleted || pod.context.teardownReason !== null;
}
