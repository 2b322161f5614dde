import type { KubeConfig } from '@kubernetes/client-node';
import { EventRecorder, type EventRecorderOptions } from '../cluster/event-recorder.js';
import { loadKubeConfig } from '../cluster/kube-api.js';
import { PodConditionWriter } from '../cluster/pod-conditions.js';
import { PodWatcher, type PodWatcherOptions } from '../cluster/pod-watcher.js';
import { SharedUserWarning } from '../cluster/shared-user-warning.js';
import { type TransitionHook, transitionHook } from '../cluster/transition-events.js';
import { WebhookServer, type WebhookServerOptions } from '../cluster/webhook-server.js';
import type { FleetDeps } from '../pods/fleet-deps.js';
import type { Role } from './roles.js';

export interface ClusterRoleOptions {
  /** Instead of Backhaul.Kubernetes.Kubeconfig / the service account. */
  kubeConfig?: KubeConfig;
  watcher?: Omit<PodWatcherOptions, 'recorder'>;
  webhook?: Omit<WebhookServerOptions, 'config' | 'log'>;
  recorder?: Omit<EventRecorderOptions, 'log'>;
}

export interface ClusterRoles {
  watcher: PodWatcher | undefined;
  webhook: WebhookServer | undefined;
  /** Records Events for the control role's transitions (and the watcher's warnings), when a cluster is known. */
  recorder: EventRecorder | undefined;
  /** The control role's hook that records those Events (FleetDeps.onTransition); undefined without one. */
  onTransition: TransitionHook | undefined;
  stop(): Promise<void>;
}

/**
 * The Kubernetes side of a fleet member (fleet.ts): the watch and webhook roles, and the
 * Event recorder behind the control role's `onTransition` hook. Without a cluster (no kubeconfig, not in
 * a pod) the control role simply records no Events; the watch role refuses to start.
 */
export async function startClusterRoles(
  deps: FleetDeps,
  roles: readonly Role[],
  opts: ClusterRoleOptions = {},
): Promise<ClusterRoles> {
  const cfg = deps.config.Backhaul.Kubernetes;
  const log = deps.log;
  const needsCluster = roles.includes('watch');
  const wantsEvents = cfg.RecordEvents && (roles.includes('control') || roles.includes('watch'));
  const wantsConditions = cfg.PodCondition && (roles.includes('control') || roles.includes('watch'));
  const kubeConfig =
    needsCluster || wantsEvents || wantsConditions ? (opts.kubeConfig ?? loadKubeConfig(cfg)) : undefined;
  if (needsCluster && !kubeConfig) {
    throw new Error(
      'the watch role needs a cluster: set Backhaul.Kubernetes.Kubeconfig, or run it in a pod with a service account',
    );
  }
  const recorder =
    wantsEvents && kubeConfig
      ? EventRecorder.fromKubeConfig(kubeConfig, {
          now: deps.now,
          ...opts.recorder,
          log: log.child({ part: 'events' }),
        })
      : undefined;
  const conditions =
    wantsConditions && kubeConfig
      ? PodConditionWriter.fromKubeConfig(kubeConfig, log.child({ part: 'conditions' }))
      : undefined;
  const sharedUser = recorder
    ? new SharedUserWarning(
        deps.redis,
        deps.keys,
        recorder,
        deps.config.Network.SSH.User,
        log.child({ part: 'isolation' }),
      )
    : undefined;
  const onTransition =
    (recorder || conditions) && roles.includes('control')
      ? transitionHook({ recorder, conditions, sharedUser }, log)
      : undefined;

  let webhook: WebhookServer | undefined;
  if (roles.includes('webhook')) {
    webhook = await WebhookServer.start({ ...opts.webhook, config: deps.config, log: log.child({ role: 'webhook' }) });
  }
  let watcher: PodWatcher | undefined;
  if (roles.includes('watch') && kubeConfig) {
    watcher = new PodWatcher(deps, kubeConfig, cfg, {
      ...opts.watcher,
      ...(recorder ? { recorder } : {}),
      ...(conditions ? { conditions } : {}),
    });
    watcher.start();
  }
  return {
    watcher,
    webhook,
    recorder,
    onTransition,
    stop: async () => {
      await Promise.all([watcher?.stop(), webhook?.close()]);
      await Promise.all([recorder?.flush(), conditions?.flush()]);
    },
  };
}
