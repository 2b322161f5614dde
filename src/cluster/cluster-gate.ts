import { isIPv4 } from 'node:net';
import {
  CoreV1Api,
  DiscoveryV1Api,
  type KubeConfig,
  NetworkingV1Api,
  type V1EndpointSlice,
  type V1NetworkPolicy,
  type V1Pod,
  type V1Service,
} from '@kubernetes/client-node';
import type { ClusterVerdict } from '../contract/cluster-verdict.js';
import { NamespaceEndpointPolicy } from '../contract/endpoint-policy.js';
import { serviceOfName } from '../contract/host-names.js';
import { type Forward, parseReverseRequest, requestContext } from '../contract/reverse-request.js';
import type { SiteConfig } from '../contract/site-config.js';
import { type Clock, systemClock } from '../pods/clock.js';
import { kubeCall, orNotFound } from './kube-api.js';
import { Memo } from './memo.js';
import {
  type DestinationPod,
  evaluateNetworkPolicies,
  type PolicyDestination,
  type PolicyWorld,
} from './network-policy-eval.js';

/** The pod as the gate needs it. */
export interface GatedPod {
  namespace: string;
  labels: Readonly<Record<string, string>>;
  annotations: Readonly<Record<string, string>>;
}

type Labels = Readonly<Record<string, string>>;

/** Short memories: a pod's events come in bursts, and a changed policy must be seen by the next resync. */
export const CLUSTER_CACHE_MS = 10_000;

/**
 * What the cluster says of a pod before the fleet serves it (the watch role asks; the answer travels to
 * the machine as CLUSTER_VERDICT): its namespace must carry the opt-in label, and no NetworkPolicy may
 * refuse what it forwards to a pod of its namespace and labels. Reads Namespaces, Services,
 * EndpointSlices, Pods and NetworkPolicies (the RBAC of KUBE_API_ACCESS); an API error is thrown, so
 * the pod waits for the next try instead of being served unchecked.
 */
export class ClusterGate {
  private readonly core: CoreV1Api;
  private readonly discovery: DiscoveryV1Api;
  private readonly networking: NetworkingV1Api;
  private readonly namespaces: Memo<Labels | null>;
  private readonly policies: Memo<readonly V1NetworkPolicy[]>;
  private readonly services: Memo<V1Service | undefined>;
  private readonly slices: Memo<readonly V1EndpointSlice[]>;
  private readonly pods: Memo<V1Pod | undefined>;
  private readonly selected: Memo<readonly V1Pod[]>;

  constructor(
    kubeConfig: KubeConfig,
    private readonly config: SiteConfig,
    private readonly now: Clock = systemClock,
    cacheMs = CLUSTER_CACHE_MS,
  ) {
    this.namespaces = new Memo(cacheMs);
    this.policies = new Memo(cacheMs);
    this.services = new Memo(cacheMs);
    this.slices = new Memo(cacheMs);
    this.pods = new Memo(cacheMs);
    this.selected = new Memo(cacheMs);
    this.core = kubeConfig.makeApiClient(CoreV1Api);
    this.discovery = kubeConfig.makeApiClient(DiscoveryV1Api);
    this.networking = kubeConfig.makeApiClient(NetworkingV1Api);
  }

  async verdict(pod: GatedPod): Promise<ClusterVerdict> {
    const k8s = this.config.Backhaul.Kubernetes;
    if (k8s.NamespaceLabel !== '') {
      const [key = '', value = ''] = k8s.NamespaceLabel.split('=');
      const labels = await this.namespaceLabels(pod.namespace);
      if (labels?.[key] !== value) {
        return {
          ok: false,
          why: `namespace ${pod.namespace} is not labelled ${k8s.NamespaceLabel}: this site serves only the namespaces that opted in (Backhaul.Kubernetes.NamespaceLabel); an admin can run: kubectl label namespace ${pod.namespace} ${k8s.NamespaceLabel}`,
        };
      }
    }
    let forwards: readonly Forward[];
    try {
      forwards = parseReverseRequest(pod.annotations, requestContext(this.config, pod.namespace))?.forwards ?? [];
    } catch {
      return { ok: true }; // bad input: the validate step refuses it with its own message
    }
    const externalName = await this.externalNameVerdict(pod, forwards);
    if (externalName) return externalName;
    if (k8s.NetworkPolicies) return this.networkPolicyVerdict(pod, forwards);
    return { ok: true };
  }

