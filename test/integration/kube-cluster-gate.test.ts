import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ClusterGate } from '../../src/cluster/cluster-gate.js';
import { EventRecorder } from '../../src/cluster/event-recorder.js';
import { KUBE_API_ACCESS, KUBE_API_GROUP } from '../../src/cluster/kube-api.js';
import { PodWatcher } from '../../src/cluster/pod-watcher.js';
import { ANNOTATION } from '../../src/contract/annotations.js';
import { CLUSTER_VERDICT } from '../../src/contract/cluster-verdict.js';
import type { SiteConfig } from '../../src/contract/site-config.js';
import { type RunningFleet, startFleet } from '../../src/fleet/fleet.js';
import { silentLogger } from '../../src/log.js';
import { restorePod } from '../../src/machines/pod-machine.js';
import { sendEvent } from '../../src/pods/queues.js';
import { createRedis } from '../../src/store/redis.js';
import { privateRedis } from '../fixtures/fleet-harness.js';
import { type KubeHarness, kubeHarness, kubeSite, VIRTUAL_NODE, waitFor } from '../fixtures/kube-harness.js';

const DB = 13;
const OPT_IN = { 'interlink.eu/backhaul': 'enabled' };

/**
 * The cluster gate with the real watcher, control role and client library against the fake API server:
 * a pod is served only in a namespace that opted in, and only with forwards the cluster's NetworkPolicies
 * would allow to a pod of its namespace and labels (its own egress, the destination's ingress).
 */
