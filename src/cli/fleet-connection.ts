import type { Redis } from 'ioredis';
import { createLogger, silentLogger, withoutCredentials } from '../log.js';
import { type FleetDeps, fleetDeps, type PodReadDeps, podReadDeps } from '../pods/fleet-deps.js';
import { createRedis } from '../store/redis.js';
import { CliError, EXIT } from './exit-codes.js';
import { type ConfigOption, loadSiteConfig } from './inputs.js';
import { passwordOnCommandLine, type RedisTarget, type RedisTargetFlags, redisTarget } from './redis-target.js';

export interface FleetOption extends ConfigOption, RedisTargetFlags {}

/**
 * Connects a one-shot command to the fleet's Redis (`redisTarget`: `--redis`, else REDIS_URL, else the
 * site config's; the password from a file or the environment). Redis is reached before anything else is
 * set up, so an unreachable server is one line and exit 1 within a second or so — not the queues' own
 * connection errors printed by BullMQ, one per queue.
 */
export async function withFleet<T>(opts: FleetOption, use: (deps: FleetDeps) => Promise<T>): Promise<T> {
  const config = await loadSiteConfig(opts);
  const redis = await connectRedis(redisTarget(opts, config));
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
  const named = opts.redis !== undefined || !!process.env.REDIS_URL;
  const config = named || (!opts.config && !process.env.BACKHAUL_CONFIG) ? undefined : await loadSiteConfig(opts);
  const redis = await connectRedis(redisTarget(opts, config));
  const deps = podReadDeps(redis);
  try {
    return await use(deps);
  } finally {
    await deps.queues.close().catch(() => undefined);
    redis.disconnect();
  }
}

async function connectRedis(target: RedisTarget): Promise<Redis> {
  const warning = passwordOnCommandLine(target);
  if (warning) process.stderr.write(`backhaul: warning: ${warning}\n`);
  const { url } = target;
  const redis: Redis = createRedis(url, {
    kind: 'command',
    connectionName: 'backhaul-cli',
    ...(target.password === undefined ? {} : { password: target.password }),
  });
  let lastError: Error | undefined;
  redis.on('error', (err: Error) => {
    lastError = err; // reported below, once, by the command that fails
  });
  try {
    await redis.ping().catch((err: Error) => {
      const cause = lastError ?? err;
      throw new CliError(`cannot reach Redis at ${withoutCredentials(url)}: ${cause.message}`, EXIT.failure);
    });
  } catch (err) {
    redis.disconnect();
    throw err;
  }
  return redis;
}

/** POD is `namespace/name` or a UID (ARCHITECTURE.md, "The command line"). */
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
    .option(
      '--redis <url>',
      'Redis (default: $REDIS_URL, else Backhaul.Redis.URL); put no password in it (ps shows it)',
    )
    .option(
      '--redis-password-file <file>',
      "Redis password (default: $REDIS_PASSWORD, else $REDIS_PASSWORD_FILE's, else Backhaul.Redis.PasswordFile's)",
    );
}
