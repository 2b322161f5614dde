import type { V1NetworkPolicy, V1NetworkPolicySpec } from '@kubernetes/client-node';
import { describe, expect, it } from 'vitest';
import {
  type DestinationPod,
  evaluateNetworkPolicies,
  matchesLabelSelector,
  type PolicyDestination,
  type PolicySource,
  type PolicyWorld,
} from '../../src/cluster/network-policy-eval.js';

const source: PolicySource = { namespace: 'tenant-a', labels: { app: 'train' } };

function policy(namespace: string, name: string, spec: V1NetworkPolicySpec): V1NetworkPolicy {
  return { metadata: { namespace, name }, spec };
}

function world(
  policies: readonly V1NetworkPolicy[],
  namespaceLabels: Record<string, Record<string, string>> = {},
): PolicyWorld {
  const byNamespace = new Map<string, V1NetworkPolicy[]>();
  for (const p of policies) {
    const ns = p.metadata?.namespace ?? '';
    byNamespace.set(ns, [...(byNamespace.get(ns) ?? []), p]);
  }
  return { policies: byNamespace, namespaceLabels: new Map(Object.entries(namespaceLabels)) };
}

function podDestination(
  ip: string,
  port: number,
  pod: Partial<DestinationPod> & Pick<DestinationPod, 'namespace' | 'name'>,
): PolicyDestination {
  const full: DestinationPod = { labels: {}, containerPorts: [], ...pod };
  return {
    ip,
    port,
    protocol: 'TCP',
    pod: full,
    label: `svc.${full.namespace} (pod ${full.name}, ${ip}:${port})`,
  };
}

function ipDestination(ip: string, port: number): PolicyDestination {
  return { ip, port, protocol: 'TCP', label: `${ip}:${port}` };
}

const postgres: PolicyDestination = {
  ip: '10.0.0.5',
  port: 5432,
  protocol: 'TCP',
  pod: {
    namespace: 'tenant-b',
    name: 'postgres-0',
    labels: { app: 'postgres' },
    containerPorts: [{ name: 'pg', containerPort: 5432 }],
  },
  label: 'postgres.tenant-b (pod postgres-0, 10.0.0.5:5432)',
};

/** The same pod, in the source's own namespace. */
const cache = podDestination('10.0.1.7', 6379, {
  namespace: 'tenant-a',
  name: 'cache-0',
  labels: { app: 'cache' },
  containerPorts: [{ name: 'redis', containerPort: 6379, protocol: 'TCP' }],
});

const denyEgress = policy('tenant-a', 'deny-egress', { podSelector: {}, policyTypes: ['Egress'] });

/** Allowed with only `spec` as the one egress policy of tenant-a, refused when deny-egress alone applies. */
function egressWith(
  spec: V1NetworkPolicySpec,
  dest: PolicyDestination,
  labels?: Record<string, Record<string, string>>,
) {
  return evaluateNetworkPolicies(
    source,
    [dest],
    world([policy('tenant-a', 'allow', { podSelector: {}, policyTypes: ['Egress'], ...spec })], labels),
  );
}

