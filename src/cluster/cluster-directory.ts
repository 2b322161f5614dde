import { CoreV1Api, DiscoveryV1Api, type KubeConfig, type V1Pod } from '@kubernetes/client-node';
import type { ServiceRef } from '../contract/endpoint-policy.js';
import type { Logger } from '../log.js';
import { type Clock, systemClock } from '../pods/clock.js';
import type { ServiceAnswer, ServiceDirectory } from '../ssh/service-directory.js';
import { describeKubeError, kubeCall, orNotFound } from './kube-api.js';

/** How long an answer is used before the API is asked again. */
export const SERVICE_TTL_MS = 5_000;
/** While the API does not answer, an older answer is used this long (a Service's ClusterIP does not move). */
export const SERVICE_STALE_MS = 5 * 60_000;
/** How often the fleet namespace's Services and pods are listed. */
export const FLEET_REFRESH_MS = 10_000;

interface Entry {
  at: number;
  answer: ServiceAnswer;
}

/**
 * Services as the Kubernetes API has them, for the session host's dials (`ServiceDirectory`): the
 * Service (its ClusterIPs and ports, or its ExternalName), and every endpoint of its EndpointSlices,
 * each marked whether a pod of the Service's own namespace has that address (the pod named by the
 * endpoint's targetRef, read back: a slice written by hand can name any pod, and any address). And the
 * fleet namespace's ClusterIPs and pod IPs, listed every FLEET_REFRESH_MS: the dialer refuses them
 * whatever answer led there.
 */
export class ClusterDirectory implements ServiceDirectory {
  private readonly core: CoreV1Api;
  private readonly discovery: DiscoveryV1Api;
  private readonly answers = new Map<string, Entry>();
  private readonly inFlight = new Map<string, Promise<ServiceAnswer>>();
  private fleet: ReadonlySet<string> = new Set();
  private readonly listeners = new Set<(addresses: readonly string[]) => void>();
  private timer: NodeJS.Timeout | undefined;
  private fleetFailing = false;

  constructor(
    kubeConfig: KubeConfig,
    private readonly fleetNamespace: string,
    private readonly log: Logger,
    private readonly now: Clock = systemClock,
  ) {
    this.core = kubeConfig.makeApiClient(CoreV1Api);
    this.discovery = kubeConfig.makeApiClient(DiscoveryV1Api);
  }

  /** Lists the fleet namespace once (a failure is logged; the interfaces still protect) and keeps doing so. */
  async start(): Promise<void> {
    await this.refreshFleet();
    this.timer = setInterval(() => void this.refreshFleet(), FLEET_REFRESH_MS);
    this.timer.unref();
  }

  stop(): void {
    clearInterval(this.timer);
    this.listeners.clear();
  }

  fleetAddresses(): ReadonlySet<string> {
    return this.fleet;
  }

  onFleetAddresses(listener: (addresses: readonly string[]) => void): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  lookup(service: ServiceRef): Promise<ServiceAnswer> {
    const key = `${service.namespace}/${service.name}`;
    const hit = this.answers.get(key);
    const now = this.now();
    if (hit && now - hit.at < SERVICE_TTL_MS) return Promise.resolve(hit.answer);
    const pending = this.inFlight.get(key);
    if (pending) return pending;
    const read = this.read(service).then(
      (answer) => {
        if (this.answers.size > 5_000) this.answers.clear();
        this.answers.set(key, { at: this.now(), answer });
        return answer;
      },
      (err: unknown) => {
        if (hit && this.now() - hit.at < SERVICE_STALE_MS) {
          this.log.warn(
            { service: key, err: describeKubeError(err), ageMs: this.now() - hit.at },
            'the Kubernetes API did not answer for a Service: its last answer is used',
          );
          return hit.answer;
        }
        throw new Error(`cannot look Service ${service.name}.${service.namespace} up: ${describeKubeError(err)}`);
      },
    );
    this.inFlight.set(key, read);
    const done = () => this.inFlight.delete(key);
    read.then(done, done);
    return read;
  }

