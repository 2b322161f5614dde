import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { transition } from 'xstate';
import type { PodError } from '../../src/machines/error-kinds.js';
import {
  applyEvent,
  DEADLINE_NAMES,
  MACHINE_VERSION,
  POD_ACTION_TYPES,
  POD_STATES,
  type PodAction,
  type PodDeadline,
  type PodEvent,
  type PodInput,
  type PodSnapshot,
  type PodStateName,
  PURE_STEPS,
  parsePodEvent,
  persistPod,
  podActionsSchema,
  podMachine,
  REPORT_STATES,
  RestoreError,
  restorePod,
  SESSION_REPORT_TYPES,
  type SessionReport,
  type ShadowPhaseState,
  STATE_OF_STEP,
  STEP_OF_STATE,
  STEPS,
  startPod,
  stateHasTag,
  stateOf,
  statePath,
  statesTagged,
} from '../../src/machines/pod-machine.js';
import { backoffDelay, deadlineTimeout } from '../../src/machines/pod-rules.js';
import { podContextSchema } from '../../src/machines/pod-schema.js';

const T0 = 1_700_000_000_000;
const LIMITS = {
  retryLimit: 3,
  backoffBaseMs: 1_000,
  backoffMaxMs: 5_000,
  nodeWaitTimeoutMs: 7_200_000,
  phaseTimeoutMs: 60_000,
};
const INPUT: PodInput = {
  uid: '7c1b0f1e-3c4f-4a5e-9d2b-0123456789ab',
  namespace: 'user',
  name: 'analysis',
  annotations: { 'interlink.eu/reverse-forwards': 'minio.user.svc.cluster.local:9000' },
  ...LIMITS,
};
const HOST = 'session-host-a';
const BATCH = { batchHost: 'node-17', jobId: '4242' };
const SOFT: PodError = { kind: 'node-unreachable', message: 'connect ECONNREFUSED', permanent: false };
/** The login node out of reach: the whole site, not this pod. */
const SITE: PodError = {
  kind: 'login-unreachable',
  message: 'login 10.0.0.1:22: Timed out while waiting for handshake',
  permanent: false,
};
const HARD: PodError = { kind: 'host-key-mismatch', message: 'host key of login.example changed', permanent: true };

const SHADOW_STATES = [
  'launchingShadow',
  'waitingBatchHost',
  'openingCarrier',
  'establishingForwards',
  'active',
] as const satisfies readonly PodStateName[];

/** Applies an event and checks the contract every transition keeps. */
function step(snapshot: PodSnapshot, event: PodEvent) {
  const result = applyEvent(snapshot, event);
  if (!result.changed) {
    expect(result.actions).toEqual([]);
    expect(result.snapshot).toBe(snapshot);
    expect(result.to).toBe(result.from);
  }
  // Effects are plain data the worker can put into jobs.
  expect(JSON.parse(JSON.stringify(result.actions))).toEqual(result.actions);
  for (const action of result.actions) expect(POD_ACTION_TYPES).toContain(action.type);
  return result;
}

/** A report (or deadline, or launch failure) of the snapshot's current generation. */
function report(snapshot: PodSnapshot, type: SessionReport['type'] | 'DEADLINE', at: number): PodEvent {
  const generation = snapshot.context.generation;
  switch (type) {
    case 'SHADOW_UP':
      return { type, at, generation, host: HOST };
    case 'BATCH_HOST':
      return { type, at, generation, ...BATCH };
    case 'CARRIER_LOST':
      return { type, at, generation, reason: 'keepalive timeout' };
    case 'SESSION_FAILED':
      return { type, at, generation, error: SOFT };
    case 'SHADOW_HELD':
      return { type, at, generation, host: HOST, phase: 'active' };
    case 'DEADLINE':
      return { type, at, generation, name: snapshot.context.deadline?.name ?? 'launchingShadow' };
    default:
      return { type, at, generation };
  }
}

/** The ordinary way through the chart: each state, and the event that leads into it. */
const ORDINARY_PATH: readonly [PodStateName, (snapshot: PodSnapshot, at: number) => PodEvent][] = [
  ['rendering', (_, at) => ({ type: 'STEP_DONE', at, step: 'validate' })],
  ['launchingShadow', (_, at) => ({ type: 'STEP_DONE', at, step: 'render' })],
  ['waitingBatchHost', (snapshot, at) => report(snapshot, 'SHADOW_UP', at)],
  ['openingCarrier', (snapshot, at) => report(snapshot, 'BATCH_HOST', at)],
  ['establishingForwards', (snapshot, at) => report(snapshot, 'CARRIER_OPEN', at)],
  ['active', (snapshot, at) => report(snapshot, 'FORWARDS_READY', at)],
  ['tearingDown', (snapshot, at) => report(snapshot, 'JOB_ENDED', at)],
  ['done', (snapshot, at) => ({ type: 'STEP_DONE', at, step: 'teardown', generation: snapshot.context.generation })],
];

/** Drives a fresh pod into `target` the ordinary way; `at` advances one ms per event. */
function reach(target: PodStateName, input: PodInput = INPUT): PodSnapshot {
  let { snapshot } = startPod(input, T0);
  let at = T0;
  const go = (event: PodEvent) => {
    const result = applyEvent(snapshot, event);
    expect(result.changed).toBe(true);
    snapshot = result.snapshot;
  };
  const path: PodStateName[] = ['validating'];
  if (target === 'failed') {
    go({ type: 'STEP_FAILED', at: ++at, step: 'validate', error: HARD });
    expect(stateOf(snapshot)).toBe('failed');
    return snapshot;
  }
  for (const [next, event] of ORDINARY_PATH) {
    if (path.at(-1) === target) break;
    go(event(snapshot, ++at));
    path.push(next);
  }
  expect(stateOf(snapshot)).toBe(target);
  return snapshot;
}

const types = (actions: PodAction[]) => actions.map((a) => a.type);

describe('pod machine: its topology, read from the chart by the code outside it', () => {
  it('holds the shadow phases in one compound state, whose transitions they share', () => {
    const shadow = podMachine.getStateNodeById('pod.shadow');
    expect(Object.keys(shadow.states)).toEqual([...statesTagged('shadow')]);
    expect(shadow.tags).toEqual(['shadow']);
    // Said once, on the parent: each phase ends the same way.
    for (const event of ['SOCKETS_VANISHED', 'JOB_ENDED', 'CARRIER_LOST', 'SESSION_FAILED', 'DEADLINE'])
      expect(Object.keys(shadow.config.on ?? {}), event).toContain(event);
    for (const phase of Object.values(shadow.states))
      for (const event of ['SOCKETS_VANISHED', 'JOB_ENDED', 'CARRIER_LOST', 'SESSION_FAILED', 'DEADLINE'])
        expect(Object.keys(phase.config.on ?? {}), `${phase.key} ${event}`).not.toContain(event);
    // Stored pods name the leaf; the value XState keeps is the path.
    const active = reach('active');
    expect(active.value).toEqual({ shadow: 'active' });
    expect(stateOf(active)).toBe('active');
    expect(persistPod(active).state).toBe('active');
    expect(statePath('active')).toBe('shadow.active');
    expect(statePath('failed')).toBe('failed');
  });

  it('restores a stored phase into the compound state, and it goes on from there', () => {
    const stored = JSON.parse(JSON.stringify(persistPod(reach('openingCarrier'))));
    expect(stored.state).toBe('openingCarrier');
    const restored = restorePod(stored);
    if (!restored.ok) throw restored.error;
    expect(restored.snapshot.value).toEqual({ shadow: 'openingCarrier' });
    expect(restored.snapshot.hasTag('shadowRunning')).toBe(true);
    const { generation } = restored.snapshot.context;
    const next = applyEvent(restored.snapshot, { type: 'CARRIER_OPEN', generation, at: T0 + 5 });
    expect(next.to).toBe('establishingForwards');
  });

  it('tags the shadow states, those whose shadow has reported, and the settled ones', () => {
    expect([...statesTagged('shadow')]).toEqual([
      'launchingShadow',
      'waitingBatchHost',
      'openingCarrier',
      'establishingForwards',
      'active',
    ]);
    expect([...statesTagged('shadowRunning')]).toEqual([
      'waitingBatchHost',
      'openingCarrier',
      'establishingForwards',
      'active',
    ]);
    expect([...statesTagged('settled')]).toEqual(['active', 'failed', 'done']);
    // The stored state name is enough: no snapshot is needed to ask.
    expect(stateHasTag('tearingDown', 'shadow')).toBe(false);
  });

  it('names the step of each step state, both ways, and the pure ones', () => {
    expect(STEP_OF_STATE).toEqual({
      validating: 'validate',
      rendering: 'render',
      launchingShadow: 'launch',
      tearingDown: 'teardown',
    });
    for (const step of STEPS) expect(STEP_OF_STATE[STATE_OF_STEP[step]], step).toBe(step);
    expect([...PURE_STEPS]).toEqual(['validate', 'render']);
  });

  it('agrees with what the chart does: entering a step state asks for its step', () => {
    for (const [state, step] of Object.entries(STEP_OF_STATE)) {
      const node = podMachine.getStateNodeById(`pod.${statePath(state as PodStateName)}`);
      expect(JSON.stringify(node?.entry), state).toContain('runStep');
      expect(POD_STATES, step).toContain(state);
    }
  });
});

