/**
 * The fleet's session hosts (ARCHITECTURE.md, "Redis keys and queues" `<prefix>hosts`): each registers with its capacity, then
 * heartbeats with its load. Heartbeat times come from the Redis clock. A host whose heartbeat is older
 * than `staleAfterMs` is shown as stale and pruned; its next heartbeat tells it to register again.
 */
import type { Redis } from 'ioredis';
import { RedisKeys } from './keys.js';
import { redisTimeMs } from './redis.js';
import { script } from './scripts.js';

export interface SessionHost {
  id: string;
  /** Shadows it can hold. */
  capacity: number;
  /** Shadows it holds. */
  load: number;
  meta: Record<string, string>;
  /** Redis clock, ms. */
  startedAt: number;
  heartbeatAt: number;
}

export interface HostListing {
  now: number;
  hosts: (SessionHost & { stale: boolean })[];
}

export interface HostRegistryOptions {
  keys?: RedisKeys;
  staleAfterMs?: number;
}

export class HostRegistry {
  readonly keys: RedisKeys;
  readonly staleAfterMs: number;

  constructor(
    private readonly redis: Redis,
    opts: HostRegistryOptions = {},
  ) {
    this.keys = opts.keys ?? new RedisKeys();
    this.staleAfterMs = opts.staleAfterMs ?? 15_000;
  }

  /** Returns the registration time (Redis clock, ms). */
  async register(id: string, capacity: number, load = 0, meta: Record<string, string> = {}): Promise<number> {
    return Number(
      await script('host-register').run(this.redis, [this.keys.hosts()], [id, capacity, load, JSON.stringify(meta)]),
    );
  }

  /** False when the host is not registered (it was pruned as stale): register again. */
  async heartbeat(id: string, load: number): Promise<boolean> {
    return Number(await script('host-heartbeat').run(this.redis, [this.keys.hosts()], [id, load])) > 0;
  }

  async unregister(id: string): Promise<boolean> {
    return (await this.redis.hdel(this.keys.hosts(), id)) === 1;
  }

  async list(): Promise<HostListing> {
    const [[timeErr, time] = [null, ['0', '0']], [hostsErr, raw] = [null, {}]] =
      (await this.redis.multi().time().hgetall(this.keys.hosts()).exec()) ?? [];
    if (timeErr) throw timeErr;
    if (hostsErr) throw hostsErr;
    const now = redisTimeMs(time as [string, string]);
    const hosts: HostListing['hosts'] = [];
    for (const json of Object.values(raw as Record<string, string>)) {
      const host = parseHost(json);
      if (host) hosts.push({ ...host, stale: now - host.heartbeatAt > this.staleAfterMs });
    }
    hosts.sort((a, b) => a.id.localeCompare(b.id));
    return { now, hosts };
  }

  /** Forgets hosts not heard from for `staleAfterMs`; returns their ids. */
  async prune(): Promise<string[]> {
    return (await script('host-prune').run(this.redis, [this.keys.hosts()], [this.staleAfterMs])) as string[];
  }
}

function parseHost(json: string): SessionHost | null {
  try {
    const value = JSON.parse(json) as Partial<SessionHost>;
    if (typeof value.id !== 'string') return null;
    return {
      id: value.id,
      capacity: Number(value.capacity ?? 0),
      load: Number(value.load ?? 0),
      // Redis's cjson writes an empty table as {} — or [] when it cannot tell: both mean no metadata.
      meta: value.meta && !Array.isArray(value.meta) ? value.meta : {},
      startedAt: Number(value.startedAt ?? 0),
      heartbeatAt: Number(value.heartbeatAt ?? 0),
    };
  } catch {
    return null;
  }
}
