import { describe, expect, it } from 'vitest';
import {
  DEFAULT_ENDPOINT_POLICY,
  type EndpointPolicy,
  endpointPolicySchema,
  type NamedEndpoint,
  NamespaceEndpointPolicy,
} from '../../src/contract/endpoint-policy.js';
import { serviceAddress } from '../../src/contract/host-names.js';

const FLEET_IP = '10.244.1.7';
/** The fleet's own addresses: its pod (v4 and v6) and its namespace's Redis Service. */
const FLEET_REDIS = '10.96.0.12';
const FLEET_IP6 = 'fd00:10:244::7';
const FLEET = new Set([FLEET_IP, FLEET_IP6, FLEET_REDIS]);

function policyFor(ns: string, raw: unknown = {}): NamespaceEndpointPolicy {
  return new NamespaceEndpointPolicy(endpointPolicySchema.parse(raw) as EndpointPolicy, ns, {
    clusterDomain: 'cluster.local',
    fleet: { has: (address) => FLEET.has(address) },
  });
}

function named(host: string, podNamespace = 'user', port = 80): NamedEndpoint {
  return { host, port, service: serviceAddress(host, podNamespace, 'cluster.local').service };
}

describe('endpoint policy: names, at validation', () => {
  const user = policyFor('user');

  it('by default: Services of the pod namespace and the Kubernetes API, nothing else', () => {
    expect(user.refusal(named('minio'))).toBeUndefined();
    expect(user.refusal(named('minio.user.svc.cluster.local'))).toBeUndefined();
    expect(user.refusal(named('kubernetes.default.svc.cluster.local', 'user', 443))).toBeUndefined();
    expect(user.refusal(named('kubernetes.default.svc'))).toBeUndefined();
    expect(user.refusal(named('postgres.tenant-b.svc'))).toBe(
      "Service postgres.tenant-b is in namespace tenant-b, not the pod's (user); Backhaul.EndpointPolicy.AllowByNamespace.user.Namespaces (or .Services) would allow it",
    );
    expect(user.refusal(named('s3.example.org'))).toContain('host s3.example.org is outside the cluster');
    expect(user.refusal(named('10.96.0.1'))).toContain('address 10.96.0.1 is not in an allowed range');
  });

  it("the fleet's own namespace, loopback and link-local: refused, even under a broad rule", () => {
    const broad = policyFor('user', {
      Allow: { CIDRs: ['0.0.0.0/0'], Hosts: ['*.org', 'metadata.google.internal'], Namespaces: ['tenant-b'] },
    });
    for (const p of [user, broad]) {
      expect(p.refusal(named('backhaul-redis.backhaul.svc.cluster.local', 'user', 6379))).toBe(
        "Service backhaul-redis.backhaul is in the fleet's own namespace (backhaul); only a rule naming it (Backhaul.EndpointPolicy.Allow.Services: [backhaul-redis.backhaul]) opens it",
      );
      expect(p.refusal(named('127.0.0.1'))).toContain('is loopback (the fleet itself)');
      expect(p.refusal(named('127.1.2.3'))).toContain('is loopback');
      expect(p.refusal(named('169.254.169.254'))).toContain('is link-local (cloud metadata)');
      expect(p.refusal(named('0.0.0.0'))).toContain('"this network"');
      expect(p.refusal(named('db.localhost'))).toContain("the fleet's own loopback");
      expect(p.refusal(named(FLEET_IP))).toContain("is the fleet's own address");
    }
    expect(broad.refusal(named('postgres.tenant-b.svc'))).toBeUndefined();
    expect(broad.refusal(named('10.96.0.1'))).toBeUndefined();
    expect(broad.refusal(named('s3.example.org'))).toBeUndefined();
    expect(broad.refusal(named('example.com'))).toContain('outside the cluster');
    const any = policyFor('user', { Allow: { Namespaces: ['*'], Hosts: ['*'] } });
    expect(any.refusal(named('postgres.tenant-b.svc'))).toBeUndefined();
    expect(any.refusal(named('example.org'))).toBeUndefined();
    expect(any.refusal(named('backhaul-redis.backhaul.svc'))).toContain("fleet's own namespace");
    expect(any.refusal(named('db.localhost'))).toContain("the fleet's own loopback");
    // A bare name is a Service of the pod's namespace: `localhost` is dialled as localhost.user.svc.cluster.local.
    expect(serviceAddress('localhost', 'user', 'cluster.local').dialHost).toBe('localhost.user.svc.cluster.local');
  });

  it('a rule that names them opens them: a CIDR inside the range, the Service or namespace by name', () => {
    const p = policyFor('user', {
      Allow: { CIDRs: ['127.0.0.0/8', `${FLEET_IP}/32`], Services: ['webhook.backhaul'] },
    });
    expect(p.refusal(named('127.0.0.1'))).toBeUndefined();
    expect(p.refusal(named(FLEET_IP))).toBeUndefined();
    expect(p.refusal(named('webhook.backhaul.svc'))).toBeUndefined();
    expect(p.refusal(named('backhaul-redis.backhaul.svc'))).toContain("fleet's own namespace");
    expect(p.refusal(named('169.254.169.254'))).toContain('link-local');
  });

  it('per namespace: what one namespace is allowed another is not', () => {
    const raw = { AllowByNamespace: { 'team-a': { Namespaces: ['shared'] } } };
    expect(policyFor('team-a', raw).refusal(named('db.shared.svc', 'team-a'))).toBeUndefined();
    expect(policyFor('team-b', raw).refusal(named('db.shared.svc', 'team-b'))).toContain("not the pod's (team-b)");
  });

  it('OwnNamespace and KubernetesAPI can be turned off', () => {
    const p = policyFor('user', { OwnNamespace: false, KubernetesAPI: false });
    expect(p.refusal(named('minio'))).toContain("not the pod's");
    expect(p.refusal(named('kubernetes.default.svc'))).toContain('in namespace default');
  });
});

