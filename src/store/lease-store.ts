/**
 * Fencing leases on a pod's shadow (ARCHITECTURE.md, "The machine"): `<prefix>lease:<uid>` names the session host that
 * holds the shadow, its generation and a fencing token drawn from a counter at each grant. Only the
 * current token renews (even past `expiresAt`, so a Redis outage does not end healthy shadows) or releases;
 * a session whose renewal fails has lost the lease and closes at once.
 * Times come from the Redis clock, so hosts with skewed clocks agree on expiry.
 *
 * The key outlives `expiresAt` by `retainMs`, so the reaper can still see whose lease expired (a dead
 * session host) before the key disappears by itself.
 */
import type { Redis } from 'ioredis';
import { RedisKeys } from './keys.js';
import { redisTimeMs } from './redis.js';
import { script } from './scripts.js';

export interface Lease {
  uid: string;
  holder: string;
  generation: number;
  token: number;
  /** Redis clock, ms. */
  expiresAt: number;
}

/**
 * Refused: `held` by another holder, `reasserted` held by another that kept the shadow through a loss of
 * Redis's data, `older-generation` a newer shadow holds it, `recovering` free but only re-assertions are
 * granted until the recovery window closes (`current.expiresAt` says when; holder '' then).
 */
export type AcquireRefusal = 'held' | 'reasserted' | 'older-generation' | 'recovering';

export type AcquireResult = { ok: true; lease: Lease } | { ok: false; reason: AcquireRefusal; current: Lease };

const REFUSALS: ReadonlySet<string> = new Set<AcquireRefusal>(['held', 'reasserted', 'older-generation', 'recovering']);

/** Renewed by the current token even after expiresAt: fencing is by token, so a holder nobody replaced goes on. */
export type RenewResult = { ok: true; expiresAt: number } | { ok: false; reason: 'lost' };

export interface LeaseListing {
  /** Redis clock when listed, ms. */
  now: number;
  leases: (Lease & { expired: boolean })[];
}

/**
 * A shadow without a live lease is given this long before the control plane calls it lost: a session
 * that ended on its own releases its lease just after queueing its report, and that report, not a
 * CARRIER_LOST, must decide what happens to the pod.
 */
export const LEASE_GRACE_MS = 20_000;

export interface LeaseStoreOptions {
  keys?: RedisKeys;
  /** How long an expired lease's key is kept for the reaper (ms). */
  retainMs?: number;
}

export class LeaseStore {
  readonly keys: RedisKeys;
  readonly retainMs: number;

  constructor(
    private readonly redis: Redis,
    { keys = new RedisKeys(), retainMs = 60_000 }: LeaseStoreOptions = {},
  ) {
    this.keys = keys;
    this.retainMs = retainMs;
  }

  /**
   * Granted when free, expired or already ours; never to a generation older than the holder's. While
   * the fleet recovers from a Redis that lost its data, a free lease goes only to a holder that
   * `reassert`s one it held before the loss (redis/epoch-check.lua).
   */
  async acquire(
    uid: string,
    holder: string,
    generation: number,
    ttlMs: number,
    opts: { reassert?: boolean } = {},
  ): Promise<AcquireResult> {
    const reply = (await script('lease-acquire').run(
      this.redis,
      [this.keys.lease(uid), this.keys.leases(), this.keys.leaseToken(), this.keys.epoch()],
      [uid, holder, generation, Math.ceil(ttlMs), this.retainMs, opts.reassert ? '1' : '0'],
    )) as [number, string, number, number, number, string?];
    const [granted, leaseHolder, leaseGeneration, token, expiresAt, reason] = reply;
    const lease = { uid, holder: leaseHolder, generation: leaseGeneration, token, expiresAt };
    if (granted === 1) return { ok: true, lease };
    return { ok: false, reason: REFUSALS.has(reason ?? '') ? (reason as AcquireRefusal) : 'held', current: lease };
  }