describe('matchesLabelSelector', () => {
  const labels = { app: 'train', tier: 'gpu' };

  it('matches nothing when absent and everything when empty', () => {
    expect(matchesLabelSelector(undefined, labels)).toBe(false);
    expect(matchesLabelSelector({}, labels)).toBe(true);
    expect(matchesLabelSelector({}, {})).toBe(true);
  });

  it('ANDs matchLabels and matchExpressions', () => {
    expect(matchesLabelSelector({ matchLabels: { app: 'train' } }, labels)).toBe(true);
    expect(matchesLabelSelector({ matchLabels: { app: 'train', tier: 'cpu' } }, labels)).toBe(false);
    expect(
      matchesLabelSelector(
        { matchLabels: { app: 'train' }, matchExpressions: [{ key: 'tier', operator: 'In', values: ['cpu'] }] },
        labels,
      ),
    ).toBe(false);
    expect(
      matchesLabelSelector(
        { matchLabels: { app: 'train' }, matchExpressions: [{ key: 'tier', operator: 'In', values: ['cpu', 'gpu'] }] },
        labels,
      ),
    ).toBe(true);
  });

  it('knows In, NotIn, Exists and DoesNotExist, and no other operator', () => {
    const one = (key: string, operator: string, values?: string[]) =>
      matchesLabelSelector({ matchExpressions: [{ key, operator, ...(values ? { values } : {}) }] }, labels);
    expect(one('app', 'In', ['train'])).toBe(true);
    expect(one('app', 'In', ['serve'])).toBe(false);
    expect(one('missing', 'In', ['train'])).toBe(false);
    expect(one('app', 'NotIn', ['serve'])).toBe(true);
    expect(one('app', 'NotIn', ['train'])).toBe(false);
    expect(one('missing', 'NotIn', ['train'])).toBe(true);
    expect(one('app', 'Exists')).toBe(true);
    expect(one('missing', 'Exists')).toBe(false);
    expect(one('app', 'DoesNotExist')).toBe(false);
    expect(one('missing', 'DoesNotExist')).toBe(true);
    expect(one('app', 'Gt', ['1'])).toBe(false);
    expect(one('app', 'in', ['train'])).toBe(false);
  });

  it('does not find labels on the object prototype', () => {
    expect(matchesLabelSelector({ matchExpressions: [{ key: 'constructor', operator: 'Exists' }] }, {})).toBe(false);
  });
});

