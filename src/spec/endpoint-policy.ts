import { BlockList, isIPv4, isIPv6 } from 'node:net';
import { networkInterfaces } from 'node:os';
import { z } from 'zod';

/**
 * Which endpoints a pod may reach through its tunnel. The fleet dials for the pod from its own place in
 * the cluster, where the pod's NetworkPolicies do not apply: without a policy a pod could reach the
 * fleet's Redis, the fleet's loopback, cloud metadata or another tenant's database.
 *
 * By default a pod reaches the Services of its own namespace and the Kubernetes API; the site allows
 * more, for every namespace or per namespace. Loopback, link-local and the fleet's own namespace are
 * refused unless a rule names them itself (a CIDR inside 127.0.0.0/8, `Namespaces: [backhaul]`): a
 * broad rule such as 0.0.0.0/0 or `Hosts: ["*"]` never opens them.
 *
 * Checked twice: on the names, when the pod is validated (webhook and control plane), and at dial time
 * on the resolved address (a name that resolves to loopback or metadata is refused then).
 */

const NAMESPACE = /^(?=.{1,63}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?$/;
const SERVICE = /^(?=.{1,63}\.)[a-z0-9]([-a-z0-9]*[a-z0-9])?\.[a-z0-9]([-a-z0-9]*[a-z0-9])?$/;
const NAMESPACE_OR_ANY = /^(\*|(?=.{1,63}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?)$/;
const HOST_PATTERN = /^\*$|^(\*\.)?(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;
const CIDR = /^(\d{1,3}(?:\.\d{1,3}){3})\/(\d{1,2})$/;

function validCidr(text: string): boolean {
  const m = CIDR.exec(text);
  return !!m && isIPv4(m[1] ?? '') && Number(m[2]) <= 32;
}

export const endpointRulesSchema = z.strictObject({
  /** Services of these namespaces; `*`: of every namespace (the fleet's own still only by name). */
  Namespaces: z
    .array(z.string().regex(NAMESPACE_OR_ANY, 'expected a namespace name (DNS-1123 label) or *'))
    .default([]),
  /** These Services, as `name.namespace`. */
  Services: z.array(z.string().regex(SERVICE, 'expected a Service as name.namespace, e.g. minio.storage')).default([]),
  /** IPv4 ranges, e.g. 10.20.0.0/16 (an address as x.y.z.w/32). */
  CIDRs: z.array(z.string().refine(validCidr, 'expected an IPv4 CIDR such as 10.20.0.0/16')).default([]),
  /** Host names outside the cluster, exact or `*.example.org` (any name below it); `*`: any (never localhost). */
  Hosts: z
    .array(z.string().regex(HOST_PATTERN, 'expected a host name, *.domain for every name below it, or *'))
    .default([]),
});

export const endpointPolicySchema = z.strictObject({
  /** Services of the pod's own namespace. */
  OwnNamespace: z.boolean().default(true),
  /** The Kubernetes API (`kubernetes.default`). */
  KubernetesAPI: z.boolean().default(true),
  /** Allowed to the pods of every namespace. */
  Allow: endpointRulesSchema.prefault({}),
  /** Allowed to the pods of one namespace, in addition to Allow. */
  AllowByNamespace: z
    .record(z.string().regex(NAMESPACE, 'expected a namespace name (DNS-1123 label)'), endpointRulesSchema)
    .default({}),
  /** The fleet's own namespace: its Services (Redis, the webhook) are refused unless a rule names them. */
  FleetNamespace: z.string().regex(NAMESPACE, 'expected a namespace name (DNS-1123 label)').default('backhaul'),
});

export type EndpointPolicy = z.output<typeof endpointPolicySchema>;
type EndpointRules = z.output<typeof endpointRulesSchema>;

function parseCidr(text: string): { address: string; prefix: number } {
  const m = CIDR.exec(text);
  return { address: m?.[1] ?? '0.0.0.0', prefix: Number(m?.[2] ?? 32) };
}

function blockOf(cidrs: readonly string[]): BlockList {
  const list = new BlockList();
  for (const cidr of cidrs) {
    const { address, prefix } = parseCidr(cidr);
    list.addSubnet(address, prefix, 'ipv4');
  }
  return list;
}

/** Ranges that are never reached through a broad rule: only a rule inside them opens them. */
const PROTECTED: ReadonlyArray<{ cidr: string; what: string; block: BlockList }> = [
  { cidr: '127.0.0.0/8', what: 'loopback (the fleet itself)' },
  { cidr: '169.254.0.0/16', what: 'link-local (cloud metadata)' },
  { cidr: '0.0.0.0/8', what: '"this network"' },
].map((p) => ({ ...p, block: blockOf([p.cidr]) }));

/** IPv6 ranges refused at dial time (rules are IPv4 only, so nothing opens them). */
const PROTECTED6: ReadonlyArray<{ what: string; block: BlockList }> = (
  [
    ['::1', 128, 'loopback (the fleet itself)'],
    ['fe80::', 10, 'link-local'],
    ['fd00:ec2::254', 128, 'cloud metadata'],
    ['::', 128, 'unspecified'],
  ] as const
).map(([address, prefix, what]) => {
  const block = new BlockList();
  block.addSubnet(address, prefix, 'ipv6');
  return { what, block };
});

let ownAddresses: readonly string[] | undefined;

/**
 * The fleet's own addresses (its pod IP): a pod must not dial the fleet's own listeners through them.
 * Read once: every validation and every dial asks, and a pod's addresses do not change.
 */
export function fleetAddresses(): readonly string[] {
  ownAddresses ??= Object.values(networkInterfaces())
    .flatMap((list) => list ?? [])
    .filter((i) => !i.internal)
    .map((i) => i.address);
  return ownAddresses;
}

/** Is the range `inner` inside `outer`? */
function cidrInside(inner: string, outer: string): boolean {
  const i = parseCidr(inner);
  const o = parseCidr(outer);
  return i.prefix >= o.prefix && blockOf([outer]).check(i.address, 'ipv4');
}

/** Where a refusal's rule is: the key an admin would change. */
const POLICY_KEY = 'Backhaul.EndpointPolicy';

/** An endpoint as the pod named it. */
export interface NamedEndpoint {
  /** The host as written (lower case). */
  host: string;
  /** The Service it names, when it names one. */
  service: { name: string; namespace: string } | undefined;
  port: number;
}

/**
 * The policy for the pods of one namespace. `refusal*` return undefined when allowed, else why not,
 * naming the rule that would allow it.
 */
export class NamespaceEndpointPolicy {
  private readonly rules: EndpointRules;
  private readonly cidrs: BlockList;
  private readonly protectedOpen: ReadonlyArray<{ cidr: string; open: BlockList }>;

  constructor(
    private readonly policy: EndpointPolicy,
    readonly podNamespace: string,
    /** Refused unless a rule names each as `<address>/32`. */
    private readonly ownAddresses: readonly string[] = fleetAddresses(),
  ) {
    const extra = policy.AllowByNamespace[podNamespace];
    this.rules = {
      Namespaces: [...policy.Allow.Namespaces, ...(extra?.Namespaces ?? [])],
      Services: [...policy.Allow.Services, ...(extra?.Services ?? [])],
      CIDRs: [...policy.Allow.CIDRs, ...(extra?.CIDRs ?? [])],
      Hosts: [...policy.Allow.Hosts, ...(extra?.Hosts ?? [])],
    };
    this.cidrs = blockOf(this.rules.CIDRs);
    // For each protected range, only the allowed CIDRs inside it open (parts of) it.
    this.protectedOpen = PROTECTED.map((p) => ({
      cidr: p.cidr,
      open: blockOf(this.rules.CIDRs.filter((c) => cidrInside(c, p.cidr))),
    }));
  }

  /** The names check: at validation, before anything is dialled. */
  refusalOfName(endpoint: NamedEndpoint): string | undefined {
    const { host, service } = endpoint;
    if (isIPv4(host)) return this.refusalOfAddress(host);
    if (service) return this.refusalOfService(service);
    if (host === 'localhost' || host.endsWith('.localhost')) {
      return `${host} is the fleet's own loopback; only a CIDR rule inside 127.0.0.0/8 in ${POLICY_KEY} opens it`;
    }
    if (this.rules.Hosts.some((pattern) => hostMatches(pattern, host))) return undefined;
    return `host ${host} is outside the cluster and not allowed: ${POLICY_KEY}.Allow.Hosts (or AllowByNamespace.${this.podNamespace}.Hosts) would list it`;
  }

  private refusalOfService(service: { name: string; namespace: string }): string | undefined {
    const id = `${service.name}.${service.namespace}`;
    const named = this.rules.Services.includes(id) || this.rules.Namespaces.includes(service.namespace);
    if (named) return undefined;
    if (service.namespace === this.policy.FleetNamespace) {
      return `Service ${id} is in the fleet's own namespace (${this.policy.FleetNamespace}); only a rule naming it (${POLICY_KEY}.Allow.Services: [${id}]) opens it`;
    }
    if (this.policy.KubernetesAPI && service.namespace === 'default' && service.name === 'kubernetes') return undefined;
    if (this.policy.OwnNamespace && service.namespace === this.podNamespace) return undefined;
    if (this.rules.Namespaces.includes('*')) return undefined;
    return `Service ${id} is in namespace ${service.namespace}, not the pod's (${this.podNamespace}); ${POLICY_KEY}.AllowByNamespace.${this.podNamespace}.Namespaces (or .Services) would allow it`;
  }

  /** The address check: at dial time, on what the name resolved to (and on IPv4 literals at validation). */
  refusalOfAddress(address: string, name?: string): string | undefined {
    const what = name && name !== address ? `${name} (${address})` : address;
    const mapped = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/i.exec(address)?.[1];
    if (mapped) return this.refusalOfAddress(mapped, name ?? address);
    if (isIPv6(address)) {
      for (const p of PROTECTED6) {
        if (p.block.check(address, 'ipv6')) return `${what} is ${p.what}, never reached through a tunnel`;
      }
      return name === undefined ? `${what}: IPv6 literals are not endpoints` : undefined;
    }
    if (!isIPv4(address)) return `${what} is not an IP address`;
    if (this.ownAddresses.includes(address) && !this.rules.CIDRs.includes(`${address}/32`)) {
      return `${what} is the fleet's own address; only a CIDR rule ${address}/32 in ${POLICY_KEY} opens it`;
    }
    for (const [i, p] of PROTECTED.entries()) {
      if (!p.block.check(address, 'ipv4')) continue;
      if (this.protectedOpen[i]?.open.check(address, 'ipv4')) return undefined;
      return `${what} is ${p.what}, never reached unless a CIDR rule inside ${p.cidr} in ${POLICY_KEY} names it`;
    }
    if (name === undefined && !this.cidrs.check(address, 'ipv4')) {
      return `address ${address} is not in an allowed range: ${POLICY_KEY}.Allow.CIDRs (or AllowByNamespace.${this.podNamespace}.CIDRs) would list it`;
    }
    return undefined;
  }
}

function hostMatches(pattern: string, host: string): boolean {
  if (pattern === '*') return true;
  if (pattern.startsWith('*.')) return host.endsWith(pattern.slice(1));
  return pattern === host;
}

/** The default policy: own namespace and the Kubernetes API. */
export const DEFAULT_ENDPOINT_POLICY: EndpointPolicy = endpointPolicySchema.parse({});
