import { describe, expect, it } from 'vitest';
import { initialTransition, transition } from 'xstate';
import {
  applyEvent,
  POD_ACTION_TYPES,
  POD_STATES,
  type PodEvent,
  type PodInput,
  type PodSnapshot,
  podMachine,
  startPod,
  stateOf,
} from '../../src/machines/pod-machine.js';

/**
 * The transition engine (src/machines/pod-transition.ts) runs XState's own `machine.transition` through
 * one actor scope made once, instead of XState's public pure `transition()`, which builds an inert actor
 * per call (bench:control's micro part: 6.9 µs against 32.6 µs per transition). It relies on XState
 * collecting a transition's actions through the scope's `actionExecutor` and on nothing else of the scope
 * being used by this chart. These tests compare it with the public API at every state and event: an
 * XState upgrade that changes either fails here.
 */
const T0 = 1_700_000_000_000;
const INPUT: PodInput = {
  uid: '7c1b0f1e-3c4f-4a5e-9d2b-0123456789ab',
  namespace: 'user',
  name: 'analysis',
  annotations: { 'interlink.eu/reverse-forwards': 'minio.user.svc.cluster.local:9000' },
  retryLimit: 3,
  backoffBaseMs: 1_000,
  backoffMaxMs: 5_000,
  nodeWaitTimeoutMs: 7_200_000,
  phaseTimeoutMs: 60_000,
};
const PLAN = { site: 'a'.repeat(64), plan: { uid: INPUT.uid } };
const SOFT = { kind: 'node-unreachable', message: 'connect ECONNREFUSED', permanent: false } as const;
const HARD = { kind: 'invalid-pod', message: 'bad annotation', permanent: true } as const;

const named = (actions: readonly { type: string; params?: unknown }[]) =>
  actions
    .filter((a) => (POD_ACTION_TYPES as readonly string[]).includes(a.type))
    .map((a) => ({ type: a.type, params: a.params }));

/** Every event a pod can receive, for a snapshot at `generation`. */
function events(generation: number, at: number): PodEvent[] {
  return [
    { type: 'POD_UPSERT', namespace: 'user', name: 'renamed', annotations: {}, at },
    { type: 'POD_DELETED', at },
    { type: 'RETRY', at },
    { type: 'TEARDOWN', reason: 'operator', at },
    { type: 'STEP_DONE', step: 'validate', generation, at },
    { type: 'STEP_DONE', step: 'render', generation, plan: PLAN, at },
    { type: 'STEP_DONE', step: 'teardown', generation, at },
    { type: 'STEP_FAILED', step: 'launch', generation, error: SOFT, at },
    { type: 'STEP_FAILED', step: 'validate', generation, error: HARD, at },
    { type: 'DEADLINE', name: 'launchingShadow', generation, at },
    { type: 'SHADOW_UP', host: 'h', generation, lease: 1, at },
    { type: 'BATCH_HOST', batchHost: 'n1', jobId: '7', generation, lease: 1, at },
    { type: 'CARRIER_OPEN', generation, lease: 1, at },
    { type: 'FORWARDS_READY', generation, lease: 1, at },
    { type: 'SHADOW_HELD', host: 'h', phase: 'active', generation: generation + 1, lease: 1, at },
    { type: 'SOCKETS_VANISHED', generation, lease: 1, at },
    { type: 'JOB_ENDED', jobState: 'COMPLETED', generation, lease: 1, at },
    { type: 'CARRIER_LOST', reason: 'keepalive', generation, lease: 1, at },
    { type: 'SESSION_FAILED', error: SOFT, generation, lease: 1, at },
  ];
}

/** A snapshot in each state the chart has, reached by the engine and checked against XState on the way. */
function snapshotsOfEveryState(): Map<string, PodSnapshot> {
  const found = new Map<string, PodSnapshot>();
  const queue: PodSnapshot[] = [startPod(INPUT, T0).snapshot];
  let at = T0;
  while (queue.length > 0 && found.size < POD_STATES.length) {
    const snapshot = queue.shift() as PodSnapshot;
    if (found.has(stateOf(snapshot))) continue;
    found.set(stateOf(snapshot), snapshot);
    at += 1;
    for (const event of events(snapshot.context.generation, at)) {
      const next = applyEvent(snapshot, event);
      if (next.changed) queue.push(next.snapshot);
    }
  }
  return found;
}

describe('the transition engine gives what XState’s public pure API gives', () => {
  it('startPod: the first snapshot and its effects are initialTransition’s', () => {
    const ours = startPod(INPUT, T0);
    const [reference, actions] = initialTransition(podMachine, { input: INPUT, at: T0 });
    expect(stateOf(reference)).toBe(stateOf(ours.snapshot));
    expect(reference.context).toEqual(ours.snapshot.context);
    expect(ours.actions.length).toBeGreaterThan(0);
    expect(ours.actions).toEqual(named(actions));
  });

  it('applyEvent: the next state, context and effects are transition()’s, for every state and event', () => {
    const states = snapshotsOfEveryState();
    expect([...states.keys()].sort()).toEqual([...POD_STATES].sort());
    let compared = 0;
    let withEffects = 0;
    for (const [state, snapshot] of states) {
      for (const event of events(snapshot.context.generation, T0 + 1_000)) {
        const ours = applyEvent(snapshot, event);
        if (snapshot.status !== 'active') {
          // XState's pure transition() still takes root transitions out of a final state; the engine does not.
          expect(ours.changed, `${state} + ${event.type}`).toBe(false);
          continue;
        }
        const [reference, actions] = transition(podMachine, snapshot, event);
        const seen = `${state} + ${event.type}`;
        expect(stateOf(ours.snapshot), seen).toBe(stateOf(reference));
        expect(ours.snapshot.context, seen).toEqual(reference.context);
        expect(ours.actions, seen).toEqual(ours.changed ? named(actions) : []);
        compared += 1;
        if (ours.actions.length > 0) withEffects += 1;
      }
    }
    expect(compared).toBeGreaterThan(150);
    expect(withEffects).toBeGreaterThan(20);
  });
});
