import type { PodContext, PodStateName } from '../machines/pod-machine.js';
import { clampMessage } from './kube-events.js';

/**
 * The pod condition that says whether a pod's reverse forwards are up (`kubectl get pod -o wide`,
 * `kubectl wait --for=condition=interlink.eu/ReverseForwardsReady`), and, with a readiness gate of that
 * type (injected by the webhook where the site enables it), whether the pod is Ready. Pure.
 */
export const FORWARDS_READY_CONDITION = 'interlink.eu/ReverseForwardsReady';

export interface PodCondition {
  type: typeof FORWARDS_READY_CONDITION;
  status: 'True' | 'False';
  /** UpperCamelCase, stable: tools filter on it. */
  reason: string;
  message: string;
  /** RFC 3339, seconds. */
  lastTransitionTime: string;
}

/** Why the forwards are not up, by the machine's state. */
const NOT_READY: Partial<Record<PodStateName, { reason: string; message: string }>> = {
  validating: { reason: 'Validating', message: 'checking the pod’s reverse forwards' },
  rendering: { reason: 'Validating', message: 'checking the pod’s reverse forwards' },
  launchingShadow: { reason: 'Launching', message: 'starting a session for the pod’s job' },
  waitingBatchHost: { reason: 'WaitingForJob', message: 'waiting for the pod’s Slurm job to run' },
  openingCarrier: { reason: 'OpeningCarrier', message: 'connecting to the job’s batch host' },
  establishingForwards: { reason: 'EstablishingForwards', message: 'setting up the forwards on the batch host' },
  tearingDown: { reason: 'TearingDown', message: 'the forwards are being torn down' },
  failed: { reason: 'Failed', message: 'setting up the forwards failed' },
};

/**
 * The condition a pod in STATE should carry, or null when it should be left as it is (`done`: the
 * pod's machine is gone, and so, mostly, is the pod). `at` only dates a change: callers keep the stored
 * time when the status does not change (lastTransitionTime means the last change of status).
 */
export function forwardsCondition(state: PodStateName, ctx: PodContext, at: number): PodCondition | null {
  const time = new Date(Math.floor(at / 1000) * 1000).toISOString().replace('.000Z', 'Z');
  if (state === 'active') {
    return {
      type: FORWARDS_READY_CONDITION,
      status: 'True',
      reason: 'ForwardsReady',
      message: clampMessage(
        `reverse forwards up on ${ctx.batchHost ?? 'the batch host'}${ctx.jobId ? ` (job ${ctx.jobId})` : ''}`,
      ),
      lastTransitionTime: time,
    };
  }
  const why = NOT_READY[state];
  if (!why) return null;
  const error = ctx.lastError && (state === 'failed' || state === 'launchingShadow') ? `: ${ctx.lastError.kind}` : '';
  return {
    type: FORWARDS_READY_CONDITION,
    status: 'False',
    reason: why.reason,
    message: clampMessage(`${why.message}${error}`),
    lastTransitionTime: time,
  };
}

/** Whether a pod's conditions already say what `wanted` says (status and reason; the time is the change's). */
export function conditionHolds(
  current: readonly { type?: string; status?: string; reason?: string }[] | undefined,
  wanted: PodCondition,
): boolean {
  const found = current?.find((c) => c.type === wanted.type);
  return found !== undefined && found.status === wanted.status && found.reason === wanted.reason;
}

/** The strategic-merge patch of `status` that sets the condition (conditions merge by `type`). */
export function conditionPatch(condition: PodCondition): { status: { conditions: PodCondition[] } } {
  return { status: { conditions: [condition] } };
}

/** The readiness gate the webhook adds, where the site enables it (Backhaul.Kubernetes.ReadinessGate). */
export const FORWARDS_READINESS_GATE = { conditionType: FORWARDS_READY_CONDITION } as const;
