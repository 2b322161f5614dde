import { describe, expect, it } from 'vitest';
import {
  DEFAULT_ENDPOINT_POLICY,
  type EndpointPolicy,
  endpointPolicySchema,
  type NamedEndpoint,
  NamespaceEndpointPolicy,
} from '../../src/spec/endpoint-policy.js';
import { serviceAddress } from '../../src/spec/host-names.js';

const FLEET_IP = '10.244.1.7';

function policyFor(ns: string, raw: unknown = {}): NamespaceEndpointPolicy {
  return new NamespaceEndpointPolicy(endpointPolicySchema.parse(raw) as EndpointPolicy, ns, [FLEET_IP]);
}

function named(host: string, podNamespace = 'user', port = 80): NamedEndpoint {
  return { host, port, service: serviceAddress(host, podNamespace, 'cluster.local').service };
}

describe('endpoint policy: names, at validation', () => {
  const user = policyFor('user');

  it('by default: Services of the pod namespace and the Kubernetes API, nothing else', () => {
    expect(user.refusalOfName(named('minio'))).toBeUndefined();
    expect(user.refusalOfName(named('minio.user.svc.cluster.local'))).toBeUndefined();
    expect(user.refusalOfName(named('kubernetes.default.svc.cluster.local', 'user', 443))).toBeUndefined();
    expect(user.refusalOfName(named('kubernetes.default.svc'))).toBeUndefined();
    expect(user.refusalOfName(named('postgres.tenant-b.svc'))).toBe(
      "Service postgres.tenant-b is in namespace tenant-b, not the pod's (user); Backhaul.EndpointPolicy.AllowByNamespace.user.Namespaces (or .Services) would allow it",
    );
    expect(user.refusalOfName(named('s3.example.org'))).toContain('host s3.example.org is outside the cluster');
    expect(user.refusalOfName(named('10.96.0.1'))).toContain('address 10.96.0.1 is not in an allowed range');
  });

  it("the fleet's own namespace, loopback and link-local: refused, even under a broad rule", () => {
    const broad = policyFor('user', {
      Allow: { CIDRs: ['0.0.0.0/0'], Hosts: ['*.org', 'metadata.google.internal'], Namespaces: ['tenant-b'] },
    });
    for (const p of [user, broad]) {
      expect(p.refusalOfName(named('backhaul-redis.backhaul.svc.cluster.local', 'user', 6379))).toBe(
        "Service backhaul-redis.backhaul is in the fleet's own namespace (backhaul); only a rule naming it (Backhaul.EndpointPolicy.Allow.Services: [backhaul-redis.backhaul]) opens it",
      );
      expect(p.refusalOfName(named('127.0.0.1'))).toContain('is loopback (the fleet itself)');
      expect(p.refusalOfName(named('127.1.2.3'))).toContain('is loopback');
      expect(p.refusalOfName(named('169.254.169.254'))).toContain('is link-local (cloud metadata)');
      expect(p.refusalOfName(named('0.0.0.0'))).toContain('"this network"');
      expect(p.refusalOfName(named('db.localhost'))).toContain("the fleet's own loopback");
      expect(p.refusalOfName(named(FLEET_IP))).toContain("is the fleet's own address");
    }
    expect(broad.refusalOfName(named('postgres.tenant-b.svc'))).toBeUndefined();
    expect(broad.refusalOfName(named('10.96.0.1'))).toBeUndefined();
    expect(broad.refusalOfName(named('s3.example.org'))).toBeUndefined();
    expect(broad.refusalOfName(named('example.com'))).toContain('outside the cluster');
    const any = policyFor('user', { Allow: { Namespaces: ['*'], Hosts: ['*'] } });
    expect(any.refusalOfName(named('postgres.tenant-b.svc'))).toBeUndefined();
    expect(any.refusalOfName(named('example.org'))).toBeUndefined();
    expect(any.refusalOfName(named('backhaul-redis.backhaul.svc'))).toContain("fleet's own namespace");
    expect(any.refusalOfName(named('db.localhost'))).toContain("the fleet's own loopback");
    // A bare name is a Service of the pod's namespace: `localhost` is dialled as localhost.user.svc.cluster.local.
    expect(serviceAddress('localhost', 'user', 'cluster.local').dialHost).toBe('localhost.user.svc.cluster.local');
  });

  it('a rule that names them opens them: a CIDR inside the range, the Service or namespace by name', () => {
    const p = policyFor('user', {
      Allow: { CIDRs: ['127.0.0.0/8', `${FLEET_IP}/32`], Services: ['webhook.backhaul'] },
    });
    expect(p.refusalOfName(named('127.0.0.1'))).toBeUndefined();
    expect(p.refusalOfName(named(FLEET_IP))).toBeUndefined();
    expect(p.refusalOfName(named('webhook.backhaul.svc'))).toBeUndefined();
    expect(p.refusalOfName(named('backhaul-redis.backhaul.svc'))).toContain("fleet's own namespace");
    expect(p.refusalOfName(named('169.254.169.254'))).toContain('link-local');
  });

  it('per namespace: what one namespace is allowed another is not', () => {
    const raw = { AllowByNamespace: { 'team-a': { Namespaces: ['shared'] } } };
    expect(policyFor('team-a', raw).refusalOfName(named('db.shared.svc', 'team-a'))).toBeUndefined();
    expect(policyFor('team-b', raw).refusalOfName(named('db.shared.svc', 'team-b'))).toContain(
      "not the pod's (team-b)",
    );
  });

  it('OwnNamespace and KubernetesAPI can be turned off', () => {
    const p = policyFor('user', { OwnNamespace: false, KubernetesAPI: false });
    expect(p.refusalOfName(named('minio'))).toContain("not the pod's");
    expect(p.refusalOfName(named('kubernetes.default.svc'))).toContain('in namespace default');
  });
});

