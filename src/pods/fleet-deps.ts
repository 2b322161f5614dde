import type { Redis } from 'ioredis';
import type { SiteConfig } from '../contract/site-config.js';
import type { Logger } from '../log.js';
import type { PodContext, PodEvent, PodLimits, PodStateName } from '../machines/pod-machine.js';
import { FleetMetrics } from '../metrics/fleet-metrics.js';
import { HostRegistry } from '../store/host-registry.js';
import { RedisKeys } from '../store/keys.js';
import { LeaseStore } from '../store/lease-store.js';
import { SnapshotStore } from '../store/snapshot-store.js';
import { type Clock, systemClock } from './clock.js';
import { type FleetQueues, openQueues } from './queues.js';

/** What every role of the fleet shares: the site, Redis, the stores and the queues. Built once, never changed. */
export interface FleetDeps {
  readonly config: SiteConfig;
  /** Connection for commands and BullMQ queues (workers open their own blocking connections). */
  readonly redis: Redis;
  readonly keys: RedisKeys;
  readonly store: SnapshotStore;
  readonly leases: LeaseStore;
  readonly hosts: HostRegistry;
  readonly queues: FleetQueues;
  /** BullMQ key prefix; tests give each run its own. */
  readonly bullPrefix: string | undefined;
  readonly log: Logger;
  /** This fleet member's Prometheus metrics, in a registry of its own. */
  readonly metrics: FleetMetrics;
  /** The fleet's one clock (epoch ms): every role reads time here, so a test can move it. */
  readonly now: Clock;
}

/**
 * What the control worker calls after each applied (stored) transition; `from` is null when the event
 * created the machine. Must not throw or block: the cluster roles record Kubernetes Events with it.
 */
export type TransitionHook = (
  uid: string,
  ctx: PodContext,
  from: PodStateName | null,
  to: PodStateName,
  event: PodEvent,
) => void;

export interface FleetDepsOptions {
  keyPrefix?: string;
  /** Where this member counts (a new registry when absent). */
  metrics?: FleetMetrics;
  bullPrefix?: string;
  now?: () => number;
}

/** What reading pods takes (status, list, following a pod): no site, nothing written. */
export type PodReadDeps = Pick<FleetDeps, 'redis' | 'keys' | 'store' | 'leases' | 'queues' | 'now'>;

export function podReadDeps(redis: Redis, opts: FleetDepsOptions = {}): PodReadDeps {
  const keys = new RedisKeys(opts.keyPrefix);
  return {
    redis,
    keys,
    store: new SnapshotStore(redis, { keys }),
    leases: new LeaseStore(redis, { keys }),
    queues: openQueues(redis, keys, opts.bullPrefix, true),
    now: opts.now ?? systemClock,
  };
}

export function fleetDeps(config: SiteConfig, redis: Redis, log: Logger, opts: FleetDepsOptions = {}): FleetDeps {
  const keys = new RedisKeys(opts.keyPrefix);
  const metrics = opts.metrics ?? new FleetMetrics();
  return {
    config,
    redis,
    keys,
    store: new SnapshotStore(redis, { keys, onConflict: () => metrics.casConflicts.inc() }),
    leases: new LeaseStore(redis, { keys }),
    hosts: new HostRegistry(redis, { keys }),
    queues: openQueues(redis, keys, opts.bullPrefix),
    bullPrefix: opts.bullPrefix,
    log,
    metrics,
    now: opts.now ?? systemClock,
  };
}

/** The machine's limits from the site configuration. */
export function podLimits(config: SiteConfig): PodLimits {
  const b = config.Backhaul;
  return {
    retryLimit: b.RetryLimit,
    backoffBaseMs: b.RetryBackoff,
    backoffMaxMs: b.RetryBackoffMax,
    nodeWaitTimeoutMs: config.Network.SSH.NodeWaitTimeout,
    phaseTimeoutMs: b.PhaseTimeout,
  };
}
