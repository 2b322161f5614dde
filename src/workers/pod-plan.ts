import { createHash } from 'node:crypto';
import { ANNOTATION } from '../contract/annotations.js';
import { requireClusterVerdict } from '../contract/cluster-verdict.js';
import { InputError } from '../contract/input-error.js';
import { parseReverseRequest, type ReverseRequest, requestContext } from '../contract/reverse-request.js';
import type { SiteConfig } from '../contract/site-config.js';
import type { PodContext, RenderedPlan } from '../machines/pod-machine.js';
import { renderedPlan } from '../machines/pod-schema.js';
import { renderSessionPlan, type SessionPlan } from '../render/session-plan.js';
import { sessionPlanSchema } from '../render/session-plan-schema.js';

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

/** The session plan of the pod and the site, rendered now (throws InputError for bad input). */
function planOf(context: PodContext, config: SiteConfig): SessionPlan {
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

const digests = new WeakMap<SiteConfig, string>();

/** Which site configuration a plan was rendered from: a SHA-256 of the parsed configuration. */
export function siteDigest(config: SiteConfig): string {
  let digest = digests.get(config);
  if (digest === undefined) {
    digest = createHash('sha256').update(JSON.stringify(config)).digest('hex');
    digests.set(config, digest);
  }
  return digest;
}

/** What the render step stores with the pod (throws InputError for bad input). */
export function renderPlan(context: PodContext, config: SiteConfig): RenderedPlan {
  return { site: siteDigest(config), plan: { ...planOf(context, config) } };
}

/** The plan a launch uses; `rendered` says why it was rendered again instead of taken as stored. */
export interface LaunchPlan {
  plan: SessionPlan;
  rendered?: 'site-changed' | 'not-stored' | 'unreadable';
}

/** The plan stored beside a pod (SnapshotStore.plan), checked; 'unreadable' when it is not one. */
export function parseStoredPlan(json: string | null): RenderedPlan | null | 'unreadable' {
  if (json === null) return null;
  try {
    const parsed = renderedPlan.safeParse(JSON.parse(json));
    return parsed.success ? parsed.data : 'unreadable';
  } catch {
    return 'unreadable';
  }
}

/**
 * The stored plan, when the site configuration is the one it was rendered from: a relaunch serves what
 * the pod was validated and rendered with. Under another configuration (the fleet restarted with a
 * changed site file) it is rendered again on purpose, for the site as it is now.
 */
export function launchPlan(
  context: PodContext,
  config: SiteConfig,
  stored: RenderedPlan | null | 'unreadable',
): LaunchPlan {
  if (stored && stored !== 'unreadable' && stored.site === siteDigest(config)) {
    const plan = sessionPlanSchema.safeParse(stored.plan);
    if (plan.success) return { plan: plan.data };
    return { plan: planOf(context, config), rendered: 'unreadable' };
  }
  const rendered = stored === 'unreadable' ? 'unreadable' : stored ? 'site-changed' : 'not-stored';
  return { plan: planOf(context, config), rendered };
}
