import type { Duplex } from 'node:stream';
import type { Client } from 'ssh2';
import { openDirectTcpip } from '../../src/ssh/direct-tcpip.js';
import { verifyHostKey } from '../../src/ssh/known-hosts.js';
import type { SiteAccess } from '../../src/ssh/site-access.js';
import { connectSsh } from '../../src/ssh/ssh-connect.js';
import type { LoopbackSite } from './loopback-site.js';

/**
 * The node's sshd reached as a node carrier reaches it: a login connection, a direct-tcpip jump from
 * it, and the node connection over the jump, its host key checked against the site's known hosts. The
 * errors of both connections land in `errors` (a test that stops or kills an sshd gets resets there,
 * not as an uncaught exception: seen once when the site stopped while the login connection closed).
 */
export async function connectNodeThroughLogin(
  site: LoopbackSite,
  access: SiteAccess,
  keepalive: { intervalMs: number; countMax?: number },
): Promise<{ login: Client; jump: Duplex; node: Client; errors: Error[] }> {
  const errors: Error[] = [];
  const { client: login } = await connectSsh(access.login);
  login.on('error', (err: Error) => errors.push(err));
  const jump = await openDirectTcpip(login, site.nodeHost, site.nodePort);
  const { client: node } = await connectSsh({
    label: `node sshd ${site.nodeHost}:${site.nodePort}`,
    hop: 'node',
    host: site.nodeHost,
    port: site.nodePort,
    username: access.carrier.user,
    privateKey: access.carrier.privateKey,
    sock: jump,
    keepaliveIntervalMs: keepalive.intervalMs,
    ...(keepalive.countMax === undefined ? {} : { keepaliveCountMax: keepalive.countMax }),
    verifyHostKey: (key) => verifyHostKey(access.carrier.knownHosts, site.nodeHost, site.nodePort, key),
  });
  node.on('error', (err: Error) => errors.push(err));
  return { login, jump, node, errors };
}
