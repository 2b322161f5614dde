import { createServer, type Server, type Socket } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ClusterDirectory } from '../../src/cluster/cluster-directory.js';
import { endpointPolicySchema } from '../../src/contract/endpoint-policy.js';
import { silentLogger } from '../../src/log.js';
import { EndpointDialer, EndpointRefusedError } from '../../src/ssh/endpoint-dial.js';
import { type KubeHarness, kubeHarness } from '../fixtures/kube-harness.js';

/**
 * Issue 25, item 1: Services through the API, never through DNS. The real ClusterDirectory and dialer
 * against the fake API server; loopback addresses stand for the cluster's (a CIDR rule opens 127/8, as
 * on the loopback site), and a server listens on each address a Service could send a connection to,
 * counting who reached it.
 */
describe('dialling Services as the Kubernetes API has them', () => {
  let kube: KubeHarness;
  let directory: ClusterDirectory;
  const servers: Server[] = [];
  /** Connections each server (by name) accepted. */
  const reached = new Map<string, number>();

  /** A server on ADDRESS:PORT that says NAME and closes. */
  async function listen(name: string, address: string, port: number): Promise<void> {
    const server = createServer((s) => {
      reached.set(name, (reached.get(name) ?? 0) + 1);
      s.on('error', () => undefined);
      s.end(`${name}\n`);
    });
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(port, address, resolve);
    });
    servers.push(server);
  }

  const PORT = 18_080;

  beforeAll(async () => {
    kube = await kubeHarness();
    const { api } = kube;
    // team-a's own Service, with a pod behind it.
    api.createPod({ metadata: { name: 'web-0', namespace: 'team-a', labels: { app: 'web' } } });
    api.updatePod('team-a', 'web-0', (pod) => {
      (pod.status as Record<string, unknown>).podIP = '127.0.1.51';
      (pod.status as Record<string, unknown>).podIPs = [{ ip: '127.0.1.51' }];
    });
    api.putService({
      metadata: { name: 'web', namespace: 'team-a' },
      spec: { clusterIP: '127.0.0.51', selector: { app: 'web' }, ports: [{ port: PORT, protocol: 'TCP' }] },
    });
    api.putEndpointSlice({
      metadata: { name: 'web-abc', namespace: 'team-a', labels: { 'kubernetes.io/service-name': 'web' } },
      endpoints: [
        {
          addresses: ['127.0.1.51'],
          conditions: { ready: true },
          targetRef: { kind: 'Pod', name: 'web-0', namespace: 'team-a' },
        },
      ],
      ports: [{ port: PORT, protocol: 'TCP' }],
    });
    // Another tenant's database, and the fleet's own Redis.
    api.createPod({ metadata: { name: 'postgres-0', namespace: 'tenant-b' } });
    api.updatePod('tenant-b', 'postgres-0', (pod) => {
      (pod.status as Record<string, unknown>).podIP = '127.0.2.52';
    });
    api.putService({
      metadata: { name: 'postgres', namespace: 'tenant-b' },
      spec: { clusterIP: '127.0.0.52', ports: [{ port: PORT, protocol: 'TCP' }] },
    });
    api.createPod({ metadata: { name: 'backhaul-redis-0', namespace: 'backhaul' } });
    api.updatePod('backhaul', 'backhaul-redis-0', (pod) => {
      (pod.status as Record<string, unknown>).podIP = '127.0.3.53';
    });
    api.putService({
      metadata: { name: 'backhaul-redis', namespace: 'backhaul' },
      spec: { clusterIP: '127.0.0.53', ports: [{ port: PORT, protocol: 'TCP' }] },
    });
    // team-a's hostile Services: ExternalNames to the others, and selector-less ones with slices written by hand.
    api.putService({
      metadata: { name: 'r', namespace: 'team-a' },
      spec: { type: 'ExternalName', externalName: 'postgres.tenant-b.svc.cluster.local' },
    });
    api.putService({
      metadata: { name: 'q', namespace: 'team-a' },
      spec: { type: 'ExternalName', externalName: 'backhaul-redis.backhaul.svc.cluster.local' },
    });
    api.putService({
      metadata: { name: 'alias-web', namespace: 'team-a' },
      spec: { type: 'ExternalName', externalName: 'web.team-a.svc.cluster.local' },
    });
    for (const [name, clusterIP, address, targetRef] of [
      ['to-fleet', '127.0.0.54', '127.0.3.53', undefined],
      ['to-tenant', '127.0.0.55', '127.0.2.52', { kind: 'Pod', name: 'web-0', namespace: 'team-a' }],
    ] as const) {
      api.putService({ metadata: { name, namespace: 'team-a' }, spec: { clusterIP, ports: [{ port: PORT }] } });
      api.putEndpointSlice({
        metadata: { name: `${name}-1`, namespace: 'team-a', labels: { 'kubernetes.io/service-name': name } },
        endpoints: [{ addresses: [address], conditions: { ready: true }, ...(targetRef ? { targetRef } : {}) }],
        ports: [{ port: PORT }],
      });
    }
    // A headless Service: its ready endpoint is dialled on the port the pod named.
    api.putService({
      metadata: { name: 'db', namespace: 'team-a' },
      spec: { clusterIP: 'None', selector: { app: 'web' }, ports: [{ port: PORT }] },
    });
    api.putEndpointSlice({
      metadata: { name: 'db-1', namespace: 'team-a', labels: { 'kubernetes.io/service-name': 'db' } },
      endpoints: [
        {
          addresses: ['127.0.1.51'],
          conditions: { ready: true },
          targetRef: { kind: 'Pod', name: 'web-0', namespace: 'team-a' },
        },
      ],
      ports: [{ port: PORT }],
    });
    await listen('web', '127.0.0.51', PORT);
    await listen('web-pod', '127.0.1.51', PORT);
    await listen('tenant-b', '127.0.0.52', PORT);
    await listen('tenant-b-pod', '127.0.2.52', PORT);
    await listen('fleet-redis', '127.0.0.53', PORT);
    await listen('fleet-redis-pod', '127.0.3.53', PORT);
    await listen('to-fleet', '127.0.0.54', PORT);
    await listen('to-tenant', '127.0.0.55', PORT);
    directory = new ClusterDirectory(kube.kubeConfig(), 'backhaul', silentLogger());
    await directory.start();
  });

  afterAll(async () => {
    directory?.stop();
    for (const server of servers) server.close();
    await kube?.close();
  });

  const dialer = (raw: unknown = { Allow: { CIDRs: ['127.0.0.0/8'] } }) =>
    new EndpointDialer(
      { hostAliases: {}, endpointPolicy: endpointPolicySchema.parse(raw), clusterDomain: 'cluster.local' },
      'team-a',
      directory,
    );

  /** What the server said, or `refused: …` / the error. */
  function outcome(socket: Socket): Promise<string> {
    return new Promise((resolve) => {
      let said = '';
      socket.on('data', (d: Buffer) => {
        said += d.toString();
      });
      socket.once('end', () => resolve(said.trim()));
      socket.once('error', (err) =>
        resolve(err instanceof EndpointRefusedError ? `refused: ${err.message}` : `error: ${err.message}`),
      );
    });
  }
  const svc = (name: string, ns = 'team-a') => `${name}.${ns}.svc.cluster.local`;

  it("dials a Service's ClusterIP from the API, and a headless one's ready endpoint", async () => {
    expect(await outcome(dialer().dial(svc('web'), PORT))).toBe('web');
    expect(await outcome(dialer().dial(svc('db'), PORT))).toBe('web-pod');
    // An ExternalName to an allowed Service is that Service.
    expect(await outcome(dialer().dial(svc('alias-web'), PORT))).toBe('web');
  });

  it('refuses an ExternalName to another tenant or to the fleet, judged as the name it points to', async () => {
    const before = new Map(reached);
    expect(await outcome(dialer().dial(svc('r'), PORT))).toBe(
      "refused: Service r.team-a is an ExternalName for postgres.tenant-b.svc.cluster.local: Service postgres.tenant-b is in namespace tenant-b, not the pod's (team-a); Backhaul.EndpointPolicy.AllowByNamespace.team-a.Namespaces (or .Services) would allow it",
    );
    expect(await outcome(dialer().dial(svc('q'), PORT))).toContain(
      "refused: Service q.team-a is an ExternalName for backhaul-redis.backhaul.svc.cluster.local: Service backhaul-redis.backhaul is in the fleet's own namespace",
    );
    // Even where every namespace is allowed, the fleet's is not.
    expect(
      await outcome(dialer({ Allow: { CIDRs: ['127.0.0.0/8'], Namespaces: ['*'] } }).dial(svc('q'), PORT)),
    ).toContain("in the fleet's own namespace");
    expect(reached).toEqual(before);
  });

  it('refuses a Service whose hand-written endpoints lead to the fleet or to another tenant', async () => {
    const before = new Map(reached);
    expect(await outcome(dialer().dial(svc('to-fleet'), PORT))).toBe(
      "refused: an endpoint of Service to-fleet.team-a: 127.0.3.53 is the fleet's own address (its pods, its namespace's Services); only a CIDR rule 127.0.3.53/32 in Backhaul.EndpointPolicy opens it",
    );
    // The slice names team-a's pod, but that pod does not have the address (it is tenant-b's): the
    // directory reads the pod back, so the endpoint counts as written by hand…
    expect(await directory.lookup({ name: 'to-tenant', namespace: 'team-a' })).toMatchObject({
      kind: 'service',
      backends: [{ address: '127.0.2.52', podOfNamespace: false }],
    });
    expect(await directory.lookup({ name: 'web', namespace: 'team-a' })).toMatchObject({
      backends: [{ address: '127.0.1.51', podOfNamespace: true }],
    });
    // …which only a CIDR rule could open (here 127.0.2.52 is also loopback, refused first).
    expect(
      await outcome(dialer({ Allow: { CIDRs: ['127.0.0.0/24', '127.0.1.0/24'] } }).dial(svc('to-tenant'), PORT)),
    ).toBe(
      'refused: an endpoint of Service to-tenant.team-a: 127.0.2.52 is loopback (the fleet itself), never reached unless a CIDR rule inside 127.0.0.0/8 in Backhaul.EndpointPolicy names it',
    );
    expect(reached).toEqual(before);
  });

  it("the fleet's own Services are refused at dial time whatever the rule, unless a rule names them", async () => {
    const broad = dialer({ Allow: { CIDRs: ['0.0.0.0/0', '127.0.0.0/8'], Namespaces: ['*'], Hosts: ['*'] } });
    expect(await outcome(broad.dial('127.0.0.53', PORT))).toContain("127.0.0.53 is the fleet's own address");
    expect(await outcome(broad.dial(svc('backhaul-redis', 'backhaul'), PORT))).toContain("fleet's own namespace");
    const named = dialer({ Allow: { CIDRs: ['127.0.0.0/8'], Services: ['backhaul-redis.backhaul'] } });
    expect(await outcome(named.dial(svc('backhaul-redis', 'backhaul'), PORT))).toBe('fleet-redis');
  });

  it('says what is wrong with a Service that cannot be dialled', async () => {
    expect(await outcome(dialer().dial(svc('nothing'), PORT))).toBe('error: Service nothing.team-a: no such Service');
    expect(await outcome(dialer().dial(svc('web'), 9))).toBe(
      `error: Service web.team-a has no TCP port 9 (its ports: ${PORT})`,
    );
  });
});
