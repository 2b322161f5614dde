import { ApiException, CoreV1Api, DiscoveryV1Api, NetworkingV1Api } from '@kubernetes/client-node';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { type KubeHarness, kubeHarness } from '../fixtures/kube-harness.js';

/** What a rejected call threw (undefined if it did not reject). */
async function failure(call: Promise<unknown>): Promise<unknown> {
  try {
    await call;
  } catch (err) {
    return err;
  }
  return undefined;
}

/** The Status the server sent with an ApiException (the client hands the body over as text). */
function statusOf(err: unknown): Record<string, unknown> {
  const body = (err as ApiException<unknown>).body;
  return (typeof body === 'string' ? JSON.parse(body) : body) as Record<string, unknown>;
}

const names = (list: { items: { metadata?: { name?: string; namespace?: string } }[] }) =>
  list.items.map((o) => (o.metadata?.namespace ? `${o.metadata.namespace}/${o.metadata.name}` : o.metadata?.name));

/**
 * The read-only resources of the fake API server (namespaces, services, endpointslices,
 * networkpolicies), read through the real @kubernetes/client-node over HTTPS with a token.
 */
describe('fake API server: namespaces, services, endpointslices, networkpolicies', () => {
  let kube: KubeHarness;
  let core: CoreV1Api;
  let discovery: DiscoveryV1Api;
  let networking: NetworkingV1Api;

  beforeAll(async () => {
    kube = await kubeHarness();
    const kc = kube.kubeConfig();
    core = kc.makeApiClient(CoreV1Api);
    discovery = kc.makeApiClient(DiscoveryV1Api);
    networking = kc.makeApiClient(NetworkingV1Api);

    kube.api.putNamespace('db', { team: 'data' });
    kube.api.putNamespace('user', { team: 'ml', tier: 'gpu' });
    kube.api.putNamespace('web');
    kube.api.putService({
      metadata: { name: 'postgres', namespace: 'db', labels: { app: 'postgres' } },
      spec: { selector: { app: 'postgres' }, ports: [{ name: 'pg', port: 5432, protocol: 'TCP' }] },
    });
    kube.api.putService({
      metadata: { name: 'redis', namespace: 'db', labels: { app: 'redis' } },
      spec: { selector: { app: 'redis' }, ports: [{ port: 6379 }], clusterIP: 'None' },
    });
    kube.api.putService({ metadata: { name: 'frontend', namespace: 'web' }, spec: { ports: [{ port: 80 }] } });
    kube.api.putEndpointSlice({
      metadata: { name: 'postgres-abcde', namespace: 'db', labels: { 'kubernetes.io/service-name': 'postgres' } },
      endpoints: [{ addresses: ['10.244.1.7'], conditions: { ready: true } }],
      ports: [{ name: 'pg', port: 5432, protocol: 'TCP' }],
    });
    kube.api.putEndpointSlice({
      metadata: { name: 'redis-fghij', namespace: 'db', labels: { 'kubernetes.io/service-name': 'redis' } },
      endpoints: [{ addresses: ['10.244.2.9'] }],
      ports: [{ port: 6379 }],
    });
    kube.api.putNetworkPolicy({
      metadata: { name: 'default-deny', namespace: 'db' },
      spec: { podSelector: {} },
    });
    kube.api.putNetworkPolicy({
      metadata: { name: 'allow-user', namespace: 'db' },
      spec: {
        podSelector: { matchLabels: { app: 'postgres' } },
        ingress: [{ from: [{ namespaceSelector: { matchLabels: { team: 'ml' } } }], ports: [{ port: 5432 }] }],
        egress: [{ to: [{ ipBlock: { cidr: '10.0.0.0/8' } }] }],
      },
    });
    kube.api.putNetworkPolicy({ metadata: { name: 'web-open', namespace: 'web' }, spec: {} });
  });

  afterAll(async () => {
    await kube?.close();
  });

  beforeEach(() => {
    kube.api.clearFailures();
  });

  it('reads a namespace, with the kubernetes.io/metadata.name label the API server sets', async () => {
    const ns = await core.readNamespace({ name: 'user' });
    expect(ns).toMatchObject({
      apiVersion: 'v1',
      kind: 'Namespace',
      metadata: { name: 'user', labels: { team: 'ml', tier: 'gpu', 'kubernetes.io/metadata.name': 'user' } },
      status: { phase: 'Active' },
    });
    expect(ns.metadata?.namespace).toBeUndefined();
    expect(ns.metadata?.uid).toMatch(/^[0-9a-f-]{36}$/);
    expect(Number(ns.metadata?.resourceVersion)).toBeGreaterThan(100);
    expect(ns.metadata?.creationTimestamp).toBeInstanceOf(Date);
  });

  it('lists namespaces by labelSelector as a NamespaceList', async () => {
    const all = await core.listNamespace();
    expect(all).toMatchObject({ apiVersion: 'v1', kind: 'NamespaceList' });
    expect(all.metadata?.resourceVersion).toBe(kube.api.resourceVersion);
    expect(names(all)).toEqual(['db', 'user', 'web']);

    expect(names(await core.listNamespace({ labelSelector: 'team=ml' }))).toEqual(['user']);
    expect(names(await core.listNamespace({ labelSelector: 'team' }))).toEqual(['db', 'user']);
    expect(names(await core.listNamespace({ labelSelector: '!team' }))).toEqual(['web']);
    expect(names(await core.listNamespace({ labelSelector: 'kubernetes.io/metadata.name in (db,web)' }))).toEqual([
      'db',
      'web',
    ]);
    expect(names(await core.listNamespace({ fieldSelector: 'metadata.name=web' }))).toEqual(['web']);
  });

  it('relabels a namespace, keeping its metadata.name label', async () => {
    const before = await core.readNamespace({ name: 'web' });
    kube.api.labelNamespace('web', { team: 'ml' });
    const after = await core.readNamespace({ name: 'web' });
    expect(after.metadata?.labels).toEqual({ team: 'ml', 'kubernetes.io/metadata.name': 'web' });
    expect(after.metadata?.uid).toBe(before.metadata?.uid);
    expect(Number(after.metadata?.resourceVersion)).toBeGreaterThan(Number(before.metadata?.resourceVersion));
    expect(names(await core.listNamespace({ labelSelector: 'team=ml' }))).toEqual(['user', 'web']);
    kube.api.labelNamespace('web', {});
    expect(names(await core.listNamespace({ labelSelector: 'team=ml' }))).toEqual(['user']);
  });

  it('pages a namespace list with limit and continue', async () => {
    const first = await core.listNamespace({ limit: 2 });
    expect(names(first)).toEqual(['db', 'user']);
    expect(first.metadata?._continue).toEqual(expect.any(String));
    const rest = await core.listNamespace({ limit: 2, _continue: first.metadata?._continue });
    expect(names(rest)).toEqual(['web']);
    expect(rest.metadata?._continue).toBeUndefined();
  });

  it('reads and lists services, in a namespace and across all', async () => {
    const pg = await core.readNamespacedService({ name: 'postgres', namespace: 'db' });
    expect(pg).toMatchObject({
      apiVersion: 'v1',
      kind: 'Service',
      metadata: { name: 'postgres', namespace: 'db', labels: { app: 'postgres' } },
      spec: { type: 'ClusterIP', selector: { app: 'postgres' }, ports: [{ name: 'pg', port: 5432, protocol: 'TCP' }] },
    });
    expect(pg.spec?.clusterIP).toMatch(/^10\.96\.\d+\.\d+$/);
    expect(pg.spec?.clusterIPs).toEqual([pg.spec?.clusterIP]);
    expect((await core.readNamespacedService({ name: 'redis', namespace: 'db' })).spec?.clusterIP).toBe('None');

    const inDb = await core.listNamespacedService({ namespace: 'db' });
    expect(inDb).toMatchObject({ apiVersion: 'v1', kind: 'ServiceList' });
    expect(names(inDb)).toEqual(['db/postgres', 'db/redis']);
    expect(names(await core.listNamespacedService({ namespace: 'db', labelSelector: 'app=redis' }))).toEqual([
      'db/redis',
    ]);
    expect(names(await core.listServiceForAllNamespaces())).toEqual(['db/postgres', 'db/redis', 'web/frontend']);

    // Replacing a Service keeps its uid and cluster IP.
    kube.api.putService({
      metadata: { name: 'postgres', namespace: 'db', labels: { app: 'postgres', v: '2' } },
      spec: { selector: { app: 'postgres' }, ports: [{ port: 5433 }] },
    });
    const replaced = await core.readNamespacedService({ name: 'postgres', namespace: 'db' });
    expect(replaced.metadata?.uid).toBe(pg.metadata?.uid);
    expect(replaced.spec?.clusterIP).toBe(pg.spec?.clusterIP);
    expect(replaced.spec?.ports).toEqual([{ port: 5433 }]);
  });

  it("lists a Service's EndpointSlices by the kubernetes.io/service-name label", async () => {
    const slices = await discovery.listNamespacedEndpointSlice({
      namespace: 'db',
      labelSelector: 'kubernetes.io/service-name=postgres',
    });
    expect(slices).toMatchObject({ apiVersion: 'discovery.k8s.io/v1', kind: 'EndpointSliceList' });
    expect(slices.metadata?.resourceVersion).toBe(kube.api.resourceVersion);
    expect(slices.items).toMatchObject([
      {
        apiVersion: 'discovery.k8s.io/v1',
        kind: 'EndpointSlice',
        metadata: { name: 'postgres-abcde', namespace: 'db' },
        addressType: 'IPv4',
        endpoints: [{ addresses: ['10.244.1.7'], conditions: { ready: true } }],
        ports: [{ name: 'pg', port: 5432, protocol: 'TCP' }],
      },
    ]);
    expect(
      names(
        await discovery.listNamespacedEndpointSlice({
          namespace: 'web',
          labelSelector: 'kubernetes.io/service-name=postgres',
        }),
      ),
    ).toEqual([]);
    expect(names(await discovery.listEndpointSliceForAllNamespaces())).toEqual(['db/postgres-abcde', 'db/redis-fghij']);
    const redis = await discovery.readNamespacedEndpointSlice({ name: 'redis-fghij', namespace: 'db' });
    expect(redis.endpoints).toEqual([{ addresses: ['10.244.2.9'] }]);
  });

  it('lists and reads NetworkPolicies, with the policyTypes the API server defaults', async () => {
    const policies = await networking.listNamespacedNetworkPolicy({ namespace: 'db' });
    expect(policies).toMatchObject({ apiVersion: 'networking.k8s.io/v1', kind: 'NetworkPolicyList' });
    expect(names(policies)).toEqual(['db/allow-user', 'db/default-deny']);
    expect(policies.items.map((p) => [p.metadata?.name, p.spec?.policyTypes])).toEqual([
      ['allow-user', ['Ingress', 'Egress']],
      ['default-deny', ['Ingress']],
    ]);
    const allow = await networking.readNamespacedNetworkPolicy({ name: 'allow-user', namespace: 'db' });
    expect(allow).toMatchObject({
      apiVersion: 'networking.k8s.io/v1',
      kind: 'NetworkPolicy',
      spec: {
        podSelector: { matchLabels: { app: 'postgres' } },
        // The client names the rule's `from` `_from`.
        ingress: [{ _from: [{ namespaceSelector: { matchLabels: { team: 'ml' } } }], ports: [{ port: 5432 }] }],
      },
    });
    expect((await networking.readNamespacedNetworkPolicy({ name: 'web-open', namespace: 'web' })).spec).toEqual({
      podSelector: {},
      policyTypes: ['Ingress'],
    });
    expect(names(await networking.listNetworkPolicyForAllNamespaces())).toEqual([
      'db/allow-user',
      'db/default-deny',
      'web/web-open',
    ]);
  });

  it('answers 404 NotFound for a missing or deleted object, as an ApiException', async () => {
    const noNs = await failure(core.readNamespace({ name: 'nope' }));
    expect(noNs).toBeInstanceOf(ApiException);
    expect((noNs as ApiException<unknown>).code).toBe(404);
    expect(statusOf(noNs)).toMatchObject({
      kind: 'Status',
      reason: 'NotFound',
      message: 'namespaces "nope" not found',
    });

    const noSvc = await failure(core.readNamespacedService({ name: 'postgres', namespace: 'web' }));
    expect((noSvc as ApiException<unknown>).code).toBe(404);

    kube.api.putEndpointSlice({
      metadata: { name: 'gone-xyz', namespace: 'db', labels: { 'kubernetes.io/service-name': 'gone' } },
    });
    const slice = await discovery.readNamespacedEndpointSlice({ name: 'gone-xyz', namespace: 'db' });
    expect(slice.endpoints).toEqual([]);
    kube.api.deleteObject('endpointslices', 'db', 'gone-xyz');
    const noSlice = await failure(discovery.readNamespacedEndpointSlice({ name: 'gone-xyz', namespace: 'db' }));
    expect(noSlice).toBeInstanceOf(ApiException);
    expect((noSlice as ApiException<unknown>).code).toBe(404);
    expect(statusOf(noSlice)).toMatchObject({
      reason: 'NotFound',
      message: 'endpointslices.discovery.k8s.io "gone-xyz" not found',
      details: { name: 'gone-xyz', group: 'discovery.k8s.io', kind: 'endpointslices' },
    });
    expect(kube.api.getObject('endpointslices', 'db', 'gone-xyz')).toBeUndefined();
    expect(() => kube.api.deleteObject('endpointslices', 'db', 'gone-xyz')).toThrow(/no endpointslices db\/gone-xyz/);

    kube.api.putNamespace('temp');
    kube.api.deleteObject('namespaces', undefined, 'temp');
    expect(((await failure(core.readNamespace({ name: 'temp' }))) as ApiException<unknown>).code).toBe(404);
  });

  it('serves these resources read-only', async () => {
    const err = await failure(core.createNamespace({ body: { metadata: { name: 'new' } } }));
    expect((err as ApiException<unknown>).code).toBe(405);
    expect(kube.api.getObject('namespaces', undefined, 'new')).toBeUndefined();
  });

  it('fails the calls failNext picks, then serves again', async () => {
    kube.api.failNext(503, 1, (c) => c.group === 'networking.k8s.io');
    const err = await failure(networking.listNamespacedNetworkPolicy({ namespace: 'db' }));
    expect((err as ApiException<unknown>).code).toBe(503);
    expect(names(await networking.listNamespacedNetworkPolicy({ namespace: 'db' }))).toEqual([
      'db/allow-user',
      'db/default-deny',
    ]);
  });

  it('still routes pods under /api/v1/namespaces/{ns}/pods next to /api/v1/namespaces/{name}', async () => {
    kube.api.createPod({ metadata: { name: 'p', namespace: 'db' } });
    expect(names(await core.listNamespacedPod({ namespace: 'db' }))).toEqual(['db/p']);
    expect((await core.readNamespace({ name: 'db' })).metadata?.name).toBe('db');
    expect((await core.readNamespacedPod({ name: 'p', namespace: 'db' })).kind).toBe('Pod');
  });

  it('records every call as (verb, group, resource)', async () => {
    const from = kube.api.calls.length;
    await core.readNamespace({ name: 'db' });
    await core.listNamespace({ labelSelector: 'team=ml' });
    await core.readNamespacedService({ name: 'postgres', namespace: 'db' });
    await core.listServiceForAllNamespaces();
    await discovery.listNamespacedEndpointSlice({ namespace: 'db', labelSelector: 'kubernetes.io/service-name=x' });
    await networking.listNamespacedNetworkPolicy({ namespace: 'web' });
    await core.listNamespacedPod({ namespace: 'db' });
    expect(
      kube.api.calls.slice(from).map(({ verb, group, resource, namespace, name }) => ({
        verb,
        group,
        resource,
        namespace,
        name,
      })),
    ).toEqual([
      { verb: 'get', group: '', resource: 'namespaces', namespace: undefined, name: 'db' },
      { verb: 'list', group: '', resource: 'namespaces', namespace: undefined, name: undefined },
      { verb: 'get', group: '', resource: 'services', namespace: 'db', name: 'postgres' },
      { verb: 'list', group: '', resource: 'services', namespace: undefined, name: undefined },
      { verb: 'list', group: 'discovery.k8s.io', resource: 'endpointslices', namespace: 'db', name: undefined },
      { verb: 'list', group: 'networking.k8s.io', resource: 'networkpolicies', namespace: 'web', name: undefined },
      { verb: 'list', group: '', resource: 'pods', namespace: 'db', name: undefined },
    ]);
    expect(kube.api.calls[from + 1]?.query).toMatchObject({ labelSelector: 'team=ml' });
    expect(kube.api.calls[from + 4]?.query).toMatchObject({ labelSelector: 'kubernetes.io/service-name=x' });
    for (const access of ['namespaces.get', 'namespaces.list', 'services.get', 'endpointslices.list']) {
      expect([...kube.api.usedAccess()]).toContain(access);
    }
  });
});