describe('cluster gate: namespace opt-in and NetworkPolicies (watch and control roles)', () => {
  let kube: KubeHarness;
  let redis: Awaited<ReturnType<typeof privateRedis>>;
  let config: SiteConfig;
  let fleet: RunningFleet;
  let watcher: PodWatcher;
  let recorder: EventRecorder;

  const machine = async (uid: string) => {
    const stored = await fleet.deps.store.load(uid);
    if (!stored) return undefined;
    const restored = restorePod(stored.snapshot);
    if (!restored.ok) throw new Error(`cannot restore ${uid}`);
    return { state: stored.state, context: restored.snapshot.context };
  };
  const settled = (uid: string, states: readonly string[]) =>
    waitFor(`the machine of ${uid} in ${states.join('/')}`, async () => {
      const m = await machine(uid);
      return m && states.includes(m.state) ? m : undefined;
    });
  const pod = (
    namespace: string,
    name: string,
    forwards: string,
    labels: Record<string, string> = { app: 'train' },
  ) => {
    kube.api.createPod({ metadata: { name, namespace, labels, annotations: { [ANNOTATION.forwards]: forwards } } });
    return kube.api.schedule(namespace, name, VIRTUAL_NODE).metadata.uid;
  };
  const eventsOf = (namespace: string, name: string) =>
    kube.api
      .listEvents(namespace)
      .filter((e) => (e.involvedObject as { name?: string }).name === name)
      .map((e) => ({ reason: e.reason, message: e.message }));

  beforeAll(async () => {
    kube = await kubeHarness();
    redis = await privateRedis(DB);
    config = kubeSite(redis.url, kube.kubeconfigFile, {
      NamespaceLabel: 'interlink.eu/backhaul=enabled',
      NetworkPolicies: true,
      // The gate's reads are counted here: no pod status writes (each would be a watch event to check).
      PodCondition: false,
    });
    const connection = createRedis(redis.url);
    fleet = await startFleet(config, connection, silentLogger(), {
      roles: ['control'],
      bullPrefix: 'bhgate',
      reaperEveryMs: 60_000,
    });
    const stop = fleet.stop;
    fleet.stop = async () => {
      await stop();
      connection.disconnect();
    };

    kube.api.putNamespace('team-a', OPT_IN);
    kube.api.putNamespace('tenant-b', { ...OPT_IN, team: 'b' });
    kube.api.putNamespace('quiet');
    // tenant-b/postgres: one ready pod behind it.
    kube.api.createPod({
      metadata: { name: 'postgres-0', namespace: 'tenant-b', labels: { app: 'db' } },
      spec: { containers: [{ name: 'pg', ports: [{ name: 'pg', containerPort: 5432 }] }] },
    });
    kube.api.putService({
      metadata: { name: 'postgres', namespace: 'tenant-b' },
      spec: { selector: { app: 'db' }, ports: [{ name: 'pg', port: 5432, targetPort: 5432 }] },
    });
    kube.api.putEndpointSlice({
      metadata: { name: 'postgres-x1', namespace: 'tenant-b', labels: { 'kubernetes.io/service-name': 'postgres' } },
      ports: [{ name: 'pg', port: 5432, protocol: 'TCP' }],
      endpoints: [
        {
          addresses: ['10.1.0.5'],
          conditions: { ready: true },
          targetRef: { kind: 'Pod', name: 'postgres-0', namespace: 'tenant-b' },
        },
      ],
    });
    // team-a/cache: a Service of the pod's own namespace, with no endpoint ready yet.
    kube.api.putService({
      metadata: { name: 'cache', namespace: 'team-a' },
      spec: { selector: { app: 'cache' }, ports: [{ port: 6379, targetPort: 6379 }] },
    });

    recorder = EventRecorder.fromKubeConfig(kube.kubeConfig(), { log: silentLogger(), instance: 'fleet-0' });
    watcher = new PodWatcher(fleet.deps, kube.kubeConfig(), config.Backhaul.Kubernetes, {
      resyncMs: 600_000,
      backoffBaseMs: 100,
      backoffMaxMs: 1_000,
      watchTimeoutSeconds: 60,
      // Each test changes policies and expects the next check to see them (the fleet keeps them 10 s).
      clusterCacheMs: 0,
      recorder,
    });
    watcher.start();
    await watcher.whenSynced();
  });

  afterAll(async () => {
    await watcher?.stop();
    await recorder?.flush();
    await fleet?.stop();
    await redis?.close();
    await kube?.close();
  });

  it('refuses a pod of a namespace without the opt-in label: the machine fails naming the label, and an Event says so', async () => {
    const uid = pod('quiet', 'unlabelled', 'cache.quiet.svc.cluster.local:6379');
    const m = await settled(uid, ['failed']);
    expect(m.context.lastError?.message).toMatch(
      /namespace quiet is not labelled interlink\.eu\/backhaul=enabled: this site serves only the namespaces that opted in/,
    );
    expect(m.context.annotations[CLUSTER_VERDICT]).toMatch(/^refused: namespace quiet is not labelled/);
    await recorder.flush();
    expect(eventsOf('quiet', 'unlabelled')).toContainEqual({
      reason: 'ReverseRefused',
      message: expect.stringMatching(/kubectl label namespace quiet interlink\.eu\/backhaul=enabled/),
    });
  });

  it('does not take a verdict a pod writes itself: the key is not among the annotations the watcher reads', async () => {
    kube.api.createPod({
      metadata: {
        name: 'forger',
        namespace: 'quiet',
        labels: { app: 'train' },
        annotations: { [ANNOTATION.forwards]: 'cache.quiet.svc.cluster.local:6379', [CLUSTER_VERDICT]: 'ok' },
      },
    });
    const uid = kube.api.schedule('quiet', 'forger', VIRTUAL_NODE).metadata.uid;
    const m = await settled(uid, ['failed']);
    expect(m.context.annotations[CLUSTER_VERDICT]).toMatch(/^refused: namespace quiet is not labelled/);
  });

  it('serves a pod of an opted-in namespace whose forwards no NetworkPolicy refuses', async () => {
    const uid = pod('team-a', 'allowed', 'cache:6379 postgres.tenant-b.svc:5432');
    const m = await settled(uid, ['launchingShadow']);
    expect(m.context.annotations[CLUSTER_VERDICT]).toBe('ok');
  });

  it("refuses a forward the pod's own egress policy denies, naming the policy and the endpoint", async () => {
    kube.api.putNetworkPolicy({
      metadata: { name: 'own-namespace-only', namespace: 'team-a' },
      spec: {
        podSelector: { matchLabels: { app: 'locked' } },
        policyTypes: ['Egress'],
        egress: [{ to: [{ namespaceSelector: { matchLabels: { 'kubernetes.io/metadata.name': 'team-a' } } }] }],
      },
    });
    const refused = pod('team-a', 'locked-db', 'postgres.tenant-b.svc:5432', { app: 'locked' });
    const m = await settled(refused, ['failed']);
    expect(m.context.lastError?.message).toMatch(
      /forward 5432 to postgres\.tenant-b\.svc:5432: NetworkPolicy team-a\/own-namespace-only selects pods with the labels of this pod \(app=locked\) for egress, and none of its egress rules allows TCP port 5432 to postgres\.tenant-b \(pod postgres-0, 10\.1\.0\.5:5432\)/,
    );
    // The same labels may still reach their own namespace (the Service's selector stands in for its pods).
    const inside = pod('team-a', 'locked-cache', 'cache:6379', { app: 'locked' });
    expect((await settled(inside, ['launchingShadow'])).context.annotations[CLUSTER_VERDICT]).toBe('ok');
  });

  it("refuses a forward the destination's ingress policy denies, naming that policy", async () => {
    kube.api.putNetworkPolicy({
      metadata: { name: 'db-from-own-team', namespace: 'tenant-b' },
      spec: {
        podSelector: { matchLabels: { app: 'db' } },
        policyTypes: ['Ingress'],
        ingress: [{ from: [{ namespaceSelector: { matchLabels: { team: 'b' } } }] }],
      },
    });
    try {
      const uid = pod('team-a', 'cross-tenant', 'postgres.tenant-b.svc:5432');
      const m = await settled(uid, ['failed']);
      expect(m.context.lastError?.message).toMatch(
        /NetworkPolicy tenant-b\/db-from-own-team selects pod tenant-b\/postgres-0 for ingress, and none of its ingress rules allows TCP port 5432 from a pod of namespace team-a with labels app=train/,
      );
    } finally {
      kube.api.deleteObject('networkpolicies', 'tenant-b', 'db-from-own-team');
    }
  });

  it('tears down a served pod once a policy refuses it (at the next resync), with an Event', async () => {
    const uid = pod('team-a', 'later', 'postgres.tenant-b.svc:5432', { app: 'later' });
    await settled(uid, ['launchingShadow']);
    kube.api.putNetworkPolicy({
      metadata: { name: 'deny-all-egress', namespace: 'team-a' },
      spec: { podSelector: { matchLabels: { app: 'later' } }, policyTypes: ['Egress'] },
    });
    // No pod event: only the level-triggered resync can notice.
    await watcher.resync();
    const history = await waitFor('the machine to be torn down', async () => {
      const m = await machine(uid);
      if (m && m.state !== 'done' && m.state !== 'tearingDown') return undefined;
      return fleet.deps.store.history(uid);
    });
    expect(JSON.stringify(history)).toContain('refused-by-cluster');
    await recorder.flush();
    expect(eventsOf('team-a', 'later')).toContainEqual({
      reason: 'ReverseRefused',
      message: expect.stringMatching(/NetworkPolicy team-a\/deny-all-egress selects pods with the labels of this pod/),
    });
  });

  it('serves a refused pod once its namespace opts in (at the next resync): validated again, no RETRY needed', async () => {
    kube.api.putNamespace('late');
    const uid = pod('late', 'early-bird', 'cache.late.svc.cluster.local:6379');
    const refused = await settled(uid, ['failed']);
    expect(refused.context.lastError?.message).toMatch(/namespace late is not labelled/);
    kube.api.labelNamespace('late', OPT_IN);
    // No pod event: the label is on the namespace.
    await watcher.resync();
    const served = await settled(uid, ['launchingShadow']);
    expect(served.context.annotations[CLUSTER_VERDICT]).toBe('ok');
    expect(JSON.stringify(await fleet.deps.store.history(uid))).not.toContain('RETRY');
  });

  it('gives a pod torn down by a policy its tunnel back once the policy is gone', async () => {
    const uid = pod('team-a', 'again', 'postgres.tenant-b.svc:5432', { app: 'again' });
    await settled(uid, ['launchingShadow']);
    kube.api.putNetworkPolicy({
      metadata: { name: 'deny-again', namespace: 'team-a' },
      spec: { podSelector: { matchLabels: { app: 'again' } }, policyTypes: ['Egress'] },
    });
    await watcher.resync();
    await waitFor('the machine torn down and forgotten', async () =>
      (await machine(uid)) === undefined ? true : undefined,
    );
    // Still refused: a resync starts nothing.
    await watcher.resync();
    await new Promise((r) => setTimeout(r, 500));
    expect(await machine(uid)).toBeUndefined();
    kube.api.deleteObject('networkpolicies', 'team-a', 'deny-again');
    await watcher.resync();
    const back = await settled(uid, ['launchingShadow']);
    expect(back.context.annotations[CLUSTER_VERDICT]).toBe('ok');
  });

  it("a Service with no endpoint yet: its pods' named ports resolve its targetPort and the policy's named port", async () => {
    // team-a/web: targetPort "http" (8080 on its pod), no EndpointSlice yet; an ingress policy on its pods
    // admits app=train on the port named "http" only.
    kube.api.createPod({
      metadata: { name: 'web-0', namespace: 'team-a', labels: { app: 'web' } },
      spec: { containers: [{ name: 'web', ports: [{ name: 'http', containerPort: 8080 }] }] },
    });
    kube.api.putService({
      metadata: { name: 'web', namespace: 'team-a' },
      spec: { selector: { app: 'web' }, ports: [{ port: 80, targetPort: 'http' }] },
    });
    kube.api.putNetworkPolicy({
      metadata: { name: 'web-from-train', namespace: 'team-a' },
      spec: {
        podSelector: { matchLabels: { app: 'web' } },
        policyTypes: ['Ingress'],
        ingress: [{ from: [{ podSelector: { matchLabels: { app: 'train' } } }], ports: [{ port: 'http' }] }],
      },
    });
    const served = pod('team-a', 'browser', '8080:web.team-a.svc.cluster.local:80');
    const first = await settled(served, ['launchingShadow', 'failed']);
    expect(first.state, first.context.lastError?.message).toBe('launchingShadow');
    // Another pod's labels are not admitted: refused, naming the policy.
    const other = pod('team-a', 'stranger', '8080:web.team-a.svc.cluster.local:80', { app: 'stranger' });
    const refused = await settled(other, ['failed', 'launchingShadow']);
    expect(refused.state).toBe('failed');
    expect(refused.context.lastError?.message).toContain('team-a/web-from-train');
  });

  it("refuses a forward to the pod's own ExternalName Service pointing at the fleet's namespace, even where every namespace is allowed", async () => {
    kube.api.putService({
      metadata: { name: 'r', namespace: 'team-a' },
      spec: { type: 'ExternalName', externalName: 'backhaul-redis.backhaul.svc.cluster.local' },
    });
    const uid = pod('team-a', 'via-external-name', '16379:r.team-a.svc.cluster.local:6379');
    const m = await settled(uid, ['failed', 'launchingShadow']);
    expect(m.state).toBe('failed');
    expect(m.context.lastError?.message).toContain(
      "forward 16379 to r.team-a.svc.cluster.local:6379: Service r.team-a is an ExternalName for backhaul-redis.backhaul.svc.cluster.local: Service backhaul-redis.backhaul is in the fleet's own namespace (backhaul)",
    );
  });

  it('the control role refuses a machine that no watcher checked (a POD_UPSERT sent by hand)', async () => {
    const uid = 'hand-made-0000-4000-8000-000000000001';
    await sendEvent(fleet.deps.queues, uid, {
      type: 'POD_UPSERT',
      namespace: 'team-a',
      name: 'by-hand',
      annotations: { [ANNOTATION.forwards]: 'cache:6379' },
      at: Date.now(),
    });
    const m = await settled(uid, ['failed']);
    expect(m.context.lastError?.message).toMatch(
      /was not checked against the cluster .* only the watch role may start/,
    );
  });

  it('reads each object once per cache period however often a pod is checked (the fleet default: 10 s)', async () => {
    const gate = new ClusterGate(kube.kubeConfig(), config);
    const asked = {
      namespace: 'team-a',
      labels: { app: 'train' },
      annotations: { [ANNOTATION.forwards]: 'postgres.tenant-b.svc:5432' },
    };
    // The gate's reads only: the fleet of this file writes pod conditions and Events meanwhile.
    const reads = () => kube.api.calls.filter((c) => c.verb === 'get' || c.verb === 'list');
    const before = reads().length;
    expect(await gate.verdict(asked)).toEqual({ ok: true });
    const first = reads()
      .slice(before)
      .map((c) => `${c.resource}.${c.verb}`);
    expect(first.sort()).toEqual(
      [
        'endpointslices.list',
        'namespaces.get',
        'namespaces.get',
        'networkpolicies.list',
        'networkpolicies.list',
        'pods.get',
        'services.get',
      ].sort(),
    );
    for (let i = 0; i < 20; i += 1) expect(await gate.verdict(asked)).toEqual({ ok: true });
    expect(reads().length - before, 'reads after 21 checks').toBe(first.length);
  });

  it('makes only the API calls its RBAC grants', () => {
    const granted = new Set(
      Object.entries(KUBE_API_ACCESS).flatMap(([resource, verbs]) =>
        verbs.map((verb) => `${KUBE_API_GROUP[resource as keyof typeof KUBE_API_ACCESS]}/${resource}.${verb}`),
      ),
    );
    const made = new Set(kube.api.calls.map((c) => `${c.group}/${c.resource}.${c.verb}`));
    for (const call of made) expect(granted, `made ${[...made].join(', ')}`).toContain(call);
    for (const needed of ['/namespaces.get', '/services.get', 'discovery.k8s.io/endpointslices.list']) {
      expect(made).toContain(needed);
    }
    expect(made).toContain('networking.k8s.io/networkpolicies.list');
  });
});
