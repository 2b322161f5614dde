import { InputError } from './input-error.js';
import type { KubernetesConfig } from './site-config.js';

/**
 * What the watch role found in the cluster about a pod, carried to its machine with the pod's
 * annotations (a key no pod can set: the watcher sends only the annotations it reads, then adds this).
 * `ok`, or `refused: <why>`. The validate step reads it, so the checks hold for every machine whatever
 * sent its events, and the machine stays a pure function of what it was sent.
 */
export const CLUSTER_VERDICT = 'backhaul.interlink.eu/cluster-verdict';

export type ClusterVerdict = { ok: true } | { ok: false; why: string };

export function formatVerdict(verdict: ClusterVerdict): string {
  return verdict.ok ? 'ok' : `refused: ${verdict.why}`;
}

/** Whether the site asks the watch role to check pods against the cluster at all. */
export function clusterChecksOn(cfg: Pick<KubernetesConfig, 'NamespaceLabel' | 'NetworkPolicies'>): boolean {
  return cfg.NamespaceLabel !== '' || cfg.NetworkPolicies;
}

/** Throws InputError unless the watch role checked the pod and found nothing against it. */
export function requireClusterVerdict(
  annotations: Readonly<Record<string, string>>,
  cfg: Pick<KubernetesConfig, 'NamespaceLabel' | 'NetworkPolicies'>,
  namespace: string,
): void {
  if (!clusterChecksOn(cfg)) return;
  const verdict = annotations[CLUSTER_VERDICT];
  if (verdict === 'ok') return;
  if (verdict?.startsWith('refused: ')) {
    throw new InputError('cluster', verdict.slice('refused: '.length));
  }
  throw new InputError(
    'cluster',
    `pod of namespace ${namespace} was not checked against the cluster (namespace label ${cfg.NamespaceLabel || '(any)'}, NetworkPolicies ${cfg.NetworkPolicies ? 'on' : 'off'}): only the watch role may start machines on this site`,
    { accepted: 'pods sent by backhaul watch; or Backhaul.Kubernetes.NamespaceLabel "" and NetworkPolicies false' },
  );
}