describe('endpoint policy: addresses, at dial time', () => {
  const user = policyFor('user');

  it('an allowed name that resolves to loopback, metadata or the fleet is refused', () => {
    expect(user.refusalOfAddress('10.96.12.4', 'minio.user.svc.cluster.local')).toBeUndefined();
    expect(user.refusalOfAddress('127.0.0.1', 'minio.user.svc.cluster.local')).toBe(
      'minio.user.svc.cluster.local (127.0.0.1) is loopback (the fleet itself), never reached unless a CIDR rule inside 127.0.0.0/8 in Backhaul.EndpointPolicy names it',
    );
    expect(user.refusalOfAddress('169.254.169.254', 'evil.user.svc.cluster.local')).toContain('link-local');
    expect(user.refusalOfAddress(FLEET_IP, 'x.user.svc.cluster.local')).toContain("fleet's own address");
    expect(user.refusalOfAddress('::1', 'x.user.svc.cluster.local')).toContain('loopback');
    expect(user.refusalOfAddress('::ffff:127.0.0.1', 'x.user.svc.cluster.local')).toContain('loopback');
    expect(user.refusalOfAddress('fe80::1', 'x.user.svc.cluster.local')).toContain('link-local');
    expect(user.refusalOfAddress('fd00:ec2::254', 'x.user.svc.cluster.local')).toContain('cloud metadata');
    expect(user.refusalOfAddress('2001:db8::5', 'x.user.svc.cluster.local')).toBeUndefined();
  });
});

describe('endpoint policy: configuration', () => {
  it('bad rules are refused with what is expected', () => {
    const bad = (raw: unknown) => endpointPolicySchema.safeParse(raw).error?.issues[0]?.message;
    expect(bad({ Allow: { CIDRs: ['10.0.0.0/33'] } })).toBe('expected an IPv4 CIDR such as 10.20.0.0/16');
    expect(bad({ Allow: { CIDRs: ['10.0.0.300/8'] } })).toBe('expected an IPv4 CIDR such as 10.20.0.0/16');
    expect(bad({ Allow: { Services: ['minio'] } })).toBe('expected a Service as name.namespace, e.g. minio.storage');
    expect(bad({ Allow: { Hosts: ['*.'] } })).toBe('expected a host name, *.domain for every name below it, or *');
    expect(bad({ Allow: { Namespaces: ['Team_A'] } })).toBe('expected a namespace name (DNS-1123 label) or *');
    expect(bad({ Allow: { Ports: [80] } })).toContain('Unrecognized key');
  });

  it('the default is own namespace and the Kubernetes API, fleet namespace backhaul', () => {
    expect(DEFAULT_ENDPOINT_POLICY).toMatchObject({
      OwnNamespace: true,
      KubernetesAPI: true,
      FleetNamespace: 'backhaul',
    });
  });
});
