import { Queue, Worker } from 'bullmq';
import type { Redis } from 'ioredis';
import { afterEach, describe, expect, it } from 'vitest';
import { type HealthServer, startHealthServer } from '../../src/fleet/health.js';
import { LostConnections } from '../../src/store/lost-connections.js';
import { createRedis } from '../../src/store/redis.js';
import { waitFor } from '../../tools/sandbox/shadow-harness.js';

/**
 * A fleet connection that ioredis gives up on (status `end` without the fleet closing it) is reported,
 * duplicates included, and fails the process's /livez; connections closed by their owner, BullMQ's
 * among them, are not. The real Redis at 127.0.0.1:6379, database 1.
 */

const DB = 1;
const URL = `redis://127.0.0.1:6379/${DB}`;
const opened: Redis[] = [];
let health: HealthServer | undefined;

afterEach(async () => {
  for (const r of opened.splice(0)) r.disconnect();
  await health?.close();
  health = undefined;
});

function watched(lost: LostConnections, name: string): Redis {
  const r = createRedis(URL, { watch: lost, connectionName: name });
  opened.push(r);
  return r;
}

/**
 * Ends R the way ioredis ends a connection for good: a `disconnect(true)` (as its own role check and its
 * failover detector call it) while a reconnect is under way makes the connector give up, and the
 * connection goes to `end` instead of trying again.
 */
async function giveUp(r: Redis): Promise<void> {
  const ended = new Promise((resolve) => r.once('end', resolve));
  r.once('connecting', () => r.disconnect(true));
  r.disconnect(true);
  await ended;
}

describe('lost fleet connections', () => {
  it('reports a connection ioredis gave up on, and its duplicates by name; /livez fails until the restart', async () => {
    const reported: string[] = [];
    const lost = new LostConnections((name) => reported.push(name));
    const main = watched(lost, 'bh-test-lost');
    expect(await main.ping()).toBe('PONG');
    const dup = main.duplicate();
    opened.push(dup);
    dup.on('error', () => undefined); // its "Connection is closed." as it gives up
    expect(await dup.ping()).toBe('PONG');

    health = await startHealthServer(0, '127.0.0.1', {
      ready: [],
      live: [{ name: 'redis-connections', check: () => lost.list().length === 0 }],
    });
    const livez = async () => {
      const res = await fetch(`http://127.0.0.1:${health?.port}/livez`);
      return { status: res.status, body: await res.json() };
    };
    expect(await livez()).toEqual({ status: 200, body: { status: 'ok', failing: [] } });

    await giveUp(dup);
    expect(dup.status).toBe('end');
    expect(reported).toEqual(['bh-test-lost#1']);
    expect(await livez()).toEqual({ status: 503, body: { status: 'not live', failing: ['redis-connections'] } });
    // The connection it was duplicated from is untouched.
    expect(await main.ping()).toBe('PONG');
  });

  it('does not report connections their owner closed: disconnect(), QUIT, or a reconnect', async () => {
    const reported: string[] = [];
    const lost = new LostConnections((name) => reported.push(name));
    const a = watched(lost, 'bh-test-closed-a');
    const b = watched(lost, 'bh-test-closed-b');
    const c = watched(lost, 'bh-test-closed-c');
    await Promise.all([a.ping(), b.ping(), c.ping()]);

    const bEnded = new Promise((resolve) => b.once('end', resolve));
    await b.quit();
    await bEnded;
    const aEnded = new Promise((resolve) => a.once('end', resolve));
    a.disconnect();
    await aEnded;
    // A reconnect asked for by its owner comes back.
    c.disconnect(true);
    expect(await c.ping()).toBe('PONG');
    expect(reported).toEqual([]);
  });

  it("does not report BullMQ's connections when its worker and queue close", async () => {
    const reported: string[] = [];
    const lost = new LostConnections((name) => reported.push(name));
    const connection = watched(lost, 'bh-test-bullmq');
    // The duplicates BullMQ makes (its worker's blocking connection), to wait until they have ended.
    const duplicates: Redis[] = [];
    const duplicate = connection.duplicate.bind(connection);
    connection.duplicate = ((override?: Parameters<Redis['duplicate']>[0]) => {
      const made = duplicate(override);
      duplicates.push(made);
      return made;
    }) as Redis['duplicate'];
    const prefix = 'bh-test-lost';
    const queue = new Queue('lost-connections', { connection, prefix });
    const done = new Promise<unknown>((resolve) => {
      const worker = new Worker('lost-connections', async (job) => job.data, { connection, prefix });
      worker.on('completed', (_job, result) => resolve(worker.close().then(() => result)));
    });
    await queue.add('one', { n: 1 });
    expect(await done).toEqual({ n: 1 });
    await queue.obliterate({ force: true });
    await queue.close();
    expect(duplicates.length, 'connections BullMQ duplicated').toBeGreaterThan(0);
    await waitFor("BullMQ's connections ended", () => duplicates.every((d) => d.status === 'end'), 10_000).catch(
      (err: Error) => {
        throw new Error(`${err.message}: ${duplicates.map((d) => d.status).join(' ')}`);
      },
    );
    expect(reported).toEqual([]);
  });
});
