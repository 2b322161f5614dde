import type { ServiceBackend, ServiceRef } from '../contract/endpoint-policy.js';

/**
 * What the dialling side asks of the cluster: a Service as the Kubernetes API has it (never DNS, whose
 * answer for a name a tenant controls could be anything), and the fleet's own addresses. The session
 * host's is `ClusterDirectory` (src/cluster); a tunnel thread's asks the session host's.
 */
export interface ServiceDirectory {
  lookup(service: ServiceRef): Promise<ServiceAnswer>;
  /** The fleet's own addresses beyond its interfaces: its namespace's Services and pods. */
  fleetAddresses(): ReadonlySet<string>;
  /** Called with the new list whenever it changes; returns the unsubscribe. */
  onFleetAddresses(listener: (addresses: readonly string[]) => void): () => void;
}

/** A Service as the API has it, as plain data (it crosses into tunnel threads). */
export type ServiceAnswer =
  /** No such Service (or no API to ask): `why` says which. */
  | { kind: 'missing'; why: string }
  /** `type: ExternalName`: a name for another name, judged by the policy as a name of its own. */
  | { kind: 'external-name'; target: string }
  | {
      kind: 'service';
      /** Its ClusterIPs, primary first; empty for a headless Service. */
      clusterIPs: string[];
      /** Its TCP ports. */
      ports: number[];
      /** Every endpoint behind it, ready or not (kube-proxy may use terminating ones). */
      backends: Array<ServiceBackend & { ready: boolean }>;
    };

/** Without a Kubernetes API (`backhaul submit` against a site, the loopback tests): Services by HostAliases only. */
export const NO_CLUSTER_DIRECTORY: ServiceDirectory = {
  lookup: async (service) => ({
    kind: 'missing',
    why: `no Kubernetes API to look Service ${service.name}.${service.namespace} up (Backhaul.Kubernetes.Kubeconfig, or Backhaul.HostAliases naming its address)`,
  }),
  fleetAddresses: () => new Set(),
  onFleetAddresses: () => () => undefined,
};
