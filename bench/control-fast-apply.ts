/**
 * Experiment (bench only; src/ is not changed): XState's pure `transition(machine, snapshot, event)`
 * builds a whole inert actor for every call (createInertActorScope → createActor → the machine's
 * initial snapshot, whose context factory throws on the missing input — an Error with a stack trace,
 * caught by XState — then a fresh actor system). `fastApplyEvent` gives the machine one actor scope
 * made once per process instead; the transition itself is XState's own (`podMachine.transition`).
 * The pod machine spawns no children and uses no `self`, so a shared scope is safe for it.
 *
 * `applyPodEventWith` is src/workers/pod-events.ts's applyPodEvent with the apply function as a
 * parameter, so a worker variant can run the whole control path with either.
 */
import { type AnyActorScope, createActor } from 'xstate';
import {
  applyEvent,
  MACHINE_VERSION,
  POD_ACTION_TYPES,
  type PodAction,
  type PodContext,
  type PodEvent,
  type PodSnapshot,
  type PodTransition,
  persistPod,
  podMachine,
  restorePod,
  startPod,
  stateOf,
} from '../src/machines/pod-machine.js';
import type { HistoryEntry, PodWrite } from '../src/store/snapshot-store.js';
import { type FleetDeps, podLimits } from '../src/workers/fleet-deps.js';
import type { ApplyResult } from '../src/workers/pod-events.js';

let scope: AnyActorScope | undefined;
let collected: { type: string; params?: unknown }[] = [];

function sharedScope(): AnyActorScope {
  if (scope) return scope;
  const self = createActor(podMachine, {
    input: {
      input: {
        uid: 'scope',
        namespace: 'scope',
        name: 'scope',
        retryLimit: 1,
        backoffBaseMs: 1,
        backoffMaxMs: 1,
        nodeWaitTimeoutMs: 1,
        phaseTimeoutMs: 1,
      },
      at: 0,
    },
  });
  scope = {
    self,
    id: '',
    sessionId: '',
    logger: () => {},
    defer: () => {},
    emit: () => {},
    system: self.system,
    stopChild: () => {},
    actionExecutor: (action) => {
      collected.push(action as { type: string; params?: unknown });
    },
  };
  return scope;
}

const ACTION_TYPES: ReadonlySet<string> = new Set(POD_ACTION_TYPES);

function toPodActions(executable: readonly { type: string; params?: unknown }[]): PodAction[] {
  return executable
    .filter((action) => ACTION_TYPES.has(action.type))
    .map((action) => ({ type: action.type, params: structuredClone(action.params) }) as PodAction);
}

/** applyEvent of src/machines/pod-machine.ts, through the shared actor scope. */
export function fastApplyEvent(snapshot: PodSnapshot, event: PodEvent): PodTransition {
  const from = stateOf(snapshot);
  if (snapshot.status !== 'active') return { snapshot, actions: [], changed: false, from, to: from };
  const actorScope = sharedScope();
  collected = [];
  const next = podMachine.transition(snapshot, event, actorScope) as PodSnapshot;
  const executable = collected;
  collected = [];
  const to = stateOf(next);
  const changed =
    next !== snapshot && (to !== from || JSON.stringify(next.context) !== JSON.stringify(snapshot.context));
  if (!changed) return { snapshot, actions: [], changed: false, from, to: from };
  return { snapshot: next, actions: toPodActions(executable), changed, from, to };
}

// ---- applyPodEvent of src/workers/pod-events.ts with the apply function as a parameter ----

function detailOf(event: PodEvent): string | undefined {
  switch (event.type) {
    case 'SHADOW_UP':
      return `host ${event.host}`;
    case 'BATCH_HOST':
      return `job ${event.jobId} on ${event.batchHost}`;
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
    default:
      return undefined;
  }
}

function historyOf(event: PodEvent, from: string, to: string, generation: number): HistoryEntry {
  const detail = detailOf(event);
  return { at: event.at, event: event.type, from, to, generation, ...(detail === undefined ? {} : { detail }) };
}

function writeOf(context: PodContext, persisted: unknown, state: string, history: HistoryEntry): PodWrite {
  return {
    snapshot: persisted,
    version: MACHINE_VERSION,
    state,
    namespace: context.namespace,
    name: context.name,
    history,
  };
}

export type ApplyFn = (snapshot: PodSnapshot, event: PodEvent) => PodTransition;

export async function applyPodEventWith(
  deps: FleetDeps,
  uid: string,
  event: PodEvent,
  apply: ApplyFn = applyEvent,
): Promise<ApplyResult> {
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
        write: writeOf(context, persistPod(start.snapshot), to, historyOf(event, '', to, context.generation)),
        value: { kind: 'applied', from: null, to, actions: start.actions, context },
      };
    }
    const restored = restorePod(stored.snapshot);
    if (!restored.ok) return { value: { kind: 'unrestorable', message: restored.error.message } };
    const step = apply(restored.snapshot, event);
    if (!step.changed) return { value: { kind: 'ignored', state: step.from } };
    const context = step.snapshot.context;
    return {
      write: writeOf(
        context,
        persistPod(step.snapshot),
        step.to,
        historyOf(event, step.from, step.to, context.generation),
      ),
      value: { kind: 'applied', from: step.from, to: step.to, actions: step.actions, context },
    };
  });
  return outcome.value;
}
