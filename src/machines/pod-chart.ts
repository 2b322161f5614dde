/**
 * One pod's reverse setup as a statechart (ARCHITECTURE.md, "The machine"): the chart alone. It runs
 * only through the pure transition engine (pod-transition.ts: `startPod` / `applyEvent` return the
 * next snapshot and the effects to run); the control worker stores the snapshot (pod-persistence.ts,
 * compare-and-set in Redis) and runs the effects.
 *
 * No I/O, no clock, no timers: every event carries `at`, deadlines live in context and are delivered
 * back as DEADLINE events (XState's `after` timers and delayed `raise` do not survive a restore). The
 * store indexes `context.deadline` in the same compare-and-set that stores the snapshot, so arming or
 * withdrawing a deadline is a context change, not an effect, and cannot be lost between the two.
 *
 *   validating ─STEP_DONE(validate)─► rendering ─STEP_DONE(render)─► shadow ─SOCKETS_VANISHED | JOB_ENDED─►
 *   tearingDown ─STEP_DONE(teardown)─► done
 *
 *   shadow (the current generation's shadow; a compound state):
 *     launchingShadow ─SHADOW_UP─► waitingBatchHost ─BATCH_HOST─► openingCarrier ─CARRIER_OPEN─►
 *     establishingForwards ─FORWARDS_READY─► active
 *     a report of a later phase skips the missed ones; a late report of a passed phase only fills in data.
 *     CARRIER_LOST | SESSION_FAILED | STEP_FAILED(launch) | DEADLINE (the one the phase armed)
 *       → launchingShadow (next generation, after backoff) while launches are left, else → failed;
 *       the site out of reach (login- or slurm-unreachable) spends no launch: the pod waits, backing off to 30 s;
 *       a permanent error (and the node wait deadline) → failed at once. The old shadow is stopped.
 *
 *   SHADOW_HELD (a session host kept this pod's shadow through a loss of Redis's data, and the record was
 *   rebuilt from the API server): the pod takes that shadow as its own, in the state its reports reached —
 *   at its generation, stopping the one it launched itself if that was an older one.
 *
 *   from every state but done: TEARDOWN | POD_DELETED → tearingDown.
 *   failed ─RETRY─► validating (or ─► tearingDown when it was a teardown that failed).
 *   failed ─POD_UPSERT (changed)─► validating when the pod was refused as it was (invalid-pod).
 *
 * A stored pod names its leaf state (`active`, not `shadow.active`): leaf names are unique across the
 * chart, so the short name is the whole address.
 *
 * Reports, deadlines and step results of another generation are ignored: no transition, no effects.
 */
import { and, assign, setup } from 'xstate';
import { isSiteWide } from './error-kinds.js';
import {
  deadlineTimeout,
  errorOf,
  hasBudget,
  isCurrent,
  isStep,
  nextLaunch,
  podChanged,
  reportAddsInfo,
  teardownReasonOf,
} from './pod-rules.js';
import type {
  DeadlineName,
  PodContext,
  PodEvent,
  PodInput,
  RunStepParams,
  ShadowPhaseState,
  StepName,
  StopShadowParams,
} from './pod-types.js';
import { SHADOW_PHASE_STATES } from './pod-types.js';

interface MachineInput {
  input: PodInput;
  at: number;
}

const stepGuard = (step: StepName) => ({ type: 'isCurrentStep', params: { step } }) as const;

/** Entering a deadline state arms its deadline (kept in context, indexed by the store)… */
function armDeadline(name: DeadlineName) {
  return [{ type: 'armDeadline', params: { name } }] as const;
}

/** …and leaving it, by any transition, withdraws it. */
const disarmDeadline = ['disarmDeadline'] as const;

const launchStep = ({ context }: Args): RunStepParams => ({
  step: 'launch',
  generation: context.generation,
  delayMs: context.backoffMs,
});

/** A report of the current shadow moves the pod to that report's phase. */
const advanceTo = <T extends ShadowPhaseState>(target: T) =>
  ({ guard: 'isCurrent', target, actions: 'noteReport' }) as const;

/** A late report of a phase already passed only fills in what it knows. */
const fillIn = { guard: and(['isCurrent', 'reportAddsInfo']), actions: 'noteReport' } as const;