describe('egress of the offloaded pod', () => {
  it('allows everything when no policy selects the pod for egress', () => {
    expect(evaluateNetworkPolicies(source, [postgres], world([]))).toEqual({ allowed: true });
  });

  it('refuses under a default-deny egress policy and names it', () => {
    expect(evaluateNetworkPolicies(source, [postgres], world([denyEgress]))).toEqual({
      allowed: false,
      direction: 'egress',
      policies: ['tenant-a/deny-egress'],
      destination: postgres,
      message:
        'NetworkPolicy tenant-a/deny-egress selects pods with the labels of this pod (app=train) for egress, and none of its egress rules allows TCP port 5432 to postgres.tenant-b (pod postgres-0, 10.0.0.5:5432)',
    });
  });

  it('names every selecting policy, with sorted labels', () => {
    const other = policy('tenant-a', 'only-dns', {
      podSelector: { matchLabels: { app: 'train' } },
      policyTypes: ['Egress'],
      egress: [{ ports: [{ protocol: 'UDP', port: 53 }] }],
    });
    const verdict = evaluateNetworkPolicies(
      { namespace: 'tenant-a', labels: { team: 'ml', app: 'train' } },
      [postgres],
      world([denyEgress, other]),
    );
    expect(verdict).toMatchObject({ allowed: false, policies: ['tenant-a/deny-egress', 'tenant-a/only-dns'] });
    expect(verdict.allowed === false && verdict.message).toBe(
      'NetworkPolicies tenant-a/deny-egress, tenant-a/only-dns select pods with the labels of this pod (app=train,team=ml) for egress, and none of their egress rules allows TCP port 5432 to postgres.tenant-b (pod postgres-0, 10.0.0.5:5432)',
    );
  });

  it('says "(no labels)" for a pod without labels', () => {
    const verdict = evaluateNetworkPolicies({ namespace: 'tenant-a', labels: {} }, [postgres], world([denyEgress]));
    expect(verdict.allowed === false && verdict.message).toContain(
      'with the labels of this pod (no labels) for egress',
    );
  });

  it('reads a policy without podSelector (required, but dropped when empty) as selecting every pod', () => {
    const noSelector = policy('tenant-a', 'no-selector', { policyTypes: ['Egress'] });
    expect(evaluateNetworkPolicies(source, [postgres], world([noSelector]))).toMatchObject({
      allowed: false,
      policies: ['tenant-a/no-selector'],
    });
  });

  it('ignores a policy whose podSelector does not select the pod', () => {
    const other = policy('tenant-a', 'deny-web', {
      podSelector: { matchLabels: { app: 'web' } },
      policyTypes: ['Egress'],
    });
    const elsewhere = policy('tenant-c', 'deny-all', { podSelector: {}, policyTypes: ['Egress'] });
    expect(evaluateNetworkPolicies(source, [postgres], world([other, elsewhere]))).toEqual({ allowed: true });
  });

  it('ANDs the policy podSelector expressions when selecting the pod', () => {
    const notTraining = policy('tenant-a', 'deny-non-train', {
      podSelector: { matchExpressions: [{ key: 'app', operator: 'NotIn', values: ['train'] }] },
      policyTypes: ['Egress'],
    });
    const gpuLess = policy('tenant-a', 'deny-no-gpu', {
      podSelector: { matchExpressions: [{ key: 'gpu', operator: 'DoesNotExist' }] },
      policyTypes: ['Egress'],
    });
    expect(evaluateNetworkPolicies(source, [postgres], world([notTraining]))).toEqual({ allowed: true });
    expect(evaluateNetworkPolicies(source, [postgres], world([gpuLess]))).toMatchObject({
      allowed: false,
      policies: ['tenant-a/deny-no-gpu'],
    });
  });

  it('allows pods of its own namespace through a podSelector peer, and only of its own namespace', () => {
    const spec = { egress: [{ to: [{ podSelector: { matchLabels: { app: 'cache' } } }] }] };
    expect(egressWith(spec, cache)).toEqual({ allowed: true });
    const sameLabelsElsewhere = podDestination('10.0.2.7', 6379, {
      namespace: 'tenant-b',
      name: 'cache-0',
      labels: { app: 'cache' },
    });
    expect(egressWith(spec, sameLabelsElsewhere)).toMatchObject({ allowed: false, policies: ['tenant-a/allow'] });
    expect(egressWith(spec, postgres)).toMatchObject({ allowed: false, direction: 'egress' });
  });

  it('allows another namespace through namespaceSelector + podSelector, with kubernetes.io/metadata.name implied', () => {
    const byName = {
      egress: [
        {
          to: [
            {
              namespaceSelector: { matchLabels: { 'kubernetes.io/metadata.name': 'tenant-b' } },
              podSelector: { matchLabels: { app: 'postgres' } },
            },
          ],
        },
      ],
    };
    expect(egressWith(byName, postgres)).toEqual({ allowed: true });
    // Both selectors must match: the right namespace with the wrong pod labels is refused.
    const otherPod = podDestination('10.0.0.9', 5432, {
      namespace: 'tenant-b',
      name: 'mysql-0',
      labels: { app: 'mysql' },
    });
    expect(egressWith(byName, otherPod)).toMatchObject({ allowed: false, destination: otherPod });
    // The implied label is the namespace's name, not an extra label the map could override.
    expect(egressWith(byName, postgres, { 'tenant-b': { 'kubernetes.io/metadata.name': 'tenant-x' } })).toEqual({
      allowed: true,
    });
  });

  it('matches namespaces by their labels, and every namespace with an empty namespaceSelector', () => {
    const team = { egress: [{ to: [{ namespaceSelector: { matchLabels: { team: 'data' } } }] }] };
    expect(egressWith(team, postgres, { 'tenant-b': { team: 'data' } })).toEqual({ allowed: true });
    expect(egressWith(team, postgres, { 'tenant-b': { team: 'web' } })).toMatchObject({ allowed: false });
    expect(egressWith(team, postgres)).toMatchObject({ allowed: false });
    expect(egressWith({ egress: [{ to: [{ namespaceSelector: {} }] }] }, postgres)).toEqual({ allowed: true });
  });

  it('allows an IPv4 ipBlock but not its except ranges', () => {
    const spec = { egress: [{ to: [{ ipBlock: { cidr: '10.0.0.0/16', except: ['10.0.0.0/24'] } }] }] };
    expect(egressWith(spec, ipDestination('10.0.1.7', 443))).toEqual({ allowed: true });
    expect(egressWith(spec, ipDestination('10.0.0.7', 443))).toMatchObject({
      allowed: false,
      message: expect.stringContaining('allows TCP port 443 to 10.0.0.7:443'),
    });
    expect(egressWith(spec, ipDestination('10.1.0.1', 443))).toMatchObject({ allowed: false });
    // Never across families, though Node's BlockList maps IPv4 into ::ffff:0:0/96.
    expect(
      egressWith({ egress: [{ to: [{ ipBlock: { cidr: '::ffff:0:0/96' } }] }] }, ipDestination('10.0.1.7', 443)),
    ).toMatchObject({ allowed: false });
  });

  it('matches no address with a malformed cidr, and does not throw', () => {
    for (const cidr of ['10.0.0.0/33', '10.0.0.0/', '10.0.0.0/8/8', 'ten/8', '2001:db8::/129']) {
      expect(egressWith({ egress: [{ to: [{ ipBlock: { cidr } }] }] }, ipDestination('10.0.0.5', 443))).toMatchObject({
        allowed: false,
      });
    }
  });

  it('allows an IPv6 ipBlock but not its except ranges', () => {
    const spec = { egress: [{ to: [{ ipBlock: { cidr: '2001:db8::/32', except: ['2001:db8:1::/48'] } }] }] };
    expect(egressWith(spec, ipDestination('2001:db8:2::5', 443))).toEqual({ allowed: true });
    expect(egressWith(spec, ipDestination('2001:db8:1::5', 443))).toMatchObject({ allowed: false });
    expect(egressWith(spec, ipDestination('2001:db9::5', 443))).toMatchObject({ allowed: false });
    expect(egressWith(spec, ipDestination('10.0.0.5', 443))).toMatchObject({ allowed: false });
  });

  it('matches an ipBlock against the IP of a pod destination too', () => {
    expect(egressWith({ egress: [{ to: [{ ipBlock: { cidr: '10.0.0.5/32' } }] }] }, postgres)).toEqual({
      allowed: true,
    });
  });

  it('never matches a plain IP destination with a pod peer', () => {
    const asIp = ipDestination('10.0.0.5', 5432);
    const spec = { egress: [{ to: [{ namespaceSelector: {} }, { podSelector: {} }] }] };
    expect(egressWith(spec, postgres)).toEqual({ allowed: true });
    expect(egressWith(spec, asIp)).toMatchObject({ allowed: false, destination: asIp });
  });

  it('matches numeric ports, and ranges with endPort', () => {
    const only = (ports: V1NetworkPolicySpec['egress']) => egressWith({ egress: ports }, postgres).allowed;
    expect(only([{ ports: [{ port: 5432 }] }])).toBe(true);
    expect(only([{ ports: [{ port: 5433 }] }])).toBe(false);
    expect(only([{ ports: [{ port: 5000, endPort: 5432 }] }])).toBe(true);
    expect(only([{ ports: [{ port: 5432, endPort: 6000 }] }])).toBe(true);
    expect(only([{ ports: [{ port: 5433, endPort: 6000 }] }])).toBe(false);
    expect(only([{ ports: [{ port: 5000, endPort: 5431 }] }])).toBe(false);
    expect(only([{ ports: [{ protocol: 'TCP' }] }])).toBe(true);
    expect(only([{ ports: [] }])).toBe(true);
    expect(only([{ ports: [{ port: 80 }, { port: 5432 }] }])).toBe(true);
  });

  it('never matches a UDP or SCTP port entry for the TCP connection', () => {
    const only = (ports: V1NetworkPolicySpec['egress']) => egressWith({ egress: ports }, postgres).allowed;
    expect(only([{ ports: [{ protocol: 'UDP', port: 5432 }] }])).toBe(false);
    expect(only([{ ports: [{ protocol: 'SCTP', port: 5432 }] }])).toBe(false);
    expect(only([{ ports: [{ protocol: 'UDP' }] }])).toBe(false);
  });

  it('needs both the peer and the port of one rule', () => {
    const spec = {
      egress: [{ to: [{ podSelector: { matchLabels: { app: 'cache' } } }], ports: [{ port: 5432 }] }],
    };
    expect(egressWith(spec, cache)).toMatchObject({ allowed: false });
    expect(egressWith(spec, postgres)).toMatchObject({ allowed: false });
  });

  it('resolves a named port on the destination pod, TCP only, never on a plain IP', () => {
    const named = (name: string, dest: PolicyDestination) =>
      egressWith({ egress: [{ ports: [{ port: name }] }] }, dest).allowed;
    expect(named('pg', postgres)).toBe(true);
    expect(named('redis', postgres)).toBe(false);
    expect(named('redis', cache)).toBe(true);
    expect(named('pg', ipDestination('10.0.0.5', 5432))).toBe(false);
    const udpPort = podDestination('10.0.0.5', 5432, {
      namespace: 'tenant-b',
      name: 'postgres-0',
      containerPorts: [{ name: 'pg', containerPort: 5432, protocol: 'UDP' }],
    });
    expect(named('pg', udpPort)).toBe(false);
    // The name exists but for another port than the one dialed.
    const otherNumber = podDestination('10.0.0.5', 5432, {
      namespace: 'tenant-b',
      name: 'postgres-0',
      containerPorts: [{ name: 'pg', containerPort: 5433 }],
    });
    expect(named('pg', otherNumber)).toBe(false);
  });

  it('defaults policyTypes as the API server does', () => {
    const ingressOnly = policy('tenant-a', 'ingress-only', {
      podSelector: {},
      ingress: [{ _from: [{ podSelector: {} }] }],
    });
    expect(evaluateNetworkPolicies(source, [postgres], world([ingressOnly]))).toEqual({ allowed: true });

    const withEgress = policy('tenant-a', 'egress-rules', {
      podSelector: {},
      egress: [{ to: [{ podSelector: {} }] }],
    });
    expect(evaluateNetworkPolicies(source, [postgres], world([withEgress]))).toMatchObject({
      allowed: false,
      direction: 'egress',
      policies: ['tenant-a/egress-rules'],
    });
    // Egress rules default the types to Ingress and Egress: the cache pod it also selects, for ingress, has
    // no ingress rule admitting the source, while its egress rule lets the source reach it.
    expect(evaluateNetworkPolicies(source, [cache], world([withEgress]))).toMatchObject({
      allowed: false,
      direction: 'ingress',
      policies: ['tenant-a/egress-rules'],
    });
    const trainOnly = policy('tenant-a', 'train-egress', {
      podSelector: { matchLabels: { app: 'train' } },
      egress: [{ to: [{ podSelector: {} }] }],
    });
    expect(evaluateNetworkPolicies(source, [cache], world([trainOnly]))).toEqual({ allowed: true });

    // An empty list is unset for the defaulting; an explicit list is taken as written.
    const emptyTypes = policy('tenant-a', 'empty-types', {
      podSelector: {},
      policyTypes: [],
      egress: [{ to: [{ podSelector: {} }] }],
    });
    expect(evaluateNetworkPolicies(source, [postgres], world([emptyTypes]))).toMatchObject({
      allowed: false,
      direction: 'egress',
      policies: ['tenant-a/empty-types'],
    });
    const emptyTypesNoRules = policy('tenant-a', 'no-rules', { podSelector: {}, policyTypes: [] });
    expect(evaluateNetworkPolicies(source, [postgres], world([emptyTypesNoRules]))).toEqual({ allowed: true });
    const explicitIngress = policy('tenant-a', 'explicit', {
      podSelector: {},
      policyTypes: ['Ingress'],
      egress: [{ to: [{ podSelector: {} }] }],
    });
    expect(evaluateNetworkPolicies(source, [postgres], world([explicitIngress]))).toEqual({ allowed: true });
  });

  it('lets any one selecting policy allow the connection', () => {
    const allow = policy('tenant-a', 'allow-db', {
      podSelector: { matchLabels: { app: 'train' } },
      policyTypes: ['Egress'],
      egress: [{ to: [{ namespaceSelector: {}, podSelector: { matchLabels: { app: 'postgres' } } }] }],
    });
    expect(evaluateNetworkPolicies(source, [postgres], world([denyEgress, allow]))).toEqual({ allowed: true });
  });
});

