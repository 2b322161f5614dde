// biome-ignore-all lint/suspicious/noTemplateCurlyInString: the enroot mount is shell text; bash expands ${...} in job.sh.
import { stripPrelude } from './prelude-markers.js';

/**
 * The admission webhook's answer as data (ARCHITECTURE.md, "The Kubernetes side", "The prelude"): a JSONPatch (RFC 6902) that puts the
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
 * first, so admitting twice gives the same text as admitting once. Throws InputError for a block without
 * its end marker.
 */
export function preExecWithPrelude(existing: string | undefined, prelude: string): string {
  const own = existing === undefined ? '' : stripPrelude(existing);
  return prelude + own;
}

/**
 * enroot's own bind of the node's /etc/hosts (its `mounts.d/20-config.fstab`), with the job's hosts file
 * as the source. interLink's Slurm plugin pastes `slurm-job.vk.io/enroot-mounts` unquoted into the
 * `enroot start` line of job.sh, so bash expands the variable there: the prelude exports it in the batch
 * script, which runs job.sh. The fallback keeps `enroot start` valid (its --mount wants SRC:DST) for a job
 * whose prelude did not run; SocketRoot's grammar keeps the path free of blanks and colons.
 */
export const ENROOT_HOSTS_MOUNT =
  '--mount ${BACKHAUL_HOSTS_FILE:-/etc/hosts}:/etc/hosts:none:x-create=file,bind,ro,nosuid,nodev,noexec,private';

/**
 * The enroot mounts with the hosts file's mount last (after the pod's own, so it is mounted over any
 * other /etc/hosts). Admitting twice gives the same text as admitting once.
 */
export function enrootMountsWithHosts(existing: string | undefined): string {
  const own = (existing ?? '').split(ENROOT_HOSTS_MOUNT).join(' ').replace(/\s+/g, ' ').trim();
  return own === '' ? ENROOT_HOSTS_MOUNT : `${own} ${ENROOT_HOSTS_MOUNT}`;
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

/** The operations that set the annotations in VALUES (none for one that already has its value). */
export function annotationPatch(
  annotations: Readonly<Record<string, string>> | undefined,
  values: Readonly<Record<string, string>>,
): JsonPatchOp[] {
  if (annotations === undefined) return [{ op: 'add', path: '/metadata/annotations', value: { ...values } }];
  return Object.entries(values)
    .filter(([key, value]) => annotations[key] !== value)
    .map(([key, value]) => ({
      op: Object.hasOwn(annotations, key) ? ('replace' as const) : ('add' as const),
      path: `/metadata/annotations/${jsonPointerSegment(key)}`,
      value,
    }));
}
