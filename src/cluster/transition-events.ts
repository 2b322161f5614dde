import type { Logger } from '../log.js';
import type { PodContext, PodEvent, PodStateName } from '../machines/pod-machine.js';
import type { TransitionHook } from '../pods/fleet-deps.js';
import { transitionEvents } from '../render/kube-events.js';
import { forwardsCondition } from '../render/pod-condition.js';
import type { EventRecorder } from './event-recorder.js';
import type { PodConditionWriter } from './pod-conditions.js';
import type { SharedUserWarning } from './shared-user-warning.js';

export type { TransitionHook };

/**
 * Records the Kubernetes Events one transition of a pod's machine means (forwards established, torn
 * down, SOCKS, refused, failed sessions…). Returns at once; the recorder calls the API in the background.
 */
export function recordTransition(
  recorder: EventRecorder,
  pod: PodContext,
  from: PodStateName | null,
  to: PodStateName,
  event: PodEvent,
): void {
  for (const spec of transitionEvents(pod, from, to, event)) {
    recorder.recordSpec({ uid: pod.uid, namespace: pod.namespace, name: pod.name }, spec);
  }
}

/** Sets the pod's forwards condition for the state it entered (`done`: its machine is gone). */
export function conditionForTransition(
  conditions: PodConditionWriter,
  pod: PodContext,
  to: PodStateName,
  at: number,
): void {
  if (to === 'done') {
    conditions.forget(pod.uid);
    return;
  }
  const condition = forwardsCondition(to, pod, at);
  if (condition) conditions.set({ uid: pod.uid, namespace: pod.namespace, name: pod.name }, condition);
}

/**
 * The control worker's `onTransition` hook (FleetDeps): Events, and the pod's forwards condition. Neither
 * may fail or hold up a transition: both go to the API in the background.
 */
export function transitionHook(
  parts: {
    recorder?: EventRecorder | undefined;
    conditions?: PodConditionWriter | undefined;
    sharedUser?: SharedUserWarning | undefined;
  },
  log: Logger,
): TransitionHook {
  return (uid, ctx, from, to, event) => {
    try {
      if (parts.recorder) recordTransition(parts.recorder, ctx, from, to, event);
      parts.sharedUser?.observe(ctx, to, event);
      if (parts.conditions) conditionForTransition(parts.conditions, ctx, to, event.at);
    } catch (err) {
      log.warn({ uid, err }, 'could not record the Events or condition of a transition');
    }
  };
}