  /**
   * A Service of the pod's that is an ExternalName is judged as the name it points to: a tenant's own
   * `r` → `postgres.tenant-b.svc…` is refused here already, with the words the dial would use.
   */
  private async externalNameVerdict(pod: GatedPod, forwards: readonly Forward[]): Promise<ClusterVerdict | undefined> {
    const domain = this.config.Backhaul.ClusterDomain;
    const policy = new NamespaceEndpointPolicy(this.config.Backhaul.EndpointPolicy, pod.namespace, {
      clusterDomain: domain,
    });
    for (const forward of forwards) {
      const service = serviceOfName(forward.dialHost, domain);
      if (!service) continue;
      const svc = await this.serviceOf(service);
      const target =
        svc?.spec?.type === 'ExternalName' ? svc.spec.externalName?.toLowerCase().replace(/\.$/, '') : undefined;
      if (target === undefined) continue;
      const why = policy.refusal({ host: target, service: serviceOfName(target, domain), port: forward.port });
      if (why !== undefined) {
        return {
          ok: false,
          why: `forward ${forward.listenPort} to ${forward.host}:${forward.port}: Service ${service.name}.${service.namespace} is an ExternalName for ${target}: ${why}`,
        };
      }
    }
    return undefined;
  }

  private serviceOf(service: { name: string; namespace: string }): Promise<V1Service | undefined> {
    return this.services.get(`${service.namespace}/${service.name}`, this.now(), () => {
      kubeCall('services.get');
      return orNotFound(this.core.readNamespacedService(service));
    });
  }

  private async networkPolicyVerdict(pod: GatedPod, forwards: readonly Forward[]): Promise<ClusterVerdict> {
    for (const forward of forwards) {
      const destinations = await this.destinationsOf(forward.dialHost, forward.port);
      if (destinations.length === 0) continue;
      const world = await this.worldOf(pod.namespace, destinations);
      const verdict = evaluateNetworkPolicies({ namespace: pod.namespace, labels: pod.labels }, destinations, world);
      if (!verdict.allowed) {
        return {
          ok: false,
          why: `forward ${forward.listenPort} to ${forward.host}:${forward.port}: ${verdict.message}`,
        };
      }
    }
    return { ok: true };
  }

