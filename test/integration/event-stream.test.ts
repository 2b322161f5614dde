import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Redis } from 'ioredis';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { silentLogger } from '../../src/log.js';
import type { PodEvent } from '../../src/machines/pod-machine.js';
import { EventStream, type StreamedEvent } from '../../src/pods/event-stream.js';
import { RedisKeys } from '../../src/store/keys.js';
import { createRedis } from '../../src/store/redis.js';
import { EventConsumer, type EventConsumerOptions, PermanentEventError } from '../../src/workers/event-consumer.js';
import { waitFor } from '../../tools/sandbox/shadow-harness.js';
import { freePort } from '../../tools/sandbox/sshd.js';
import { RedisServer } from '../fixtures/redis-server.js';

/**
 * The pods' events as one Redis stream and a consumer group (src/pods/event-stream.ts,
 * src/workers/event-consumer.ts), on a Redis of its own (so that INFO commandstats counts only this).
 */
const KEYS = new RedisKeys('bh:');
const FAST: Partial<EventConsumerOptions> = { reclaimAfterMs: 600, sweepEveryMs: 100, maxDeliveries: 3, tries: 1 };

let server: RedisServer;
let redis: Redis;
let stream: EventStream;
const consumers: EventConsumer[] = [];

function event(n: number): PodEvent {
  return { type: 'TEARDOWN', reason: `r${n}`, at: n };
}

function consumer(handler: (e: StreamedEvent, delivery: number) => Promise<unknown>, opts = FAST): EventConsumer {
  const c = new EventConsumer(stream, redis, handler, silentLogger(), { concurrency: 16, ...opts });
  consumers.push(c);
  c.start();
  return c;
}

async function calls(): Promise<Map<string, number>> {
  const info = await redis.info('commandstats');
  return new Map([...info.matchAll(/^cmdstat_(\w+):calls=(\d+)/gm)].map((m) => [m[1] as string, Number(m[2])]));
}

beforeAll(async () => {
  server = new RedisServer(await freePort(), await mkdtemp(join(tmpdir(), 'bh-redis-')));
  await server.start();
  redis = createRedis(server.url);
  stream = new EventStream(redis, KEYS);
}, 30_000);

beforeEach(async () => {
  await redis.flushall();
});

afterEach(async () => {
  // A consumer whose handler never ends (a worker killed mid-event) is left after a second.
  await Promise.all(consumers.splice(0).map((c) => c.close(1_000)));
});

afterAll(async () => {
  redis?.disconnect();
  await server?.crash();
  if (server) await rm(server.dir, { recursive: true, force: true });
});

