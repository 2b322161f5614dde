import { ANNOTATION, REVERSE_ANNOTATIONS } from '../contract/annotations.js';
import { InputError, isInputError, quote } from '../contract/input-error.js';
import {
  hasReverseAnnotations,
  parseReverseRequest,
  type ReverseRequest,
  requestContext,
} from '../contract/reverse-request.js';
import type { SiteConfig } from '../contract/site-config.js';
import { FORWARDS_READY_CONDITION } from '../render/pod-condition.js';
import { hasPrelude, renderPrelude, stripPrelude } from '../render/prelude.js';
import {
  annotationPatch,
  enrootMountsWithHosts,
  type JsonPatchOp,
  preExecWithPrelude,
  readinessGatePatch,
} from '../render/webhook-patch.js';

/**
 * AdmissionReview v1 (admission.k8s.io/v1) for pods (ARCHITECTURE.md, "The Kubernetes side", "Annotations", "The prelude"). Pure: a review document in,
 * the response document out; src/cluster/webhook-server.ts serves it over HTTPS.
 *
 * - `mutate`: validates the reverse annotations against the site and patches the prelude into
 *   `slurm-job.vk.io/pre-exec` and the hosts file's mount into `slurm-job.vk.io/enroot-mounts` (idempotent); refuses a bad pod with the annotation, the entry and what
 *   would be accepted. SOCKS, when the site allows it, is admitted with a warning.
 * - `validate`: the same checks on the pod as it will be stored, plus: a pod with forwards must carry the
 *   prelude (otherwise the mutating webhook did not run for it and its job would never start the relay).
 *
 * - `validate` on UPDATE: the reverse annotations and the pre-exec cannot change once the pod exists: the
 *   job's prelude was rendered from them (the virtual kubelet submits it at creation), so a new value
 *   would describe forwards the job's relay does not serve.
 *
 * - `not-enabled`: for namespaces without the opt-in label (the manifest's namespaceSelector says so, so
 *   no API call is needed): a new pod that asks for reverse forwards is refused, saying how to opt in.
 *   Without it the pod would be admitted unmutated and wait for forwards that never come.
 *
 * Pods without reverse annotations, other kinds and other operations are allowed untouched.
 */

export const ADMISSION_API_VERSION = 'admission.k8s.io/v1';

export type AdmissionMode = 'mutate' | 'validate' | 'not-enabled';

export interface AdmissionResponse {
  uid: string;
  allowed: boolean;
  status?: { code: number; reason: string; message: string };
  patchType?: 'JSONPatch';
  /** Base64 of the JSONPatch document. */
  patch?: string;
  warnings?: string[];
}

export interface AdmissionReviewResponse {
  apiVersion: typeof ADMISSION_API_VERSION;
  kind: 'AdmissionReview';
  response: AdmissionResponse;
}

/** Not an AdmissionReview v1 request: answered with HTTP 400. */
export class BadReviewError extends Error {
  override readonly name = 'BadReviewError';
}

interface ReviewRequest {
  uid: string;
  kind?: { group?: string; version?: string; kind?: string };
  resource?: { group?: string; version?: string; resource?: string };
  subResource?: string;
  namespace?: string;
  operation?: string;
  object?: unknown;
  oldObject?: unknown;
}

interface PodObject {
  metadata?: { name?: string; generateName?: string; namespace?: string; annotations?: Record<string, unknown> };
  spec?: { readinessGates?: unknown };
}

/** The readiness gate the site asks for (Backhaul.Kubernetes.ReadinessGate), for a pod with forwards. */
function gateOps(pod: PodObject, config: SiteConfig, forwards: number): JsonPatchOp[] {
  if (!config.Backhaul.Kubernetes.ReadinessGate || forwards === 0) return [];
  const gates = pod.spec?.readinessGates;
  // Not a list: the API server refuses the pod itself, with its own words.
  if (gates !== undefined && !Array.isArray(gates)) return [];
  return readinessGatePatch(gates as { conditionType?: string }[] | undefined, FORWARDS_READY_CONDITION);
}

function requestOf(review: unknown): ReviewRequest {
  if (typeof review !== 'object' || review === null) throw new BadReviewError('expected a JSON object');
  const r = review as { apiVersion?: unknown; kind?: unknown; request?: unknown };
  if (r.kind !== 'AdmissionReview' || r.apiVersion !== ADMISSION_API_VERSION) {
    throw new BadReviewError(
      `expected an AdmissionReview of ${ADMISSION_API_VERSION} (admissionReviewVersions: ["v1"]), got ${quote(String(r.kind))} ${quote(String(r.apiVersion))}`,
    );
  }
  const request = r.request as ReviewRequest | undefined;
  if (typeof request !== 'object' || request === null || typeof request.uid !== 'string' || request.uid === '') {
    throw new BadReviewError('the AdmissionReview has no request.uid');
  }
  return request;
}

/** The pod's annotations; a non-string value is bad input (the API server would refuse it anyway). */
function annotationsOf(pod: PodObject): Record<string, string> | undefined {
  const raw = pod.metadata?.annotations;
  if (raw === undefined || raw === null) return undefined;
  const out: Record<string, string> = {};
  for (const [key, value] of Object.entries(raw)) {
    if (typeof value !== 'string') throw new InputError(key, 'annotation values must be strings');
    out[key] = value;
  }
  return out;
}

