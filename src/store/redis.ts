import { Redis, type RedisOptions } from 'ioredis';
import { parseRedisUrl } from '../contract/redis-url.js';
import type { FleetRedisOptions, LostConnections } from './lost-connections.js';

export const DEFAULT_REDIS_URL = 'redis://127.0.0.1:6379';

export interface CreateRedisOptions {
  /**
   * `worker` (default): commands wait for Redis to come back instead of failing (BullMQ needs
   * `maxRetriesPerRequest: null`). `command`: a CLI run fails fast when Redis cannot be reached.
   */
  kind?: 'worker' | 'command';
  /** Shown by CLIENT LIST. */
  connectionName?: string;
  /** When the URL carries none (it comes from a file or the environment, never argv). */
  password?: string;
  /** Anything else for ioredis (replies mapped as ioredis does by default). */
  options?: Omit<RedisOptions, 'replyMapping'>;
  /** Told when this connection, or a duplicate of it, closes for good without being closed (a worker's). */
  watch?: LostConnections;
}

/**
 * A connection to Redis, from `--redis URL`, else REDIS_URL, else the local default (ARCHITECTURE.md, "The command line"):
 * one server, or the master a set of sentinels names (src/contract/redis-url.ts). Throws RedisUrlError on a
 * URL it cannot read.
 */
export function createRedis(url?: string, opts: CreateRedisOptions = {}): Redis {
  const target = url ?? process.env.REDIS_URL ?? DEFAULT_REDIS_URL;
  const kind = opts.kind ?? 'worker';
  const base: RedisOptions =
    kind === 'worker'
      ? { maxRetriesPerRequest: null, enableReadyCheck: true }
      : { maxRetriesPerRequest: 1, connectTimeout: 5_000, retryStrategy: (times) => (times > 3 ? null : 200 * times) };
  const options: FleetRedisOptions = {
    ...parseRedisUrl(target).options,
    ...base,
    ...(opts.connectionName === undefined ? {} : { connectionName: opts.connectionName }),
    ...(opts.password === undefined ? {} : { password: opts.password }),
    ...opts.options,
    // ioredis' default, said outright: every caller reads replies as it maps them.
    replyMapping: 'legacy',
  };
  return opts.watch ? opts.watch.connect(options, opts.connectionName ?? 'redis') : new Redis(options);
}

/** A TIME reply ([seconds, microseconds]) in epoch ms. */
export function redisTimeMs([seconds, micros]: readonly [string | number, string | number]): number {
  return Number(seconds) * 1000 + Math.floor(Number(micros) / 1000);
}