  private async read(ref: ServiceRef): Promise<ServiceAnswer> {
    kubeCall('services.get');
    const svc = await orNotFound(this.core.readNamespacedService({ namespace: ref.namespace, name: ref.name }));
    if (!svc) return { kind: 'missing', why: 'no such Service' };
    const spec = svc.spec ?? {};
    if (spec.type === 'ExternalName') {
      return spec.externalName
        ? { kind: 'external-name', target: spec.externalName.toLowerCase() }
        : { kind: 'missing', why: 'an ExternalName Service without a name' };
    }
    const clusterIPs = (spec.clusterIPs ?? (spec.clusterIP ? [spec.clusterIP] : [])).filter(
      (ip) => ip !== '' && ip !== 'None',
    );
    const ports = (spec.ports ?? []).filter((p) => (p.protocol ?? 'TCP') === 'TCP').map((p) => p.port);
    kubeCall('endpointslices.list');
    const slices = await this.discovery.listNamespacedEndpointSlice({
      namespace: ref.namespace,
      labelSelector: `kubernetes.io/service-name=${ref.name}`,
    });
    const endpoints = slices.items.flatMap((slice) => slice.endpoints ?? []);
    const podOf = (endpoint: (typeof endpoints)[number]) => {
      const target = endpoint.targetRef;
      return target?.kind === 'Pod' && (target.namespace ?? ref.namespace) === ref.namespace ? target.name : undefined;
    };
    // Each pod named by an endpoint, read once and all at once (a headless Service may have many).
    const names = [...new Set(endpoints.map(podOf).filter((n): n is string => n !== undefined))];
    const pods = new Map(
      await Promise.all(names.map(async (name) => [name, await this.podOf(ref.namespace, name)] as const)),
    );
    const backends: Array<{ address: string; podOfNamespace: boolean; ready: boolean }> = [];
    for (const endpoint of endpoints) {
      const name = podOf(endpoint);
      const pod = name === undefined ? undefined : pods.get(name);
      const podIPs = new Set((pod?.status?.podIPs ?? []).map((p) => p.ip).concat(pod?.status?.podIP ?? []));
      const ready = endpoint.conditions?.ready !== false;
      for (const address of endpoint.addresses) backends.push({ address, podOfNamespace: podIPs.has(address), ready });
    }
    return { kind: 'service', clusterIPs, ports, backends };
  }

  private podOf(namespace: string, name: string): Promise<V1Pod | undefined> {
    kubeCall('pods.get');
    return orNotFound(this.core.readNamespacedPod({ namespace, name }));
  }

  private async refreshFleet(): Promise<void> {
    try {
      kubeCall('services.list');
      const services = await this.core.listNamespacedService({ namespace: this.fleetNamespace });
      kubeCall('pods.list');
      const pods = await this.core.listNamespacedPod({ namespace: this.fleetNamespace });
      const addresses = new Set<string>();
      for (const svc of services.items) {
        for (const ip of svc.spec?.clusterIPs ?? [svc.spec?.clusterIP ?? '']) addresses.add(ip.toLowerCase());
        for (const ip of svc.spec?.externalIPs ?? []) addresses.add(ip.toLowerCase());
        for (const ingress of svc.status?.loadBalancer?.ingress ?? []) if (ingress.ip) addresses.add(ingress.ip);
      }
      for (const pod of pods.items) {
        for (const ip of pod.status?.podIPs ?? []) addresses.add(ip.ip.toLowerCase());
        if (pod.status?.podIP) addresses.add(pod.status.podIP.toLowerCase());
      }
      addresses.delete('');
      addresses.delete('none');
      if (this.fleetFailing) this.log.info({ namespace: this.fleetNamespace }, 'the fleet namespace is listed again');
      this.fleetFailing = false;
      if (addresses.size === this.fleet.size && [...addresses].every((a) => this.fleet.has(a))) return;
      this.fleet = addresses;
      const list = [...addresses];
      for (const listener of this.listeners) listener(list);
    } catch (err) {
      if (!this.fleetFailing) {
        this.log.warn(
          { namespace: this.fleetNamespace, err: describeKubeError(err) },
          "cannot list the fleet namespace's Services and pods: the last list (and the fleet's interfaces) still refuse them",
        );
      }
      this.fleetFailing = true;
    }
  }
}