describe('pod machine: a refused pod that changes', () => {
  const refused = () => {
    const { snapshot } = startPod(INPUT, T0);
    const failed = applyEvent(snapshot, {
      type: 'STEP_FAILED',
      step: 'validate',
      generation: 0,
      error: { kind: 'invalid-pod', message: 'cluster: namespace quiet is not labelled', permanent: true },
      at: T0 + 1,
    });
    expect(failed.to).toBe('failed');
    return failed.snapshot;
  };
  const upsert = (annotations: Record<string, string>): PodEvent => ({
    type: 'POD_UPSERT',
    namespace: 'user',
    name: 'analysis',
    annotations,
    at: T0 + 2,
  });

  it('is validated again when its annotations change (a fixed entry, a verdict lifted)', () => {
    const changed = { ...INPUT.annotations, 'backhaul.interlink.eu/cluster-verdict': 'ok' };
    const next = applyEvent(refused(), upsert(changed));
    expect(next.to).toBe('validating');
    expect(next.snapshot.context.annotations).toEqual(changed);
    expect(next.snapshot.context.attempts).toBe(0);
    expect(next.actions).toEqual([{ type: 'runStep', params: { step: 'validate', generation: 0 } }]);
  });

  it('stays failed for the same pod again, and for a failure that was not a refusal', () => {
    expect(applyEvent(refused(), upsert(INPUT.annotations ?? {})).changed).toBe(false);
    const lost = applyEvent(reach('active'), {
      type: 'SESSION_FAILED',
      generation: 1,
      error: { kind: 'forwarding-refused', message: 'no', permanent: true },
      at: T0 + 3,
    });
    expect(lost.to).toBe('failed');
    const next = applyEvent(lost.snapshot, upsert({ ...INPUT.annotations, x: 'y' }));
    expect(next.to).toBe('failed');
    expect(next.snapshot.context.annotations).toMatchObject({ x: 'y' });
  });
});

describe('pod machine: the happy path', () => {
  it('starts in validating and asks for the validate step', () => {
    const { snapshot, actions } = startPod(INPUT, T0);
    expect(stateOf(snapshot)).toBe('validating');
    expect(actions).toEqual([{ type: 'runStep', params: { step: 'validate', generation: 0 } }]);
    expect(snapshot.context).toMatchObject({
      uid: INPUT.uid,
      namespace: 'user',
      name: 'analysis',
      createdAt: T0,
      generation: 0,
      attempts: 0,
      deadline: null,
      host: null,
      lastError: null,
      podDeleted: false,
    });
  });

  it('refuses bad input at start (a caller bug)', () => {
    expect(() => startPod({ ...INPUT, retryLimit: 0 }, T0)).toThrow(/retryLimit/);
    expect(() => startPod({ ...INPUT, backoffMaxMs: 10 }, T0)).toThrow(/backoffMaxMs/);
    expect(() => startPod({ ...INPUT, uid: '' }, T0)).toThrow(/uid/);
  });

  it('goes validating → … → active → tearingDown → done with the exact effects', () => {
    let { snapshot } = startPod(INPUT, T0);
    /** The effects, and the deadline the state holds (kept in context; the store indexes it). */
    const expectStep = (
      event: PodEvent,
      to: PodStateName,
      actions: PodAction[],
      deadline: PodDeadline | null = null,
    ) => {
      const result = step(snapshot, event);
      expect(result.changed).toBe(true);
      expect(result.to).toBe(to);
      expect(result.actions).toEqual(actions);
      expect(result.snapshot.context.deadline).toEqual(deadline);
      snapshot = result.snapshot;
    };
    expectStep({ type: 'STEP_DONE', at: T0 + 1, step: 'validate', generation: 0 }, 'rendering', [
      { type: 'runStep', params: { step: 'render', generation: 0 } },
    ]);
    expectStep(
      { type: 'STEP_DONE', at: T0 + 2, step: 'render', generation: 0 },
      'launchingShadow',
      [{ type: 'runStep', params: { step: 'launch', generation: 1, delayMs: 0 } }],
      { name: 'launchingShadow', at: T0 + 2 + 60_000, generation: 1 },
    );
    expect(snapshot.context).toMatchObject({ generation: 1, attempts: 1 });
    expectStep({ type: 'SHADOW_UP', at: T0 + 3, generation: 1, host: HOST }, 'waitingBatchHost', [], {
      name: 'waitingBatchHost',
      at: T0 + 3 + 7_200_000,
      generation: 1,
    });
    expect(snapshot.context.host).toBe(HOST);
    expectStep({ type: 'BATCH_HOST', at: T0 + 4, generation: 1, ...BATCH }, 'openingCarrier', [], {
      name: 'openingCarrier',
      at: T0 + 4 + 60_000,
      generation: 1,
    });
    expect(snapshot.context).toMatchObject(BATCH);
    expectStep({ type: 'CARRIER_OPEN', at: T0 + 5, generation: 1 }, 'establishingForwards', [], {
      name: 'establishingForwards',
      at: T0 + 5 + 60_000,
      generation: 1,
    });
    expectStep({ type: 'FORWARDS_READY', at: T0 + 6, generation: 1 }, 'active', []);
    expect(snapshot.context).toMatchObject({ attempts: 0, forwardsReadyAt: T0 + 6, deadline: null });
    expectStep({ type: 'SOCKETS_VANISHED', at: T0 + 7, generation: 1 }, 'tearingDown', [
      { type: 'runStep', params: { step: 'teardown', generation: 1 } },
    ]);
    expect(snapshot.context.teardownReason).toBe('sockets-vanished');
    expectStep({ type: 'STEP_DONE', at: T0 + 8, step: 'teardown', generation: 1 }, 'done', []);
    expect(snapshot.status).toBe('done');
  });

  it('STEP_FAILED of validate or render → failed with the error', () => {
    for (const [state, stepName] of [
      ['validating', 'validate'],
      ['rendering', 'render'],
    ] as const) {
      const result = step(reach(state), {
        type: 'STEP_FAILED',
        at: T0 + 100,
        step: stepName,
        error: { kind: 'invalid-pod', message: 'interlink.eu/reverse-forwards entry "x:udp"', permanent: true },
      });
      expect(result.to).toBe('failed');
      expect(result.actions).toEqual([]);
      expect(result.snapshot.context.lastError).toEqual({
        kind: 'invalid-pod',
        message: 'interlink.eu/reverse-forwards entry "x:udp"',
        at: T0 + 100,
      });
    }
  });

  it('step results of another step or an older generation are ignored', () => {
    const validating = reach('validating');
    expect(step(validating, { type: 'STEP_DONE', at: T0, step: 'render' }).changed).toBe(false);
    expect(step(validating, { type: 'STEP_DONE', at: T0, step: 'validate', generation: 7 }).changed).toBe(false);
    const rendering = reach('rendering');
    expect(step(rendering, { type: 'STEP_DONE', at: T0, step: 'validate' }).changed).toBe(false);
    const tearingDown = reach('tearingDown');
    expect(step(tearingDown, { type: 'STEP_DONE', at: T0, step: 'teardown', generation: 0 }).changed).toBe(false);
    expect(step(tearingDown, { type: 'STEP_DONE', at: T0, step: 'launch', generation: 1 }).changed).toBe(false);
    // A launch step that succeeded changes nothing: the shadow reports for itself.
    const launching = reach('launchingShadow');
    expect(step(launching, { type: 'STEP_DONE', at: T0, step: 'launch', generation: 1 }).changed).toBe(false);
  });
});