/**
 * A shadow held through a loss of Redis's data, of the pod's own generation, that got further than the
 * pod's state: the pod moves there (from `from`, to each phase after it).
 */
function heldAhead(from: 'launchingShadow' | ShadowPhaseState) {
  return SHADOW_PHASE_STATES.slice(SHADOW_PHASE_STATES.indexOf(from as ShadowPhaseState) + 1).map((phase) => ({
    guard: { type: 'heldAt', params: { phase } } as const,
    target: phase,
    actions: 'noteHeld' as const,
  }));
}

/**
 * …or of a newer generation than the pod's (the pod relaunched before the loss; its rebuilt record is at
 * its first): the pod takes that generation, and the shadow it launched itself is stopped.
 */
const heldNewer = SHADOW_PHASE_STATES.map((phase) => ({
  guard: { type: 'heldNewer', params: { phase } } as const,
  target: `.${phase}`,
  reenter: true,
  actions: [
    {
      type: 'stopShadow',
      params: ({ context }: Args): StopShadowParams => ({ generation: context.generation, reason: 'adopted' }),
    },
    'noteHeld',
  ] as const,
}));

/** The job ended or its sockets vanished: nothing left to hold up. */
const endShadow = { guard: 'isCurrent', target: '#pod.tearingDown', actions: 'noteTeardown' } as const;

/**
 * The current shadow ended badly: a permanent error → failed; launches left → the next generation
 * (after backoff); none left → failed. Either way the old shadow is stopped, the node left as it is.
 */
function relaunchOrFail(when: typeof REPORT | typeof LAUNCH_STEP) {
  const actions = [
    'noteError',
    {
      type: 'stopShadow',
      params: ({ context, event }: Args): StopShadowParams => ({
        generation: context.generation,
        reason: errorOf(context, event).kind,
      }),
    },
  ] as const;
  return [
    { guard: when.permanent, target: '#pod.failed', actions },
    { guard: when.withBudget, target: '#pod.shadow.launchingShadow', reenter: true, actions },
    { guard: when.current, target: '#pod.failed', actions },
  ] as const;
}

/** …for a session report or deadline of the current generation… */
const REPORT = {
  current: 'isCurrent',
  permanent: and(['isCurrent', 'isPermanent']),
  withBudget: and(['isCurrent', 'hasBudget']),
} as const;

/** …or for the launch step of the current generation. */
const LAUNCH_STEP = {
  current: stepGuard('launch'),
  permanent: and([stepGuard('launch'), 'isPermanent']),
  withBudget: and([stepGuard('launch'), 'hasBudget']),
} as const;

interface Args {
  context: PodContext;
  event: PodEvent;
}

