import { createServer } from 'node:net';
import { PassThrough } from 'node:stream';
import { Client } from 'ssh2';
import { describe, expect, it } from 'vitest';
import { parseSiteConfig } from '../../src/contract/site-config.js';
import { dialAddress } from '../../src/ssh/host-aliases.js';
import { ReverseForwards } from '../../src/ssh/reverse-forwards.js';
import { loopbackDialer } from '../../tools/sandbox/dial-rules.js';

const SITE = { Network: { SSH: { LoginHost: 'login', User: 'u', KeyFile: '/k', KnownHostsFile: '/kh' } } };

describe('Backhaul.HostAliases', () => {
  it('is empty by default and maps host names to IPv4 addresses', () => {
    expect(parseSiteConfig(SITE).Backhaul.HostAliases).toEqual({});
    const config = parseSiteConfig({
      ...SITE,
      Backhaul: { HostAliases: { 'minio.demo.svc.cluster.local': '127.0.0.9' } },
    });
    expect(config.Backhaul.HostAliases).toEqual({ 'minio.demo.svc.cluster.local': '127.0.0.9' });
  });

  it.each([
    [{ bad_name: '127.0.0.1' }, 'Backhaul.HostAliases.bad_name: expected a DNS host name'],
    [{ minio: '::1' }, 'Backhaul.HostAliases.minio: expected an IPv4 address'],
    [{ minio: 'minio.example.org' }, 'Backhaul.HostAliases.minio: expected an IPv4 address'],
  ])('refuses %j, naming the key', (aliases, message) => {
    expect(() => parseSiteConfig({ ...SITE, Backhaul: { HostAliases: aliases } })).toThrow(message);
  });

  it('resolves a name through the map (case-insensitively) and leaves other names to DNS', () => {
    const aliases = { 'Minio.Demo.svc.cluster.local': '127.0.0.9' };
    expect(dialAddress('minio.demo.svc.cluster.local', aliases)).toBe('127.0.0.9');
    expect(dialAddress('MINIO.demo.svc.cluster.local', aliases)).toBe('127.0.0.9');
    expect(dialAddress('redis.demo.svc.cluster.local', aliases)).toBe('redis.demo.svc.cluster.local');
    expect(dialAddress('constructor', aliases)).toBe('constructor');
    expect(dialAddress('10.0.0.1')).toBe('10.0.0.1');
  });

  it('makes a forward dial the alias of its endpoint name', async () => {
    let dialed = 0;
    const server = createServer((s) => {
      dialed += 1;
      s.end();
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const port = (server.address() as { port: number }).port;
    const client = new Client();
    // The name does not resolve here: only the alias can reach the server.
    const target = { socketPath: '/tmp/bh-x/9000.sock', dialHost: 'minio.demo.svc.cluster.local', port };
    const forwards = new ReverseForwards(
      client,
      [target],
      [],
      { warn: () => undefined },
      { dialer: loopbackDialer('demo', { 'minio.demo.svc.cluster.local': '127.0.0.1' }) },
    );
    const outcome = await new Promise<string>((resolve) =>
      client.emit(
        'unix connection',
        { socketPath: target.socketPath },
        () => {
          resolve('accepted');
          // ssh2 hands back the channel to pipe into: a PassThrough stands in for it.
          return new PassThrough();
        },
        () => resolve('rejected'),
      ),
    );
    expect(outcome).toBe('accepted');
    await new Promise((r) => setTimeout(r, 100));
    expect(dialed).toBe(1);
    expect(forwards.stats.connections).toBe(1);
    server.close();
  });
});
