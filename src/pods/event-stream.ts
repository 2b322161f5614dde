import type { Redis } from 'ioredis';
import type { PodEvent } from '../machines/pod-machine.js';
import type { RedisKeys } from '../store/keys.js';
import { script } from '../store/scripts.js';

/** The control role's consumer group on the events stream. */
export const EVENT_GROUP = 'control';

/** How long a once-id's key may outlive an event that was lost (a Redis that lost its last writes). */
const ONCE_TTL_MS = 86_400_000;

/** Dead letters kept (XADD MAXLEN ~). */
const DEAD_MAX_LEN = 10_000;

/** An entry of the stream as a consumer reads it. */
export interface StreamedEvent {
  id: string;
  uid: string;
  /** The event as sent (JSON text): the consumer parses it, so that a bad one is a dead letter, not a crash. */
  event: string;
  /** The once-id it was sent with (sendOnce), whose key goes when it is applied. */
  once: string | undefined;
}

/** An entry delivered but not acknowledged: its consumer is working on it, failed, or died. */
export interface PendingEvent {
  id: string;
  consumer: string;
  idleMs: number;
  deliveries: number;
}

export interface DeadEvent {
  id: string;
  uid: string;
  event: string;
  reason: string;
  /** Its id in the events stream. */
  from: string;
  /** Its delivery that gave up: 1 for an event refused at once. */
  delivery: number;
}

type RawEntry = [id: string, fields: string[]];

function entryOf([id, fields]: RawEntry): StreamedEvent {
  const field = (name: string) => {
    const i = fields.indexOf(name);
    return i >= 0 && i % 2 === 0 ? fields[i + 1] : undefined;
  };
  return { id, uid: field('uid') ?? '', event: field('event') ?? '', once: field('once') };
}

function isError(err: unknown, code: string): boolean {
  return err instanceof Error && err.message.startsWith(code);
}

/**
 * The pods' events: one Redis stream, read by the control role as one consumer group (ARCHITECTURE.md,
 * "Events"). Sending is one XADD; a consumer reads many at once (XREADGROUP), acknowledges them in one
 * command, and takes over what a dead consumer left (XPENDING, XCLAIM). Against a BullMQ job per event
 * (about 35 Redis commands each: add, move to active, lock, move to finished, its event stream), an
 * event costs about two.
 */
export class EventStream {
  readonly key: string;
  readonly deadKey: string;

  constructor(
    private readonly redis: Redis,
    private readonly keys: RedisKeys,
  ) {
    this.key = keys.events();
    this.deadKey = keys.deadEvents();
  }

  /** Sends one event to a pod's machine. */
  async send(uid: string, event: PodEvent): Promise<string> {
    return (await this.redis.xadd(this.key, '*', 'uid', uid, 'event', JSON.stringify(event))) as string;
  }

  /** Sends it unless an event sent with the same `once` id has not been applied yet; null then. */
  async sendOnce(uid: string, event: PodEvent, once: string): Promise<string | null> {
    const id = await script('events-send-once').run(
      this.redis,
      [this.key, this.keys.eventOnce(once)],
      [uid, JSON.stringify(event), once, ONCE_TTL_MS],
    );
    return typeof id === 'string' ? id : null;
  }

  /** Makes the consumer group (from the stream's start: events sent before any worker ran count). */
  async ensureGroup(): Promise<void> {
    try {
      await this.redis.xgroup('CREATE', this.key, EVENT_GROUP, '0', 'MKSTREAM');
    } catch (err) {
      if (!isError(err, 'BUSYGROUP')) throw err;
    }
  }

  /**
   * Up to `count` events no consumer has had yet, waiting up to `blockMs` for one; on the given
   * connection (a blocking read holds it). A missing group (a Redis that lost its data) is made again.
   */
  async read(connection: Redis, consumer: string, count: number, blockMs: number): Promise<StreamedEvent[]> {
    const args = ['GROUP', EVENT_GROUP, consumer, 'COUNT', count, 'BLOCK', blockMs, 'STREAMS', this.key, '>'] as const;
    let reply: unknown;
    try {
      reply = await connection.xreadgroup(...args);
    } catch (err) {
      if (!isError(err, 'NOGROUP')) throw err;
      await this.ensureGroup();
      return [];
    }
    const streams = reply as [string, RawEntry[]][] | null;
    return (streams?.[0]?.[1] ?? []).map(entryOf);
  }

  /** Acknowledges applied events (one command for all) and removes their once-ids' keys. */
  async ack(events: readonly StreamedEvent[]): Promise<void> {
    if (events.length === 0) return;
    const pipeline = this.redis.pipeline();
    pipeline.xack(this.key, EVENT_GROUP, ...events.map((e) => e.id));
    const once = events.flatMap((e) => (e.once === undefined ? [] : [this.keys.eventOnce(e.once)]));
    if (once.length > 0) pipeline.del(...once);
    for (const [err] of (await pipeline.exec()) ?? []) if (err) throw err;
  }

