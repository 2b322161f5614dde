import { BlockList, isIP } from 'node:net';
import type {
  V1LabelSelector,
  V1NetworkPolicy,
  V1NetworkPolicyPeer,
  V1NetworkPolicyPort,
} from '@kubernetes/client-node';

/**
 * Would the cluster's NetworkPolicies let the offloaded pod open this TCP connection? The fleet dials
 * for the pod from its own namespace, where the pod's policies do not apply, so the fleet evaluates them
 * itself (networking.k8s.io/v1 semantics) on objects the caller read from the API. Pure: no I/O.
 */

export interface PolicySource {
  namespace: string;
  labels: Readonly<Record<string, string>>;
}

export interface DestinationPod {
  namespace: string;
  name: string;
  labels: Readonly<Record<string, string>>;
  containerPorts: readonly { name?: string; containerPort: number; protocol?: string }[];
}

/** One address the connection may end at (an endpoint of a Service, or a plain IP). */
export interface PolicyDestination {
  ip: string;
  port: number;
  protocol: 'TCP';
  pod?: DestinationPod;
  /** how to name it in messages, e.g. "postgres.tenant-b (pod postgres-0, 10.0.0.5:5432)" */
  label: string;
}

export interface PolicyWorld {
  /** NetworkPolicies by namespace (only the namespaces involved need to be present; missing = none). */
  policies: ReadonlyMap<string, readonly V1NetworkPolicy[]>;
  /**
   * Labels of namespaces, by name (for namespaceSelector); a missing namespace has no labels but
   * `kubernetes.io/metadata.name` is always implied as its name, as the API server sets it.
   */
  namespaceLabels: ReadonlyMap<string, Readonly<Record<string, string>>>;
}

export type PolicyVerdict =
  | { allowed: true }
  | {
      allowed: false;
      direction: 'egress' | 'ingress';
      /** "namespace/name" of every policy that selects the pod for that direction. */
      policies: string[];
      destination: PolicyDestination;
      message: string;
    };

type Labels = Readonly<Record<string, string>>;

/**
 * metav1 label selector semantics. An absent selector matches nothing (as LabelSelectorAsSelector does);
 * call sites where absence means "any" say so themselves.
 */
export function matchesLabelSelector(selector: V1LabelSelector | undefined, labels: Labels): boolean {
  if (!selector) return false;
  // Own keys only: a label named like an Object.prototype member must not be found on the prototype.
  const has = (key: string): boolean => Object.hasOwn(labels, key);
  for (const [key, value] of Object.entries(selector.matchLabels ?? {})) {
    if (!has(key) || labels[key] !== value) return false;
  }
  return (selector.matchExpressions ?? []).every(({ key, operator, values = [] }) => {
    switch (operator) {
      case 'In':
        return has(key) && values.includes(labels[key]!);
      case 'NotIn':
        return !has(key) || !values.includes(labels[key]!);
      case 'Exists':
        return has(key);
      case 'DoesNotExist':
        return !has(key);
      default:
        // An operator this code does not know could mean anything: refusing to match is the safe reading.
        return false;
    }
  });
}

/** The API server's defaulting; it applies it only when the list is empty, so an empty list is "unset". */
function policyTypes(policy: V1NetworkPolicy): readonly string[] {
  const spec = policy.spec;
  if (spec?.policyTypes?.length) return spec.policyTypes;
  return spec?.egress?.length ? ['Ingress', 'Egress'] : ['Ingress'];
}

type Selecting = { id: string; namespace: string; policy: V1NetworkPolicy };

function selectingPolicies(world: PolicyWorld, namespace: string, labels: Labels, type: string): Selecting[] {
  return (world.policies.get(namespace) ?? [])
    .filter(
      // podSelector is required by the API; a serializer may drop an empty `{}`, so absent reads as "all pods".
      (policy) => policyTypes(policy).includes(type) && matchesLabelSelector(policy.spec?.podSelector ?? {}, labels),
    )
    .map((policy) => ({ id: `${namespace}/${policy.metadata?.name ?? '(unnamed)'}`, namespace, policy }));
}

