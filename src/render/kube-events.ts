import { ANNOTATION } from '../contract/annotations.js';
import { displayText } from '../contract/display-text.js';
import { isSiteWide } from '../machines/error-kinds.js';
import type { PodContext, PodEvent, PodStateName } from '../machines/pod-machine.js';
import { SITE_BACKOFF_MAX_MS } from '../machines/pod-rules.js';

/**
 * Kubernetes Events on the offloaded pod (`kubectl describe pod` shows them): what backhaul did with the
 * pod's reverse forwards. Pure: which Events a transition of the machine means, and the Event objects.
 */

export type KubeEventType = 'Normal' | 'Warning';

export interface EventSpec {
  type: KubeEventType;
  /** UpperCamelCase, short, stable: tools filter on it. */
  reason: string;
  message: string;
}

/** The object an Event is about. */
export interface InvolvedPod {
  uid: string;
  namespace: string;
  name: string;
}

export const EVENT_REASONS = {
  forwardsEstablished: 'ReverseForwardsReady',
  teardownStarted: 'ReverseForwardsTearingDown',
  tornDown: 'ReverseForwardsClosed',
  socks: 'ReverseSocksEnabled',
  refused: 'ReverseForwardingRefused',
  sessionFailed: 'ReverseSessionFailed',
  failed: 'ReverseSetupFailed',
  teardownFailed: 'ReverseTeardownFailed',
  retrying: 'ReverseSetupRetrying',
  siteUnreachable: 'ReverseSiteUnreachable',
  preludeMissing: 'PreludeMissing',
  trapMissed: 'PreludeTrapNotRun',
  sharedUser: 'ReverseTunnelSharedUser',
  preludeFailed: 'ReversePreludeFailed',
} as const;

/** Event messages are meant for one screen line or two; the API server refuses very long ones. */
export const MAX_MESSAGE = 1024;

export function clampMessage(message: string): string {
  return message.length <= MAX_MESSAGE ? message : `${message.slice(0, MAX_MESSAGE - 1)}…`;
}

const SESSION_FAILURES: ReadonlySet<PodEvent['type']> = new Set([
  'CARRIER_LOST',
  'SESSION_FAILED',
  'DEADLINE',
  'STEP_FAILED',
]);

function lastError(ctx: PodContext): string {
  return ctx.lastError ? `${ctx.lastError.kind}: ${ctx.lastError.message}` : 'unknown error';
}

function forwardCount(ctx: PodContext): number {
  return (ctx.annotations[ANNOTATION.forwards] ?? '').split(/\s+/).filter((e) => e.length > 0).length;
}

/**
 * The Events a transition means (none for most). `from` is null when the machine was just created.
 * SOCKS is announced once the pod is validated (the webhook also warns at admission).
 */