describe('pod machine: session reports in every shadow state', () => {
  type Expect = PodStateName | 'ignored';
  // Rows: the state; columns: a report of the current generation → where it leads.
  const table: Record<(typeof SHADOW_STATES)[number], Record<SessionReport['type'] | 'DEADLINE', Expect>> = {
    launchingShadow: {
      SHADOW_UP: 'waitingBatchHost',
      BATCH_HOST: 'openingCarrier',
      CARRIER_OPEN: 'establishingForwards',
      FORWARDS_READY: 'active',
      SHADOW_HELD: 'active',
      SOCKETS_VANISHED: 'tearingDown',
      JOB_ENDED: 'tearingDown',
      CARRIER_LOST: 'launchingShadow',
      SESSION_FAILED: 'launchingShadow',
      DEADLINE: 'launchingShadow',
    },
    waitingBatchHost: {
      SHADOW_UP: 'ignored',
      BATCH_HOST: 'openingCarrier',
      CARRIER_OPEN: 'establishingForwards',
      FORWARDS_READY: 'active',
      SHADOW_HELD: 'active',
      SOCKETS_VANISHED: 'tearingDown',
      JOB_ENDED: 'tearingDown',
      CARRIER_LOST: 'launchingShadow',
      SESSION_FAILED: 'launchingShadow',
      DEADLINE: 'failed',
    },
    openingCarrier: {
      SHADOW_UP: 'ignored',
      BATCH_HOST: 'ignored',
      CARRIER_OPEN: 'establishingForwards',
      FORWARDS_READY: 'active',
      SHADOW_HELD: 'active',
      SOCKETS_VANISHED: 'tearingDown',
      JOB_ENDED: 'tearingDown',
      CARRIER_LOST: 'launchingShadow',
      SESSION_FAILED: 'launchingShadow',
      DEADLINE: 'launchingShadow',
    },
    establishingForwards: {
      SHADOW_UP: 'ignored',
      BATCH_HOST: 'ignored',
      CARRIER_OPEN: 'ignored',
      FORWARDS_READY: 'active',
      SHADOW_HELD: 'active',
      SOCKETS_VANISHED: 'tearingDown',
      JOB_ENDED: 'tearingDown',
      CARRIER_LOST: 'launchingShadow',
      SESSION_FAILED: 'launchingShadow',
      DEADLINE: 'launchingShadow',
    },
    active: {
      SHADOW_UP: 'ignored',
      BATCH_HOST: 'ignored',
      CARRIER_OPEN: 'ignored',
      FORWARDS_READY: 'ignored',
      SHADOW_HELD: 'ignored',
      SOCKETS_VANISHED: 'tearingDown',
      JOB_ENDED: 'tearingDown',
      CARRIER_LOST: 'launchingShadow',
      SESSION_FAILED: 'launchingShadow',
      DEADLINE: 'ignored',
    },
  };
  it('REPORT_STATES (what a session host keeps of its shadow, for SHADOW_HELD) says what the chart does', () => {
    expect(Object.keys(REPORT_STATES).sort()).toEqual(['BATCH_HOST', 'CARRIER_OPEN', 'FORWARDS_READY', 'SHADOW_UP']);
    for (const [type, state] of Object.entries(REPORT_STATES)) {
      expect(table.launchingShadow[type as keyof (typeof table)['launchingShadow']], type).toBe(state);
    }
  });

  const cases = SHADOW_STATES.flatMap((state) =>
    Object.entries(table[state]).map(([type, expected]) => ({
      state,
      type: type as SessionReport['type'] | 'DEADLINE',
      expected,
    })),
  );

  it.each(cases)('$state + $type → $expected', ({ state, type, expected }) => {
    const before = reach(state);
    const at = T0 + 1_000;
    const result = step(before, report(before, type, at));
    if (expected === 'ignored') {
      expect(result.changed).toBe(false);
      return;
    }
    expect(result.changed).toBe(true);
    expect(result.to).toBe(expected);
    const ctx = result.snapshot.context;
    const stop = { type: 'stopShadow', params: { generation: before.context.generation, reason: expect.any(String) } };
    switch (expected) {
      case 'launchingShadow': {
        expect(ctx.generation).toBe(before.context.generation + 1);
        expect(ctx.attempts).toBe(before.context.attempts + 1);
        const delayMs = backoffDelay(before.context.attempts, LIMITS.backoffBaseMs, LIMITS.backoffMaxMs);
        expect(result.actions).toEqual([
          stop,
          { type: 'runStep', params: { step: 'launch', generation: ctx.generation, delayMs } },
        ]);
        expect(ctx.deadline).toEqual({
          name: 'launchingShadow',
          at: at + delayMs + LIMITS.phaseTimeoutMs,
          generation: ctx.generation,
        });
        expect(ctx.lastError?.at).toBe(at);
        expect(ctx.host).toBeNull();
        break;
      }
      case 'tearingDown':
        expect(result.actions).toEqual([
          { type: 'runStep', params: { step: 'teardown', generation: before.context.generation } },
        ]);
        expect(ctx.teardownReason).toBe(type === 'JOB_ENDED' ? 'job-ended' : 'sockets-vanished');
        expect(ctx.deadline).toBeNull();
        break;
      case 'failed':
        expect(result.actions).toEqual([stop]);
        expect(ctx.lastError).toMatchObject({ kind: 'node-wait-timeout', at });
        expect(ctx.deadline).toBeNull();
        break;
      default: {
        // Forward progress: the old deadline goes, the new state's (if any) comes.
        const name = expected as (typeof DEADLINE_NAMES)[number];
        expect(result.actions).toEqual([]);
        expect(ctx.deadline).toEqual(
          (DEADLINE_NAMES as readonly string[]).includes(expected)
            ? { name, at: at + deadlineTimeout(ctx, name), generation: ctx.generation }
            : null,
        );
        expect(ctx.generation).toBe(before.context.generation);
      }
    }
  });

  it.each(
    SHADOW_STATES.flatMap((state) =>
      [...SESSION_REPORT_TYPES, 'DEADLINE' as const].flatMap((type) => [
        { state, type, delta: -1 },
        // A held shadow of a newer generation is taken over (its own describe, above).
        ...(type === 'SHADOW_HELD' ? [] : [{ state, type, delta: +1 }]),
      ]),
    ),
  )('$state ignores $type of generation current$delta', ({ state, type, delta }) => {
    const before = reach(state);
    const event = report(before, type, T0 + 1_000) as PodEvent & { generation: number };
    const result = step(before, { ...event, generation: before.context.generation + delta } as PodEvent);
    expect(result.changed).toBe(false);
  });

  it('session reports outside the shadow states are ignored', () => {
    for (const state of ['validating', 'rendering', 'tearingDown', 'failed', 'done'] as const) {
      const before = reach(state);
      for (const type of SESSION_REPORT_TYPES) {
        expect(step(before, report(before, type, T0 + 1_000)).changed, `${state} ${type}`).toBe(false);
      }
    }
  });

  it('a late report of a passed phase fills in what it knows, without moving', () => {
    let snapshot = reach('launchingShadow');
    // BATCH_HOST overtook SHADOW_UP: the pod moves on and learns the host when SHADOW_UP arrives.
    snapshot = step(snapshot, report(snapshot, 'BATCH_HOST', T0 + 10)).snapshot;
    expect(stateOf(snapshot)).toBe('openingCarrier');
    expect(snapshot.context.host).toBeNull();
    const late = step(snapshot, report(snapshot, 'SHADOW_UP', T0 + 11));
    expect(late).toMatchObject({ changed: true, from: 'openingCarrier', to: 'openingCarrier', actions: [] });
    expect(late.snapshot.context.host).toBe(HOST);
    expect(late.snapshot.context.deadline).toEqual(snapshot.context.deadline);
    // The same report again brings nothing.
    expect(step(late.snapshot, report(late.snapshot, 'SHADOW_UP', T0 + 12)).changed).toBe(false);
    // A changed batch host (the job was requeued) is noted in active too.
    const active = reach('active');
    const moved = step(active, { type: 'BATCH_HOST', at: T0 + 13, generation: 1, batchHost: 'node-3', jobId: '4242' });
    expect(moved.to).toBe('active');
    expect(moved.snapshot.context.batchHost).toBe('node-3');
  });

  it('STEP_FAILED(launch) of the current generation relaunches; other steps and generations are ignored', () => {
    const before = reach('launchingShadow');
    const failed = step(before, { type: 'STEP_FAILED', at: T0 + 50, step: 'launch', generation: 1, error: SOFT });
    expect(failed.to).toBe('launchingShadow');
    expect(failed.snapshot.context.generation).toBe(2);
    expect(failed.snapshot.context.lastError).toEqual({ kind: SOFT.kind, message: SOFT.message, at: T0 + 50 });
    // Without an error the kind names the step.
    const bare = step(before, { type: 'STEP_FAILED', at: T0 + 50, step: 'launch' });
    expect(bare.snapshot.context.lastError?.kind).toBe('launch-failed');
    expect(step(before, { type: 'STEP_FAILED', at: T0, step: 'launch', generation: 0 }).changed).toBe(false);
    expect(step(before, { type: 'STEP_FAILED', at: T0, step: 'render' }).changed).toBe(false);
    for (const state of ['waitingBatchHost', 'openingCarrier', 'establishingForwards', 'active'] as const) {
      const later = reach(state);
      expect(step(later, { type: 'STEP_FAILED', at: T0, step: 'launch', generation: 1 }).changed).toBe(false);
    }
  });
});

