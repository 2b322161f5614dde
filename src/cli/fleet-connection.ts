import type { Redis } from 'ioredis';
import { createLogger, silentLogger } from '../log.js';
import { type FleetDeps, fleetDeps, type PodReadDeps, podReadDeps } from '../pods/fleet-deps.js';
import { createRedis } from '../store/redis.js';
import { CliError, EXIT } from './exit-codes.js';
import { type ConfigOption, loadSiteConfig } from './inputs.js';

export interface FleetOption extends ConfigOption {
  redis?: string;
}

/**
 * Connects a one-shot command to the fleet's Redis (`--redis`, else REDIS_URL, else the site config's).
 * Redis is reached before anything else is set up, so an unreachable server is one line and exit 1
 * within a second or so — not the queues' own connection errors printed by BullMQ, one per queue.
 */
export async function withFleet<T>(opts: FleetOption, use: (deps: FleetDeps) => Promise<T>): Promise<T> {
  const config = await loadSiteConfig(opts);
  // An empty REDIS_URL is unset, not "connect to the default".
  const url = opts.redis ?? (process.env.REDIS_URL || config.Backhaul.Redis.URL);
  const redis = await connectRedis(url);
  const deps = fleetDeps(config, redis, process.env.BACKHAUL_LOG_LEVEL ? createLogger('backhaul') : silentLogger());
  try {
    return await use(deps);
  } finally {
    await deps.queues.close().catch(() => undefined);
    redis.disconnect();
  }
}

/**
 * For commands that only read (status, list): Redis alone, from `--redis` or REDIS_URL, the site
 * configuration only when neither is given; and nothing is written (BullMQ's queue metadata included).
 */
export async function withPodReader<T>(opts: FleetOption, use: (deps: PodReadDeps) => Promise<T>): Promise<T> {
  let url = opts.redis ?? (process.env.REDIS_URL || undefined);
  if (url === undefined) {
    if (!opts.config && !process.env.BACKHAUL_CONFIG) {
      throw new CliError(
        'no Redis to read from: pass --redis URL, set REDIS_URL, or name the site configuration (--config FILE or BACKHAUL_CONFIG)',
        EXIT.usage,
      );
    }
    url = (await loadSiteConfig(opts)).Backhaul.Redis.URL;
  }
  const redis = await connectRedis(url);
  const deps = podReadDeps(redis);
  try {
    return await use(deps);
  } finally {
    await deps.queues.close().catch(() => undefined);
    redis.disconnect();
  }
}

async function connectRedis(url: string): Promise<Redis> {
  const redis: Redis = createRedis(url, { kind: 'command', connectionName: 'backhaul-cli' });
  let lastError: Error | undefined;
  redis.on('error', (err: Error) => {
    lastError = err; // reported below, once, by the command that fails
  });
  try {
    await redis.ping().catch((err: Error) => {
      const cause = lastError ?? err;
      throw new CliError(`cannot reach Redis at ${redactUrl(url)}: ${cause.message}`, EXIT.failure);
    });
  } catch (err) {
    redis.disconnect();
    throw err;
  }
  return redis;
}

/** The URL without its password, for messages. */
export function redactUrl(url: string): string {
  try {
    const parsed = new URL(url);
    if (!parsed.password) return url;
    parsed.password = '***';
    return parsed.toString();
  } catch {
    return url.replace(/\/\/[^@/]*@/, '//***@');
  }
}

/** POD is `namespace/name` or a UID (ARCHITECTURE.md §3.10). */
export async function resolvePod(deps: Pick<FleetDeps, 'store'>, pod: string): Promise<string> {
  if (pod.includes('/')) {
    const [namespace = '', name = ''] = pod.split('/', 2);
    const named = await deps.store.podsByName(namespace, name);
    const [only] = named;
    if (!only) throw new CliError(`no pod ${pod} is known to backhaul`, EXIT.failure);
    if (named.length > 1) {
      const which = named.map((p) => `${p.uid} (${p.state})`).join(', ');
      throw new CliError(
        `${named.length} pods are named ${pod}: ${which}; name the one you mean by its UID`,
        EXIT.usage,
      );
    }
    return only.uid;
  }
  if (!(await deps.store.load(pod))) throw new CliError(`no pod with UID ${pod} is known to backhaul`, EXIT.failure);
  return pod;
}

export function fleetOptions<T extends { option(flags: string, description: string): T }>(command: T): T {
  return command
    .option('-c, --config <file>', 'site configuration (default: $BACKHAUL_CONFIG)')
    .option('--redis <url>', 'Redis (default: $REDIS_URL, else Backhaul.Redis.URL)');
}