describe('ingress of the destination pod', () => {
  const denyIngress = policy('tenant-b', 'db-ingress', { podSelector: {}, policyTypes: ['Ingress'] });

  function ingressWith(spec: V1NetworkPolicySpec, src: PolicySource = source, labels = {}) {
    return evaluateNetworkPolicies(
      src,
      [postgres],
      world([policy('tenant-b', 'db-ingress', { podSelector: { matchLabels: { app: 'postgres' } }, ...spec })], labels),
    );
  }

  it('refuses under a default-deny ingress policy in the destination namespace and names it', () => {
    expect(evaluateNetworkPolicies(source, [postgres], world([denyIngress]))).toEqual({
      allowed: false,
      direction: 'ingress',
      policies: ['tenant-b/db-ingress'],
      destination: postgres,
      message:
        'NetworkPolicy tenant-b/db-ingress selects pod tenant-b/postgres-0 for ingress, and none of its ingress rules allows TCP port 5432 from a pod of namespace tenant-a with labels app=train',
    });
    const verdict = evaluateNetworkPolicies({ namespace: 'tenant-a', labels: {} }, [postgres], world([denyIngress]));
    expect(verdict.allowed === false && verdict.message).toMatch(
      /from a pod of namespace tenant-a with \(no labels\)$/,
    );
  });

  it('allows a rule admitting the source namespace', () => {
    const admitA = {
      ingress: [{ _from: [{ namespaceSelector: { matchLabels: { 'kubernetes.io/metadata.name': 'tenant-a' } } }] }],
    };
    expect(ingressWith(admitA)).toEqual({ allowed: true });
    expect(ingressWith(admitA, { namespace: 'tenant-c', labels: { app: 'train' } })).toMatchObject({
      allowed: false,
      direction: 'ingress',
    });
  });

  it('reads `from` of rules parsed as plain JSON as well as client-node’s `_from`', () => {
    const raw = JSON.parse(
      '{"ingress":[{"from":[{"namespaceSelector":{"matchLabels":{"kubernetes.io/metadata.name":"tenant-c"}}}]}]}',
    ) as V1NetworkPolicySpec;
    expect(ingressWith(raw)).toMatchObject({ allowed: false, direction: 'ingress' });
    expect(ingressWith(raw, { namespace: 'tenant-c', labels: {} })).toEqual({ allowed: true });
  });

  it('matches the source by namespace and pod labels together', () => {
    const spec = {
      ingress: [
        {
          _from: [
            { namespaceSelector: { matchLabels: { env: 'prod' } }, podSelector: { matchLabels: { app: 'train' } } },
          ],
        },
      ],
    };
    expect(ingressWith(spec, source, { 'tenant-a': { env: 'prod' } })).toEqual({ allowed: true });
    expect(
      ingressWith(spec, { namespace: 'tenant-a', labels: { app: 'serve' } }, { 'tenant-a': { env: 'prod' } }),
    ).toMatchObject({ allowed: false });
    expect(ingressWith(spec, source, { 'tenant-a': { env: 'dev' } })).toMatchObject({ allowed: false });
  });

  it('admits a podSelector peer only from the policy’s own namespace', () => {
    const spec = { ingress: [{ _from: [{ podSelector: { matchLabels: { app: 'train' } } }] }] };
    expect(ingressWith(spec)).toMatchObject({ allowed: false, direction: 'ingress' });
    expect(ingressWith(spec, { namespace: 'tenant-b', labels: { app: 'train' } })).toEqual({ allowed: true });
  });

  it('never admits the source through an ipBlock', () => {
    expect(
      ingressWith({ ingress: [{ _from: [{ ipBlock: { cidr: '0.0.0.0/0' } }, { ipBlock: { cidr: '::/0' } }] }] }),
    ).toMatchObject({ allowed: false, direction: 'ingress' });
  });

  it('checks the ports of an ingress rule against the destination port, named ports on the pod', () => {
    expect(ingressWith({ ingress: [{ ports: [{ port: 5432 }] }] })).toEqual({ allowed: true });
    expect(ingressWith({ ingress: [{ ports: [{ port: 'pg' }] }] })).toEqual({ allowed: true });
    expect(ingressWith({ ingress: [{ ports: [{ port: 5433 }] }] })).toMatchObject({ allowed: false });
    expect(ingressWith({ ingress: [{ ports: [{ port: 5432, protocol: 'UDP' }] }] })).toMatchObject({ allowed: false });
    expect(ingressWith({ ingress: [{}] })).toEqual({ allowed: true });
  });

  it('does not apply a policy that selects other pods, nor to a plain IP', () => {
    const web = policy('tenant-b', 'web-ingress', {
      podSelector: { matchLabels: { app: 'web' } },
      policyTypes: ['Ingress'],
    });
    expect(evaluateNetworkPolicies(source, [postgres], world([web]))).toEqual({ allowed: true });
    expect(evaluateNetworkPolicies(source, [ipDestination('10.0.0.5', 5432)], world([denyIngress]))).toEqual({
      allowed: true,
    });
  });

  it('does not let the source’s egress policies stand in for the destination’s ingress ones', () => {
    const allowAllEgress = policy('tenant-a', 'allow-all', { podSelector: {}, policyTypes: ['Egress'], egress: [{}] });
    expect(evaluateNetworkPolicies(source, [postgres], world([allowAllEgress, denyIngress]))).toMatchObject({
      allowed: false,
      direction: 'ingress',
      policies: ['tenant-b/db-ingress'],
    });
  });
});

