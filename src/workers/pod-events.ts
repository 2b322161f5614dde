import {
  applyEvent,
  MACHINE_VERSION,
  type PodAction,
  type PodContext,
  type PodEvent,
  type PodStateName,
  persistPod,
  startPod,
  stateOf,
} from '../machines/pod-machine.js';
import { type FleetDeps, podLimits } from '../pods/fleet-deps.js';
import { podRecordOf } from '../pods/pod-reader.js';
import type { HistoryEntry, PodWrite } from '../store/snapshot-store.js';
import { reviewAfter } from './reaper.js';

export type ApplyResult =
  | {
      kind: 'applied';
      from: PodStateName | null;
      to: PodStateName;
      actions: PodAction[];
      context: PodContext;
      /** The record's compare-and-set gen after this write: its outbox is cleared by it once the actions ran. */
      gen: number;
    }
  | { kind: 'ignored'; state: string | null }
  | { kind: 'unrestorable'; message: string };

/** One line of history detail for an event: what an operator needs to read the timeline. */
function detailOf(event: PodEvent): string | undefined {
  switch (event.type) {
    case 'SHADOW_UP':
      return `host ${event.host}`;
    case 'BATCH_HOST':
      return `job ${event.jobId} on ${event.batchHost}`;
    case 'SHADOW_HELD':
      return `kept by host ${event.host} through a loss of Redis's data, at ${event.phase}`;
    case 'CARRIER_LOST':
      return event.reason;
    case 'SESSION_FAILED':
      return `${event.error.kind}: ${event.error.message}`;
    case 'STEP_FAILED':
      return event.error ? `${event.step}: ${event.error.kind}: ${event.error.message}` : event.step;
    case 'STEP_DONE':
      return event.step;
    case 'TEARDOWN':
      return event.reason;
    case 'DEADLINE':
      return `${event.name} deadline`;
    case 'JOB_ENDED': {
      const trap = event.trapMissed ? "without the prelude's trap: its socket dir was left, and removed" : undefined;
      return [event.jobState, trap, event.note].filter((part) => part !== undefined).join(', ') || undefined;
    }
    default:
      return undefined;
  }
}

function historyOf(event: PodEvent, from: string, to: string, generation: number): HistoryEntry {
  const detail = detailOf(event);
  return { at: event.at, event: event.type, from, to, generation, ...(detail === undefined ? {} : { detail }) };
}

function writeOf(
  context: PodContext,
  persisted: unknown,
  state: PodStateName,
  history: HistoryEntry,
  actions: readonly PodAction[],
): PodWrite {
  return {
    snapshot: persisted,
    version: MACHINE_VERSION,
    state,
    namespace: context.namespace,
    name: context.name,
    history,
    deadlineAt: context.deadline?.at ?? null,
    effects: actions,
    reviewAfterMs: reviewAfter(state),
  };
}

/**
 * Load → transition (pure) → compare-and-set, retried on conflicts. A POD_UPSERT for an unknown pod
 * creates its machine; any other event for an unknown pod is dropped. The effects are returned, not run:
 * the caller runs them once the new state is stored.
 */
export async function applyPodEvent(deps: FleetDeps, uid: string, event: PodEvent): Promise<ApplyResult> {
  const outcome = await deps.store.applyWithRetry<ApplyResult>(uid, (stored) => {
    if (!stored) {
      if (event.type !== 'POD_UPSERT') return { value: { kind: 'ignored', state: null } };
      const start = startPod(
        {
          uid,
          namespace: event.namespace,
          name: event.name,
          annotations: event.annotations,
          ...podLimits(deps.config),
        },
        event.at,
      );
      const context = start.snapshot.context;
      const to = stateOf(start.snapshot);
      return {
        write: {
          ...writeOf(
            context,
            persistPod(start.snapshot),
            to,
            historyOf(event, '', to, context.generation),
            start.actions,
          ),
          createdBy: event.at,
        },
        value: { kind: 'applied', from: null, to, actions: start.actions, context, gen: 0 },
      };
    }
    const record = podRecordOf(stored);
    if (!record.ok) return { value: { kind: 'unrestorable', message: record.error.message } };
    const step = applyEvent(record.snapshot, event);
    if (!step.changed) return { value: { kind: 'ignored', state: step.from } };
    const context = step.snapshot.context;
    // The plan render made is kept beside the snapshot, with the transition that takes it (not in the
    // context: every other transition would load and store it again).
    const plan = event.type === 'STEP_DONE' && event.plan ? { plan: JSON.stringify(event.plan) } : {};
    return {
      write: {
        ...writeOf(
          context,
          persistPod(step.snapshot),
          step.to,
          historyOf(event, step.from, step.to, context.generation),
          step.actions,
        ),
        ...plan,
      },
      value: { kind: 'applied', from: step.from, to: step.to, actions: step.actions, context, gen: 0 },
    };
  });
  // Events of one pod are not ordered: a POD_UPSERT the watcher queued before the pod's deletion
  // completed may be taken after it, and must not start a machine for a pod that is gone (the store
  // refuses, atomically, to create a record older than the pod's end; a later one, a resubmission, may).
  if (outcome.finished) return { kind: 'ignored', state: 'done' };
  const result = outcome.value;
  return result.kind === 'applied' ? { ...result, gen: outcome.gen ?? 0 } : result;
}