describe('pod machine: a shadow held through a loss of Redis data (SHADOW_HELD)', () => {
  const held = (generation: number, phase: ShadowPhaseState, at = T0 + 5_000): PodEvent => ({
    type: 'SHADOW_HELD',
    at,
    generation,
    lease: 99,
    host: 'host-kept',
    phase,
    ...BATCH,
    addresses: ['127.0.5.1'],
    isolation: { relay: 'job', sockets: 'job' },
  });

  it('a rebuilt record (its first launch under way) takes the live shadow of its own generation where it got: no second launch is stopped, the deadline is that phase', () => {
    const rebuilt = reach('launchingShadow');
    expect(rebuilt.context.generation).toBe(1);
    const result = step(rebuilt, held(1, 'waitingBatchHost'));
    expect(result.to).toBe('waitingBatchHost');
    // The launched session job of generation 1 is the same shadow's: nothing to stop (its host stands down).
    expect(result.actions).toEqual([]);
    const ctx = result.snapshot.context;
    expect(ctx).toMatchObject({ generation: 1, host: 'host-kept', ...BATCH, forwardsReadyAt: null });
    expect(ctx.deadline).toEqual({
      name: 'waitingBatchHost',
      at: T0 + 5_000 + deadlineTimeout(ctx, 'waitingBatchHost'),
      generation: 1,
    });
  });

  it('a shadow of a newer generation (the pod had relaunched before the loss): the pod takes its generation, active, and stops the one it launched', () => {
    const rebuilt = reach('launchingShadow');
    const result = step(rebuilt, held(3, 'active'));
    expect(result.to).toBe('active');
    expect(result.actions).toEqual([{ type: 'stopShadow', params: { generation: 1, reason: 'adopted' } }]);
    expect(result.snapshot.context).toMatchObject({
      generation: 3,
      host: 'host-kept',
      ...BATCH,
      attempts: 0,
      forwardsReadyAt: T0 + 5_000,
      relayAddresses: ['127.0.5.1'],
      isolation: { relay: 'job', sockets: 'job' },
      deadline: null,
    });
    // From now on the held shadow's reports drive the pod; the launched one's are stale.
    const after = result.snapshot;
    expect(step(after, { type: 'JOB_ENDED', at: T0 + 6_000, generation: 1 }).changed).toBe(false);
    expect(step(after, { type: 'JOB_ENDED', at: T0 + 6_000, generation: 3 }).to).toBe('tearingDown');
  });

  it('the same phase at a newer generation re-enters it: its deadline is re-armed for the held generation', () => {
    const waiting = reach('waitingBatchHost');
    const result = step(waiting, held(2, 'waitingBatchHost'));
    expect(result.to).toBe('waitingBatchHost');
    expect(result.actions).toEqual([{ type: 'stopShadow', params: { generation: 1, reason: 'adopted' } }]);
    expect(result.snapshot.context.deadline).toMatchObject({ name: 'waitingBatchHost', generation: 2 });
  });

  it('changes nothing when the pod is there already, is older news, or the pod is not waiting for a shadow', () => {
    const active = reach('active');
    expect(step(active, held(1, 'active')).changed).toBe(false);
    expect(step(active, held(1, 'establishingForwards')).changed).toBe(false);
    expect(step(reach('establishingForwards'), held(1, 'openingCarrier')).changed).toBe(false);
    expect(step(reach('launchingShadow'), held(0, 'active')).changed).toBe(false);
    for (const state of ['validating', 'rendering', 'tearingDown', 'failed'] as const) {
      expect(step(reach(state), held(5, 'active')).changed, state).toBe(false);
    }
  });
});

