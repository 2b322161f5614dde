import { lookup as dnsLookup } from 'node:dns/promises';
import { isIPv4, isIPv6, Socket } from 'node:net';
import {
  type DialAddress,
  type EndpointPolicy,
  type NamedEndpoint,
  NamespaceEndpointPolicy,
} from '../contract/endpoint-policy.js';
import { isDnsName, serviceAddress, serviceOfName } from '../contract/host-names.js';
import type { SiteConfig } from '../contract/site-config.js';
import { dialAddress, type HostAliases } from './host-aliases.js';
import { NO_CLUSTER_DIRECTORY, type ServiceDirectory } from './service-directory.js';

/** What the fleet dials for a pod with, as plain data (it crosses into tunnel threads). */
export interface DialRules {
  /** `Backhaul.HostAliases`: the site's own word for a name, before anything else is asked. */
  hostAliases: HostAliases;
  /** `Backhaul.EndpointPolicy`, checked again here on the address about to be dialled. */
  endpointPolicy: EndpointPolicy;
  clusterDomain: string;
}

/** The site's dial rules. */
export function dialRulesOf(config: SiteConfig): DialRules {
  return {
    hostAliases: config.Backhaul.HostAliases,
    endpointPolicy: config.Backhaul.EndpointPolicy,
    clusterDomain: config.Backhaul.ClusterDomain,
  };
}

/** An endpoint the policy refused at dial time (the socket is destroyed with it). */
export class EndpointRefusedError extends Error {
  override readonly name = 'EndpointRefusedError';
  readonly code = 'EENDPOINTREFUSED';
}

/** An ExternalName may name another: this many hops, then it is refused (a loop, or a maze). */
const MAX_EXTERNAL_NAMES = 4;

interface Target {
  address: string;
  port: number;
}

/**
 * Dials endpoints for the pods of one namespace. A Service is looked up in the Kubernetes API, never in
 * DNS: its ClusterIP (a headless one's ready endpoints) is what is dialled, and what stands behind it is
 * checked too (an endpoint written by hand to the fleet's Redis or another tenant's pod is refused). An
 * ExternalName is judged as the name it points to. A name outside the cluster is resolved as an absolute
 * name (no search path: `redis.backhaul` cannot become the fleet's own Service). Every address passes
 * the endpoint policy's one check before it is dialled.
 */
export class EndpointDialer {
  private readonly policy: NamespaceEndpointPolicy;
  private roundRobin = 0;

  constructor(
    private readonly rules: DialRules,
    readonly podNamespace: string,
    private readonly directory: ServiceDirectory = NO_CLUSTER_DIRECTORY,
  ) {
    this.policy = new NamespaceEndpointPolicy(rules.endpointPolicy, podNamespace, {
      clusterDomain: rules.clusterDomain,
      fleet: { has: (address) => directory.fleetAddresses().has(address) },
    });
  }

  /** A declared forward's endpoint (its name was checked when the pod was validated; it is again here). */
  dial(dialHost: string, port: number): Socket {
    return this.connecting(() => this.resolve(this.named(dialHost, port), 0));
  }

  /**
   * A SOCKS destination, checked by name here (nothing validated it before); a bare or short name is a
   * Service of the pod's namespace, dialled as such.
   */
  dialSocks(destination: string, port: number): Socket {
    const host = destination.toLowerCase();
    if (isIPv6(host) || host.startsWith('['))
      return failed(new EndpointRefusedError(`${host}: IPv6 literals are not endpoints`));
    if (!isIPv4(host) && !isDnsName(host)) {
      return failed(new EndpointRefusedError(`${JSON.stringify(destination.slice(0, 100))} is not a host name`));
    }
    const address = serviceAddress(host, this.podNamespace, this.rules.clusterDomain);
    return this.connecting(() =>
      this.resolve({ host: address.service ? address.dialHost : host, port, service: address.service }, 0),
    );
  }

  /** A name as dialled: a Service only in its full form (`name.ns.svc.<domain>`), as plans and CNAMEs write it. */
  private named(host: string, port: number): NamedEndpoint {
    const lower = host.toLowerCase().replace(/\.$/, '');
    return { host: lower, port, service: serviceOfName(lower, this.rules.clusterDomain) };
  }