export function socksWarning(request: ReverseRequest): string | undefined {
  if (request.socksPort === undefined) return undefined;
  return `${ANNOTATION.socksPort} ${request.socksPort}: SOCKS reaches all the endpoint policy allows, not only the forwards`;
}

/** The annotations a pod's job was rendered from: fixed once the pod exists. */
const FROZEN_ANNOTATIONS = [...REVERSE_ANNOTATIONS, ANNOTATION.preExec] as const;

function validateUpdate(
  request: ReviewRequest,
  respond: (response: Omit<AdmissionResponse, 'uid'>) => AdmissionReviewResponse,
): AdmissionReviewResponse {
  try {
    const before = annotationsOf((request.oldObject ?? {}) as PodObject) ?? {};
    const after = annotationsOf((request.object ?? {}) as PodObject) ?? {};
    // Only pods that use backhaul (before or after) are backhaul's business.
    if (!hasReverseAnnotations(before) && !hasReverseAnnotations(after)) return respond({ allowed: true });
    for (const key of FROZEN_ANNOTATIONS) {
      if (before[key] === after[key]) continue;
      throw new InputError(
        key,
        `cannot change once the pod exists (from ${describe(before[key])} to ${describe(after[key])}): its job's prelude was rendered from it`,
        { accepted: 'the value the pod was created with; to change the forwards, delete the pod and create it again' },
      );
    }
    return respond({ allowed: true });
  } catch (err) {
    if (!isInputError(err)) throw err;
    return respond({ allowed: false, status: { code: 403, reason: 'Forbidden', message: err.message } });
  }
}

function notEnabled(
  namespace: string,
  config: SiteConfig,
  respond: (response: Omit<AdmissionResponse, 'uid'>) => AdmissionReviewResponse,
): AdmissionReviewResponse {
  const label = config.Backhaul.Kubernetes.NamespaceLabel;
  if (label === '') return respond({ allowed: true }); // the site serves every namespace
  return respond({
    allowed: false,
    status: {
      code: 403,
      reason: 'Forbidden',
      message: `the pod asks for reverse forwards (interlink.eu/reverse-*), but namespace ${namespace} has not opted in to them: an admin labels it with kubectl label namespace ${namespace} ${label} (Backhaul.Kubernetes.NamespaceLabel); until then its pods get no tunnel`,
    },
  });
}

function describe(value: string | undefined): string {
  if (value === undefined) return 'unset';
  return quote(value);
}

/** Answers one AdmissionReview. Throws BadReviewError for a document that is not one. */
export function admit(review: unknown, mode: AdmissionMode, config: SiteConfig): AdmissionReviewResponse {
  const request = requestOf(review);
  const respond = (response: Omit<AdmissionResponse, 'uid'>): AdmissionReviewResponse => ({
    apiVersion: ADMISSION_API_VERSION,
    kind: 'AdmissionReview',
    response: { uid: request.uid, ...response },
  });
  const isPod =
    (request.kind?.kind ?? 'Pod') === 'Pod' &&
    (request.kind?.group ?? '') === '' &&
    (request.resource?.resource ?? 'pods') === 'pods' &&
    !request.subResource;
  const operation = request.operation ?? 'CREATE';
  if (!isPod) return respond({ allowed: true });
  if (operation === 'UPDATE' && mode === 'validate') return validateUpdate(request, respond);
  if (operation !== 'CREATE') return respond({ allowed: true });
  const pod = (request.object ?? {}) as PodObject;
  try {
    const annotations = annotationsOf(pod);
    if (!annotations || !hasReverseAnnotations(annotations)) return respond({ allowed: true });
    if (mode === 'not-enabled')
      return notEnabled(request.namespace || pod.metadata?.namespace || 'default', config, respond);
    const reverse = config.Network.SSH.Reverse;
    const parsed = parseReverseRequest(
      annotations,
      requestContext(config, request.namespace || pod.metadata?.namespace || 'default'),
    );
    if (!parsed) return respond({ allowed: true });
    const existing = annotations[ANNOTATION.preExec];
    if (mode === 'mutate') {
      const ops = [
        ...annotationPatch(annotations, {
          [ANNOTATION.preExec]: preExecWithPrelude(existing, renderPrelude(parsed, reverse)),
          // Apptainer gets the hosts file from the prelude's APPTAINER_BIND; enroot from its mounts.
          [ANNOTATION.enrootMounts]: enrootMountsWithHosts(annotations[ANNOTATION.enrootMounts]),
        }),
        ...gateOps(pod, config, parsed.forwards.length),
      ];
      const warning = socksWarning(parsed);
      return respond({
        allowed: true,
        ...(ops.length > 0
          ? { patchType: 'JSONPatch' as const, patch: Buffer.from(JSON.stringify(ops)).toString('base64') }
          : {}),
        ...(warning ? { warnings: [warning] } : {}),
      });
    }
    if (existing !== undefined) stripPrelude(existing); // a block without its end marker is refused
    if (parsed.forwards.length > 0 && !(existing !== undefined && hasPrelude(existing))) {
      throw new InputError(ANNOTATION.preExec, 'holds no backhaul prelude, so the job would never start the relay', {
        accepted:
          "a pod admitted through backhaul's mutating webhook (is its namespace selected by the MutatingWebhookConfiguration?)",
      });
    }
    return respond({ allowed: true });
  } catch (err) {
    if (!isInputError(err)) throw err;
    return respond({ allowed: false, status: { code: 403, reason: 'Forbidden', message: err.message } });
  }
}