describe('pod machine: deadlines', () => {
  it('each deadline state holds exactly one deadline of its own name and generation; others hold none', () => {
    for (const state of POD_STATES) {
      const snapshot = reach(state);
      const deadline = snapshot.context.deadline;
      if ((DEADLINE_NAMES as readonly string[]).includes(state)) {
        expect(deadline).toMatchObject({ name: state, generation: snapshot.context.generation });
      } else {
        expect(deadline, state).toBeNull();
      }
    }
  });

  it('computes deadlines from the event time: phase timeout, node wait, backoff included', () => {
    const launching = reach('launchingShadow');
    expect(launching.context.deadline?.at).toBe(T0 + 2 + LIMITS.phaseTimeoutMs);
    const relaunched = step(launching, report(launching, 'CARRIER_LOST', T0 + 500)).snapshot;
    // attempts was 1: the relaunch waits backoffBase first, and the deadline counts it.
    expect(relaunched.context.deadline?.at).toBe(T0 + 500 + LIMITS.backoffBaseMs + LIMITS.phaseTimeoutMs);
    const waiting = reach('waitingBatchHost');
    expect(waiting.context.deadline?.at).toBe(T0 + 3 + LIMITS.nodeWaitTimeoutMs);
  });

  it('leaving a deadline state by any transition withdraws its deadline', () => {
    for (const state of DEADLINE_NAMES) {
      for (const event of [
        { type: 'TEARDOWN', at: T0 + 9, reason: 'operator' } as const,
        { type: 'POD_DELETED', at: T0 + 9 } as const,
      ]) {
        const before = reach(state);
        const result = step(before, event);
        expect(before.context.deadline).toMatchObject({ name: state, generation: before.context.generation });
        expect(result.snapshot.context.deadline).toBeNull();
      }
    }
  });

  it('a DEADLINE whose name or generation is not current is ignored', () => {
    for (const state of DEADLINE_NAMES) {
      const before = reach(state);
      const generation = before.context.generation;
      for (const name of DEADLINE_NAMES.filter((n) => n !== state)) {
        expect(step(before, { type: 'DEADLINE', at: T0 + 5, name, generation }).changed).toBe(false);
      }
      expect(step(before, { type: 'DEADLINE', at: T0 + 5, name: state, generation: generation - 1 }).changed).toBe(
        false,
      );
    }
    // The deadline of a state already left, delivered late.
    const waiting = reach('waitingBatchHost');
    expect(step(waiting, { type: 'DEADLINE', at: T0 + 5, name: 'launchingShadow', generation: 1 }).changed).toBe(false);
    for (const state of ['validating', 'rendering', 'active', 'tearingDown', 'failed', 'done'] as const) {
      const snapshot = reach(state);
      for (const name of DEADLINE_NAMES) {
        const event = { type: 'DEADLINE', at: T0 + 5, name, generation: snapshot.context.generation } as const;
        expect(step(snapshot, event).changed, `${state} ${name}`).toBe(false);
      }
    }
  });

  it('the DEADLINE of a relaunched generation is the new one; the old generation’s is stale', () => {
    const first = reach('openingCarrier');
    const relaunched = step(first, report(first, 'DEADLINE', T0 + 60_000)).snapshot;
    expect(relaunched.context.generation).toBe(2);
    expect(
      step(relaunched, { type: 'DEADLINE', at: T0 + 60_001, name: 'launchingShadow', generation: 1 }).changed,
    ).toBe(false);
    const again = step(relaunched, { type: 'DEADLINE', at: T0 + 200_000, name: 'launchingShadow', generation: 2 });
    expect(again.to).toBe('launchingShadow');
    expect(again.snapshot.context.generation).toBe(3);
  });
});

describe('pod machine: retry budget and backoff', () => {
  it('backoffDelay: 0 for the first launch, then base·2^(n-1) capped at max', () => {
    expect([0, 1, 2, 3, 4, 5, 60].map((n) => backoffDelay(n, 1_000, 5_000))).toEqual([
      0, 1_000, 2_000, 4_000, 5_000, 5_000, 5_000,
    ]);
    expect(backoffDelay(3, 250, 100_000)).toBe(1_000);
  });

  it('relaunches with the exact delays, stops each old shadow, and fails once the budget is spent', () => {
    const input = { ...INPUT, retryLimit: 5, backoffBaseMs: 1_000, backoffMaxMs: 5_000 };
    let snapshot = reach('launchingShadow', input);
    const delays: number[] = [];
    const stopped: number[] = [];
    let at = T0 + 1_000;
    // Bounded: a machine that never gives up must fail this test, not hang it.
    for (let loss = 0; loss < 20; loss += 1) {
      at += 1_000;
      const result = step(snapshot, report(snapshot, 'CARRIER_LOST', at));
      for (const action of result.actions) {
        if (action.type === 'runStep') delays.push(action.params.delayMs ?? -1);
        if (action.type === 'stopShadow') stopped.push(action.params.generation);
      }
      snapshot = result.snapshot;
      if (result.to === 'failed') break;
      expect(result.to).toBe('launchingShadow');
    }
    expect(delays).toEqual([1_000, 2_000, 4_000, 5_000]);
    expect(stopped).toEqual([1, 2, 3, 4, 5]);
    expect(snapshot.context).toMatchObject({ attempts: 5, generation: 5, deadline: null });
    expect(snapshot.context.lastError).toMatchObject({ kind: 'carrier-lost', message: 'keepalive timeout' });
  });

  it('the site out of reach spends no launch: the pod relaunches, backing off to 30 s, until it answers', () => {
    const input = { ...INPUT, retryLimit: 3, backoffBaseMs: 1_000, backoffMaxMs: 300_000 };
    let snapshot = reach('launchingShadow', input);
    snapshot = step(snapshot, report(snapshot, 'CARRIER_LOST', T0 + 100)).snapshot; // the carrier died: 1 spent
    expect(snapshot.context.attempts).toBe(2);
    const delays: number[] = [];
    let at = T0 + 200;
    // Forty failures in a row: a budget of 3 would have failed the pod at the third.
    for (let i = 0; i < 40; i++) {
      at += 1_000;
      const result = step(snapshot, {
        type: 'SESSION_FAILED',
        at,
        generation: snapshot.context.generation,
        error: SITE,
      });
      expect(result.to, `failure ${i}`).toBe('launchingShadow');
      for (const action of result.actions) if (action.type === 'runStep') delays.push(action.params.delayMs ?? -1);
      snapshot = result.snapshot;
    }
    expect(snapshot.context.attempts).toBe(2);
    expect(snapshot.context.lastError).toMatchObject({ kind: 'login-unreachable' });
    expect(delays.slice(0, 6)).toEqual([2_000, 4_000, 8_000, 16_000, 30_000, 30_000]);
    expect(Math.max(...delays)).toBe(30_000);
    // The site answers again; a failure of the pod's own spends again, from where it was.
    const own = step(snapshot, {
      type: 'SESSION_FAILED',
      at: at + 1,
      generation: snapshot.context.generation,
      error: SOFT,
    });
    expect(own.to).toBe('launchingShadow');
    expect(own.snapshot.context.attempts).toBe(3);
    const last = step(own.snapshot, {
      type: 'SESSION_FAILED',
      at: at + 2,
      generation: own.snapshot.context.generation,
      error: SOFT,
    });
    expect(last.to).toBe('failed');
  });

  it('FORWARDS_READY resets the count: the next loss relaunches at once with the whole budget', () => {
    let snapshot = reach('launchingShadow');
    snapshot = step(snapshot, report(snapshot, 'SESSION_FAILED', T0 + 10)).snapshot;
    snapshot = step(snapshot, report(snapshot, 'SESSION_FAILED', T0 + 20)).snapshot;
    expect(snapshot.context.attempts).toBe(3); // the budget (3) is now spent
    snapshot = step(snapshot, report(snapshot, 'FORWARDS_READY', T0 + 30)).snapshot;
    expect(stateOf(snapshot)).toBe('active');
    expect(snapshot.context.attempts).toBe(0);
    const lost = step(snapshot, report(snapshot, 'CARRIER_LOST', T0 + 40));
    expect(lost.to).toBe('launchingShadow');
    expect(lost.actions).toContainEqual({ type: 'runStep', params: { step: 'launch', generation: 4, delayMs: 0 } });
    expect(lost.snapshot.context.attempts).toBe(1);
  });

  it('a permanent error fails at once from every shadow state, budget or not', () => {
    for (const state of SHADOW_STATES) {
      const before = reach(state);
      const result = step(before, { type: 'SESSION_FAILED', at: T0 + 77, generation: 1, error: HARD });
      expect(result.to, state).toBe('failed');
      expect(types(result.actions)).not.toContain('runStep');
      expect(result.actions).toContainEqual({
        type: 'stopShadow',
        params: { generation: 1, reason: 'host-key-mismatch' },
      });
      expect(result.snapshot.context.lastError).toEqual({ kind: HARD.kind, message: HARD.message, at: T0 + 77 });
      expect(result.snapshot.context.generation).toBe(1);
    }
    const launching = reach('launchingShadow');
    const launch = step(launching, { type: 'STEP_FAILED', at: T0, step: 'launch', generation: 1, error: HARD });
    expect(launch.to).toBe('failed');
  });

  it('the node wait deadline fails at once (waiting again would wait as long again)', () => {
    const waiting = reach('waitingBatchHost');
    const result = step(waiting, report(waiting, 'DEADLINE', T0 + LIMITS.nodeWaitTimeoutMs));
    expect(result.to).toBe('failed');
    expect(result.snapshot.context.lastError?.kind).toBe('node-wait-timeout');
  });
});