describe('the events stream', () => {
  it('delivers events sent before any consumer ran, in order, each once; about 2 commands an event', async () => {
    for (let n = 0; n < 200; n += 1) await stream.send(`pod-${n % 7}`, event(n));
    const before = await calls();
    const seen: number[] = [];
    consumer(async (e) => {
      seen.push((JSON.parse(e.event) as { at: number }).at);
    });
    await waitFor('all applied', () => (seen.length === 200 ? true : undefined), 10_000);
    await waitFor('all acknowledged', async () => ((await stream.waiting()).length === 0 ? true : undefined), 5_000);
    expect(seen).toEqual(Array.from({ length: 200 }, (_, n) => n));
    const after = await calls();
    const used = (cmd: string) => (after.get(cmd) ?? 0) - (before.get(cmd) ?? 0);
    // Read in batches of up to 16 (the concurrency), acknowledged in batches: far fewer than one each.
    expect(used('xreadgroup'), JSON.stringify([...after])).toBeLessThan(60);
    expect(used('xack')).toBeLessThan(60);
    // Trimmed once acknowledged.
    await waitFor('trimmed', async () => ((await redis.xlen(stream.key)) === 0 ? true : undefined), 5_000);
  });

  it('a consumer that dies holding events: another takes them over and applies them', async () => {
    for (let n = 0; n < 5; n += 1) await stream.send('pod-a', event(n));
    // Reads and never finishes (a worker SIGKILLed mid-event): its entries stay pending.
    const stuck = consumer(() => new Promise(() => undefined), { ...FAST, reclaimAfterMs: 60_000 });
    await waitFor('read by the stuck one', async () => ((await stream.pending(0, 10)).length === 5 ? true : undefined));
    expect((await stream.pending(0, 10)).every((p) => p.consumer === stuck.name)).toBe(true);
    const applied: { at: number; delivery: number }[] = [];
    consumer(async (e, delivery) => {
      applied.push({ at: (JSON.parse(e.event) as { at: number }).at, delivery });
    });
    await waitFor('taken over', () => (applied.length === 5 ? true : undefined), 10_000);
    expect(applied.map((a) => a.at).sort()).toEqual([0, 1, 2, 3, 4]);
    expect(applied.every((a) => a.delivery === 2)).toBe(true);
    await waitFor('acknowledged', async () => ((await stream.pending(0, 10)).length === 0 ? true : undefined), 5_000);
  });

  it('buries an event that fails every time after maxDeliveries, and one refused as permanent at once', async () => {
    const failing = await stream.send('pod-f', event(1));
    const bad = await stream.send('pod-b', event(2));
    const tried: string[] = [];
    consumer(async (e, delivery) => {
      tried.push(`${e.id}#${delivery}`);
      if (e.id === bad) throw new PermanentEventError('pod pod-b: not an event of this machine');
      throw new Error('Redis is not answering');
    });
    await waitFor('both buried', async () => ((await stream.dead()).length === 2 ? true : undefined), 15_000);
    const dead = await stream.dead();
    expect(dead.find((d) => d.from === bad)).toMatchObject({
      uid: 'pod-b',
      reason: 'pod pod-b: not an event of this machine',
      delivery: 1,
    });
    expect(dead.find((d) => d.from === failing)).toMatchObject({
      uid: 'pod-f',
      reason: 'not applied after 3 deliveries',
      delivery: 3,
    });
    expect(tried.filter((t) => t.startsWith(failing))).toEqual([`${failing}#1`, `${failing}#2`, `${failing}#3`]);
    expect(await stream.waiting()).toEqual([]);
  });

  it('sends a once-id event once while it waits, and again once it is applied; its key goes with it', async () => {
    expect(await stream.sendOnce('pod-o', event(1), 'pod-o-upsert-7')).not.toBeNull();
    expect(await stream.sendOnce('pod-o', event(2), 'pod-o-upsert-7')).toBeNull();
    const applied: number[] = [];
    consumer(async (e) => {
      applied.push((JSON.parse(e.event) as { at: number }).at);
    });
    await waitFor('applied', () => (applied.length === 1 ? true : undefined));
    await waitFor('its key removed', async () =>
      (await redis.exists(KEYS.eventOnce('pod-o-upsert-7'))) === 0 ? true : undefined,
    );
    expect(await stream.sendOnce('pod-o', event(3), 'pod-o-upsert-7')).not.toBeNull();
    await waitFor('applied again', () => (applied.length === 2 ? true : undefined));
    expect(applied).toEqual([1, 3]);
  });

  it('never trims an event not yet delivered or not acknowledged', async () => {
    const held = consumer(() => new Promise(() => undefined), { ...FAST, reclaimAfterMs: 60_000 });
    await stream.send('pod-t', event(1));
    await waitFor('pending', async () => ((await stream.pending(0, 10)).length === 1 ? true : undefined));
    await held.pause();
    await stream.send('pod-t', event(2));
    expect(await stream.trim()).toBe(0);
    expect((await stream.waiting('pod-t')).map((e) => (JSON.parse(e.event) as { at: number }).at)).toEqual([1, 2]);
  });

  it('carries on after Redis lost its data (the group is made again) and reads what is sent next', async () => {
    const applied: number[] = [];
    consumer(async (e) => {
      applied.push((JSON.parse(e.event) as { at: number }).at);
    });
    await stream.send('pod-e', event(1));
    await waitFor('applied', () => (applied.length === 1 ? true : undefined));
    await redis.flushall();
    await new Promise((r) => setTimeout(r, 1_500));
    await stream.send('pod-e', event(2));
    await waitFor('applied after the loss', () => (applied.length === 2 ? true : undefined), 10_000);
    expect(applied).toEqual([1, 2]);
  });
});
