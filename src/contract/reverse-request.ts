import { ANNOTATION, MAX_FORWARDS, MIN_LISTEN_PORT, REVERSE_ANNOTATIONS } from './annotations.js';
import { repeatOnAddress, withSlots } from './derivations.js';
import { type EndpointPolicy, NamespaceEndpointPolicy } from './endpoint-policy.js';
import { isDnsName, isIpv4, serviceAddress } from './host-names.js';
import { InputError, quote } from './input-error.js';
import type { ReverseConfig, SiteConfig } from './site-config.js';

export type NodeExec = 'ssh' | 'srun';

/** One declared endpoint: the relay listens on `listenPort`, the fleet dials `dialHost:port`. */
export interface Forward {
  listenPort: number;
  /** The host as the pod wrote it (lower case). */
  host: string;
  port: number;
  dialHost: string;
  /** Names mapped to the bind address in the job's hosts file. */
  names: string[];
}

/** What a pod asked for, validated against the site. */
export interface ReverseRequest {
  forwards: Forward[];
  socksPort: number | undefined;
  nodeExec: NodeExec | undefined;
}

export interface RequestContext {
  reverse: ReverseConfig;
  podNamespace: string;
  clusterDomain: string;
  endpoints: EndpointPolicy;
}

/** What a pod of PODNAMESPACE is validated against on this site. */
export function requestContext(config: SiteConfig, podNamespace: string): RequestContext {
  return {
    reverse: config.Network.SSH.Reverse,
    podNamespace,
    clusterDomain: config.Backhaul.ClusterDomain,
    endpoints: config.Backhaul.EndpointPolicy,
  };
}

const ENTRY_ACCEPTED =
  'host:port or listenPort:host:port, e.g. minio.user.svc.cluster.local:9000 or 6443:kubernetes.default.svc.cluster.local:443';
const PORT = /^[1-9]\d{0,4}$/;

export function hasReverseAnnotations(annotations: Readonly<Record<string, string>>): boolean {
  return REVERSE_ANNOTATIONS.some((name) => annotations[name] !== undefined);
}

/**
 * Validates the reverse annotations of one pod. Returns undefined for a pod that asks for nothing;
 * throws InputError naming the annotation, the entry and what would be accepted.
 */
export function parseReverseRequest(
  annotations: Readonly<Record<string, string>>,
  ctx: RequestContext,
): ReverseRequest | undefined {
  if (!hasReverseAnnotations(annotations)) return undefined;
  const present = REVERSE_ANNOTATIONS.filter((name) => annotations[name] !== undefined);
  const first = present[0] ?? ANNOTATION.forwards;
  if (!ctx.reverse.Enabled) {
    throw new InputError(first, 'reverse forwards are not enabled on this site', {
      accepted: 'a pod without interlink.eu/reverse-* annotations (the site sets Network.SSH.Reverse.Enabled: false)',
    });
  }
  if (annotations[ANNOTATION.podVpn] !== undefined) {
    throw new InputError(first, `cannot be combined with ${ANNOTATION.podVpn}`, {
      accepted: `either ${ANNOTATION.podVpn} or the interlink.eu/reverse-* annotations, not both`,
    });
  }
  const forwards = parseForwards(annotations[ANNOTATION.forwards], ctx);
  const socksPort = parseSocksPort(annotations[ANNOTATION.socksPort], forwards, ctx);
  const nodeExec = parseNodeExec(annotations[ANNOTATION.nodeExec], ctx);
  if (forwards.length === 0 && socksPort === undefined) {
    throw new InputError(ANNOTATION.forwards, 'no forwards declared', {
      accepted: `at least one entry: ${ENTRY_ACCEPTED}`,
    });
  }
  return { forwards, socksPort, nodeExec };
}

function parseForwards(value: string | undefined, ctx: RequestContext): Forward[] {
  if (value === undefined) return [];
  const entries = value.split(/\s+/).filter((e) => e.length > 0);
  const field = ANNOTATION.forwards;
  if (entries.length > MAX_FORWARDS) {
    throw new InputError(field, `${entries.length} entries; at most ${MAX_FORWARDS} are allowed`, {
      accepted: `up to ${MAX_FORWARDS} entries separated by white space`,
    });
  }
  const policy = new NamespaceEndpointPolicy(ctx.endpoints, ctx.podNamespace, { clusterDomain: ctx.clusterDomain });
  const forwards = entries.map((entry) => parseForwardEntry(entry, ctx, policy));
  // Each Service has its own address, so a listen port may repeat across Services, not within one.
  const slotted = withSlots(forwards);
  const repeat = repeatOnAddress(slotted);
  const forward = repeat && slotted[repeat.index];
  if (repeat && forward) {
    const shared =
      forward.names.length === 0
        ? "IPv4 endpoints are reached at the pod's first address"
        : `both are ${forward.dialHost}`;
    throw new InputError(
      field,
      `listen port ${forward.listenPort} is already used by ${quote(entries[repeat.previous] ?? '')} on the same address (${shared})`,
      {
        entry: entries[repeat.index] ?? '',
        accepted: `a distinct listen port, e.g. ${forward.listenPort + 1}:${forward.host}:${forward.port}; two different Services may share a port`,
      },
    );
  }
  return forwards;
}

