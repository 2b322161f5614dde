/**
 * The chart's topology, read from the chart (pod-chart.ts) for the code outside the machine: the leaf
 * states and their names, tags, steps and the phase each report moves a shadow to. Nothing here is typed
 * a second time: a state added to the chart is here at once.
 */
import type { StateValue, StateValueFrom } from 'xstate';
import { type PodSnapshot, podMachine } from './pod-chart.js';
import type { PodEventType, ShadowPhaseState, StepName } from './pod-types.js';
import { SHADOW_PHASE_STATES } from './pod-types.js';

type ChartValue = StateValueFrom<typeof podMachine>;
type LeavesOf<V> = V extends string ? V : V extends object ? { [K in keyof V]-?: LeavesOf<V[K]> }[keyof V] : never;
type CompoundsOf<V> = V extends object ? keyof V | { [K in keyof V]-?: CompoundsOf<V[K]> }[keyof V] : never;
/** A state of the chart that has no children: what a stored pod names (derived from the chart, not typed again). */
export type PodStateName = Exclude<LeavesOf<ChartValue>, CompoundsOf<ChartValue>>;

/**
 * Tags of the pod states: `shadow`, a shadow of the current generation should be running (launched or
 * reporting); `shadowRunning`, it has reported (its lease and session job can be checked); `settled`, the
 * pod waits for nothing of its own (active, failed, done).
 */
export type PodTag = 'shadow' | 'shadowRunning' | 'settled';

interface StateNodeView {
  key: string;
  path: readonly string[];
  tags: ReadonlySet<string>;
  meta?: { step?: StepName; pure?: boolean };
  states: Record<string, StateNodeView>;
}

/**
 * The chart's leaves, by name (the names are unique across the chart; a stored pod names its leaf), each
 * with its path from the root and the tags of the leaf and of every state around it.
 */
interface Leaf {
  path: readonly string[];
  tags: ReadonlySet<string>;
  meta: StateNodeView['meta'];
}

const leaves: ReadonlyMap<PodStateName, Leaf> = (() => {
  const found = new Map<PodStateName, Leaf>();
  const walk = (node: StateNodeView, inherited: readonly string[]) => {
    const tags = [...inherited, ...node.tags];
    const children = Object.values(node.states);
    if (children.length === 0)
      found.set(node.key as PodStateName, { path: node.path, tags: new Set(tags), meta: node.meta });
    for (const child of children) walk(child, tags);
  };
  for (const node of Object.values(podMachine.root.states as unknown as Record<string, StateNodeView>)) walk(node, []);
  return found;
})();

/**
 * The leaf states of the chart, in the chart's order (a healthy pod's path up to `tearingDown`, then `failed`, `done`): the names stored pods, `status` and the metrics use.
 */
export const POD_STATES: readonly PodStateName[] = [...leaves.keys()];
const POD_STATE_SET: ReadonlySet<string> = new Set(POD_STATES);

export function isPodStateName(value: string): value is PodStateName {
  return POD_STATE_SET.has(value);
}

/** Whether a state carries a tag, read from the chart (works on stored state names). */
export function stateHasTag(state: PodStateName, tag: PodTag): boolean {
  return leaves.get(state)?.tags.has(tag) ?? false;
}

/** The states with a tag. */
export function statesTagged(tag: PodTag): ReadonlySet<PodStateName> {
  return new Set(POD_STATES.filter((state) => stateHasTag(state, tag)));
}

/** The step each step state runs on entry, from the chart's `meta.step`. */
export const STEP_OF_STATE: Readonly<Partial<Record<PodStateName, StepName>>> = Object.fromEntries(
  POD_STATES.flatMap((state) => {
    const step = leaves.get(state)?.meta?.step;
    return step ? [[state, step]] : [];
  }),
);

/** The state a step belongs to: a step job that finds its pod in another state is stale. */
export const STATE_OF_STEP: Readonly<Record<StepName, PodStateName>> = Object.fromEntries(
  Object.entries(STEP_OF_STATE).map(([state, step]) => [step, state]),
) as Record<StepName, PodStateName>;

/** Steps that are pure functions of the pod and the site (`meta.pure`): the control worker runs them inline. */
export const PURE_STEPS: ReadonlySet<StepName> = new Set(
  [...leaves.values()].flatMap(({ meta }) => (meta?.pure && meta.step ? [meta.step] : [])),
);

/**
 * The state each phase report moves a just-launched shadow's pod to, read from `launchingShadow`'s own
 * transitions (a session host keeps how far its shadow got, for SHADOW_HELD).
 */
export const REPORT_STATES: Readonly<Partial<Record<PodEventType, ShadowPhaseState>>> = (() => {
  const launching = podMachine.getStateNodeById('pod.shadow.launchingShadow');
  const found: Partial<Record<PodEventType, ShadowPhaseState>> = {};
  for (const [type, transitions] of launching.transitions) {
    const target = transitions.length === 1 ? transitions[0]?.target?.[0]?.key : undefined;
    const phase = SHADOW_PHASE_STATES.find((state) => state === target);
    if (phase) found[type as PodEventType] = phase;
  }
  return found;
})();

/** The pod's leaf state: `{ shadow: 'active' }` is `active`. */
export function stateOf(snapshot: PodSnapshot): PodStateName {
  let value: unknown = snapshot.value;
  while (typeof value === 'object' && value !== null) value = Object.values(value)[0];
  return value as PodStateName;
}

/** Where a leaf sits in the chart, e.g. `shadow.active` (its state node's id is `pod.` and this). */
export function statePath(state: PodStateName): string {
  return (leaves.get(state)?.path ?? [state]).join('.');
}

/** The chart's value of a leaf state: `active` is `{ shadow: 'active' }`. */
export function chartValueOf(state: PodStateName): StateValue {
  const path = leaves.get(state)?.path ?? [state];
  return path.slice(0, -1).reduceRight<StateValue>((inner, key) => ({ [key]: inner }), state);
}
