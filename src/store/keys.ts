/**
 * Redis key names (ARCHITECTURE.md, "Redis keys and queues"), all under one prefix so that several installations — or parallel
 * test runs — can share a server. `bh:` unless configured.
 */
export const DEFAULT_KEY_PREFIX = 'bh:';

export class RedisKeys {
  constructor(readonly prefix: string = DEFAULT_KEY_PREFIX) {}

  /** Hash: snapshot, version, gen, state, updatedAt, namespace, name. */
  pod(uid: string): string {
    return `${this.prefix}pod:${uid}`;
  }
  /** Sorted set: every known pod's uid, scored by its last update (ms). */
  pods(): string {
    return `${this.prefix}pods`;
  }
  /** Hash: "<namespace>/<name>" → uid. */
  podsByName(): string {
    return `${this.prefix}pods:by-name`;
  }
  /** Stream: the pod's transitions, capped. */
  history(uid: string): string {
    return `${this.prefix}hist:${uid}`;
  }
  /** Sorted set: uids of pods whose state holds a deadline, scored by when it falls due (ms). */
  deadlines(): string {
    return `${this.prefix}deadlines`;
  }
  /** Sorted set: uids whose last transition's effects have not been run yet, scored by when written (ms). */
  outbox(): string {
    return `${this.prefix}outbox`;
  }
  /**
   * Sorted set: uids the control plane should look at again, scored by when (ms). Each stored state sets
   * its pod's entry (a step that should have reported by then, a shadow whose lease should exist), and a
   * released lease sets it too; the converger reads only what is due, so pods that wait for nothing cost
   * nothing.
   */
  review(): string {
    return `${this.prefix}review`;
  }
  /** Hash: holder, generation, token, expiresAt. */
  lease(uid: string): string {
    return `${this.prefix}lease:${uid}`;
  }
  /** Sorted set: uids with a lease, scored by its expiry (ms), for the reaper. */
  leases(): string {
    return `${this.prefix}leases`;
  }
  /** Counter: fencing tokens. */
  leaseToken(): string {
    return `${this.prefix}lease-token`;
  }
  /**
   * Sorted set: namespaces whose pods came up on a site that separates tunnels by Unix user only,
   * scored by when last seen (ms); a day's worth, with a TTL (SharedUserWarning).
   */
  userNamespaces(): string {
    return `${this.prefix}user-namespaces`;
  }
  /** Hash: session host id → JSON (capacity, load, heartbeat). */
  hosts(): string {
    return `${this.prefix}hosts`;
  }
  /**
   * String (JSON): what the pod's forwards carry now (forward-traffic.ts), written by the session host
   * holding its shadow while it changes, at least every 5 minutes, with a 15-minute TTL; removed at the session's end.
   */
  traffic(uid: string): string {
    return `${this.prefix}traffic:${uid}`;
  }
  /**
   * Stream: events for the pods' machines (uid, event JSON), read by the control role's consumer group
   * (EVENT_GROUP); entries every consumer has acknowledged are trimmed away.
   */
  events(): string {
    return `${this.prefix}events`;
  }
  /** Stream, capped: events that could not be applied (bad, or failing MaxDeliveries times), with why. */
  deadEvents(): string {
    return `${this.prefix}events:dead`;
  }
  /** String: an event sent once while it waits (the watch's resends), removed when it is applied. */
  eventOnce(id: string): string {
    return `${this.prefix}events:once:${id}`;
  }
  /** Hash: id, since, recoverUntil; never deleted, so a Redis that lost its data is told by its absence (RedisEpoch). */
  epoch(): string {
    return `${this.prefix}epoch`;
  }
}