function namespaceLabelsOf(world: PolicyWorld, namespace: string): Labels {
  return { ...world.namespaceLabels.get(namespace), 'kubernetes.io/metadata.name': namespace };
}

/** A selector peer (podSelector and/or namespaceSelector) against a pod, for a policy in `policyNamespace`. */
function peerSelectsPod(
  peer: V1NetworkPolicyPeer,
  policyNamespace: string,
  pod: { namespace: string; labels: Labels },
  world: PolicyWorld,
): boolean {
  // A peer with neither selector is an ipBlock, or invalid (the API rejects `{}`): it selects no pod.
  if (!peer.podSelector && !peer.namespaceSelector) return false;
  const inNamespace = peer.namespaceSelector
    ? matchesLabelSelector(peer.namespaceSelector, namespaceLabelsOf(world, pod.namespace))
    : pod.namespace === policyNamespace;
  return inNamespace && (!peer.podSelector || matchesLabelSelector(peer.podSelector, pod.labels));
}

/** Inside `cidr`, same address family only (BlockList alone would also map IPv4 into ::ffff:0:0/96). */
function inCidr(cidr: string, ip: string): boolean {
  const [address = '', bits, ...extra] = cidr.split('/');
  const version = isIP(ip);
  const max = version === 4 ? 32 : 128;
  if (version === 0 || isIP(address) !== version || extra.length) return false;
  if (bits !== undefined && (!/^\d{1,3}$/.test(bits) || Number(bits) > max)) return false;
  const block = new BlockList();
  const family = version === 4 ? 'ipv4' : 'ipv6';
  block.addSubnet(address, bits === undefined ? max : Number(bits), family);
  return block.check(ip, family);
}

function egressPeerMatches(
  peer: V1NetworkPolicyPeer,
  policyNamespace: string,
  dest: PolicyDestination,
  world: PolicyWorld,
): boolean {
  // Whether an ipBlock also covers pod IPs differs between implementations (it is meant for addresses
  // outside the cluster, yet Calico and others match pod IPs too). Matching the IP of pod destinations as
  // well errs towards allowing: a false refusal would break a connection the cluster may well permit.
  if (peer.ipBlock) {
    const { cidr, except = [] } = peer.ipBlock;
    return inCidr(cidr, dest.ip) && !except.some((range) => inCidr(range, dest.ip));
  }
  return dest.pod !== undefined && peerSelectsPod(peer, policyNamespace, dest.pod, world);
}

function ingressPeerMatches(
  peer: V1NetworkPolicyPeer,
  policyNamespace: string,
  source: PolicySource,
  world: PolicyWorld,
): boolean {
  // The offloaded pod runs on the HPC site and its traffic arrives from the fleet's IP: it has no cluster
  // address an ipBlock could have been written for, so only selector peers can admit it.
  return !peer.ipBlock && peerSelectsPod(peer, policyNamespace, source, world);
}

function portMatches(entry: V1NetworkPolicyPort, dest: PolicyDestination): boolean {
  if ((entry.protocol ?? 'TCP') !== 'TCP') return false;
  if (entry.port == null) return true;
  if (typeof entry.port === 'number') {
    return entry.endPort == null ? dest.port === entry.port : dest.port >= entry.port && dest.port <= entry.endPort;
  }
  // A named port resolves on the destination pod (for ingress the selected pod is that same pod); a plain
  // IP has no container ports to resolve it against.
  const name = entry.port;
  return (
    dest.pod?.containerPorts.some(
      (c) => c.name === name && (c.protocol ?? 'TCP') === 'TCP' && c.containerPort === dest.port,
    ) ?? false
  );
}

