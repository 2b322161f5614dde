import { stripPrelude } from './prelude-markers.js';

/**
 * The admission webhook's answer as data (ARCHITECTURE.md §3.9, §3.4): a JSONPatch (RFC 6902) that puts the
 * current prelude at the top of `slurm-job.vk.io/pre-exec`. Pure.
 */

export interface JsonPatchOp {
  op: 'add' | 'replace';
  path: string;
  value: unknown;
}

/** A map key as one JSON Pointer segment (RFC 6901): "~" → "~0", "/" → "~1". */
export function jsonPointerSegment(key: string): string {
  return key.replace(/~/g, '~0').replace(/\//g, '~1');
}

/**
 * The pre-exec with `prelude` first and the pod's own commands after it. A backhaul block already in
 * the text (a re-submitted pod, a manifest copied from a running pod, a second admission) is removed
 * first, so admitting twice gives the same text as admitting once. Throws SpecError for a block without
 * its end marker.
 */
export function preExecWithPrelude(existing: string | undefined, prelude: string): string {
  const own = existing === undefined ? '' : stripPrelude(existing);
  return prelude + own;
}

/**
 * The operations that add a readiness gate of `conditionType` to a pod spec (none when it has one): the
 * pod is then Ready only once that condition is True.
 */
export function readinessGatePatch(
  gates: readonly { conditionType?: string }[] | undefined,
  conditionType: string,
): JsonPatchOp[] {
  if (gates === undefined) return [{ op: 'add', path: '/spec/readinessGates', value: [{ conditionType }] }];
  if (gates.some((gate) => gate.conditionType === conditionType)) return [];
  return [{ op: 'add', path: '/spec/readinessGates/-', value: { conditionType } }];
}

/** The operations that set annotation `key` to `value` (none when it already has that value). */
export function annotationPatch(
  annotations: Readonly<Record<string, string>> | undefined,
  key: string,
  value: string,
): JsonPatchOp[] {
  if (annotations === undefined) return [{ op: 'add', path: '/metadata/annotations', value: { [key]: value } }];
  if (annotations[key] === value) return [];
  return [
    {
      op: Object.hasOwn(annotations, key) ? 'replace' : 'add',
      path: `/metadata/annotations/${jsonPointerSegment(key)}`,
      value,
    },
  ];
}