describe('several endpoints of one Service', () => {
  const second = podDestination('10.0.0.6', 5432, {
    namespace: 'tenant-b',
    name: 'postgres-1',
    labels: { app: 'postgres' },
  });

  it('refuses when any endpoint is refused, naming that endpoint', () => {
    const onlyFirst = policy('tenant-a', 'first-only', {
      podSelector: {},
      policyTypes: ['Egress'],
      egress: [{ to: [{ ipBlock: { cidr: '10.0.0.5/32' } }] }],
    });
    expect(evaluateNetworkPolicies(source, [postgres], world([onlyFirst]))).toEqual({ allowed: true });
    const verdict = evaluateNetworkPolicies(source, [postgres, second], world([onlyFirst]));
    expect(verdict).toMatchObject({ allowed: false, direction: 'egress', destination: second });
    expect(verdict.allowed === false && verdict.message).toContain('to svc.tenant-b (pod postgres-1, 10.0.0.6:5432)');
  });

  it('reports the first refused endpoint, and egress before ingress', () => {
    const onlyFirst = policy('tenant-a', 'first-only', {
      podSelector: {},
      policyTypes: ['Egress'],
      egress: [{ to: [{ ipBlock: { cidr: '10.0.0.5/32' } }] }],
    });
    const denyFirstIngress = policy('tenant-b', 'deny-postgres-0', {
      podSelector: { matchLabels: { app: 'postgres' } },
      policyTypes: ['Ingress'],
    });
    // The first endpoint is refused by ingress only, the second by egress: the first one is the verdict.
    expect(evaluateNetworkPolicies(source, [postgres, second], world([onlyFirst, denyFirstIngress]))).toMatchObject({
      allowed: false,
      direction: 'ingress',
      destination: postgres,
    });
    // One endpoint refused both ways: egress is reported.
    expect(evaluateNetworkPolicies(source, [second], world([onlyFirst, denyFirstIngress]))).toMatchObject({
      allowed: false,
      direction: 'egress',
      destination: second,
    });
  });

  it('goes on past a plain IP endpoint to the pods after it', () => {
    const denyIngress = policy('tenant-b', 'db-ingress', { podSelector: {}, policyTypes: ['Ingress'] });
    expect(
      evaluateNetworkPolicies(source, [ipDestination('10.0.0.4', 5432), postgres], world([denyIngress])),
    ).toMatchObject({ allowed: false, direction: 'ingress', destination: postgres });
  });

  it('allows when there is no endpoint to refuse', () => {
    expect(evaluateNetworkPolicies(source, [], world([denyEgress]))).toEqual({ allowed: true });
  });
});
