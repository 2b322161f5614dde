import { isIP } from 'node:net';
import type { RedisOptions } from 'ioredis';

/**
 * The Redis URLs the fleet and the CLI accept, as ioredis options:
 *
 *   redis://[user[:password]@]host[:port][/db]             one server
 *   rediss://…                                             the same over TLS
 *   redis+sentinel://[user[:password]@]host[:port][,host[:port]…]/master[/db]
 *   rediss+sentinel://…                                    sentinels and master over TLS
 *
 * With Sentinel, the hosts are the sentinels (port 26379 by default) and `master` is the name they
 * monitor; the fleet asks them where the master is, and again after a failover. A user and password in
 * the URL are the master's (ACL); sentinels that require a password of their own get it from
 * REDIS_SENTINEL_PASSWORD (one sent to a sentinel without `requirepass` would fail the connection).
 * A password is better given by file or environment (it is in the ConfigMap or `ps` otherwise).
 */

export const REDIS_URL_ACCEPTED =
  'redis://[user[:password]@]host[:port][/db], rediss://… (TLS), or redis+sentinel://[user[:password]@]host[:port][,host[:port]…]/master[/db] (rediss+sentinel:// for TLS)';

const SCHEME = /^(rediss?)(\+sentinel)?:\/\/(.*)$/i;
const HOST_PORT = /^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9._-]+)(?::(\d{1,5}))?$/;
const MASTER_NAME = /^[A-Za-z0-9._-]{1,64}$/;
/** How long a sentinel may take to answer before the next one is asked (test/integration/redis-sentinel-clients.test.ts). */
const SENTINEL_COMMAND_TIMEOUT_MS = 2_000;

export class RedisUrlError extends Error {}

export interface ParsedRedisUrl {
  sentinel: boolean;
  options: RedisOptions;
  /** host:port of the server, or of every sentinel, for messages (no credentials). */
  where: string;
}

function port(text: string | undefined, fallback: number, what: string): number {
  if (text === undefined) return fallback;
  const n = Number(text);
  if (!Number.isInteger(n) || n < 1 || n > 65535) throw new RedisUrlError(`${what}: port ${text} is not 1-65535`);
  return n;
}

function hostOf(part: string, fallbackPort: number, what: string): { host: string; port: number } {
  const m = HOST_PORT.exec(part);
  if (!m?.[1]) throw new RedisUrlError(`${what}: "${part}" is not host[:port]`);
  return { host: m[1].replace(/^\[|\]$/g, ''), port: port(m[2], fallbackPort, what) };
}

function db(text: string | undefined): number | undefined {
  if (text === undefined || text === '') return undefined;
  if (!/^\d{1,2}$/.test(text)) throw new RedisUrlError(`database "${text}" is not a number 0-99`);
  return Number(text);
}

/** Parses URL; throws RedisUrlError saying what is wrong and what is accepted. */
export function parseRedisUrl(url: string, env: NodeJS.ProcessEnv = process.env): ParsedRedisUrl {
  const m = SCHEME.exec(url.trim());
  if (!m) throw new RedisUrlError(`not a Redis URL; accepted: ${REDIS_URL_ACCEPTED}`);
  const tls = m[1]?.toLowerCase() === 'rediss';
  const sentinel = m[2] !== undefined;
  let rest = m[3] ?? '';
  const query = rest.indexOf('?');
  if (query >= 0) throw new RedisUrlError('query parameters are not read: give options in the site configuration');
  const at = rest.lastIndexOf('@');
  let username: string | undefined;
  let password: string | undefined;
  if (at >= 0) {
    const userinfo = rest.slice(0, at);
    rest = rest.slice(at + 1);
    const colon = userinfo.indexOf(':');
    const user = decodeURIComponent(colon >= 0 ? userinfo.slice(0, colon) : userinfo);
    const pass = colon >= 0 ? decodeURIComponent(userinfo.slice(colon + 1)) : undefined;
    if (user !== '') username = user;
    if (pass !== undefined && pass !== '') password = pass;
  }
  const [hosts = '', ...path] = rest.split('/');
  const credentials = {
    ...(username === undefined ? {} : { username }),
    ...(password === undefined ? {} : { password }),
  };
  if (!sentinel) {
    if (path.length > 1) throw new RedisUrlError(`"/${path.join('/')}": only a database number may follow the host`);
    const server = hostOf(hosts || '127.0.0.1', 6379, 'host');
    const database = db(path[0]);
    return {
      sentinel,
      where: `${server.host}:${server.port}`,
      options: {
        host: server.host,
        port: server.port,
        ...credentials,
        ...(database === undefined ? {} : { db: database }),
        // SNI carries names only (RFC 6066): Node warns at an address, and checks it against the certificate's IP SANs anyway.
        ...(tls ? { tls: isIP(server.host) ? {} : { servername: server.host } } : {}),
      },
    };
  }
  if (hosts === '') throw new RedisUrlError('no sentinel: give host[:port][,host[:port]…] before /master');
  const sentinels = hosts.split(',').map((h) => hostOf(h, 26379, 'sentinel'));
  const [name, dbText, ...extra] = path;
  if (!name || !MASTER_NAME.test(name)) {
    throw new RedisUrlError(
      `the master's name must follow the sentinels (…/mymaster): letters, digits and . _ -, got "${name ?? ''}"`,
    );
  }
  if (extra.length > 0) throw new RedisUrlError(`"/${extra.join('/')}": only a database number may follow the master`);
  const database = db(dbText);
  const sentinelPassword = env.REDIS_SENTINEL_PASSWORD || undefined;
  return {
    sentinel,
    where: `${sentinels.map((s) => `${s.host}:${s.port}`).join(',')} (master ${name})`,
    options: {
      sentinels,
      name,
      ...credentials,
      ...(sentinelPassword === undefined ? {} : { sentinelPassword }),
      ...(database === undefined ? {} : { db: database }),
      ...(tls ? { tls: {}, sentinelTLS: {}, enableTLSForSentinelMode: true } : {}),
      // Ask the sentinels as soon as they announce a new master, not only when the old one stops answering.
      failoverDetector: true,
      // A sentinel answers its questions at once; one that does not (paused, its host hung) is skipped for
      // the next instead of holding the reconnect for good (ioredis waits forever without a timeout).
      sentinelCommandTimeout: SENTINEL_COMMAND_TIMEOUT_MS,
    },
  };
}

/** Whether URL carries a password (for the warning about one on the command line). */
export function redisUrlHasPassword(url: string): boolean {
  try {
    return parseRedisUrl(url, {}).options.password !== undefined;
  } catch {
    return false;
  }
}

/** What is wrong with URL as the fleet's Redis, for the configuration's error ('' when nothing). */
export function redisUrlProblem(url: string): string {
  try {
    parseRedisUrl(url, {});
    return '';
  } catch (err) {
    return (err as Error).message;
  }
}