describe('pod machine: TEARDOWN, POD_DELETED and RETRY from every state', () => {
  it.each(
    POD_STATES.flatMap((state) => (['TEARDOWN', 'POD_DELETED'] as const).map((type) => ({ state, type }))),
  )('$type from $state', ({ state, type }) => {
    const before = reach(state);
    const event: PodEvent =
      type === 'TEARDOWN' ? { type, at: T0 + 500, reason: 'operator asked' } : { type, at: T0 + 500 };
    const result = step(before, event);
    if (state === 'done') {
      expect(result.changed).toBe(false);
      return;
    }
    expect(result.to).toBe('tearingDown');
    if (state === 'tearingDown') {
      // Already under way: no second teardown step; a deletion is still noted.
      expect(result.actions).toEqual([]);
      expect(result.snapshot.context.podDeleted).toBe(type === 'POD_DELETED');
      expect(result.changed).toBe(type === 'POD_DELETED');
      return;
    }
    expect(result.actions).toEqual([
      { type: 'runStep', params: { step: 'teardown', generation: before.context.generation } },
    ]);
    expect(result.snapshot.context.deadline).toBeNull();
    expect(result.snapshot.context.podDeleted).toBe(type === 'POD_DELETED');
    expect(result.snapshot.context.teardownReason).toBe(type === 'TEARDOWN' ? 'operator asked' : 'pod-deleted');
    // …and the teardown step's success ends it.
    const done = step(result.snapshot, {
      type: 'STEP_DONE',
      at: T0 + 600,
      step: 'teardown',
      generation: before.context.generation,
    });
    expect(done.to).toBe('done');
  });

  it('a POD_DELETED seen twice in tearingDown changes nothing the second time', () => {
    const first = step(reach('tearingDown'), { type: 'POD_DELETED', at: T0 + 1 }).snapshot;
    expect(step(first, { type: 'POD_DELETED', at: T0 + 2 }).changed).toBe(false);
  });

  it.each(POD_STATES)('RETRY from %s', (state) => {
    const before = reach(state);
    const result = step(before, { type: 'RETRY', at: T0 + 900 });
    if (state !== 'failed') {
      expect(result.changed).toBe(false);
      return;
    }
    expect(result.to).toBe('validating');
    expect(result.actions).toEqual([{ type: 'runStep', params: { step: 'validate', generation: 0 } }]);
    expect(result.snapshot.context.attempts).toBe(0);
  });

  it('RETRY after a spent budget starts a fresh count and a new generation', () => {
    let snapshot = reach('launchingShadow');
    for (let loss = 0; loss < 20 && stateOf(snapshot) !== 'failed'; loss += 1) {
      snapshot = step(snapshot, report(snapshot, 'CARRIER_LOST', T0 + 10)).snapshot;
    }
    expect(stateOf(snapshot)).toBe('failed');
    expect(snapshot.context).toMatchObject({ attempts: 3, generation: 3 });
    snapshot = step(snapshot, { type: 'RETRY', at: T0 + 20 }).snapshot;
    expect(snapshot.context.attempts).toBe(0);
    snapshot = step(snapshot, { type: 'STEP_DONE', at: T0 + 21, step: 'validate', generation: 3 }).snapshot;
    const launch = step(snapshot, { type: 'STEP_DONE', at: T0 + 22, step: 'render', generation: 3 });
    expect(launch.actions[0]).toEqual({ type: 'runStep', params: { step: 'launch', generation: 4, delayMs: 0 } });
  });

  it('a failed teardown goes to failed; RETRY then retries the teardown, not the setup', () => {
    const tearing = step(reach('active'), { type: 'POD_DELETED', at: T0 + 1 }).snapshot;
    const failed = step(tearing, {
      type: 'STEP_FAILED',
      at: T0 + 2,
      step: 'teardown',
      generation: 1,
      error: { kind: 'login-unreachable', message: 'timeout', permanent: false },
    });
    expect(failed.to).toBe('failed');
    expect(failed.snapshot.context.lastError?.kind).toBe('login-unreachable');
    const retried = step(failed.snapshot, { type: 'RETRY', at: T0 + 3 });
    expect(retried.to).toBe('tearingDown');
    expect(retried.actions).toEqual([{ type: 'runStep', params: { step: 'teardown', generation: 1 } }]);
  });

  it('done is final: no event moves it', () => {
    const done = reach('done');
    const events: PodEvent[] = [
      { type: 'RETRY', at: T0 },
      { type: 'TEARDOWN', at: T0, reason: 'x' },
      { type: 'POD_DELETED', at: T0 },
      { type: 'POD_UPSERT', at: T0, namespace: 'other', name: 'other', annotations: {} },
      ...SESSION_REPORT_TYPES.map((type) => report(done, type, T0)),
    ];
    for (const event of events) expect(step(done, event).changed, event.type).toBe(false);
  });
});

describe('pod machine: POD_UPSERT', () => {
  it('notes a changed name or annotations without moving or acting; a repeat is ignored', () => {
    for (const state of POD_STATES.filter((s) => s !== 'done')) {
      const before = reach(state);
      const same = { type: 'POD_UPSERT', at: T0 + 1, namespace: 'user', name: 'analysis' } as const;
      expect(step(before, { ...same, annotations: { ...INPUT.annotations } }).changed, state).toBe(false);
      const changed = step(before, { ...same, annotations: { 'interlink.eu/reverse-forwards': 'redis:6379' } });
      expect(changed).toMatchObject({ changed: true, from: state, to: state, actions: [] });
      expect(changed.snapshot.context.annotations).toEqual({ 'interlink.eu/reverse-forwards': 'redis:6379' });
    }
  });
});

describe('pod machine: persistence', () => {
  it.each(POD_STATES)('JSON round trip in %s, then the same next step as without it', (state) => {
    const live = reach(state);
    const stored = JSON.parse(JSON.stringify(persistPod(live)));
    expect(stored).toEqual({ version: MACHINE_VERSION, state, context: live.context });
    const restored = restorePod(stored);
    if (!restored.ok) throw restored.error;
    expect(stateOf(restored.snapshot)).toBe(state);
    expect(restored.snapshot.context).toEqual(live.context);
    expect(restored.snapshot.status).toBe(state === 'done' ? 'done' : 'active');
    const next: PodEvent[] = [
      { type: 'TEARDOWN', at: T0 + 5, reason: 'x' },
      { type: 'RETRY', at: T0 + 5 },
      ...SESSION_REPORT_TYPES.map((type) => report(live, type, T0 + 5)),
      report(live, 'DEADLINE', T0 + 5),
      { type: 'STEP_DONE', at: T0 + 5, step: 'validate' },
    ];
    for (const event of next) {
      const a = applyEvent(live, event);
      const b = applyEvent(restored.snapshot, event);
      expect(b.actions, event.type).toEqual(a.actions);
      expect([b.changed, b.to]).toEqual([a.changed, a.to]);
      expect(persistPod(b.snapshot)).toEqual(persistPod(a.snapshot));
    }
  });

  const good = () => JSON.parse(JSON.stringify(persistPod(reach('active'))));

  it.each([
    ['a newer version', { ...good(), version: MACHINE_VERSION + 1 }, 'unknown-version'],
    ['a version as text', { ...good(), version: String(MACHINE_VERSION) }, 'unknown-version'],
    ['an unknown state', { ...good(), state: 'holdingShadow' }, 'unknown-state'],
    [
      'a context missing a field',
      { ...good(), context: { ...good().context, generation: undefined } },
      'invalid-context',
    ],
    ['a context of the wrong type', { ...good(), context: 'yes' }, 'invalid-context'],
    ['no version', { state: 'active', context: good().context }, 'invalid-snapshot'],
    ['null', null, 'invalid-snapshot'],
    ['a number', 42, 'invalid-snapshot'],
    ['a string', 'active', 'invalid-snapshot'],
    ['an XState persisted snapshot', podMachine.getPersistedSnapshot(reach('active')) as unknown, 'invalid-snapshot'],
  ] as const)('%s → a RestoreError, not a throw', (_label, stored, kind) => {
    let result: ReturnType<typeof restorePod> | undefined;
    expect(() => {
      result = restorePod(stored);
    }).not.toThrow();
    expect(result?.ok).toBe(false);
    if (result && !result.ok) {
      expect(result.error).toBeInstanceOf(RestoreError);
      expect(result.error.kind).toBe(kind);
      expect(result.error.message.length).toBeGreaterThan(0);
      expect(JSON.parse(JSON.stringify(result.error))).toMatchObject({ kind });
    }
  });

  it('a RestoreError names what it found', () => {
    const result = restorePod({ ...good(), version: 9, state: 'holdingShadow' });
    expect(result.ok).toBe(false);
    if (!result.ok)
      expect(result.error.toJSON()).toMatchObject({ kind: 'unknown-version', version: 9, state: 'holdingShadow' });
  });
});

