/**
 * The Lua scripts of `redis/*.lua`, read once per process and run by SHA (EVALSHA). A server that does
 * not know a script yet (first use, restart, failover) answers NOSCRIPT: the script is loaded with
 * SCRIPT LOAD and run again. `preloadScripts` loads them all up front, at worker start.
 *
 * Each script's header declares its keys as `-- KEYS[n] …` lines: that is where the number of keys
 * comes from, and every call is checked against it.
 */
import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import type { Redis } from 'ioredis';

export const SCRIPT_NAMES = [
  'pod-create',
  'pod-cas',
  'pod-remove',
  'deadlines-claim',
  'outbox-claim',
  'outbox-clear',
  'review-set',
  'lease-acquire',
  'lease-renew',
  'lease-release',
  'lease-revoke',
  'lease-prune',
  'host-register',
  'host-heartbeat',
  'host-prune',
  'epoch-check',
  'events-send-once',
  'events-trim',
] as const;
export type ScriptName = (typeof SCRIPT_NAMES)[number];

/** `redis/` at the package root: two levels up from both src/store and dist/store. */
const SCRIPT_DIR = new URL('../../redis/', import.meta.url);

export class LuaScript {
  readonly sha: string;
  readonly numberOfKeys: number;

  constructor(
    readonly name: string,
    readonly source: string,
  ) {
    this.sha = createHash('sha1').update(source).digest('hex');
    this.numberOfKeys = declaredKeys(name, source);
  }

  async run(redis: Redis, keys: readonly string[], args: readonly (string | number)[]): Promise<unknown> {
    if (keys.length !== this.numberOfKeys) {
      throw new Error(`script ${this.name} takes ${this.numberOfKeys} keys, got ${keys.length}`);
    }
    try {
      return await redis.evalsha(this.sha, keys.length, ...keys, ...args);
    } catch (err) {
      if (!isNoScript(err)) throw err;
      await this.load(redis);
      return await redis.evalsha(this.sha, keys.length, ...keys, ...args);
    }
  }

  async load(redis: Redis): Promise<void> {
    const sha = await redis.script('LOAD', this.source);
    if (sha !== this.sha)
      throw new Error(`script ${this.name}: Redis computed SHA ${String(sha)}, expected ${this.sha}`);
  }
}

let registry: ReadonlyMap<ScriptName, LuaScript> | undefined;

/** All scripts, read from disk on first use and kept for the life of the process. */
export function scripts(): ReadonlyMap<ScriptName, LuaScript> {
  if (!registry) {
    registry = new Map(
      SCRIPT_NAMES.map((name) => [name, new LuaScript(name, readFileSync(new URL(`${name}.lua`, SCRIPT_DIR), 'utf8'))]),
    );
  }
  return registry;
}

export function script(name: ScriptName): LuaScript {
  const found = scripts().get(name);
  if (!found) throw new Error(`no script ${name}`);
  return found;
}

/** SCRIPT LOAD every script, so that the first calls do not each meet NOSCRIPT. */
export async function preloadScripts(redis: Redis): Promise<void> {
  await Promise.all([...scripts().values()].map((s) => s.load(redis)));
}

function declaredKeys(name: string, source: string): number {
  const declared = new Set<number>();
  for (const match of source.matchAll(/^--\s*KEYS\[(\d+)\]/gm)) declared.add(Number(match[1]));
  const count = declared.size;
  for (let i = 1; i <= count; i += 1) {
    if (!declared.has(i)) throw new Error(`script ${name}: its header declares KEYS up to ${count} but not KEYS[${i}]`);
  }
  return count;
}

function isNoScript(err: unknown): boolean {
  return err instanceof Error && err.message.startsWith('NOSCRIPT');
}
