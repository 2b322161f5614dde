import { type Command, InvalidArgumentError } from 'commander';
import { parseRedisUrl } from '../../contract/redis-url.js';
import type { RunningFleet } from '../../fleet/fleet.js';
import type { HealthServer } from '../../fleet/health.js';
import { defaultHostId, ROLES, type Role } from '../../fleet/roles.js';
import { createLogger } from '../../log.js';
import { LostConnections } from '../../store/lost-connections.js';
import { createRedis } from '../../store/redis.js';
import { type FleetOption, fleetOptions } from '../fleet-connection.js';
import { loadSiteConfig } from '../inputs.js';
import { passwordOnCommandLine, redisTarget } from '../redis-target.js';

function roles(value: string): Role[] {
  const list = value
    .split(',')
    .map((r) => r.trim())
    .filter(Boolean);
  for (const role of list) {
    if (!(ROLES as readonly string[]).includes(role)) {
      throw new InvalidArgumentError(`unknown role ${JSON.stringify(role)}; accepted: ${ROLES.join(', ')}`);
    }
  }
  if (list.length === 0) throw new InvalidArgumentError(`no role; accepted: ${ROLES.join(', ')}`);
  return list as Role[];
}

function port(value: string): number {
  const n = Number(value);
  if (!/^\d+$/.test(value) || n < 1 || n > 65535) throw new InvalidArgumentError('expected a port 1-65535');
  return n;
}

interface WorkerFlags extends FleetOption {
  roles: Role[];
  hostId?: string;
  healthPort?: number;
  healthAddress: string;
}

export function registerWorker(program: Command): void {
  fleetOptions(
    program
      .command('worker')
      .description(
        'run a member of the fleet: control (machines, steps, the convergence loop), session (holds shadows), watch (pods on the virtual nodes), webhook (admission)',
      )
      .option('--roles <list>', `comma-separated: ${ROLES.join(', ')}`, roles, ['control', 'session'] as Role[])
      .option('--host-id <id>', 'name of this session host (default: <hostname>-<pid>)')
      .option('--health-port <port>', 'serve GET /livez and /readyz on this port for probes (default: none)', port)
      .option('--health-address <address>', 'address of the health endpoint', '0.0.0.0'),
  ).action(async (flags: WorkerFlags) => {
    // Loaded here: the fleet (SSH, Kubernetes client, BullMQ workers) is not needed by any other command.
    const [{ startFleet }, { startHealthServer }, { FleetMetrics }] = await Promise.all([
      import('../../fleet/fleet.js'),
      import('../../fleet/health.js'),
      import('../../metrics/fleet-metrics.js'),
    ]);
    const config = await loadSiteConfig(flags);
    const log = createLogger('backhaul');
    // Before the health endpoint, which serves them from the start; the fleet counts into them.
    const metrics = new FleetMetrics();
    const target = redisTarget(flags, config);
    const onCommandLine = passwordOnCommandLine(target);
    if (onCommandLine) log.warn(onCommandLine);
    // A webhook-only member never uses Redis: do not even connect (pod admission must not depend on it).
    const webhookOnly = flags.roles.every((role) => role === 'webhook');
    const redisAt = parseRedisUrl(target.url).where;
    const lost = new LostConnections((name) =>
      log.error(
        { redis: redisAt, connection: name },
        'a redis connection closed for good without being closed: /livez fails so that this process is restarted',
      ),
    );
    const redis = createRedis(target.url, {
      watch: lost,
      connectionName: `backhaul-worker-${flags.hostId ?? defaultHostId()}`,
      ...(target.password === undefined ? {} : { password: target.password }),
      ...(webhookOnly ? { options: { lazyConnect: true } } : {}),
    });
    redis.on('error', (err) => log.warn({ redis: redisAt, err: err.message }, 'redis connection error (retrying)'));
    // Up before the fleet: /livez answers while start-up waits for Redis; /readyz says why it is not ready.
    let fleet: RunningFleet | undefined;
    let health: HealthServer | undefined;
    if (flags.healthPort !== undefined) {
      health = await startHealthServer(
        flags.healthPort,
        flags.healthAddress,
        {
          ready: [
            { name: 'fleet-started', check: () => fleet !== undefined },
            ...(!webhookOnly ? [{ name: 'redis', check: async () => (await redis.ping()) === 'PONG' }] : []),
            { name: 'pod-watch', check: () => fleet?.cluster.watcher?.synced ?? true },
          ],
          live: [{ name: 'redis-connections', check: () => lost.list().length === 0 }],
        },
        () => metrics.text(),
      );
      log.info({ port: health.port }, 'health endpoint listening');
    }
    const running = await startFleet(config, redis, log, {
      roles: flags.roles,
      metrics,
      ...(flags.hostId ? { hostId: flags.hostId } : {}),
    });
    fleet = running;
    await new Promise<void>((resolve) => {
      const stop = (signal: string) => {
        log.info({ signal }, 'stopping');
        void health?.close();
        running.stop().then(resolve, (err) => {
          log.error({ err }, 'stop failed');
          resolve();
        });
      };
      process.once('SIGTERM', () => stop('SIGTERM'));
      process.once('SIGINT', () => stop('SIGINT'));
    });
    redis.disconnect();
  });
}
