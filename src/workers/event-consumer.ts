import { randomBytes } from 'node:crypto';
import { hostname } from 'node:os';
import { setTimeout as sleep } from 'node:timers/promises';
import type { Redis } from 'ioredis';
import type { Logger } from '../log.js';
import type { EventStream, StreamedEvent } from '../pods/event-stream.js';

/** An event that applying again cannot help (it does not parse, or its pod's record cannot be read). */
export class PermanentEventError extends Error {
  override readonly name = 'PermanentEventError';
}

export interface EventConsumerOptions {
  /** Events applied at once. */
  concurrency: number;
  /**
   * An event delivered this long ago and still not acknowledged is taken over by whichever consumer
   * looks next: its consumer died, or gave up on it for now (a Redis error). Longer than any event
   * takes, waiting behind its pod's earlier ones included.
   */
  reclaimAfterMs: number;
  /** Delivered this many times without being applied: a dead letter (`backhaul status` shows why). */
  maxDeliveries: number;
  /** How often to look for such events, and to trim the stream. */
  sweepEveryMs: number;
  /** A blocking read waits this long for a new event (and so does close, at most). */
  blockMs: number;
  /** In-process tries of an event before it is left to `reclaimAfterMs` (backing off from 200 ms). */
  tries: number;
}

export const EVENT_CONSUMER_DEFAULTS: EventConsumerOptions = {
  concurrency: 128,
  reclaimAfterMs: 10_000,
  maxDeliveries: 10,
  sweepEveryMs: 1_000,
  blockMs: 1_000,
  tries: 3,
};

/** Trim once every this many sweeps. */
const TRIM_EVERY_SWEEPS = 5;

interface Settable {
  promise: Promise<void>;
  settle: () => void;
}

function settable(): Settable {
  let settle = () => {};
  const promise = new Promise<void>((resolve) => {
    settle = resolve;
  });
  return { promise, settle };
}

export type EventHandler = (event: StreamedEvent, delivery: number) => Promise<unknown>;

/**
 * Reads the events stream as one consumer of the control role's group: up to `concurrency` events in
 * flight, acknowledged in batches (one XACK for all that finished in the same turn of the event loop),
 * with the events of consumers that died (or that gave up for now) taken over after `reclaimAfterMs`
 * and buried after `maxDeliveries`. The handler must be safe to run twice for one event: a consumer
 * that stalls past `reclaimAfterMs` may see its event applied by another too (the pod's compare-and-set
 * makes the second a no-op).
 */
export class EventConsumer {
  readonly name = `${hostname()}-${process.pid}-${randomBytes(3).toString('hex')}`;
  private readonly opts: EventConsumerOptions;
  private readonly inFlight = new Set<string>();
  private toAck: StreamedEvent[] = [];
  private flushing: Promise<void> | undefined;
  private closing = false;
  private wake: (() => void) | undefined;
  private loop: Promise<void> | undefined;
  private sweeper: NodeJS.Timeout | undefined;
  private sweeps = 0;
  private sweeping = false;
  /** While paused: the read loop waits for `resume`, having settled `stopped`. */
  private paused: { resume: Settable; stopped: Settable } | undefined;
  /** Held by the blocking read: a copy of the connection given, so that nothing else waits behind it. */
  private readonly connection: Redis;

  constructor(
    private readonly stream: EventStream,
    connection: Redis,
    private readonly handler: EventHandler,
    private readonly log: Logger,
    opts: Partial<EventConsumerOptions> = {},
  ) {
    this.opts = { ...EVENT_CONSUMER_DEFAULTS, ...opts };
    this.connection = connection.duplicate();
    this.connection.on('error', () => undefined); // retried by ioredis; the read loop logs what fails
  }

  start(): void {
    this.loop = this.readLoop();
    this.sweeper = setInterval(() => void this.sweep(), this.opts.sweepEveryMs);
    this.sweeper.unref();
  }

  /** True while it reads (started, not closed). */
  isRunning(): boolean {
    return this.loop !== undefined && !this.closing;
  }

  /** Reads nothing more until resume() (the events in flight finish); resolves once the reading stopped. */
  async pause(): Promise<void> {
    if (!this.paused) {
      this.paused = { resume: settable(), stopped: settable() };
      this.wake?.();
    }
    await this.paused.stopped.promise;
  }

  resume(): void {
    const paused = this.paused;
    this.paused = undefined;
    paused?.resume.settle();
  }