  /** A socket at once (callers attach their handlers), connected once the target is known and allowed. */
  private connecting(find: () => Promise<Target>): Socket {
    const socket = new Socket({ allowHalfOpen: true });
    socket.setNoDelay(true);
    find().then(
      (target) => {
        if (!socket.destroyed) socket.connect({ host: target.address, port: target.port });
      },
      (err: Error) => socket.destroy(err),
    );
    return socket;
  }

  private async resolve(endpoint: NamedEndpoint, hops: number): Promise<Target> {
    const refuse = (dial?: DialAddress) => {
      const why = this.policy.refusal(endpoint, dial);
      if (why !== undefined) throw new EndpointRefusedError(why);
    };
    const alias = dialAddress(endpoint.host, this.rules.hostAliases);
    if (alias !== endpoint.host) {
      refuse({ address: alias, from: 'alias' });
      return { address: alias, port: endpoint.port };
    }
    if (isIPv4(endpoint.host)) {
      refuse({ address: endpoint.host, from: 'literal' });
      return { address: endpoint.host, port: endpoint.port };
    }
    refuse();
    if (endpoint.service) return this.resolveService(endpoint, hops);
    return this.resolveName(endpoint);
  }

  private async resolveService(endpoint: NamedEndpoint, hops: number): Promise<Target> {
    const service = endpoint.service;
    if (!service) throw new Error(`${endpoint.host} is not a Service`);
    const id = `${service.name}.${service.namespace}`;
    const answer = await this.directory.lookup(service);
    switch (answer.kind) {
      case 'missing':
        throw new Error(`Service ${id}: ${answer.why}`);
      case 'external-name': {
        const target = this.named(answer.target.replace(/\.$/, ''), endpoint.port);
        // A CNAME target is absolute: only the full Service form names a Service.
        const isService =
          target.service && answer.target.replace(/\.$/, '').endsWith(`.svc.${this.rules.clusterDomain}`);
        const next = { ...target, service: isService ? target.service : undefined };
        if (hops >= MAX_EXTERNAL_NAMES) {
          throw new EndpointRefusedError(`Service ${id} is an ExternalName chain longer than ${MAX_EXTERNAL_NAMES}`);
        }
        try {
          return await this.resolve(next, hops + 1);
        } catch (err) {
          if (err instanceof EndpointRefusedError) {
            throw new EndpointRefusedError(`Service ${id} is an ExternalName for ${next.host}: ${err.message}`);
          }
          throw err;
        }
      }
      case 'service': {
        const backends = answer.backends;
        const [clusterIP] = answer.clusterIPs;
        if (clusterIP !== undefined) {
          if (!answer.ports.includes(endpoint.port)) {
            throw new Error(
              `Service ${id} has no TCP port ${endpoint.port} (its ports: ${answer.ports.join(', ') || 'none'})`,
            );
          }
          const why = this.policy.refusal(endpoint, { address: clusterIP, from: 'service', backends });
          if (why !== undefined) throw new EndpointRefusedError(why);
          return { address: clusterIP, port: endpoint.port };
        }
        // Headless: a ready endpoint, on the port the pod named (a headless Service maps no port).
        const ready = backends.filter((b) => b.ready);
        if (ready.length === 0) throw new Error(`Service ${id} is headless and has no ready endpoint`);
        const chosen = ready[this.roundRobin++ % ready.length] ?? ready[0];
        if (!chosen) throw new Error(`Service ${id} has no ready endpoint`);
        const why = this.policy.refusal(endpoint, { address: chosen.address, from: 'service', backends });
        if (why !== undefined) throw new EndpointRefusedError(why);
        return { address: chosen.address, port: endpoint.port };
      }
    }
  }

  /** A name outside the cluster: DNS, as an absolute name, keeping the first address the policy admits. */
  private async resolveName(endpoint: NamedEndpoint): Promise<Target> {
    const answers = await dnsLookup(`${endpoint.host}.`, { all: true });
    let firstRefusal: string | undefined;
    for (const answer of answers) {
      const why = this.policy.refusal(endpoint, { address: answer.address, from: 'dns' });
      if (why === undefined) return { address: answer.address, port: endpoint.port };
      firstRefusal ??= why;
    }
    throw new EndpointRefusedError(firstRefusal ?? `${endpoint.host}: no address`);
  }
}

/** A socket that fails at once, like a connect error, so callers handle one path. */
function failed(err: Error): Socket {
  const socket = new Socket();
  process.nextTick(() => socket.destroy(err));
  return socket;
}
