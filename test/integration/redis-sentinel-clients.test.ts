import type { Redis } from 'ioredis';
import { afterEach, describe, expect, it } from 'vitest';
import { createRedis } from '../../src/store/redis.js';
import { waitFor } from '../../tools/sandbox/shadow-harness.js';
import { SentinelSet } from '../fixtures/redis-sentinel.js';

/**
 * One fleet connection (createRedis, as every worker and BullMQ's duplicates make them) through a failover
 * in which the sentinel it asks first has stopped answering (SIGSTOP: a paused VM, a hung host). The
 * connection must reach the promoted replica and stay usable; "Connection is closed." for good is the
 * failure (ioredis' status `end`, from which it never reconnects).
 */

let set: SentinelSet | undefined;
let client: Redis | undefined;

afterEach(async () => {
  client?.disconnect();
  client = undefined;
  await set?.stop();
  set = undefined;
});

/** Kills the master while sentinel 0 (the one the connection asks first) is paused; returns the promoted port. */
async function failOverPastAPausedSentinel(
  s: SentinelSet,
): Promise<{ old: number; promoted: number; killedAt: number; promotedAt: number }> {
  const old = (await s.masterPort(1)) ?? 0;
  s.pauseSentinel(0, true);
  await s.kill(old);
  const killedAt = Date.now();
  const promoted = await waitFor(
    'a replica promoted (as sentinel 1 sees it)',
    async () => {
      const port = await s.masterPort(1);
      return port !== undefined && port !== old ? port : undefined;
    },
    30_000,
  );
  return { old, promoted, killedAt, promotedAt: Date.now() };
}

/** The statuses R goes through from now on, for the failure message. */
function statusesOf(r: Redis): string[] {
  const seen: string[] = [];
  for (const event of ['connecting', 'connect', 'ready', 'close', 'reconnecting', 'end']) {
    r.on(event, () => seen.push(event));
  }
  return seen;
}

/** WORK's value, or an error saying WHAT once MS have passed without it. */
function answered<T>(work: Promise<T>, ms: number, what: string): Promise<T> {
  return Promise.race([
    work,
    new Promise<never>((_, reject) => setTimeout(() => reject(new Error(`${what} in ${ms} ms`)), ms)),
  ]);
}

/**
 * What the connection answers once it is back, and the port of the server that answered, as that server
 * says it (the socket's remote port is gone when a late +switch-master has the connection reconnect right
 * after the answer, which is allowed: seen in CI as `port: undefined`).
 */
async function reconnected(
  r: Redis,
  statuses: string[],
  timeoutMs: number,
): Promise<{ answer: { pong: string; port: number | undefined }; at: number }> {
  try {
    const [pong, info] = await answered(Promise.all([r.ping(), r.info('server')]), timeoutMs, 'no answer');
    const at = Date.now();
    // Still usable a moment later (a connection that answers once and then ends for good is the failure).
    await new Promise((resolve) => setTimeout(resolve, 1_000));
    const again = await answered(r.info('server'), timeoutMs, 'no second answer');
    const ports = [info, again].map((text) => /^tcp_port:(\d+)/m.exec(text)?.[1]);
    if (ports[0] !== ports[1]) throw new Error(`answered from port ${ports[0]}, then from ${ports[1]}`);
    return { answer: { pong, port: ports[0] === undefined ? undefined : Number(ports[0]) }, at };
  } catch (err) {
    throw new Error(`${(err as Error).message}; status ${r.status}; statuses since the kill: ${statuses.join(' ')}`);
  }
}

describe('a fleet connection through a failover', () => {
  it('does not wait forever on a sentinel that stopped answering: it asks the next one', async () => {
    set = await SentinelSet.start();
    client = createRedis(set.url, { connectionName: 'bh-test-paused-sentinel' });
    client.on('error', () => undefined);
    expect(await client.ping()).toBe('PONG');
    const statuses = statusesOf(client);
    const { promoted, killedAt, promotedAt } = await failOverPastAPausedSentinel(set);
    const back = await reconnected(client, statuses, 20_000);
    console.log(
      `sentinel 0 paused, master killed: replica promoted ${promotedAt - killedAt} ms after (as sentinel 1 saw it), the connection answered on it ${back.at - killedAt} ms after`,
    );
    expect(back.answer).toEqual({ pong: 'PONG', port: promoted });
  }, 90_000);

  it('is not ended by the failover announced while it is asking a sentinel for the master', async () => {
    set = await SentinelSet.start();
    // Sentinel 0 answers the reconnect's question only once it runs again, after the failover was announced.
    client = createRedis(set.url, {
      connectionName: 'bh-test-announced-failover',
      options: { sentinelCommandTimeout: 120_000 },
    });
    client.on('error', () => undefined);
    expect(await client.ping()).toBe('PONG');
    const statuses = statusesOf(client);
    const { promoted } = await failOverPastAPausedSentinel(set);
    // +switch-master is published as the promotion is made: give it a moment to arrive.
    await new Promise((resolve) => setTimeout(resolve, 1_000));
    set.pauseSentinel(0, false);
    const back = await reconnected(client, statuses, 20_000);
    expect(back.answer).toEqual({ pong: 'PONG', port: promoted });
  }, 90_000);
});