export function transitionEvents(
  ctx: PodContext,
  from: PodStateName | null,
  to: PodStateName,
  event: PodEvent,
): EventSpec[] {
  const specs: EventSpec[] = [];
  if (from === 'validating' && to === 'rendering') {
    const socks = ctx.annotations[ANNOTATION.socksPort];
    if (socks !== undefined) {
      specs.push({
        type: 'Warning',
        reason: EVENT_REASONS.socks,
        message: `SOCKS port ${socks.trim()} will listen on the pod's first address on the compute node (BACKHAUL_SOCKS_PROXY): its job reaches every destination the site's endpoint policy allows through it, not only the declared forwards`,
      });
    }
  }
  if (to === 'failed' && from !== 'failed') {
    if (event.type === 'STEP_FAILED' && (event.step === 'validate' || event.step === 'render')) {
      specs.push({
        type: 'Warning',
        reason: EVENT_REASONS.refused,
        message: `reverse forwarding refused: ${lastError(ctx)}`,
      });
    } else if (from === 'tearingDown') {
      specs.push({
        type: 'Warning',
        reason: EVENT_REASONS.teardownFailed,
        message: `tearing down the reverse forwards failed: ${lastError(ctx)}; \`backhaul retry\` tries again`,
      });
    } else if (SESSION_FAILURES.has(event.type)) {
      specs.push({
        type: 'Warning',
        reason: EVENT_REASONS.sessionFailed,
        message: `shadow session ${ctx.generation} failed: ${lastError(ctx)}; giving up after ${ctx.attempts} attempt(s) (\`backhaul retry\` starts over)`,
      });
    } else {
      specs.push({
        type: 'Warning',
        reason: EVENT_REASONS.failed,
        message: `reverse forwards failed: ${lastError(ctx)}`,
      });
    }
  }
  if (to === 'launchingShadow' && from !== null && from !== 'rendering' && SESSION_FAILURES.has(event.type)) {
    // No attempt numbers in the message: the same failure again is the same Event, counted (x3 over 5m).
    specs.push(
      ctx.lastError && isSiteWide(ctx.lastError)
        ? {
            type: 'Warning',
            reason: EVENT_REASONS.siteUnreachable,
            message: `the site is out of reach (${lastError(ctx)}); waiting for it: relaunching every ${SITE_BACKOFF_MAX_MS / 1000} s at most, without spending this pod's attempts`,
          }
        : {
            type: 'Warning',
            reason: EVENT_REASONS.sessionFailed,
            message: `shadow session failed: ${lastError(ctx)}; relaunching (at most ${ctx.retryLimit} attempts in a row)`,
          },
    );
  }
  if (to === 'active' && from !== 'active') {
    const n = forwardCount(ctx);
    const where = ctx.batchHost ? ` on node ${ctx.batchHost}` : '';
    const job = ctx.jobId ? `, Slurm job ${ctx.jobId}` : '';
    const host = ctx.host ? `, held by ${ctx.host}` : '';
    specs.push({
      type: 'Normal',
      reason: EVENT_REASONS.forwardsEstablished,
      message: `${n} reverse forward(s) established${where} (shadow session ${ctx.generation}${job}${host})`,
    });
  }
  if (event.type === 'JOB_ENDED' && event.note && to === 'tearingDown' && from !== 'tearingDown') {
    // The job could not set up its tunnel (its relay could not listen): the user's to fix, in the job's words.
    specs.push({
      type: 'Warning',
      reason: EVENT_REASONS.preludeFailed,
      message: `${ctx.jobId ? `Slurm job ${ctx.jobId}` : "the pod's Slurm job"}${ctx.batchHost ? ` on node ${ctx.batchHost}` : ''}: ${displayText(event.note)}`,
    });
  }
  if (event.type === 'JOB_ENDED' && event.trapMissed && to === 'tearingDown' && from !== 'tearingDown') {
    // The site's to know (a job killed outright: SIGKILL, the OOM killer, KillWait), and the user's: the
    // workload may have been killed mid-write.
    specs.push({
      type: 'Warning',
      reason: EVENT_REASONS.trapMissed,
      message: `Slurm job ${ctx.jobId ?? '?'} on node ${ctx.batchHost ?? '?'}${event.jobState ? ` (${event.jobState})` : ''} ended without running the prelude's trap (killed outright: SIGKILL, the OOM killer, or a signal before the trap was set); its socket dir was left on the node and backhaul removed it`,
    });
  }
  if (to === 'tearingDown' && from !== 'tearingDown') {
    specs.push({
      type: 'Normal',
      reason: EVENT_REASONS.teardownStarted,
      message: `tearing down the reverse forwards: ${ctx.teardownReason ?? event.type}`,
    });
  }
  if (to === 'done') {
    specs.push({
      type: 'Normal',
      reason: EVENT_REASONS.tornDown,
      message: `reverse forwards closed (${ctx.teardownReason ?? 'teardown'})`,
    });
  }
  if (from === 'failed' && to !== 'failed' && event.type === 'RETRY') {
    specs.push({
      type: 'Normal',
      reason: EVENT_REASONS.retrying,
      message: to === 'tearingDown' ? 'retrying the teardown' : 'retrying the reverse forwards from the start',
    });
  }
  return specs.map((s) => ({ ...s, message: clampMessage(s.message) }));
}

/** A core/v1 Event about a pod, as first created (count 1). */
export interface CoreEventObject {
  apiVersion: 'v1';
  kind: 'Event';
  metadata: { name: string; namespace: string };
  involvedObject: { apiVersion: 'v1'; kind: 'Pod'; namespace: string; name: string; uid: string };
  type: KubeEventType;
  reason: string;
  message: string;
  count: number;
  firstTimestamp: Date;
  lastTimestamp: Date;
  source: { component: string; host?: string };
  reportingComponent: string;
  reportingInstance: string;
}

export function eventObject(
  pod: InvolvedPod,
  spec: EventSpec,
  opts: { name: string; at: Date; component: string; instance: string },
): CoreEventObject {
  return {
    apiVersion: 'v1',
    kind: 'Event',
    metadata: { name: opts.name, namespace: pod.namespace },
    involvedObject: { apiVersion: 'v1', kind: 'Pod', namespace: pod.namespace, name: pod.name, uid: pod.uid },
    type: spec.type,
    reason: spec.reason,
    message: clampMessage(spec.message),
    count: 1,
    firstTimestamp: opts.at,
    lastTimestamp: opts.at,
    source: { component: opts.component, host: opts.instance },
    reportingComponent: opts.component,
    reportingInstance: opts.instance,
  };
}

/** The merge patch that records a repeat: count, last time and the latest message. */
export function repeatPatch(count: number, at: Date, message: string): Record<string, unknown> {
  return { count, lastTimestamp: at.toISOString(), message: clampMessage(message) };
}

/** Unique per pod and instant, as client-go names them: `<pod>.<hex nanoseconds>`. */
export function eventName(podName: string, atMs: number, sequence: number): string {
  const nanos = BigInt(atMs) * 1_000_000n + BigInt(sequence % 1_000_000);
  return `${podName}.${nanos.toString(16)}`;
}