  /**
   * Stops reading, lets the events in flight finish (for up to `graceMs`: what is left then stays pending
   * and is taken over by another consumer) and acknowledges them.
   */
  async close(graceMs = 30_000): Promise<void> {
    this.closing = true;
    if (this.sweeper) clearInterval(this.sweeper);
    this.wake?.();
    this.resume();
    await this.loop;
    const until = performance.now() + graceMs;
    while (this.inFlight.size > 0 && performance.now() < until) await sleep(10);
    await this.flush();
    this.connection.disconnect();
  }

  private async readLoop(): Promise<void> {
    while (!this.closing) {
      if (this.paused) {
        this.paused.stopped.settle();
        await this.paused.resume.promise;
        continue;
      }
      if (this.inFlight.size >= this.opts.concurrency) {
        await new Promise<void>((resolve) => {
          this.wake = resolve;
        });
        this.wake = undefined;
        continue;
      }
      try {
        const room = this.opts.concurrency - this.inFlight.size;
        for (const event of await this.stream.read(this.connection, this.name, room, this.opts.blockMs)) {
          this.dispatch(event, 1);
        }
      } catch (err) {
        if (this.closing) break;
        this.log.warn({ err }, 'cannot read the events stream; trying again');
        await sleep(500);
      }
    }
  }

  private dispatch(event: StreamedEvent, delivery: number): void {
    this.inFlight.add(event.id);
    void this.apply(event, delivery).finally(() => {
      this.inFlight.delete(event.id);
      this.wake?.();
    });
  }

  private async apply(event: StreamedEvent, delivery: number): Promise<void> {
    for (let attempt = 1; ; attempt += 1) {
      try {
        await this.handler(event, delivery);
        this.acknowledge(event);
        return;
      } catch (err) {
        if (err instanceof PermanentEventError) {
          await this.bury(event, err.message, delivery);
          return;
        }
        if (attempt >= this.opts.tries || this.closing) {
          // Left pending: taken over after reclaimAfterMs (here or by another consumer), or buried.
          this.log.warn({ err, uid: event.uid, id: event.id, delivery }, 'event not applied; it will be tried again');
          return;
        }
        await sleep(200 * 2 ** (attempt - 1));
      }
    }
  }

  private acknowledge(event: StreamedEvent): void {
    this.toAck.push(event);
    if (this.toAck.length === 1) setImmediate(() => void this.flush());
  }

  private async flush(): Promise<void> {
    await this.flushing;
    const batch = this.toAck;
    if (batch.length === 0) return;
    this.toAck = [];
    this.flushing = this.stream.ack(batch).catch((err: unknown) => {
      // Not acknowledged: delivered again after reclaimAfterMs, and applying again is a no-op.
      this.log.warn({ err, events: batch.length }, 'cannot acknowledge applied events');
    });
    await this.flushing;
  }

  private async bury(event: StreamedEvent, reason: string, delivery: number): Promise<void> {
    this.log.error({ uid: event.uid, id: event.id, reason }, 'event cannot be applied: moved to the dead letters');
    await this.stream.bury(event, reason, delivery).catch((err: unknown) => {
      this.log.warn({ err, id: event.id }, 'cannot move an event to the dead letters');
    });
  }

  /** Takes over what stalled consumers left, buries what failed too often, and now and then trims. */
  private async sweep(): Promise<void> {
    if (this.sweeping || this.closing) return;
    this.sweeping = true;
    try {
      const stale = (await this.stream.pending(this.opts.reclaimAfterMs, 64)).filter((p) => !this.inFlight.has(p.id));
      const claimed = await this.stream.claim(
        this.name,
        this.opts.reclaimAfterMs,
        stale.map((p) => p.id),
      );
      const deliveries = new Map(stale.map((p) => [p.id, p.deliveries + 1]));
      for (const event of claimed) {
        const delivery = deliveries.get(event.id) ?? this.opts.maxDeliveries;
        if (delivery > this.opts.maxDeliveries) {
          await this.bury(event, `not applied after ${delivery - 1} deliveries`, delivery - 1);
        } else {
          this.dispatch(event, delivery);
        }
      }
      this.sweeps += 1;
      if (this.sweeps % TRIM_EVERY_SWEEPS === 0) await this.stream.trim();
    } catch (err) {
      this.log.warn({ err }, 'cannot sweep the events stream');
    } finally {
      this.sweeping = false;
    }
  }
}