describe('pod machine: the render step’s plan', () => {
  it('refuses a stored plan that is not one (the site digest is SHA-256 hex, the plan an object)', () => {
    const bad = parsePodEvent({ type: 'STEP_DONE', step: 'render', at: T0, plan: { site: 'x', plan: {} } });
    expect(bad.ok).toBe(false);
    if (!bad.ok) expect(bad.message).toMatch(/plan\.site.*SHA-256/);
  });
});

describe('pod machine: version', () => {
  it('POD_STATES are the chart’s leaves, each found by its name (restore relies on it)', () => {
    expect(new Set(POD_STATES).size).toBe(POD_STATES.length);
    // Every name is a leaf of the chart, found once.
    for (const state of POD_STATES) expect(podMachine.getStateNodeById(`pod.${statePath(state)}`).key).toBe(state);
  });

  it('the stored shape is pinned to MACHINE_VERSION: change states or context → bump the version', () => {
    expect({
      version: MACHINE_VERSION,
      states: [...POD_STATES],
      context: Object.keys(podContextSchema.shape).sort(),
    }).toEqual({
      version: 1,
      states: [
        'validating',
        'rendering',
        'launchingShadow',
        'waitingBatchHost',
        'openingCarrier',
        'establishingForwards',
        'active',
        'tearingDown',
        'failed',
        'done',
      ],
      context: [
        'annotations',
        'attempts',
        'backoffBaseMs',
        'backoffMaxMs',
        'backoffMs',
        'batchHost',
        'createdAt',
        'deadline',
        'forwardsReadyAt',
        'generation',
        'host',
        'isolation',
        'jobId',
        'lastError',
        'name',
        'namespace',
        'nodeWaitTimeoutMs',
        'phaseTimeoutMs',
        'podDeleted',
        'relayAddresses',
        'retryLimit',
        'teardownReason',
        'uid',
      ],
    });
    // The context the machine builds is the one the schema checks (optional fields come later).
    const required = Object.entries(podContextSchema.shape)
      .filter(([, field]) => !field.isOptional())
      .map(([key]) => key);
    expect(Object.keys(startPod(INPUT, T0).snapshot.context).sort()).toEqual(required.sort());
    // An optional field added keeps the version: a snapshot stored without it restores, and one with it
    // restores on a build that does not know it (zod drops keys it does not know).
    expect(required).not.toContain('relayAddresses');
    expect(required).not.toContain('isolation');
  });

  it('keeps the relay addresses of FORWARDS_READY, and restores snapshots stored without them', () => {
    let snapshot = startPod(INPUT, T0).snapshot;
    const before = persistPod(snapshot);
    expect(before.context).not.toHaveProperty('relayAddresses');
    const restored = restorePod(JSON.parse(JSON.stringify(before)));
    expect(restored.ok).toBe(true);
    const events: unknown[] = [
      { type: 'STEP_DONE', step: 'validate', at: T0 + 1, generation: 0 },
      { type: 'STEP_DONE', step: 'render', at: T0 + 2, generation: 0 },
      { type: 'SHADOW_UP', host: 'h', at: T0 + 3, generation: 1 },
      { type: 'BATCH_HOST', batchHost: 'n1', jobId: '7', at: T0 + 4, generation: 1 },
      { type: 'CARRIER_OPEN', at: T0 + 5, generation: 1 },
      // As it comes from a queue job: JSON, checked by the event schema.
      {
        type: 'FORWARDS_READY',
        addresses: ['127.9.8.7', '127.200.1.2'],
        isolation: { relay: 'job', sockets: 'user' },
        at: T0 + 6,
        generation: 1,
      },
    ];
    for (const data of events) {
      const parsed = parsePodEvent(JSON.parse(JSON.stringify(data)));
      if (!parsed.ok) throw new Error(parsed.message);
      snapshot = applyEvent(snapshot, parsed.event).snapshot;
    }
    expect(stateOf(snapshot)).toBe('active');
    expect(snapshot.context.relayAddresses).toEqual(['127.9.8.7', '127.200.1.2']);
    const again = restorePod(JSON.parse(JSON.stringify(persistPod(snapshot))));
    expect(again.ok && again.snapshot.context.relayAddresses).toEqual(['127.9.8.7', '127.200.1.2']);
    expect(again.ok && again.snapshot.context.isolation).toEqual({ relay: 'job', sockets: 'user' });
    expect(
      parsePodEvent({ type: 'FORWARDS_READY', isolation: { relay: 'pod', sockets: 'user' }, at: T0, generation: 1 }).ok,
    ).toBe(false);
    expect(parsePodEvent({ type: 'FORWARDS_READY', addresses: [], at: T0, generation: 1 }).ok).toBe(false);
  });

  it('restores a snapshot a newer build stored with a context field this build does not know (rolling upgrade)', () => {
    const stored = JSON.parse(JSON.stringify(persistPod(startPod(INPUT, T0).snapshot)));
    stored.context.someFieldOfANewerBuild = ['x'];
    const restored = restorePod(stored);
    expect(restored.ok, JSON.stringify(restored)).toBe(true);
    if (restored.ok) expect(restored.snapshot.context).not.toHaveProperty('someFieldOfANewerBuild');
  });
});