function parseForwardEntry(entry: string, ctx: RequestContext, policy: NamespaceEndpointPolicy): Forward {
  const field = ANNOTATION.forwards;
  const fail = (problem: string, accepted = ENTRY_ACCEPTED): never => {
    throw new InputError(field, problem, { entry, accepted });
  };
  if (/\/udp$/i.test(entry))
    fail('SSH forwards carry TCP only; UDP cannot be forwarded', 'a TCP endpoint: host:port or listenPort:host:port');
  if (entry.includes('[') || entry.split(':').length > 3) {
    fail('IPv6 literals are not supported', 'a DNS name or an IPv4 address as host');
  }
  const parts = entry.split(':');
  if (parts.length < 2) fail('missing port');
  const [listenText, hostText, portText] = parts.length === 3 ? parts : [undefined, parts[0], parts[1]];
  const port = parsePort(portText ?? '', 'port', fail);
  const host = (hostText ?? '').toLowerCase();
  if (host.includes('_'))
    fail(
      `host ${quote(hostText ?? '')} contains "_", which is not allowed in a host name`,
      'a DNS name of letters, digits, "-" and "." (RFC 1123), or an IPv4 address',
    );
  if (/^[\d.]+$/.test(host)) {
    if (!isIpv4(host))
      fail(
        `host ${quote(hostText ?? '')} is not a valid IPv4 address`,
        'an IPv4 address such as 10.96.0.1, or a DNS name',
      );
  } else if (!isDnsName(host)) {
    fail(
      `host ${quote(hostText ?? '')} is not a DNS name or IPv4 address`,
      'a DNS name of letters, digits, "-" and "." (RFC 1123, at most 253 characters), or an IPv4 address',
    );
  }
  const listenPort = listenText === undefined ? port : parsePort(listenText, 'listen port', fail);
  if (listenPort < MIN_LISTEN_PORT) {
    const suggestion = listenPort + 8000;
    fail(
      `listen port ${listenPort} is below ${MIN_LISTEN_PORT} (the relay runs unprivileged)`,
      `a listen port of ${MIN_LISTEN_PORT} or more, e.g. ${suggestion}:${host}:${port}`,
    );
  }
  const address = serviceAddress(host, ctx.podNamespace, ctx.clusterDomain);
  const refusal = policy.refusal({ host, port, service: address.service });
  if (refusal !== undefined) {
    throw new InputError(field, `endpoint not allowed: ${refusal}`, {
      entry,
      accepted: `an endpoint the site's endpoint policy allows (by default: Services of namespace ${ctx.podNamespace} and the Kubernetes API)`,
    });
  }
  return { listenPort, host, port, dialHost: address.dialHost, names: address.names };
}

function parsePort(text: string, what: string, fail: (problem: string, accepted?: string) => never): number {
  if (!PORT.test(text) || Number(text) > 65535) {
    return fail(`${what} ${quote(text)} is not a port number`, `${what} 1-65535 in decimal`);
  }
  return Number(text);
}

function parseSocksPort(value: string | undefined, forwards: Forward[], ctx: RequestContext): number | undefined {
  if (value === undefined) return undefined;
  const field = ANNOTATION.socksPort;
  const text = value.trim();
  if (!ctx.reverse.AllowSocks) {
    throw new InputError(field, 'SOCKS is not allowed on this site', {
      entry: text,
      accepted: `explicit forwards in ${ANNOTATION.forwards} (the site sets Network.SSH.Reverse.AllowSocks: false)`,
    });
  }
  if (!PORT.test(text) || Number(text) > 65535 || Number(text) < MIN_LISTEN_PORT) {
    throw new InputError(field, 'not a port number of 1024 or more', {
      entry: text,
      accepted: 'one port 1024-65535, e.g. 11080',
    });
  }
  const port = Number(text);
  const clash = forwards.find((f) => f.listenPort === port);
  if (clash) {
    throw new InputError(field, `port ${port} is already a listen port of ${ANNOTATION.forwards}`, {
      entry: text,
      accepted: 'a port 1024-65535 that no forward listens on',
    });
  }
  return port;
}

function parseNodeExec(value: string | undefined, ctx: RequestContext): NodeExec | undefined {
  if (value === undefined) return undefined;
  const field = ANNOTATION.nodeExec;
  const text = value.trim();
  if (text !== 'ssh' && text !== 'srun') {
    throw new InputError(field, 'unknown node exec', { entry: text, accepted: '"ssh" or "srun"' });
  }
  if (!ctx.reverse.AllowNodeExecOverride) {
    throw new InputError(field, 'this site does not let pods choose how the carrier reaches the node', {
      entry: text,
      accepted: `no ${field} annotation (the site uses NodeExec: ${ctx.reverse.NodeExec}; it would need Network.SSH.Reverse.AllowNodeExecOverride: true)`,
    });
  }
  return text;
}
