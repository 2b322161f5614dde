import type { Redis } from 'ioredis';
import { ClusterDirectory } from '../cluster/cluster-directory.js';
import { loadKubeConfig } from '../cluster/kube-api.js';
import type { SiteConfig } from '../contract/site-config.js';
import type { Logger } from '../log.js';
import { type FleetDeps, type FleetDepsOptions, fleetDeps } from '../pods/fleet-deps.js';
import { NO_CLUSTER_DIRECTORY } from '../ssh/service-directory.js';
import { preloadScripts } from '../store/scripts.js';
import { ControlWorker } from '../workers/control-worker.js';
import { SessionHost } from '../workers/session-host.js';
import { type ClusterRoleOptions, type ClusterRoles, startClusterRoles } from './cluster-roles.js';
import { defaultHostId, type Role } from './roles.js';

export { defaultHostId, ROLES, type Role } from './roles.js';

export interface FleetOptions extends FleetDepsOptions {
  roles: readonly Role[];
  hostId?: string;
  /** How often the control worker's convergence loop repairs pods due for a look (default 5 s). */
  reaperEveryMs?: number;
  /** The watch and webhook roles, and Events for the control role (src/cluster). */
  cluster?: ClusterRoleOptions;
}

export interface RunningFleet {
  deps: FleetDeps;
  hostId: string;
  control: ControlWorker | undefined;
  session: SessionHost | undefined;
  /** The watcher, webhook and Event recorder, for the roles that have them. */
  cluster: ClusterRoles;
  /** Session host first (hands its shadows back), then the control worker finishes its job at hand. */
  stop(): Promise<void>;
}

export async function startFleet(
  config: SiteConfig,
  redis: Redis,
  log: Logger,
  opts: FleetOptions,
): Promise<RunningFleet> {
  const deps = fleetDeps(config, redis, log, opts);
  // A webhook-only member does not touch Redis: pod admission must not depend on it.
  if (opts.roles.some((role) => role !== 'webhook')) await preloadScripts(redis);
  const hostId = opts.hostId ?? defaultHostId();
  // Before the control worker: its transitions record Events from the first one on.
  const cluster = await startClusterRoles(deps, opts.roles, opts.cluster);
  let control: ControlWorker | undefined;
  let session: SessionHost | undefined;
  if (opts.roles.includes('control')) {
    control = new ControlWorker(
      deps,
      { events: redis, steps: redis },
      {
        ...(opts.reaperEveryMs ? { convergence: { reapEveryMs: opts.reaperEveryMs } } : {}),
        ...(cluster.onTransition ? { onTransition: cluster.onTransition } : {}),
      },
    );
  }
  let directory: ClusterDirectory | undefined;
  if (opts.roles.includes('session')) {
    // Services are dialled as the API has them; without a cluster, by Backhaul.HostAliases only.
    const kubeConfig = opts.cluster?.kubeConfig ?? loadKubeConfig(config.Backhaul.Kubernetes);
    if (kubeConfig) {
      directory = new ClusterDirectory(
        kubeConfig,
        config.Backhaul.EndpointPolicy.FleetNamespace,
        log.child({ part: 'services' }),
        deps.now,
      );
      await directory.start();
    }
    session = await SessionHost.start(deps, hostId, redis, directory ?? NO_CLUSTER_DIRECTORY);
  }
  log.info({ roles: opts.roles, hostId }, 'fleet started');
  let stopping: Promise<void> | undefined;
  return {
    deps,
    hostId,
    control,
    session,
    cluster,
    stop: () => {
      stopping ??= (async () => {
        await cluster.stop();
        await session?.stop();
        directory?.stop();
        await control?.close();
        await deps.queues.close();
        log.info({ hostId }, 'fleet stopped');
      })();
      return stopping;
    },
  };
}
