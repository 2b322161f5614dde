import { isSiteWide, podError } from './error-kinds.js';
/**
 * The pod machine's rules as plain functions of (context, event): which reports are current, how long
 * to back off, what error a failure event means. Pure; the statechart in pod-machine.ts names them.
 */
import type { DeadlineName, PodContext, PodError, PodEvent, PodUpsertEvent, StepName } from './pod-types.js';

/**
 * Backoff before the next shadow launch, given the launches already made in this streak:
 * none → 0 (first launch, or relaunch after a success), then base, 2·base, 4·base … capped at max.
 */
export function backoffDelay(attempts: number, baseMs: number, maxMs: number): number {
  if (attempts <= 0) return 0;
  return Math.min(maxMs, baseMs * 2 ** (attempts - 1));
}

/** How long a deadline state may last, counted from its entry. */
export function deadlineTimeout(context: PodContext, name: DeadlineName): number {
  switch (name) {
    case 'waitingBatchHost':
      return context.nodeWaitTimeoutMs;
    case 'launchingShadow':
      // The launch itself waits out the backoff first.
      return context.backoffMs + context.phaseTimeoutMs;
    case 'openingCarrier':
    case 'establishingForwards':
      return context.phaseTimeoutMs;
  }
}

/**
 * Is this event about the pod as it is now? Session reports and deadlines must carry the current
 * generation (a deadline also its current name); step results may omit the generation.
 */
export function isCurrent(context: PodContext, event: PodEvent): boolean {
  switch (event.type) {
    case 'DEADLINE':
      return (
        context.deadline !== null &&
        context.deadline.name === event.name &&
        context.deadline.generation === event.generation &&
        event.generation === context.generation
      );
    case 'STEP_DONE':
    case 'STEP_FAILED':
      return event.generation === undefined || event.generation === context.generation;
    case 'SHADOW_UP':
    case 'BATCH_HOST':
    case 'CARRIER_OPEN':
    case 'FORWARDS_READY':
    case 'SHADOW_HELD':
    case 'SOCKETS_VANISHED':
    case 'JOB_ENDED':
    case 'CARRIER_LOST':
    case 'SESSION_FAILED':
      return event.generation === context.generation;
    default:
      return true;
  }
}

export function isStep(event: PodEvent, step: StepName): boolean {
  return (event.type === 'STEP_DONE' || event.type === 'STEP_FAILED') && event.step === step;
}

/** The error a failure event stands for. */
export function errorOf(context: PodContext, event: PodEvent): PodError {
  switch (event.type) {
    case 'SESSION_FAILED':
      return event.error;
    case 'STEP_FAILED':
      return event.error ?? podError(`${event.step}-failed`, `step ${event.step} failed`);
    case 'CARRIER_LOST':
      return podError('carrier-lost', event.reason);
    case 'DEADLINE':
      if (event.name === 'waitingBatchHost') {
        // Waiting again would only wait as long again: the job did not get a node in time.
        return podError('node-wait-timeout', `the job got no batch host within ${context.nodeWaitTimeoutMs} ms`);
      }
      return podError('deadline', `${event.name} did not finish within ${deadlineTimeout(context, event.name)} ms`);
    default:
      return podError('unexpected', `${event.type} is not a failure`);
  }
}

/** Why an event ends the pod's tunnel; undefined for events that do not. */
export function teardownReasonOf(event: PodEvent): string | undefined {
  switch (event.type) {
    case 'TEARDOWN':
      return event.reason;
    case 'POD_DELETED':
      return 'pod-deleted';
    case 'JOB_ENDED':
      return 'job-ended';
    case 'SOCKETS_VANISHED':
      return 'sockets-vanished';
    default:
      return undefined;
  }
}

/** Launches left in this streak? */
export function hasBudget(context: PodContext): boolean {
  return context.attempts < context.retryLimit;
}

/**
 * The longest wait between two launches while the site is out of reach (a site-wide error, which spends
 * no launch: error-kinds.ts): short, so pods come back soon after it.
 */
export const SITE_BACKOFF_MAX_MS = 30_000;

/** Launches and backoff of the next launch, after the event that ended the last one (or started the first). */
export function nextLaunch(context: PodContext, cause: PodEvent): { attempts: number; backoffMs: number } {
  const failure = cause.type === 'SESSION_FAILED' || cause.type === 'CARRIER_LOST' || cause.type === 'STEP_FAILED';
  if (failure && isSiteWide(errorOf(context, cause))) {
    const backoffMs = Math.min(
      SITE_BACKOFF_MAX_MS,
      context.backoffMaxMs,
      Math.max(context.backoffBaseMs, context.backoffMs * 2),
    );
    return { attempts: context.attempts, backoffMs };
  }
  return {
    attempts: context.attempts + 1,
    backoffMs: backoffDelay(context.attempts, context.backoffBaseMs, context.backoffMaxMs),
  };
}

/** Does a POD_UPSERT bring anything new (a watch resync repeats what we know)? */
export function podChanged(context: PodContext, event: PodUpsertEvent): boolean {
  return (
    event.namespace !== context.namespace ||
    event.name !== context.name ||
    !sameRecord(event.annotations, context.annotations)
  );
}

/** Does a late (already passed) phase report carry data the context lacks? */
export function reportAddsInfo(context: PodContext, event: PodEvent): boolean {
  switch (event.type) {
    case 'SHADOW_UP':
      return event.host !== context.host;
    case 'BATCH_HOST':
      return event.batchHost !== context.batchHost || event.jobId !== context.jobId;
    default:
      return false;
  }
}

function sameRecord(a: Record<string, string>, b: Record<string, string>): boolean {
  const keys = Object.keys(a);
  if (keys.length !== Object.keys(b).length) return false;
  return keys.every((key) => Object.hasOwn(b, key) && a[key] === b[key]);
}