  /** Entries delivered at least `minIdleMs` ago and not acknowledged, oldest first. */
  async pending(minIdleMs: number, count: number): Promise<PendingEvent[]> {
    let reply: unknown;
    try {
      reply = await this.redis.xpending(this.key, EVENT_GROUP, 'IDLE', minIdleMs, '-', '+', count);
    } catch (err) {
      if (isError(err, 'NOGROUP')) return [];
      throw err;
    }
    return (reply as [string, string, number, number][]).map(([id, consumer, idleMs, deliveries]) => ({
      id,
      consumer,
      idleMs,
      deliveries,
    }));
  }

  /**
   * Takes entries over for `consumer` if they are still idle for `minIdleMs` (another consumer may have
   * claimed them first); their delivery count goes up by one. Entries trimmed meanwhile are left out.
   */
  async claim(consumer: string, minIdleMs: number, ids: readonly string[]): Promise<StreamedEvent[]> {
    if (ids.length === 0) return [];
    const reply = (await this.redis.xclaim(this.key, EVENT_GROUP, consumer, minIdleMs, ...ids)) as (RawEntry | null)[];
    return reply.filter((e): e is RawEntry => e !== null && Array.isArray(e[1])).map(entryOf);
  }

  /** Moves an event that cannot be applied to the dead letters, with why, and acknowledges it. */
  async bury(event: StreamedEvent, reason: string, delivery: number): Promise<void> {
    await this.redis.xadd(
      this.deadKey,
      'MAXLEN',
      '~',
      DEAD_MAX_LEN,
      '*',
      'uid',
      event.uid,
      'event',
      event.event,
      'reason',
      reason,
      'from',
      event.id,
      'delivery',
      delivery,
    );
    await this.ack([event]);
  }

  /** An entry by id (a pending one whose consumer died), or null once trimmed. */
  async entry(id: string): Promise<StreamedEvent | null> {
    const reply = (await this.redis.xrange(this.key, id, id)) as RawEntry[];
    return reply[0] ? entryOf(reply[0]) : null;
  }

  /** Removes entries outright (tests and operators: an event that should not be applied). */
  async drop(ids: readonly string[]): Promise<void> {
    if (ids.length > 0) await this.redis.xdel(this.key, ...ids);
  }

  /** Drops the entries every consumer is done with; returns how many. */
  async trim(): Promise<number> {
    return Number(await script('events-trim').run(this.redis, [this.key], [EVENT_GROUP]));
  }

  /** Every entry still in the stream (waiting, or delivered and not acknowledged), of one pod if given. */
  async waiting(uid?: string): Promise<StreamedEvent[]> {
    const all = ((await this.redis.xrange(this.key, '-', '+')) as RawEntry[]).map(entryOf);
    const pending = new Set((await this.pending(0, 100_000)).map((p) => p.id));
    const delivered = await this.lastDelivered();
    const live = all.filter((e) => pending.has(e.id) || compareIds(e.id, delivered) > 0);
    return uid === undefined ? live : live.filter((e) => e.uid === uid);
  }

  /** Removes the pod's dead letters (it is forgotten: nothing can show them any more). */
  async forgetDead(uid: string): Promise<void> {
    if ((await this.redis.xlen(this.deadKey)) === 0) return;
    const ids = (await this.dead(uid)).map((d) => d.id);
    if (ids.length > 0) await this.redis.xdel(this.deadKey, ...ids);
  }

  /** The dead letters, of one pod if given. */
  async dead(uid?: string): Promise<DeadEvent[]> {
    const all = ((await this.redis.xrange(this.deadKey, '-', '+')) as RawEntry[]).map(([id, fields]) => {
      const e = entryOf([id, fields]);
      const field = (name: string) => fields[fields.indexOf(name) + 1] ?? '';
      return {
        id,
        uid: e.uid,
        event: e.event,
        reason: field('reason'),
        from: field('from'),
        delivery: Number(field('delivery')),
      };
    });
    return uid === undefined ? all : all.filter((e) => e.uid === uid);
  }

  private async lastDelivered(): Promise<string> {
    try {
      const groups = (await this.redis.xinfo('GROUPS', this.key)) as unknown[][];
      for (const group of groups) {
        const name = group[group.indexOf('name') + 1];
        if (name === EVENT_GROUP) return String(group[group.indexOf('last-delivered-id') + 1]);
      }
    } catch (err) {
      if (!isError(err, 'ERR no such key')) throw err;
    }
    return '0-0';
  }
}

/** Orders stream ids (`<ms>-<seq>`). */
export function compareIds(a: string, b: string): number {
  const [am = 0n, as = 0n] = a.split('-').map(BigInt);
  const [bm = 0n, bs = 0n] = b.split('-').map(BigInt);
  return am !== bm ? (am < bm ? -1 : 1) : as === bs ? 0 : as < bs ? -1 : 1;
}