describe('pod machine: events from queue jobs', () => {
  it('parsePodEvent takes an event a newer build sent with a field this build does not know (rolling upgrade)', () => {
    // A newer session host's JOB_ENDED must still end the pod on an older control worker: the unknown
    // field is dropped, not a reason to refuse the report (which would leave the pod active for a dead job).
    const parsed = parsePodEvent({ type: 'JOB_ENDED', at: T0, generation: 2, lease: 4, someFieldOfANewerBuild: 'x' });
    expect(parsed).toEqual({ ok: true, event: { type: 'JOB_ENDED', at: T0, generation: 2, lease: 4 } });
  });

  it('parsePodEvent accepts every event shape and refuses malformed ones with a path', () => {
    const active = reach('active');
    const events: PodEvent[] = [
      { type: 'POD_UPSERT', at: T0, namespace: 'a', name: 'b', annotations: {} },
      { type: 'POD_DELETED', at: T0 },
      { type: 'RETRY', at: T0 },
      { type: 'TEARDOWN', at: T0, reason: 'r' },
      { type: 'STEP_DONE', at: T0, step: 'render' },
      { type: 'STEP_FAILED', at: T0, step: 'launch', generation: 2, error: SOFT },
      { type: 'DEADLINE', at: T0, name: 'openingCarrier', generation: 1 },
      ...SESSION_REPORT_TYPES.map((type) => report(active, type, T0)),
      { type: 'JOB_ENDED', at: T0, generation: 1, lease: 3, trapMissed: true },
      { type: 'JOB_ENDED', at: T0, generation: 1, lease: 3, jobState: 'OUT_OF_MEMORY', trapMissed: true },
      { type: 'JOB_ENDED', at: T0, generation: 1, jobState: 'REPLACED_BY_4242_7' },
    ];
    for (const event of events) expect(parsePodEvent(JSON.parse(JSON.stringify(event)))).toEqual({ ok: true, event });
    expect(parsePodEvent({ type: 'SHADOW_UP', at: T0, host: 'h' })).toMatchObject({ ok: false, message: /generation/ });
    // trapMissed is said only when true: a sender's false or a string is a bug, not a JOB_ENDED to apply.
    for (const trapMissed of [false, 'yes']) {
      expect(parsePodEvent({ type: 'JOB_ENDED', at: T0, generation: 1, trapMissed })).toMatchObject({
        ok: false,
        message: /trapMissed/,
      });
    }
    // The job state reaches an Event and `status`: a Slurm state's name or nothing.
    for (const jobState of ['', 'oom', 'OOM; rm -rf /', 'A'.repeat(65), 7]) {
      expect(parsePodEvent({ type: 'JOB_ENDED', at: T0, generation: 1, jobState })).toMatchObject({
        ok: false,
        message: /jobState/,
      });
    }
    expect(parsePodEvent({ type: 'NOPE', at: T0 })).toMatchObject({ ok: false });
    expect(parsePodEvent({ type: 'RETRY' })).toMatchObject({ ok: false, message: /at/ });
  });
});

describe('pod machine: random event sequences keep the invariants', () => {
  /** The event the pod waits for to move on from where it is. */
  const progress = (snapshot: PodSnapshot, at: number): PodEvent => {
    const generation = snapshot.context.generation;
    switch (stateOf(snapshot)) {
      case 'validating':
        return { type: 'STEP_DONE', at, step: 'validate', generation };
      case 'rendering':
        return { type: 'STEP_DONE', at, step: 'render', generation };
      case 'launchingShadow':
        return report(snapshot, 'SHADOW_UP', at);
      case 'waitingBatchHost':
        return report(snapshot, 'BATCH_HOST', at);
      case 'openingCarrier':
        return report(snapshot, 'CARRIER_OPEN', at);
      case 'establishingForwards':
        return report(snapshot, 'FORWARDS_READY', at);
      case 'active':
        return report(snapshot, 'JOB_ENDED', at);
      case 'tearingDown':
        return { type: 'STEP_DONE', at, step: 'teardown', generation };
      case 'failed':
        return { type: 'RETRY', at };
      case 'done':
        return { type: 'POD_DELETED', at };
    }
  };
  const withGeneration = (event: PodEvent, generation: number): PodEvent =>
    'generation' in event ? ({ ...event, generation } as PodEvent) : event;
  // Weighted towards progress, so that runs reach the deep states as well as the exits.
  const eventArb = fc.oneof(
    { weight: 8, arbitrary: fc.constant({ kind: 'progress' as const }) },
    {
      weight: 8,
      arbitrary: fc.constantFrom(...SESSION_REPORT_TYPES).map((type) => ({ kind: 'report' as const, type })),
    },
    { weight: 2, arbitrary: fc.constantFrom(...DEADLINE_NAMES).map((name) => ({ kind: 'deadline' as const, name })) },
    {
      weight: 4,
      arbitrary: fc.constantFrom(...STEPS).map((s) => ({ kind: 'done' as const, step: s })),
    },
    { weight: 1, arbitrary: fc.constantFrom(...STEPS).map((s) => ({ kind: 'fail' as const, step: s })) },
    {
      weight: 1,
      arbitrary: fc.constantFrom('RETRY', 'TEARDOWN', 'POD_DELETED').map((type) => ({ kind: 'op' as const, type })),
    },
    { weight: 1, arbitrary: fc.boolean().map((permanent) => ({ kind: 'sessionFailed' as const, permanent })) },
  );
  // Mostly the current generation, sometimes a stale or a future one.
  const skewArb = fc.oneof({ weight: 6, arbitrary: fc.constant(0) }, { weight: 1, arbitrary: fc.constantFrom(-1, 1) });
  const visited = new Set<PodStateName>();

  it('ignored events act never; deadlines match states; generations only grow; round trips are exact', () => {
    fc.assert(
      fc.property(fc.array(fc.tuple(eventArb, skewArb), { minLength: 10, maxLength: 60 }), (script) => {
        let snapshot = startPod(INPUT, T0).snapshot;
        let at = T0;
        for (const [pick, skew] of script) {
          at += 997;
          const generation = snapshot.context.generation + skew;
          const event: PodEvent =
            pick.kind === 'progress'
              ? withGeneration(progress(snapshot, at), generation)
              : pick.kind === 'report'
                ? ({ ...report(snapshot, pick.type, at), generation } as PodEvent)
                : pick.kind === 'deadline'
                  ? { type: 'DEADLINE', at, name: pick.name, generation }
                  : pick.kind === 'done'
                    ? { type: 'STEP_DONE', at, step: pick.step, generation }
                    : pick.kind === 'fail'
                      ? { type: 'STEP_FAILED', at, step: pick.step, generation, error: SOFT }
                      : pick.kind === 'sessionFailed'
                        ? { type: 'SESSION_FAILED', at, generation, error: { ...SOFT, permanent: pick.permanent } }
                        : pick.type === 'TEARDOWN'
                          ? { type: 'TEARDOWN', at, reason: 'fuzz' }
                          : { type: pick.type, at };
          const result = step(snapshot, event);
          const next = result.snapshot;
          expect(next.context.generation).toBeGreaterThanOrEqual(snapshot.context.generation);
          expect(next.context.attempts).toBeLessThanOrEqual(INPUT.retryLimit);
          const state = stateOf(next);
          visited.add(state);
          const inDeadlineState = (DEADLINE_NAMES as readonly string[]).includes(state);
          expect(next.context.deadline?.name ?? null).toBe(inDeadlineState ? state : null);
          if (next.context.deadline) expect(next.context.deadline.generation).toBe(next.context.generation);
          // Every launch is for the current generation.
          for (const action of result.actions) {
            if (action.type === 'runStep' && action.params.step === 'launch') {
              expect(action.params.generation).toBe(next.context.generation);
            }
          }
          const restored = restorePod(JSON.parse(JSON.stringify(persistPod(next))));
          expect(restored.ok && persistPod(restored.snapshot)).toEqual(persistPod(next));
          // The effects survive the outbox: what another worker reads back is what was asked for.
          const outbox = podActionsSchema.safeParse(JSON.parse(JSON.stringify(result.actions)));
          expect(outbox.success && outbox.data).toEqual(result.actions);
          // applyEvent runs through one shared actor scope: it must give exactly what XState's own pure
          // transition() (a fresh inert actor per call) gives.
          if (snapshot.status === 'active') {
            const [reference, executable] = transition(podMachine, snapshot, event);
            expect(stateOf(reference)).toBe(state);
            expect(reference.context).toEqual(next.context);
            const named = executable.filter((a) => (POD_ACTION_TYPES as readonly string[]).includes(a.type));
            expect(result.actions).toEqual(
              result.changed ? named.map((a) => ({ type: a.type, params: a.params })) : [],
            );
          }
          snapshot = next;
        }
      }),
      { numRuns: 150 },
    );
    // The runs went everywhere (else the invariants above were checked on too little).
    expect([...visited].sort()).toEqual([...POD_STATES].sort());
  });
});
