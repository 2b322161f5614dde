import { isIPv4, isIPv6 } from 'node:net';
import { networkInterfaces } from 'node:os';
import { z } from 'zod';
import { blockOf, cidrInside, embeddedV4, PROTECTED_V4, protectedV6, validCidr } from './ip-ranges.js';

/**
 * Which endpoints a pod may reach through its tunnel. The fleet dials for the pod from its own place in
 * the cluster, where the pod's NetworkPolicies do not apply: without a policy a pod could reach the
 * fleet's Redis, the fleet's loopback, cloud metadata or another tenant's database.
 *
 * By default a pod reaches the Services of its own namespace and the Kubernetes API; the site allows
 * more, for every namespace or per namespace. Loopback, link-local, the fleet's own addresses and its
 * namespace are refused unless a rule names them itself (a CIDR inside 127.0.0.0/8, the address as /32,
 * `Services: [x.backhaul]`): a broad rule such as 0.0.0.0/0 or `Hosts: ["*"]` never opens them.
 *
 * One check, `refusal`, for the three places that ask: admission and validation (on the names the pod
 * wrote) and every dial (on the address about to be dialled, and where it came from: the Service's own
 * addresses from the Kubernetes API, a DNS answer for a name outside the cluster, a host alias).
 */

const NAMESPACE = /^(?=.{1,63}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?$/;
const SERVICE = /^(?=.{1,63}\.)[a-z0-9]([-a-z0-9]*[a-z0-9])?\.[a-z0-9]([-a-z0-9]*[a-z0-9])?$/;
const NAMESPACE_OR_ANY = /^(\*|(?=.{1,63}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?)$/;
const HOST_PATTERN = /^\*$|^(\*\.)?(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;

export const endpointRulesSchema = z.strictObject({
  Namespaces: z
    .array(z.string().regex(NAMESPACE_OR_ANY, 'expected a namespace name (DNS-1123 label) or *'))
    .default([])
    .describe("Namespaces whose Services pods may reach; * is every namespace (but never the fleet's)."),
  Services: z
    .array(z.string().regex(SERVICE, 'expected a Service as name.namespace, e.g. minio.storage'))
    .default([])
    .describe('Services as name.namespace.'),
  CIDRs: z
    .array(z.string().refine(validCidr, 'expected an IPv4 CIDR such as 10.20.0.0/16'))
    .default([])
    .describe('IPv4 ranges, e.g. 10.20.0.0/16.'),
  Hosts: z
    .array(z.string().regex(HOST_PATTERN, 'expected a host name, *.domain for every name below it, or *'))
    .default([])
    .describe('Names outside the cluster: exact, *.example.org, or *.'),
});

export const endpointPolicySchema = z.strictObject({
  OwnNamespace: z.boolean().default(true).describe('A pod may reach the Services of its own namespace.'),
  KubernetesAPI: z.boolean().default(true).describe('A pod may reach kubernetes.default.'),
  Allow: endpointRulesSchema.prefault({}).describe('More for the pods of every namespace.'),
  AllowByNamespace: z
    .record(z.string().regex(NAMESPACE, 'expected a namespace name (DNS-1123 label)'), endpointRulesSchema)
    .default({})
    .describe('The same rules for the pods of one namespace, e.g. { team-a: { Namespaces: [shared-data] } }.'),
  FleetNamespace: z
    .string()
    .regex(NAMESPACE, 'expected a namespace name (DNS-1123 label)')
    .default('backhaul')
    .describe(
      "The fleet's own namespace (its Redis, its webhook): refused unless a rule names it; * does not open it, and its Services' and pods' addresses are refused at every dial unless a CIDR rule names the exact address.",
    ),
  ClusterCIDRs: z
    .array(z.string().refine(validCidr, 'expected an IPv4 CIDR such as 10.96.0.0/12'))
    .default([])
    .describe(
      "The cluster's own ranges (Service and pod CIDRs): a name outside the cluster whose DNS answer falls in them is refused unless a CIDR rule allows it.",
    ),
});

export type EndpointPolicy = z.output<typeof endpointPolicySchema>;
type EndpointRules = z.output<typeof endpointRulesSchema>;

/** Where a refusal's rule is: the key an admin would change. */
const POLICY_KEY = 'Backhaul.EndpointPolicy';

export interface ServiceRef {
  name: string;
  namespace: string;
}

/** An endpoint as the pod named it. */
export interface NamedEndpoint {
  /** The host as written (lower case). */
  host: string;
  /** The Service it names, when it names one. */
  service: ServiceRef | undefined;
  port: number;
}

/** The fleet's own addresses as the dialling side knows them: its interfaces, its namespace's Services and pods. */
export interface FleetAddresses {
  has(address: string): boolean;
}

/** An address behind a Service: an endpoint of its EndpointSlices. */
export interface ServiceBackend {
  address: string;
  /** The API shows a pod of the Service's own namespace with this address (not an endpoint written by hand). */
  podOfNamespace: boolean;
}

/** An address about to be dialled for an endpoint, and where it came from. */
export type DialAddress =
  /** The IPv4 address the pod wrote. */
  | { address: string; from: 'literal' }
  /** `Backhaul.HostAliases`: the site's own word for the name. */
  | { address: string; from: 'alias' }
  /** A DNS answer for a name outside the cluster. */
  | { address: string; from: 'dns' }
  /** The Service's ClusterIP or ready endpoint, from the Kubernetes API, with everything behind it. */
  | { address: string; from: 'service'; backends: readonly ServiceBackend[] };

let ownInterfaces: ReadonlySet<string> | undefined;

/**
 * The fleet's own interface addresses, IPv4 and IPv6 (its pod IPs): a pod must not dial the fleet's own
 * listeners through them. Read once: a pod's addresses do not change.
 */
export function interfaceAddresses(): ReadonlySet<string> {
  ownInterfaces ??= new Set(
    Object.values(networkInterfaces())
      .flatMap((list) => list ?? [])
      .filter((i) => !i.internal)
      .map((i) => i.address.replace(/%.*$/, '').toLowerCase()),
  );
  return ownInterfaces;
}

export interface PolicyContext {
  clusterDomain: string;
  /** The fleet's addresses beyond its interfaces (its namespace's, from the API); none at admission. */
  fleet?: FleetAddresses;
}

/**
 * The policy for the pods of one namespace. `refusal` returns undefined when allowed, else why not,
 * naming the rule that would allow it.
 */
export class NamespaceEndpointPolicy {
  private readonly rules: EndpointRules;
  private readonly cidrs;
  private readonly clusterCidrs;
  private readonly protectedOpen: ReadonlyArray<{
    cidr: string;
    what: string;
    block: ReturnType<typeof blockOf>;
    open: ReturnType<typeof blockOf>;
  }>;
  private readonly fleet: FleetAddresses;
  /** A CIDR rule inside 127.0.0.0/8 exists: `localhost` may be named (its address is still checked). */
  private readonly loopbackNamed: boolean;
  private readonly clusterSuffix: string;

  constructor(
    private readonly policy: EndpointPolicy,
    readonly podNamespace: string,
    context: PolicyContext = { clusterDomain: 'cluster.local' },
  ) {
    const extra = policy.AllowByNamespace[podNamespace];
    this.rules = {
      Namespaces: [...policy.Allow.Namespaces, ...(extra?.Namespaces ?? [])],
      Services: [...policy.Allow.Services, ...(extra?.Services ?? [])],
      CIDRs: [...policy.Allow.CIDRs, ...(extra?.CIDRs ?? [])],
      Hosts: [...policy.Allow.Hosts, ...(extra?.Hosts ?? [])],
    };
    this.cidrs = blockOf(this.rules.CIDRs);
    this.clusterCidrs = blockOf(policy.ClusterCIDRs);
    // For each protected range, only the allowed CIDRs inside it open (parts of) it.
    this.protectedOpen = PROTECTED_V4.map((p) => ({
      ...p,
      block: blockOf([p.cidr]),
      open: blockOf(this.rules.CIDRs.filter((c) => cidrInside(c, p.cidr))),
    }));
    const own = interfaceAddresses();
    const more = context.fleet;
    this.fleet = { has: (address) => own.has(address) || more?.has(address) === true };
    this.loopbackNamed = this.rules.CIDRs.some((c) => cidrInside(c, '127.0.0.0/8'));
    this.clusterSuffix = `.${context.clusterDomain}`;
  }

  /**
   * The one check. Without `dial`: the endpoint as named (admission, validation). With `dial`: the
   * address about to be dialled for it, judged with the name (every connection, SOCKS included).
   */
  refusal(endpoint: NamedEndpoint, dial?: DialAddress): string | undefined {
    const { host } = endpoint;
    if (isIPv4(host)) return this.addressRefusal(endpoint, dial ?? { address: host, from: 'literal' });
    const byName = this.nameRefusal(endpoint);
    if (byName !== undefined || dial === undefined) return byName;
    return this.addressRefusal(endpoint, dial);
  }

  private nameRefusal(endpoint: NamedEndpoint): string | undefined {
    const { host, service } = endpoint;
    if (service) return this.serviceRefusal(service);
    if (host === 'localhost' || host.endsWith('.localhost')) {
      if (this.loopbackNamed) return undefined;
      return `${host} is the fleet's own loopback; only a CIDR rule inside 127.0.0.0/8 in ${POLICY_KEY} opens it`;
    }
    // Pod, endpoint and headless-member names live under the cluster domain too; only Services are endpoints.
    if (host.endsWith(this.clusterSuffix) || host.endsWith('.svc')) {
      return `${host} is a name inside the cluster but not a Service's (name.namespace.svc${this.clusterSuffix}): only Services are endpoints in the cluster`;
    }
    if (this.rules.Hosts.some((pattern) => hostMatches(pattern, host))) return undefined;
    return `host ${host} is outside the cluster and not allowed: ${POLICY_KEY}.Allow.Hosts (or AllowByNamespace.${this.podNamespace}.Hosts) would list it`;
  }

  private serviceRefusal(service: ServiceRef): string | undefined {
    const id = `${service.name}.${service.namespace}`;
    if (this.namesService(service)) return undefined;
    if (service.namespace === this.policy.FleetNamespace) {
      return `Service ${id} is in the fleet's own namespace (${this.policy.FleetNamespace}); only a rule naming it (${POLICY_KEY}.Allow.Services: [${id}]) opens it`;
    }
    if (this.policy.KubernetesAPI && service.namespace === 'default' && service.name === 'kubernetes') return undefined;
    if (this.policy.OwnNamespace && service.namespace === this.podNamespace) return undefined;
    if (this.rules.Namespaces.includes('*')) return undefined;
    return `Service ${id} is in namespace ${service.namespace}, not the pod's (${this.podNamespace}); ${POLICY_KEY}.AllowByNamespace.${this.podNamespace}.Namespaces (or .Services) would allow it`;
  }

  /** A rule that names this Service or its namespace itself (not `*`): it opens even the fleet's own. */
  private namesService(service: ServiceRef): boolean {
    return (
      this.rules.Services.includes(`${service.name}.${service.namespace}`) ||
      this.rules.Namespaces.includes(service.namespace)
    );
  }

  private addressRefusal(endpoint: NamedEndpoint, dial: DialAddress): string | undefined {
    const label = (address: string) => (endpoint.host === address ? address : `${endpoint.host} (${address})`);
    // A Service a rule names itself may be the fleet's own (Services: [x.backhaul]).
    const fleetNamed = dial.from === 'service' && endpoint.service !== undefined && this.namesService(endpoint.service);
    const guard = (address: string) => this.guardRefusal(address, label(address), fleetNamed);
    const first = guard(dial.address);
    if (first !== undefined) return first;
    const v4 = normalized(dial.address);
    switch (dial.from) {
      case 'literal':
        if (!isIPv4(v4) || !this.cidrs.check(v4, 'ipv4')) {
          return `address ${dial.address} is not in an allowed range: ${POLICY_KEY}.Allow.CIDRs (or AllowByNamespace.${this.podNamespace}.CIDRs) would list it`;
        }
        return undefined;
      case 'dns':
        if (isIPv4(v4) && this.clusterCidrs.check(v4, 'ipv4') && !this.cidrs.check(v4, 'ipv4')) {
          return `${label(dial.address)} is inside the cluster (${POLICY_KEY}.ClusterCIDRs), though ${endpoint.host} is a name outside it; only a CIDR rule opens it`;
        }
        return undefined;
      case 'alias':
        return undefined;
      case 'service': {
        const id = endpoint.service ? `${endpoint.service.name}.${endpoint.service.namespace}` : endpoint.host;
        for (const backend of dial.backends) {
          const behind = this.guardRefusal(backend.address, backend.address, fleetNamed);
          if (behind !== undefined) return `an endpoint of Service ${id}: ${behind}`;
          const b4 = normalized(backend.address);
          if (!backend.podOfNamespace && !(isIPv4(b4) && this.cidrs.check(b4, 'ipv4'))) {
            return `Service ${id} sends its connections to ${backend.address}, which is no pod of namespace ${endpoint.service?.namespace ?? '?'} (an endpoint written by hand) and not in an allowed range: ${POLICY_KEY}.Allow.CIDRs (or AllowByNamespace.${this.podNamespace}.CIDRs) would list it`;
          }
        }
        return undefined;
      }
    }
  }

  /** What no broad rule opens: protected ranges, the fleet's own addresses, IPv6 that hides an IPv4 one. */
  private guardRefusal(address: string, what: string, fleetNamed: boolean): string | undefined {
    if (!isIPv4(address) && !isIPv6(address)) return `${what} is not an IP address`;
    const lower = address.toLowerCase();
    if (isIPv6(lower)) {
      const inner = embeddedV4(lower);
      if (inner) {
        const refused = this.guardRefusal(inner.v4, `${what}, ${inner.how} for ${inner.v4},`, fleetNamed);
        if (refused !== undefined) return refused;
      } else {
        const range = protectedV6(lower);
        if (range) return `${what} is ${range}, never reached through a tunnel`;
      }
      if (!fleetNamed && this.fleet.has(lower)) {
        return `${what} is the fleet's own address (IPv6), never reached through a tunnel`;
      }
      return undefined;
    }
    if (!fleetNamed && this.fleet.has(address) && !this.rules.CIDRs.includes(`${address}/32`)) {
      return `${what} is the fleet's own address (its pods, its namespace's Services); only a CIDR rule ${address}/32 in ${POLICY_KEY} opens it`;
    }
    for (const p of this.protectedOpen) {
      if (!p.block.check(address, 'ipv4')) continue;
      if (p.open.check(address, 'ipv4')) return undefined;
      return `${what} is ${p.what}, never reached unless a CIDR rule inside ${p.cidr} in ${POLICY_KEY} names it`;
    }
    return undefined;
  }
}

/** The IPv4 address an IPv6 one reaches (mapped, NAT64, 6to4), else the address itself. */
function normalized(address: string): string {
  return isIPv6(address) ? (embeddedV4(address)?.v4 ?? address) : address;
}

function hostMatches(pattern: string, host: string): boolean {
  if (pattern === '*') return true;
  if (pattern.startsWith('*.')) return host.endsWith(pattern.slice(1));
  return pattern === host;
}

/** The default policy: own namespace and the Kubernetes API. */
export const DEFAULT_ENDPOINT_POLICY: EndpointPolicy = endpointPolicySchema.parse({});