/** Absent or empty lists in a rule mean "any". */
function anyOrSome<T>(list: readonly T[] | undefined, test: (item: T) => boolean): boolean {
  return !list?.length || list.some(test);
}

type Rule = { peers: V1NetworkPolicyPeer[] | undefined; ports: V1NetworkPolicyPort[] | undefined };

function rulesOf(policy: V1NetworkPolicy, direction: 'egress' | 'ingress'): Rule[] {
  if (direction === 'egress') return (policy.spec?.egress ?? []).map((r) => ({ peers: r.to, ports: r.ports }));
  // client-node's deserializer renames `from` to `_from`; objects parsed as plain JSON keep `from`.
  // Reading only one would take a rule's peers as absent, i.e. as "any source".
  return (policy.spec?.ingress ?? []).map((r) => ({
    peers: r._from ?? (r as { from?: V1NetworkPolicyPeer[] }).from,
    ports: r.ports,
  }));
}

/** Sorted `key=value` pairs, so that a message is the same whatever order the labels came in. */
function labelText(labels: Labels): string | undefined {
  const pairs = Object.entries(labels)
    .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))
    .map(([key, value]) => `${key}=${value}`);
  return pairs.length ? pairs.join(',') : undefined;
}

/** The refusal when no rule of the selecting policies admits the connection; undefined when one does. */
function refusal(
  direction: 'egress' | 'ingress',
  selecting: readonly Selecting[],
  dest: PolicyDestination,
  peerMatches: (peer: V1NetworkPolicyPeer, policyNamespace: string) => boolean,
  texts: { whom: string; what: string },
): PolicyVerdict | undefined {
  const admitted = selecting.some(({ policy, namespace }) =>
    rulesOf(policy, direction).some(
      (rule) =>
        anyOrSome(rule.peers, (peer) => peerMatches(peer, namespace)) &&
        anyOrSome(rule.ports, (entry) => portMatches(entry, dest)),
    ),
  );
  if (!selecting.length || admitted) return undefined;
  const policies = selecting.map((s) => s.id);
  const [subject, its] =
    policies.length === 1
      ? [`NetworkPolicy ${policies[0]} selects`, 'its']
      : [`NetworkPolicies ${policies.join(', ')} select`, 'their'];
  const message = `${subject} ${texts.whom} for ${direction}, and none of ${its} ${direction} rules allows TCP port ${dest.port} ${texts.what}`;
  return { allowed: false, direction, policies, destination: dest, message };
}

/**
 * Egress of the source, then ingress of each destination pod. Every endpoint is checked because the
 * Service may send the connection to any of them; the first refusal is the verdict.
 */
export function evaluateNetworkPolicies(
  source: PolicySource,
  destinations: readonly PolicyDestination[],
  world: PolicyWorld,
): PolicyVerdict {
  const egress = selectingPolicies(world, source.namespace, source.labels, 'Egress');
  const listed = labelText(source.labels);
  for (const dest of destinations) {
    const egressRefusal = refusal('egress', egress, dest, (peer, ns) => egressPeerMatches(peer, ns, dest, world), {
      whom: `pods with the labels of this pod ${listed ? `(${listed})` : '(no labels)'}`,
      what: `to ${dest.label}`,
    });
    if (egressRefusal) return egressRefusal;
    // A plain IP is no pod: no ingress policy can select it.
    if (!dest.pod) continue;
    const ingress = selectingPolicies(world, dest.pod.namespace, dest.pod.labels, 'Ingress');
    const ingressRefusal = refusal(
      'ingress',
      ingress,
      dest,
      (peer, ns) => ingressPeerMatches(peer, ns, source, world),
      {
        whom: `pod ${dest.pod.namespace}/${dest.pod.name}`,
        what: `from a pod of namespace ${source.namespace} with ${listed ? `labels ${listed}` : '(no labels)'}`,
      },
    );
    if (ingressRefusal) return ingressRefusal;
  }
  return { allowed: true };
}