describe('endpoint policy: addresses, at dial time', () => {
  const user = policyFor('user');

  it('an allowed name that resolves to loopback, metadata or the fleet is refused', () => {
    expect(user.refusal(named('minio.user.svc.cluster.local'), { address: '10.96.12.4', from: 'dns' })).toBeUndefined();
    expect(user.refusal(named('minio.user.svc.cluster.local'), { address: '127.0.0.1', from: 'dns' })).toBe(
      'minio.user.svc.cluster.local (127.0.0.1) is loopback (the fleet itself), never reached unless a CIDR rule inside 127.0.0.0/8 in Backhaul.EndpointPolicy names it',
    );
    expect(user.refusal(named('evil.user.svc.cluster.local'), { address: '169.254.169.254', from: 'dns' })).toContain(
      'link-local',
    );
    expect(user.refusal(named('x.user.svc.cluster.local'), { address: FLEET_IP, from: 'dns' })).toContain(
      "fleet's own address",
    );
    expect(user.refusal(named('x.user.svc.cluster.local'), { address: '::1', from: 'dns' })).toContain('loopback');
    expect(user.refusal(named('x.user.svc.cluster.local'), { address: '::ffff:127.0.0.1', from: 'dns' })).toContain(
      'loopback',
    );
    expect(user.refusal(named('x.user.svc.cluster.local'), { address: 'fe80::1', from: 'dns' })).toContain(
      'link-local',
    );
    expect(user.refusal(named('x.user.svc.cluster.local'), { address: 'fd00:ec2::254', from: 'dns' })).toContain(
      'cloud metadata',
    );
    expect(user.refusal(named('x.user.svc.cluster.local'), { address: '2001:db8::5', from: 'dns' })).toBeUndefined();
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

describe('endpoint policy: what no broad rule opens (issue 25, item 1)', () => {
  const broad = policyFor('team-a', { Allow: { CIDRs: ['0.0.0.0/0'], Hosts: ['*'], Namespaces: ['*'] } });
  const dns = (host: string, address: string) => broad.refusal(named(host, 'team-a'), { address, from: 'dns' });

  it('IPv6 forms of a protected IPv4 address are judged as that address: mapped, compatible, NAT64, 6to4', () => {
    expect(dns('evil.example.org', '64:ff9b::a9fe:a9fe')).toContain('NAT64 for 169.254.169.254, is link-local');
    expect(dns('evil.example.org', '64:ff9b::7f00:1')).toContain('NAT64 for 127.0.0.1, is loopback');
    expect(dns('evil.example.org', '::ffff:169.254.169.254')).toContain('is link-local');
    expect(dns('evil.example.org', '::7f00:1')).toContain('IPv4-compatible for 127.0.0.1');
    expect(dns('evil.example.org', '2002:a9fe:a9fe::1')).toContain('6to4 for 169.254.169.254');
    expect(dns('evil.example.org', `64:ff9b::${'0a60:000c'}`)).toContain(
      "NAT64 for 10.96.0.12, is the fleet's own address",
    );
    expect(dns('evil.example.org', '2001:0:4136:e378:8000:63bf:3fff:fdd2')).toContain('Teredo');
    expect(dns('evil.example.org', '64:ff9b:1::a9fe:a9fe')).toContain('local-use NAT64');
    // An ordinary global IPv6 answer is fine.
    expect(dns('s3.example.org', '2600:1f18::5')).toBeUndefined();
  });

  it("the fleet's own addresses, IPv6 included, and its namespace's Services, whatever the name", () => {
    expect(dns('anything.example.org', FLEET_IP6)).toContain("is the fleet's own address (IPv6)");
    expect(dns('backhaul-redis.backhaul', FLEET_REDIS)).toBe(
      "backhaul-redis.backhaul (10.96.0.12) is the fleet's own address (its pods, its namespace's Services); only a CIDR rule 10.96.0.12/32 in Backhaul.EndpointPolicy opens it",
    );
    const service = (host: string) =>
      broad.refusal(named(host, 'team-a'), { address: FLEET_REDIS, from: 'service', backends: [] });
    expect(service('r.team-a.svc.cluster.local')).toContain("is the fleet's own address");
    // Only a rule naming the exact address, or the fleet's Service itself, opens them.
    const exact = policyFor('team-a', { Allow: { CIDRs: [`${FLEET_REDIS}/32`], Hosts: ['*'] } });
    expect(exact.refusal(named('x.example.org', 'team-a'), { address: FLEET_REDIS, from: 'dns' })).toBeUndefined();
    const byName = policyFor('team-a', { Allow: { Services: ['backhaul-redis.backhaul'] } });
    expect(
      byName.refusal(named('backhaul-redis.backhaul.svc.cluster.local', 'team-a'), {
        address: FLEET_REDIS,
        from: 'service',
        backends: [{ address: FLEET_IP, podOfNamespace: true }],
      }),
    ).toBeUndefined();
  });

  it('names inside the cluster that are not Services are never endpoints, even under Hosts: ["*"]', () => {
    for (const host of [
      'redis-0.backhaul-redis.backhaul.svc.cluster.local',
      '10-96-0-12.backhaul.pod.cluster.local',
      'cluster.local.example.svc',
    ]) {
      expect(broad.refusal(named(host, 'team-a')), host).toContain('is a name inside the cluster but not a Service');
    }
    // A two-label name is a host outside the cluster: dialled as an absolute name, never completed by a search path.
    expect(broad.refusal(named('backhaul-redis.backhaul', 'team-a'))).toBeUndefined();
  });

  it('other protected ranges: multicast, reserved, metadata outside link-local', () => {
    expect(dns('x.example.org', '224.0.0.1')).toContain('multicast');
    expect(dns('x.example.org', '255.255.255.255')).toContain('reserved');
    expect(dns('x.example.org', '100.100.100.200')).toContain('cloud metadata (Alibaba Cloud)');
    expect(dns('x.example.org', '168.63.129.16')).toContain('Azure WireServer');
  });

  it('ClusterCIDRs: a name outside the cluster may not resolve into it', () => {
    const p = policyFor('team-a', { Allow: { Hosts: ['*'] }, ClusterCIDRs: ['10.96.0.0/12', '10.244.0.0/16'] });
    expect(p.refusal(named('evil.example.org', 'team-a'), { address: '10.96.33.7', from: 'dns' })).toContain(
      'is inside the cluster (Backhaul.EndpointPolicy.ClusterCIDRs)',
    );
    expect(p.refusal(named('s3.example.org', 'team-a'), { address: '52.216.1.1', from: 'dns' })).toBeUndefined();
  });

  it('what stands behind a Service: a hand-written endpoint must be in an allowed range, a pod of its namespace need not', () => {
    const user = policyFor('team-a');
    const web = named('web.team-a.svc.cluster.local', 'team-a');
    const behind = (address: string, podOfNamespace: boolean) =>
      user.refusal(web, { address: '10.96.5.5', from: 'service', backends: [{ address, podOfNamespace }] });
    expect(behind('10.244.3.9', true)).toBeUndefined();
    expect(behind('10.244.9.9', false)).toContain(
      'Service web.team-a sends its connections to 10.244.9.9, which is no pod of namespace team-a (an endpoint written by hand)',
    );
    expect(behind(FLEET_IP, true)).toContain(
      "an endpoint of Service web.team-a: 10.244.1.7 is the fleet's own address",
    );
    expect(behind('169.254.169.254', false)).toContain('is link-local');
    const external = policyFor('team-a', { AllowByNamespace: { 'team-a': { CIDRs: ['192.0.2.0/24'] } } });
    expect(
      external.refusal(web, {
        address: '10.96.5.5',
        from: 'service',
        backends: [{ address: '192.0.2.7', podOfNamespace: false }],
      }),
    ).toBeUndefined();
  });
});
