/**
 * Host names as the annotation grammar accepts them, and the names a workload may use for a
 * Service (ARCHITECTURE.md, "Annotations": `<fqdn> <name>.<ns>.svc <name>.<ns>`, and `<name>` in the pod's namespace).
 */

const LABEL = /^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$/;
const IPV4 = /^(?:(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)$/;

/**
 * Slurm node names as squeue prints them and carriers dial them: host-name characters, with `_`
 * (Slurm accepts it and some sites use it); one grammar for the squeue parser and the carrier commands.
 */
const SLURM_NODE = /^(?=.{1,253}$)[A-Za-z0-9][A-Za-z0-9_-]*(?:\.[A-Za-z0-9][A-Za-z0-9_-]*)*$/;

export function isSlurmNodeName(host: string): boolean {
  return SLURM_NODE.test(host);
}

export function isIpv4(host: string): boolean {
  return IPV4.test(host);
}

/** RFC 1123 host name (lower case), ≤253 characters; not all-numeric in the last label. */
export function isDnsName(host: string): boolean {
  if (host.length === 0 || host.length > 253) return false;
  const labels = host.split('.');
  if (!labels.every((label) => LABEL.test(label))) return false;
  return !/^\d+$/.test(labels[labels.length - 1] ?? '');
}

export interface ServiceAddress {
  /** The name the fleet dials: a fully qualified Service name, or the host as written. */
  dialHost: string;
  /** Names the job's hosts file maps to the bind address; empty for an IPv4 endpoint. */
  names: string[];
  /** The Service the host names, when it names one. */
  service?: { name: string; namespace: string };
}

/**
 * A bare `name` is a Service in the pod's namespace: the fleet runs in another namespace, so it must
 * dial the fully qualified name or it would reach its own namespace's Service of that name.
 */
export function serviceAddress(host: string, podNamespace: string, clusterDomain: string): ServiceAddress {
  if (isIpv4(host)) return { dialHost: host, names: [] };
  const suffix = `.svc.${clusterDomain}`;
  let service: { name: string; namespace: string } | undefined;
  const labels = host.split('.');
  if (labels.length === 1) {
    service = { name: host, namespace: podNamespace };
  } else if (labels.length === 3 && labels[2] === 'svc') {
    service = { name: labels[0] ?? '', namespace: labels[1] ?? '' };
  } else if (host.endsWith(suffix) && labels.length === 3 + clusterDomain.split('.').length) {
    service = { name: labels[0] ?? '', namespace: labels[1] ?? '' };
  }
  if (!service) return { dialHost: host, names: [host] };
  const { name, namespace } = service;
  const fqdn = `${name}.${namespace}${suffix}`;
  const names = [fqdn, `${name}.${namespace}.svc`, `${name}.${namespace}`];
  if (namespace === podNamespace) names.push(name);
  return { dialHost: fqdn, names, service };
}

/** `<service>.<namespace>.svc.<cluster domain>` (how forwards name Services once parsed), else undefined. */
export function serviceOfName(host: string, clusterDomain: string): { name: string; namespace: string } | undefined {
  const suffix = `.svc.${clusterDomain}`.toLowerCase();
  const lower = host.toLowerCase().replace(/\.$/, '');
  if (!lower.endsWith(suffix)) return undefined;
  const parts = lower.slice(0, -suffix.length).split('.');
  if (parts.length !== 2 || !parts[0] || !parts[1]) return undefined;
  return { name: parts[0], namespace: parts[1] };
}
