import { type ChildProcess, spawn } from 'node:child_process';
import { once } from 'node:events';
import { closeSync, openSync } from 'node:fs';
import { join } from 'node:path';
import { createRedis } from '../../src/store/redis.js';
import { freePort } from '../sandbox/sshd.js';

/**
 * The demo's Redis: the one at `--redis` / REDIS_URL when it answers, in database 15 so it never
 * touches other data (and not even that when database 15 holds keys that are not backhaul's), else a
 * private `redis-server` on a free loopback port, in the demo's temp dir, gone at the end.
 */
export const DEMO_DB = 15;

export interface DemoRedis {
  url: string;
  /** One line for people: where it is and why. */
  description: string;
  /** Whether it is a redis-server of the demo's own. */
  private: boolean;
  /** Stops the private server (nothing for a shared one). */
  stop(): Promise<void>;
}

/** URL with its database replaced by DB. */
export function withDatabase(url: string, db: number): string {
  const u = new URL(url);
  u.pathname = `/${db}`;
  return u.toString();
}

/** Keys of this database that the demo did not (or could not have) made. */
async function foreignKeys(url: string): Promise<string[] | undefined> {
  const redis = createRedis(url, {
    kind: 'command',
    connectionName: 'backhaul-demo',
    options: { connectTimeout: 1_500, retryStrategy: () => null, lazyConnect: true },
  });
  redis.on('error', () => undefined);
  try {
    await redis.connect();
    await redis.ping();
    const foreign: string[] = [];
    let cursor = '0';
    do {
      const [next, keys] = await redis.scan(cursor, 'COUNT', 1000);
      cursor = next;
      foreign.push(...keys.filter((k) => !k.startsWith('bh:') && !k.startsWith('bull:bh-')));
    } while (cursor !== '0' && foreign.length < 5);
    return foreign;
  } catch {
    return undefined; // not answering
  } finally {
    redis.disconnect();
  }
}

export async function demoRedis(candidate: string, dir: string): Promise<DemoRedis> {
  const url = withDatabase(candidate, DEMO_DB);
  const shown = new URL(url);
  shown.password = shown.password ? '***' : '';
  const foreign = await foreignKeys(url);
  if (foreign && foreign.length === 0) {
    return {
      url,
      description: `Redis at ${shown.host}, database ${DEMO_DB} (kept apart from other data; only this demo's keys are touched)`,
      private: false,
      stop: async () => undefined,
    };
  }
  const why =
    foreign === undefined
      ? `nothing answers at ${shown.host}`
      : `database ${DEMO_DB} at ${shown.host} holds other data (${foreign[0]}, ...)`;
  const server = await startRedisServer(dir);
  return {
    url: server.url,
    private: true,
    description: `a private redis-server on 127.0.0.1:${server.port}, pid ${server.pid} (${why})`,
    stop: server.stop,
  };
}

export interface RedisServer {
  url: string;
  port: number;
  pid: number;
  stop(): Promise<void>;
}

/**
 * `redis-server` on 127.0.0.1:<free port>, no persistence, files in DIR; killed with this process.
 * `password`: started with `--requirepass` (the URL stays without it; tests give it on their own).
 */
export async function startRedisServer(dir: string, password?: string): Promise<RedisServer> {
  const port = await freePort();
  const log = openSync(join(dir, 'redis-server.log'), 'a');
  let child: ChildProcess;
  try {
    const args = ['--bind', '127.0.0.1', '--port', String(port), '--save', '', '--appendonly', 'no', '--dir', dir];
    if (password !== undefined) args.push('--requirepass', password);
    child = spawn('setpriv', ['--pdeathsig', 'KILL', '--', 'redis-server', ...args], { stdio: ['ignore', log, log] });
  } finally {
    closeSync(log);
  }
  const exited = once(child, 'exit');
  const url = `redis://127.0.0.1:${port}`;
  const stop = async () => {
    if (child.exitCode === null && child.signalCode === null) {
      child.kill('SIGTERM');
      await exited;
    }
  };
  const redis = createRedis(url, {
    kind: 'command',
    ...(password === undefined ? {} : { password }),
    options: { lazyConnect: true, retryStrategy: () => null },
  });
  redis.on('error', () => undefined);
  const deadline = Date.now() + 10_000;
  try {
    for (;;) {
      if (child.exitCode !== null)
        throw new Error(`redis-server exited (${child.exitCode}); see ${dir}/redis-server.log`);
      if (
        await redis.connect().then(
          () => true,
          () => false,
        )
      )
        break;
      if (Date.now() > deadline) throw new Error(`redis-server did not answer on ${url} within 10 s`);
      await new Promise((r) => setTimeout(r, 100));
    }
  } catch (error) {
    await stop();
    throw error;
  } finally {
    redis.disconnect();
  }
  return { url, port, pid: child.pid ?? 0, stop };
}