  async renew(uid: string, token: number, ttlMs: number): Promise<RenewResult> {
    const reply = (await script('lease-renew').run(
      this.redis,
      [this.keys.lease(uid), this.keys.leases()],
      [uid, token, Math.ceil(ttlMs), this.retainMs],
    )) as [number, number | string];
    const [renewed, detail] = reply;
    if (renewed === 1) return { ok: true, expiresAt: Number(detail) };
    return { ok: false, reason: 'lost' };
  }

  /** False when the lease is gone or was granted to someone else since. */
  async release(uid: string, token: number): Promise<boolean> {
    // The pod is looked at again once the grace is over (the review index): see LEASE_GRACE_MS.
    const reply = await script('lease-release').run(
      this.redis,
      [this.keys.lease(uid), this.keys.leases(), this.keys.review()],
      [uid, token, LEASE_GRACE_MS],
    );
    return reply === 1;
  }

  /** The control plane gives up on a shadow: delete its lease if it is of `generation` or older. */
  async revoke(uid: string, generation: number): Promise<boolean> {
    const reply = await script('lease-revoke').run(
      this.redis,
      [this.keys.lease(uid), this.keys.leases()],
      [uid, generation],
    );
    return reply === 1;
  }

  async get(uid: string): Promise<Lease | null> {
    return parseLease(uid, await this.redis.hgetall(this.keys.lease(uid)));
  }

  /** Every lease, with whether it has expired by the Redis clock. */
  async list(): Promise<LeaseListing> {
    return this.collect(await this.redis.zrange(this.keys.leases(), '0', '-1'));
  }

  /** Leases past their expiry (their holders stopped renewing), for the reaper. */
  async listExpired(): Promise<LeaseListing> {
    const now = await this.now();
    const uids = await this.redis.zrangebyscore(this.keys.leases(), '-inf', String(now));
    const listing = await this.collect(uids);
    return { now: listing.now, leases: listing.leases.filter((lease) => lease.expired) };
  }

  /** The uids of leases that expired before `before` (ms), at most `limit`: the index alone, no lease read. */
  expiredBefore(before: number, limit: number): Promise<string[]> {
    return this.redis.zrangebyscore(this.keys.leases(), '-inf', String(before), 'LIMIT', 0, limit);
  }

  /** Leases grouped by holder: which shadows each session host holds. */
  async holders(): Promise<Map<string, Lease[]>> {
    const byHolder = new Map<string, Lease[]>();
    for (const lease of (await this.list()).leases) {
      const held = byHolder.get(lease.holder) ?? [];
      held.push(lease);
      byHolder.set(lease.holder, held);
    }
    return byHolder;
  }

  private async collect(uids: readonly string[]): Promise<LeaseListing> {
    const pipeline = this.redis.pipeline();
    pipeline.time();
    for (const uid of uids) pipeline.hgetall(this.keys.lease(uid));
    const replies = (await pipeline.exec()) ?? [];
    const [timeErr, time] = replies[0] ?? [null, ['0', '0']];
    if (timeErr) throw timeErr;
    const now = redisTimeMs(time as [string, string]);
    const leases: LeaseListing['leases'] = [];
    const vanished: string[] = [];
    uids.forEach((uid, i) => {
      const [err, hash] = replies[i + 1] ?? [null, {}];
      if (err) throw err;
      const lease = parseLease(uid, hash as Record<string, string>);
      if (lease) leases.push({ ...lease, expired: lease.expiresAt <= now });
      else vanished.push(uid);
    });
    // Index entries of keys that ran out of TTL: drop them (only if the key is still gone).
    await Promise.all(
      vanished.map((uid) => script('lease-prune').run(this.redis, [this.keys.lease(uid), this.keys.leases()], [uid])),
    );
    return { now, leases };
  }

  private async now(): Promise<number> {
    const [seconds = 0, micros = 0] = await this.redis.time();
    return redisTimeMs([seconds, micros]);
  }
}

function parseLease(uid: string, hash: Record<string, string>): Lease | null {
  if (hash.holder === undefined || hash.token === undefined) return null;
  return {
    uid,
    holder: hash.holder,
    generation: Number(hash.generation),
    token: Number(hash.token),
    expiresAt: Number(hash.expiresAt),
  };
}
