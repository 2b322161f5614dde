/**
 * Whether Redis lost what it held since this process last looked (redis/epoch-check.lua): a Redis
 * restarted empty, or a replica promoted with no copy of the data, has lost the fleet's epoch with the
 * rest. Session hosts then re-assert their leases and registration, the watch role rebuilds the pods'
 * records from the API server at once, and no lease is granted to anyone else for the recovery window.
 */
import { randomUUID } from 'node:crypto';
import type { Redis } from 'ioredis';
import type { RedisKeys } from './keys.js';
import { script } from './scripts.js';

export interface EpochCheck {
  /** Redis lost its data since the last check (never on a process's first). */
  lost: boolean;
  /** Until when (Redis clock, ms) only re-asserted leases are granted; 0: no recovery under way. */
  recoverUntil: number;
}

export class RedisEpoch {
  private known = '';
  /** One check at a time per process: the callers of a concurrent one share its answer. */
  private pending: Promise<EpochCheck> | undefined;

  constructor(
    private readonly redis: Redis,
    private readonly keys: RedisKeys,
    /** How long the recovery window lasts (ms): long enough for every holder to notice and re-assert. */
    private readonly recoveryMs: number,
  ) {}

  check(): Promise<EpochCheck> {
    this.pending ??= this.run().finally(() => {
      this.pending = undefined;
    });
    return this.pending;
  }

  private async run(): Promise<EpochCheck> {
    const [id, lost, recoverUntil] = (await script('epoch-check').run(
      this.redis,
      [this.keys.epoch()],
      [this.known, randomUUID(), Math.ceil(this.recoveryMs)],
    )) as [string, number, number];
    this.known = id;
    return { lost: lost === 1, recoverUntil: Number(recoverUntil) };
  }
}

/**
 * The recovery window for a lease TTL: a holder notices the loss at its next heartbeat (2 s) or lease
 * renewal (a third of the TTL), whichever comes first; twice the TTL leaves room for a slow Redis.
 */
export function recoveryWindowMs(leaseTtlMs: number): number {
  return 2 * leaseTtlMs + 4_000;
}
