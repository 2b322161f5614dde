import { type Command, InvalidArgumentError } from 'commander';
import { createLogger } from '../../log.js';
import { createRedis } from '../../store/redis.js';
import { defaultHostId, ROLES, type Role, startFleet } from '../../workers/fleet.js';
import { type FleetOption, fleetOptions } from '../fleet-connection.js';
import { loadSiteConfig } from '../inputs.js';

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

interface WorkerFlags extends FleetOption {
  roles: Role[];
  hostId?: string;
}

export function registerWorker(program: Command): void {
  fleetOptions(
    program
      .command('worker')
      .description('run a member of the fleet: control (machines, steps, reaper), session (holds shadows)')
      .option('--roles <list>', `comma-separated: ${ROLES.join(', ')}`, roles, ['control', 'session'] as Role[])
      .option('--host-id <id>', 'name of this session host (default: <hostname>-<pid>)'),
  ).action(async (flags: WorkerFlags) => {
    const config = await loadSiteConfig(flags);
    const log = createLogger('backhaul');
    const url = flags.redis ?? process.env.REDIS_URL ?? config.Backhaul.Redis.URL;
    const redis = createRedis(url, { connectionName: `backhaul-worker-${flags.hostId ?? defaultHostId()}` });
    redis.on('error', (err) => log.warn({ err: err.message }, 'redis connection error (retrying)'));
    const fleet = await startFleet(config, redis, log, {
      roles: flags.roles,
      ...(flags.hostId ? { hostId: flags.hostId } : {}),
    });
    await new Promise<void>((resolve) => {
      const stop = (signal: string) => {
        log.info({ signal }, 'stopping');
        fleet.stop().then(resolve, (err) => {
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