  /**
   * Where a connection to host:port can end, as NetworkPolicies see it: a Service's ready endpoints
   * (pods, with their labels), or the Service's selector when none is ready yet; an IPv4 address as it
   * is. Other names (outside the cluster) are resolved only when dialled: NetworkPolicies can only
   * match them by ipBlock, which the endpoint policy's CIDRs cover.
   */
  private async destinationsOf(host: string, port: number): Promise<PolicyDestination[]> {
    if (isIPv4(host)) return [{ ip: host, port, protocol: 'TCP', label: `${host}:${port}` }];
    const service = serviceOfName(host, this.config.Backhaul.ClusterDomain);
    if (!service) return [];
    const svc = await this.serviceOf(service);
    const servicePort = svc?.spec?.ports?.find((p) => p.port === port && (p.protocol ?? 'TCP') === 'TCP');
    if (!svc || !servicePort) return []; // the dial fails anyway; nothing to refuse here
    const name = `${service.name}.${service.namespace}`;
    const slices = await this.slices.get(`${service.namespace}/${service.name}`, this.now(), async () => {
      kubeCall('endpointslices.list');
      const list = await this.discovery.listNamespacedEndpointSlice({
        namespace: service.namespace,
        labelSelector: `kubernetes.io/service-name=${service.name}`,
      });
      return list.items;
    });
    const found: PolicyDestination[] = [];
    for (const slice of slices) {
      const slicePort = portOfSlice(slice, servicePort.name);
      if (slicePort === undefined) continue;
      for (const endpoint of slice.endpoints ?? []) {
        if (endpoint.conditions?.ready === false) continue;
        const ref = endpoint.targetRef?.kind === 'Pod' ? endpoint.targetRef : undefined;
        const podName = ref?.name;
        const podNamespace = ref?.namespace ?? service.namespace;
        let target: DestinationPod | undefined;
        if (podName) {
          const object = await this.pods.get(`${podNamespace}/${podName}`, this.now(), () => {
            kubeCall('pods.get');
            return orNotFound(this.core.readNamespacedPod({ namespace: podNamespace, name: podName }));
          });
          if (object) target = destinationPod(object);
        }
        for (const ip of endpoint.addresses) {
          const where = target ? `pod ${target.name}, ${ip}:${slicePort}` : `${ip}:${slicePort}`;
          found.push({
            ip,
            port: slicePort,
            protocol: 'TCP',
            ...(target ? { pod: target } : {}),
            label: `${name} (${where})`,
          });
        }
      }
    }
    if (found.length > 0) return found;
    const selector = svc.spec?.selector;
    if (!selector || Object.keys(selector).length === 0) return [];
    // No endpoint ready yet: judge by the pods the Service selects (not ready, or not there yet). Their
    // container ports resolve a named targetPort, and a policy's named port, as the endpoints' would.
    const targetPort = servicePort.targetPort;
    const selected = await this.selected.get(`${service.namespace}/${service.name}`, this.now(), async () => {
      kubeCall('pods.list');
      const list = await this.core.listNamespacedPod({
        namespace: service.namespace,
        labelSelector: Object.entries(selector)
          .map(([key, value]) => `${key}=${value}`)
          .join(','),
      });
      return list.items;
    });
    const resolved = selected.map(destinationPod).flatMap((pod) => {
      if (typeof targetPort !== 'string') return [{ pod, port: targetPort ?? port }];
      const named = pod.containerPorts.find((c) => c.name === targetPort && (c.protocol ?? 'TCP') === 'TCP');
      return named ? [{ pod, port: named.containerPort }] : [];
    });
    if (resolved.length > 0) {
      return resolved.map(({ pod, port: podPort }) => ({
        ip: svc.spec?.clusterIP ?? '0.0.0.0',
        port: podPort,
        protocol: 'TCP' as const,
        pod,
        label: `${name} (pod ${pod.name}, no endpoint yet, port ${podPort})`,
      }));
    }
    // No pod yet either: the selector stands for them; a named targetPort keeps its name for named policy ports.
    const unnamed = typeof targetPort === 'number' ? targetPort : port;
    return [
      {
        ip: svc.spec?.clusterIP ?? '0.0.0.0',
        port: unnamed,
        protocol: 'TCP',
        pod: {
          namespace: service.namespace,
          name: `(selected by ${name})`,
          labels: selector,
          containerPorts: typeof targetPort === 'string' ? [{ name: targetPort, containerPort: unnamed }] : [],
        },
        label: `${name} (the pods it selects; none exists yet)`,
      },
    ];
  }

  private async worldOf(source: string, destinations: readonly PolicyDestination[]): Promise<PolicyWorld> {
    const involved = new Set([source, ...destinations.flatMap((d) => (d.pod ? [d.pod.namespace] : []))]);
    const policies = new Map<string, readonly V1NetworkPolicy[]>();
    const namespaceLabels = new Map<string, Labels>();
    for (const namespace of involved) {
      policies.set(namespace, await this.policiesOf(namespace));
      namespaceLabels.set(namespace, (await this.namespaceLabels(namespace)) ?? {});
    }
    return { policies, namespaceLabels };
  }

  private namespaceLabels(name: string): Promise<Labels | null> {
    return this.namespaces.get(name, this.now(), async () => {
      kubeCall('namespaces.get');
      const ns = await orNotFound(this.core.readNamespace({ name }));
      return ns ? (ns.metadata?.labels ?? {}) : null;
    });
  }

  private policiesOf(namespace: string): Promise<readonly V1NetworkPolicy[]> {
    return this.policies.get(namespace, this.now(), async () => {
      kubeCall('networkpolicies.list');
      return (await this.networking.listNamespacedNetworkPolicy({ namespace })).items;
    });
  }
}

function portOfSlice(slice: V1EndpointSlice, servicePortName: string | undefined): number | undefined {
  const entry = (slice.ports ?? []).find((p) => (p.name ?? '') === (servicePortName ?? ''));
  return entry?.port ?? undefined;
}

function destinationPod(pod: V1Pod): DestinationPod {
  return {
    namespace: pod.metadata?.namespace ?? '',
    name: pod.metadata?.name ?? '?',
    labels: pod.metadata?.labels ?? {},
    containerPorts: (pod.spec?.containers ?? []).flatMap((c) =>
      (c.ports ?? []).map((p) => ({
        containerPort: p.containerPort,
        ...(p.name ? { name: p.name } : {}),
        ...(p.protocol ? { protocol: p.protocol } : {}),
      })),
    ),
  };
}