export const podMachine = setup({
  types: {
    context: {} as PodContext,
    events: {} as PodEvent,
    input: {} as MachineInput,
  },
  actions: {
    // Effects: described here, run by the control worker from transition()'s action list.
    runStep: (_, _params: RunStepParams) => {},
    stopShadow: (_, _params: StopShadowParams) => {},

    // Context updates.
    notePod: assign(({ event }) =>
      event.type === 'POD_UPSERT'
        ? { namespace: event.namespace, name: event.name, annotations: event.annotations }
        : {},
    ),
    noteTeardown: assign(({ context, event }) => ({
      podDeleted: context.podDeleted || event.type === 'POD_DELETED',
      teardownReason: teardownReasonOf(event) ?? context.teardownReason,
    })),
    notePodDeleted: assign({ podDeleted: true }),
    noteError: assign(({ context, event }) => {
      const { kind, message } = errorOf(context, event);
      return { lastError: { kind, message, at: event.at } };
    }),
    noteReport: assign(({ event }) => {
      switch (event.type) {
        case 'SHADOW_UP':
          return { host: event.host };
        case 'BATCH_HOST':
          return { batchHost: event.batchHost, jobId: event.jobId };
        case 'FORWARDS_READY':
          return {
            forwardsReadyAt: event.at,
            attempts: 0,
            ...(event.addresses ? { relayAddresses: event.addresses } : {}),
            ...(event.isolation ? { isolation: event.isolation } : {}),
          };
        default:
          return {};
      }
    }),
    noteHeld: assign(({ context, event }) => {
      if (event.type !== 'SHADOW_HELD') return {};
      const active = event.phase === 'active';
      return {
        generation: event.generation,
        host: event.host,
        ...(event.batchHost && event.jobId ? { batchHost: event.batchHost, jobId: event.jobId } : {}),
        ...(active ? { forwardsReadyAt: context.forwardsReadyAt ?? event.at, attempts: 0 } : {}),
        ...(event.addresses ? { relayAddresses: event.addresses } : {}),
        ...(event.isolation ? { isolation: event.isolation } : {}),
      };
    }),
    beginLaunch: assign(({ context, event }) => ({
      generation: context.generation + 1,
      ...nextLaunch(context, event),
      host: null,
    })),
    armDeadline: assign(({ context, event }, params: { name: DeadlineName }) => ({
      deadline: {
        name: params.name,
        at: event.at + deadlineTimeout(context, params.name),
        generation: context.generation,
      },
    })),
    disarmDeadline: assign({ deadline: null }),
    resetForRetry: assign({ attempts: 0, teardownReason: null }),
  },
  guards: {
    isCurrent: ({ context, event }) => isCurrent(context, event),
    isCurrentStep: ({ context, event }, params: { step: StepName }) =>
      isStep(event, params.step) && isCurrent(context, event),
    isPermanent: ({ context, event }) => errorOf(context, event).permanent,
    // The site out of reach spends no launch: the pod waits for it (a site-wide error: error-kinds.ts).
    hasBudget: ({ context, event }) => hasBudget(context) || isSiteWide(errorOf(context, event)),
    podChanged: ({ context, event }) => event.type === 'POD_UPSERT' && podChanged(context, event),
    reportAddsInfo: ({ context, event }) => reportAddsInfo(context, event),
    heldAt: ({ context, event }, params: { phase: ShadowPhaseState }) =>
      event.type === 'SHADOW_HELD' && event.phase === params.phase && event.generation === context.generation,
    heldNewer: ({ context, event }, params: { phase: ShadowPhaseState }) =>
      event.type === 'SHADOW_HELD' && event.phase === params.phase && event.generation > context.generation,
    teardownPending: ({ context }) => context.podDeleted || context.teardownReason !== null,
    refusedAsItWas: ({ context }) =>
      context.lastError?.kind === 'invalid-pod' && !context.podDeleted && context.teardownReason === null,
  },
}).createMachine({
  id: 'pod',
  context: ({ input: { input, at } }) => ({
    uid: input.uid,
    namespace: input.namespace,
    name: input.name,
    annotations: input.annotations ?? {},
    retryLimit: input.retryLimit,
    backoffBaseMs: input.backoffBaseMs,
    backoffMaxMs: input.backoffMaxMs,
    nodeWaitTimeoutMs: input.nodeWaitTimeoutMs,
    phaseTimeoutMs: input.phaseTimeoutMs,
    createdAt: at,
    generation: 0,
    attempts: 0,
    backoffMs: 0,
    deadline: null,
    host: null,
    jobId: null,
    batchHost: null,
    lastError: null,
    forwardsReadyAt: null,
    podDeleted: false,
    teardownReason: null,
  }),
  initial: 'validating',
  on: {
    TEARDOWN: { target: '.tearingDown', actions: 'noteTeardown' },
    POD_DELETED: { target: '.tearingDown', actions: 'noteTeardown' },
    POD_UPSERT: { guard: 'podChanged', actions: 'notePod' },
  },
  states: {
    validating: {
      meta: { step: 'validate', pure: true },
      entry: { type: 'runStep', params: ({ context }) => ({ step: 'validate', generation: context.generation }) },
      on: {
        STEP_DONE: { guard: stepGuard('validate'), target: 'rendering' },
        STEP_FAILED: { guard: stepGuard('validate'), target: 'failed', actions: 'noteError' },
      },
    },

    rendering: {
      meta: { step: 'render', pure: true },
      entry: { type: 'runStep', params: ({ context }) => ({ step: 'render', generation: context.generation }) },
      on: {
        STEP_DONE: { guard: stepGuard('render'), target: 'shadow' },
        STEP_FAILED: { guard: stepGuard('render'), target: 'failed', actions: 'noteError' },
      },
    },

    // The shadow of the current generation, from its launch to forwards that are up. What every phase
    // does alike is said once here; each phase adds only how far a report moves it.
    shadow: {
      tags: ['shadow'],
      initial: 'launchingShadow',
      on: {
        // A late report of a phase already passed only fills in what it knows.
        SHADOW_UP: fillIn,
        BATCH_HOST: fillIn,
        SOCKETS_VANISHED: endShadow,
        JOB_ENDED: endShadow,
        CARRIER_LOST: relaunchOrFail(REPORT),
        SESSION_FAILED: relaunchOrFail(REPORT),
        // Only the deadline the phase armed is current (isCurrent): none is armed once active.
        // The node wait deadline is a permanent error (errorOf): waiting again would only wait as long again.
        DEADLINE: relaunchOrFail(REPORT),
        SHADOW_HELD: heldNewer,
      },
      states: {
        launchingShadow: {
          meta: { step: 'launch' },
          entry: ['beginLaunch', { type: 'runStep', params: launchStep }, ...armDeadline('launchingShadow')],
          exit: disarmDeadline,
          on: {
            SHADOW_UP: advanceTo('waitingBatchHost'),
            // A report of a later phase means the earlier ones happened (reports may overtake each other).
            BATCH_HOST: advanceTo('openingCarrier'),
            CARRIER_OPEN: advanceTo('establishingForwards'),
            FORWARDS_READY: advanceTo('active'),
            SHADOW_HELD: heldAhead('launchingShadow'),
            STEP_FAILED: relaunchOrFail(LAUNCH_STEP),
          },
        },

        waitingBatchHost: {
          tags: ['shadowRunning'],
          entry: armDeadline('waitingBatchHost'),
          exit: disarmDeadline,
          on: {
            BATCH_HOST: advanceTo('openingCarrier'),
            CARRIER_OPEN: advanceTo('establishingForwards'),
            FORWARDS_READY: advanceTo('active'),
            SHADOW_HELD: heldAhead('waitingBatchHost'),
          },
        },

        openingCarrier: {
          tags: ['shadowRunning'],
          entry: armDeadline('openingCarrier'),
          exit: disarmDeadline,
          on: {
            CARRIER_OPEN: advanceTo('establishingForwards'),
            FORWARDS_READY: advanceTo('active'),
            SHADOW_HELD: heldAhead('openingCarrier'),
          },
        },

        establishingForwards: {
          tags: ['shadowRunning'],
          entry: armDeadline('establishingForwards'),
          exit: disarmDeadline,
          on: {
            FORWARDS_READY: advanceTo('active'),
            SHADOW_HELD: heldAhead('establishingForwards'),
          },
        },

        active: {
          tags: ['shadowRunning', 'settled'],
        },
      },
    },

    tearingDown: {
      meta: { step: 'teardown' },
      entry: { type: 'runStep', params: ({ context }) => ({ step: 'teardown', generation: context.generation }) },
      on: {
        STEP_DONE: { guard: stepGuard('teardown'), target: 'done' },
        STEP_FAILED: { guard: stepGuard('teardown'), target: 'failed', actions: 'noteError' },
        // Already under way: a second request changes nothing (a deletion is still noted).
        TEARDOWN: {},
        // (Unguarded on purpose: a guard that fails here would let the root's POD_DELETED re-enter this state.)
        POD_DELETED: { actions: 'notePodDeleted' },
      },
    },

    failed: {
      tags: ['settled'],
      on: {
        // A pod refused as it was (its annotations, the cluster's verdict on it) is looked at again when
        // they change: a fixed annotation, a namespace that opted in, a policy that was lifted.
        POD_UPSERT: [
          { guard: and(['podChanged', 'refusedAsItWas']), target: 'validating', actions: ['notePod', 'resetForRetry'] },
          { guard: 'podChanged', actions: 'notePod' },
        ],
        // A teardown that failed is retried as a teardown; anything else starts over.
        RETRY: [
          { guard: 'teardownPending', target: 'tearingDown' },
          { target: 'validating', actions: 'resetForRetry' },
        ],
      },
    },

    done: { type: 'final', tags: ['settled'] },
  },
});

/** A pod's snapshot: the chart's state and the pod's context. */
export type PodSnapshot = ReturnType<typeof podMachine.resolveState>;
