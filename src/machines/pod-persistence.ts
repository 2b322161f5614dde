/**
 * A pod as stored: plain JSON with the machine version, the leaf state's name and the context; and back,
 * checked, never thrown (a snapshot of another version or a broken one is a RestoreError `status` shows).
 */
import { type PodSnapshot, podMachine } from './pod-chart.js';
import { describeIssue, persistedEnvelopeSchema, podContextSchema, RestoreError } from './pod-schema.js';
import { chartValueOf, isPodStateName, type PodStateName, stateOf } from './pod-topology.js';
import type { PodContext } from './pod-types.js';

/** Bump when states, context or events change shape: stored snapshots of another version are refused. */
export const MACHINE_VERSION = 1;

/** What is stored in Redis: plain JSON. */
export interface PersistedPod {
  version: typeof MACHINE_VERSION;
  state: PodStateName;
  context: PodContext;
}

export type RestoreResult = { ok: true; snapshot: PodSnapshot } | { ok: false; error: RestoreError };

export function persistPod(snapshot: PodSnapshot): PersistedPod {
  return { version: MACHINE_VERSION, state: stateOf(snapshot), context: structuredClone(snapshot.context) };
}

/**
 * A snapshot back from storage. Never throws: a snapshot of another machine version, an unknown state
 * or a malformed context comes back as a RestoreError that `status` can show.
 */
export function restorePod(persisted: unknown): RestoreResult {
  const envelope = persistedEnvelopeSchema.safeParse(persisted);
  if (!envelope.success) {
    return {
      ok: false,
      error: new RestoreError('invalid-snapshot', `not a stored pod: ${describeIssue(envelope.error.issues[0])}`),
    };
  }
  const { version, state } = envelope.data;
  if (version !== MACHINE_VERSION) {
    return {
      ok: false,
      error: new RestoreError(
        'unknown-version',
        `stored with machine version ${JSON.stringify(version)}; this build runs version ${MACHINE_VERSION}`,
        { version, state },
      ),
    };
  }
  if (!isPodStateName(state)) {
    return {
      ok: false,
      error: new RestoreError('unknown-state', `stored in state ${JSON.stringify(state)}, which this machine lacks`, {
        version,
        state,
      }),
    };
  }
  const context = podContextSchema.safeParse(envelope.data.context);
  if (!context.success) {
    return {
      ok: false,
      error: new RestoreError('invalid-context', `stored context: ${describeIssue(context.error.issues[0])}`, {
        version,
        state,
      }),
    };
  }
  try {
    return { ok: true, snapshot: podMachine.resolveState({ value: chartValueOf(state), context: context.data }) };
  } catch (err) {
    return {
      ok: false,
      error: new RestoreError('invalid-snapshot', `cannot restore: ${(err as Error).message}`, { version, state }),
    };
  }
}
