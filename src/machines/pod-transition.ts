/**
 * The transition engine: a pod's first snapshot and each next one, with the effects the chart asks for,
 * computed without running anything (the control worker runs the effects once the snapshot is stored).
 */
import { type AnyActorScope, createActor } from 'xstate';
import { type PodSnapshot, podMachine } from './pod-chart.js';
import { podInputSchema } from './pod-schema.js';
import { type PodStateName, stateOf } from './pod-topology.js';
import type { PodAction, PodEvent, PodInput } from './pod-types.js';
import { POD_ACTION_TYPES } from './pod-types.js';

export interface PodStep {
  snapshot: PodSnapshot;
  actions: PodAction[];
}

export interface PodTransition extends PodStep {
  /** False when the event was ignored: nothing to store, no actions. */
  changed: boolean;
  from: PodStateName;
  to: PodStateName;
}

/** The first snapshot of a pod and the effects of entering `validating`. Throws on bad input (a caller's bug). */
export function startPod(input: PodInput, at: number): PodStep {
  const checked = podInputSchema.parse(input);
  const snapshot = podMachine.getInitialSnapshot(transitionScope(), { input: checked, at }) as PodSnapshot;
  const executable = collected.splice(0);
  return { snapshot, actions: toPodActions(executable) };
}

/**
 * XState's pure `transition(machine, snapshot, event)` and `initialTransition` build a whole inert actor
 * (and actor system) for every call, which was half the control worker's CPU per event (bench:control). The pod machine spawns
 * no children, never uses `self` and runs no action itself (its effects are collected below), so one
 * scope made once serves every transition: the step is still XState's own `machine.transition`.
 * Node runs one transition at a time, so the collected list is never shared between two.
 */
let scope: AnyActorScope | undefined;
const collected: { type: string; params?: unknown }[] = [];

function transitionScope(): AnyActorScope {
  if (scope) return scope;
  const self = createActor(podMachine, {
    input: {
      input: podInputSchema.parse({
        uid: 'scope',
        namespace: 'scope',
        name: 'scope',
        annotations: {},
        retryLimit: 1,
        backoffBaseMs: 1,
        backoffMaxMs: 1,
        nodeWaitTimeoutMs: 1,
        phaseTimeoutMs: 1,
      }),
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

export function applyEvent(snapshot: PodSnapshot, event: PodEvent): PodTransition {
  const from = stateOf(snapshot);
  // XState's pure transition() still takes root-level transitions out of a final state: stop here.
  if (snapshot.status !== 'active') return { snapshot, actions: [], changed: false, from, to: from };
  const next = podMachine.transition(snapshot, event, transitionScope()) as PodSnapshot;
  const executable = collected.splice(0);
  const to = stateOf(next);
  const changed =
    next !== snapshot && (to !== from || JSON.stringify(next.context) !== JSON.stringify(snapshot.context));
  if (!changed) return { snapshot, actions: [], changed: false, from, to: from };
  return { snapshot: next, actions: toPodActions(executable), changed, from, to };
}

const ACTION_TYPES: ReadonlySet<string> = new Set(POD_ACTION_TYPES);

/** Keeps the named effects, as plain JSON objects; XState's own entries (assign …) are not effects. */
function toPodActions(executable: readonly { type: string; params?: unknown }[]): PodAction[] {
  return executable
    .filter((action) => ACTION_TYPES.has(action.type))
    .map((action) => ({ type: action.type, params: structuredClone(action.params) }) as PodAction);
}
