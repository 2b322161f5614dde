import { createServer, type Server, type Socket } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DEFAULT_ENDPOINT_POLICY, endpointPolicySchema } from '../../src/contract/endpoint-policy.js';
import { EndpointDialer, EndpointRefusedError } from '../../src/ssh/endpoint-dial.js';
import { loopbackDialer } from '../../tools/sandbox/dial-rules.js';

let server: Server;
let port = 0;
let accepted = 0;

beforeAll(async () => {
  server = createServer((s) => {
    accepted += 1;
    // The tests' clients close at once: a reset here is theirs, not an error.
    s.on('error', () => undefined);
    s.end('hi');
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  port = (server.address() as { port: number }).port;
});

afterAll(() => {
  server.close();
});

/** 'connected' or the error the socket failed with. */
function outcome(socket: Socket): Promise<string> {
  return new Promise((resolve) => {
    socket.once('connect', () => {
      socket.destroy();
      resolve('connected');
    });
    socket.once('error', (err) =>
      resolve(err instanceof EndpointRefusedError ? `refused: ${err.message}` : err.message),
    );
  });
}

const strict = (hostAliases: Record<string, string> = {}) =>
  new EndpointDialer({ hostAliases, endpointPolicy: DEFAULT_ENDPOINT_POLICY, clusterDomain: 'cluster.local' }, 'user');

describe('dialling an endpoint checks the address it resolves to', () => {
  it('loopback by name, or by an alias to it, is refused, and nothing is dialled', async () => {
    const before = accepted;
    expect(await outcome(strict().dial('localhost', port))).toBe(
      "refused: localhost is the fleet's own loopback; only a CIDR rule inside 127.0.0.0/8 in Backhaul.EndpointPolicy opens it",
    );
    // A HostAliases entry to loopback: the same.
    expect(
      await outcome(strict({ 'minio.user.svc.cluster.local': '127.0.0.1' }).dial('minio.user.svc.cluster.local', port)),
    ).toBe(
      'refused: minio.user.svc.cluster.local (127.0.0.1) is loopback (the fleet itself), never reached unless a CIDR rule inside 127.0.0.0/8 in Backhaul.EndpointPolicy names it',
    );
    await new Promise((r) => setTimeout(r, 50));
    expect(accepted).toBe(before);
  });

  it('where a rule names loopback, the same connections go through', async () => {
    expect(await outcome(loopbackDialer().dial('127.0.0.1', port))).toBe('connected');
    const aliased = loopbackDialer('user', { 'minio.user.svc.cluster.local': '127.0.0.1' });
    expect(await outcome(aliased.dial('minio.user.svc.cluster.local', port))).toBe('connected');
  });

  it('a name outside the cluster is asked of DNS as an absolute name: /etc/hosts and the search path are not used', async () => {
    // /etc/hosts maps bhnode1 (the loopback site's node) and localhost; as absolute names DNS knows neither.
    const anyHost = new EndpointDialer(
      {
        hostAliases: {},
        endpointPolicy: endpointPolicySchema.parse({ Allow: { CIDRs: ['127.0.0.0/8'], Hosts: ['*'] } }),
        clusterDomain: 'cluster.local',
      },
      'user',
    );
    expect(await outcome(anyHost.dial('localhost', port))).toMatch(/ENOTFOUND localhost\.$/);
  });

  it('a Service without a Kubernetes API to ask is not dialled, and says how to name its address', async () => {
    expect(await outcome(strict().dial('minio.user.svc.cluster.local', 9000))).toBe(
      'Service minio.user: no Kubernetes API to look Service minio.user up (Backhaul.Kubernetes.Kubeconfig, or Backhaul.HostAliases naming its address)',
    );
  });

  it('metadata is refused even where loopback is open', async () => {
    expect(await outcome(loopbackDialer().dial('169.254.169.254', 80))).toContain(
      'refused: 169.254.169.254 is link-local',
    );
  });
});

describe('SOCKS destinations: checked by name, bare names are the pod namespace Services', () => {
  it("the fleet's Redis, another tenant and metadata are refused by name; allowed ones are dialled", async () => {
    const d = loopbackDialer();
    expect(await outcome(d.dialSocks('backhaul-redis.backhaul.svc.cluster.local', 6379))).toContain(
      "refused: Service backhaul-redis.backhaul is in the fleet's own namespace",
    );
    expect(await outcome(d.dialSocks('postgres.tenant-b.svc', 5432))).toContain('refused: Service postgres.tenant-b');
    expect(await outcome(d.dialSocks('169.254.169.254', 80))).toContain('refused: 169.254.169.254 is link-local');
    expect(await outcome(d.dialSocks('example.org', 443))).toContain(
      'refused: host example.org is outside the cluster',
    );
    expect(await outcome(d.dialSocks('127.0.0.1', port))).toBe('connected');
  });

  it('a bare name is dialled as the Service of the pod namespace, not searched in the fleet namespace', async () => {
    const d = new EndpointDialer(
      {
        hostAliases: { 'redis.user.svc.cluster.local': '127.0.0.1' },
        endpointPolicy: endpointPolicySchema.parse({ Allow: { CIDRs: ['127.0.0.0/8'] } }),
        clusterDomain: 'cluster.local',
      },
      'user',
    );
    // Reaches the server only through the alias of its fully qualified name.
    expect(await outcome(d.dialSocks('redis', port))).toBe('connected');
  });
});
