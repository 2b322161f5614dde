import { ANNOTATION } from '../contract/annotations.js';
import { requireClusterVerdict } from '../contract/cluster-verdict.js';
import { InputError } from '../contract/input-error.js';
import { parseReverseRequest, type ReverseRequest, requestContext } from '../contract/reverse-request.js';
import type { SiteConfig } from '../contract/site-config.js';
import type { PodContext } from '../machines/pod-machine.js';
import { renderSessionPlan, type SessionPlan } from '../render/session-plan.js';

/** The pod's request, validated against the site (throws InputError for bad input). */
export function requestOf(context: PodContext, config: SiteConfig): ReverseRequest {
  const request = parseReverseRequest(context.annotations, requestContext(config, context.namespace));
  // The namespace opt-in and NetworkPolicies, as the watch role found them (src/contract/cluster-verdict.ts).
  if (request) requireClusterVerdict(context.annotations, config.Backhaul.Kubernetes, context.namespace);
  if (!request) {
    // Bad input, not a transient error: running the step again cannot add the annotation.
    throw new InputError(
      ANNOTATION.forwards,
      `missing: pod ${context.namespace}/${context.name} has no interlink.eu/reverse-* annotation`,
    );
  }
  return request;
}

/** The session plan, rendered afresh where it is needed: it is a pure function of the pod and the site. */
export function planOf(context: PodContext, config: SiteConfig): SessionPlan {
  return renderSessionPlan(
    {
      uid: context.uid,
      namespace: context.namespace,
      name: context.name,
      nodeName: undefined,
      annotations: context.annotations,
    },
    requestOf(context, config),
    config,
  );
}
