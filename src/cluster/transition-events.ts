import type { Logger } from '../log.js';
import type { PodContext, PodEvent, PodStateName } from '../machines/pod-machine.js';
import type { FleetDeps } from '../pods/fleet-deps.js';
import { transitionEvents } from '../render/kube-events.js';
import type { EventRecorder } from './event-recorder.js';

export type TransitionHook = NonNullable<FleetDeps['onTransition']>;

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

/** The control worker's `onTransition` hook (FleetDeps): Events must never fail a transition. */
export function transitionHook(recorder: EventRecorder, log: Logger): TransitionHook {
  return (uid, ctx, from, to, event) => {
    try {
      recordTransition(recorder, ctx, from, to, event);
    } catch (err) {
      log.warn({ uid, err }, 'could not record the Events of a transition');
    }
  };
}
