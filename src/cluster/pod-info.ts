import { ANNOTATION, REVERSE_ANNOTATIONS } from '../contract/annotations.js';
import { hasReverseAnnotations } from '../contract/reverse-request.js';
import { FORWARDS_READY_CONDITION } from '../render/pod-condition.js';

/**
 * What the watcher keeps of a pod: enough to decide whether it needs a machine and to tell a change
 * that matters from one that does not. Works on the client's typed V1Pod (lists) and on the raw JSON of
 * watch events alike.
 */
export interface WatchedPod {
  uid: string;
  namespace: string;
  name: string;
  nodeName: string | undefined;
  resourceVersion: string;
  /** Only the annotations the machine reads (RELEVANT_ANNOTATIONS). */
  annotations: Record<string, string>;
  /** For NetworkPolicies (the cluster gate): the policies that apply to a pod select it by these. */
  labels: Record<string, string>;
  /** Whether slurm-job.vk.io/pre-exec holds a backhaul prelude (the webhook ran). */
  hasPrelude: boolean;
  phase: string | undefined;
  terminating: boolean;
  /** The pod's interlink.eu/ReverseForwardsReady condition as the API shows it, if any. */
  forwardsCondition: { status: string; reason: string } | undefined;
}

/** The annotations a pod's machine reads: the reverse request and the pod VPN it cannot be combined with. */
export const RELEVANT_ANNOTATIONS: readonly string[] = [...REVERSE_ANNOTATIONS, ANNOTATION.podVpn];

const PRELUDE_LINE = /^# >>> backhaul prelude v\d+\b/m;

interface PodLike {
  metadata?: {
    uid?: unknown;
    namespace?: unknown;
    name?: unknown;
    resourceVersion?: unknown;
    annotations?: unknown;
    labels?: unknown;
    deletionTimestamp?: unknown;
  };
  spec?: { nodeName?: unknown };
  status?: { phase?: unknown; conditions?: unknown };
}

function forwardsConditionOf(conditions: unknown): WatchedPod['forwardsCondition'] {
  if (!Array.isArray(conditions)) return undefined;
  const found = conditions.find(
    (c): c is { status?: unknown; reason?: unknown } =>
      typeof c === 'object' && c !== null && (c as { type?: unknown }).type === FORWARDS_READY_CONDITION,
  );
  return found ? { status: String(found.status ?? ''), reason: String(found.reason ?? '') } : undefined;
}

const text = (value: unknown): string | undefined => (typeof value === 'string' && value !== '' ? value : undefined);

export function relevantAnnotations(annotations: Readonly<Record<string, unknown>>): Record<string, string> {
  const kept: Record<string, string> = {};
  for (const key of RELEVANT_ANNOTATIONS) {
    const value = annotations[key];
    if (typeof value === 'string') kept[key] = value;
  }
  return kept;
}

function stringMap(value: unknown): Record<string, string> {
  if (typeof value !== 'object' || value === null) return {};
  return Object.fromEntries(
    Object.entries(value).filter((entry): entry is [string, string] => typeof entry[1] === 'string'),
  );
}

/** A pod object from the API; undefined when it lacks a uid, namespace or name. */
export function podFromObject(object: unknown): WatchedPod | undefined {
  if (typeof object !== 'object' || object === null) return undefined;
  const pod = object as PodLike;
  const meta = pod.metadata ?? {};
  const uid = text(meta.uid);
  const namespace = text(meta.namespace);
  const name = text(meta.name);
  if (!uid || !namespace || !name) return undefined;
  const raw =
    typeof meta.annotations === 'object' && meta.annotations !== null
      ? (meta.annotations as Record<string, unknown>)
      : {};
  const preExec = raw[ANNOTATION.preExec];
  return {
    uid,
    namespace,
    name,
    nodeName: text(pod.spec?.nodeName),
    resourceVersion: text(meta.resourceVersion) ?? '',
    annotations: relevantAnnotations(raw),
    labels: stringMap(meta.labels),
    hasPrelude: typeof preExec === 'string' && PRELUDE_LINE.test(preExec),
    phase: text(pod.status?.phase),
    terminating: meta.deletionTimestamp !== undefined && meta.deletionTimestamp !== null,
    forwardsCondition: forwardsConditionOf(pod.status?.conditions),
  };
}

export interface PodScope {
  /** Empty: any node. */
  virtualNodes: readonly string[];
}

/** What the pod means for its machine. */
export type PodVerdict =
  /** Needs a machine with these annotations. */
  | { kind: 'live' }
  /** Its tunnel must go: deleted, being deleted, finished, or no longer asking for one. */
  | { kind: 'gone'; event: 'POD_DELETED' }
  | { kind: 'gone'; event: 'TEARDOWN'; reason: string }
  /** Not backhaul's (no reverse annotations, not on a virtual node, not scheduled yet). */
  | { kind: 'other' };

export function classifyPod(pod: WatchedPod, scope: PodScope): PodVerdict {
  if (!pod.nodeName) return { kind: 'other' };
  if (scope.virtualNodes.length > 0 && !scope.virtualNodes.includes(pod.nodeName)) return { kind: 'other' };
  if (!hasReverseAnnotations(pod.annotations)) return { kind: 'other' };
  if (pod.terminating) return { kind: 'gone', event: 'POD_DELETED' };
  if (pod.phase === 'Succeeded' || pod.phase === 'Failed') {
    return { kind: 'gone', event: 'TEARDOWN', reason: `pod-${pod.phase.toLowerCase()}` };
  }
  return { kind: 'live' };
}

/** What the machine is told about a live pod: two pods with the same fingerprint need no new event. */
export function podFingerprint(pod: Pick<WatchedPod, 'namespace' | 'name' | 'annotations'>): string {
  const annotations = Object.keys(pod.annotations)
    .sort()
    .map((key) => [key, pod.annotations[key]]);
  return JSON.stringify([pod.namespace, pod.name, annotations]);
}

export function sameAnnotations(a: Readonly<Record<string, string>>, b: Readonly<Record<string, string>>): boolean {
  const keys = Object.keys(a);
  if (keys.length !== Object.keys(b).length) return false;
  return keys.every((key) => Object.hasOwn(b, key) && a[key] === b[key]);
}
