import { readdir, stat } from 'node:fs/promises';
import { setTimeout as sleep } from 'node:timers/promises';
import type { Redis } from 'ioredis';
import { EventStream } from '../../src/pods/event-stream.js';
import type { FleetDeps } from '../../src/pods/fleet-deps.js';
import { QUEUE_NAMES } from '../../src/pods/queues.js';
import { DEFAULT_KEY_PREFIX, RedisKeys } from '../../src/store/keys.js';
import type { LoopbackSite } from '../sandbox/loopback-site.js';
import { descendantsOf, processTable } from '../sandbox/processes.js';
import { jobState, stepsOf, TERMINAL_STATES } from '../sandbox/slurm.js';
import type { TestUser } from '../sandbox/users.js';
import type { DemoPod } from './stack.js';

/**
 * What a pod may leave behind (ARCHITECTURE.md, "Aims (what good looks like)": no stale socket, process, lease or Redis key after
 * teardown), checked from the outside: the node's files, the process table, Slurm and Redis. The one
 * leftovers checker of the demo and the tests.
 */
export interface Check {
  what: string;
  /** Empty when the check passed. */
  problems: string[];
}

export interface LeftoverScope {
  deps: FleetDeps;
  site: LoopbackSite;
  user: TestUser;
  pod: DemoPod;
  jobId: string;
}

/** What a dir left behind holds: what was written last says who wrote after the trap. */
async function listing(dir: string): Promise<string> {
  const names = await readdir(dir).catch((e: NodeJS.ErrnoException) => [`(unreadable: ${e.code})`]);
  const rows = await Promise.all(
    names.map(async (name) => {
      const s = await stat(`${dir}/${name}`).catch(() => null);
      return s ? `${name} (${s.size} B, ${new Date(s.mtimeMs).toISOString().slice(11, 23)})` : name;
    }),
  );
  return rows.length > 0 ? rows.join(', ') : 'nothing';
}

async function exists(path: string): Promise<boolean> {
  return stat(path).then(
    () => true,
    () => false,
  );
}

/** Redis: the pod's record, indexes and lease are gone; its history stays (and expires). */
async function redisKeys({ deps, pod }: LeftoverScope): Promise<Check> {
  const history = deps.keys.history(pod.uid);
  const problems = (await keysNaming(deps.redis, pod.uid, `${deps.keys.prefix}*${pod.uid}*`))
    .filter((k) => k !== history)
    .map((k) => `key ${k}`);
  if ((await deps.redis.zscore(deps.keys.pods(), pod.uid)) !== null) problems.push(`${deps.keys.pods()} lists it`);
  if (await deps.redis.hexists(deps.keys.podsByName(), `${pod.namespace}/${pod.name}`))
    problems.push(`${deps.keys.podsByName()} names it`);
  if ((await deps.redis.exists(history)) === 0) problems.push('its history is gone too');
  return { what: `Redis: no key of the pod but its history (${history})`, problems };
}

async function lease({ deps, pod }: LeftoverScope): Promise<Check> {
  const held = await deps.leases.get(pod.uid);
  return {
    what: `no lease (${deps.keys.lease(pod.uid)})`,
    problems: held ? [`held by ${held.holder}, generation ${held.generation}`] : [],
  };
}

/** Nothing of the pod in the queues: no job (waiting, running, delayed or finished), no event not applied or buried. */
async function queuedJobs({ deps, pod }: LeftoverScope): Promise<Check> {
  const problems = await queueEntriesNaming(deps.redis, pod.uid, {
    bullPrefix: deps.bullPrefix ?? 'bull',
    keyPrefix: deps.keys.prefix,
  });
  return { what: 'no job or event of the pod in the queues', problems };
}

async function socketFiles({ pod }: LeftoverScope): Promise<Check> {
  const problems: string[] = [];
  for (const f of pod.plan.forwards) if (await exists(f.socketPath)) problems.push(f.socketPath);
  return { what: `no socket file (${pod.plan.forwards.map((f) => f.socketPath).join(', ')})`, problems };
}

/**
 * Carrier processes: whatever the node sshd runs besides its listener (node and userspace carriers),
 * anything but connection sshds under the login sshd (srun carriers), and any process of the job user
 * that names the pod's carrier dir (the user-space sshd) or its job (`srun --jobid`).
 */
function carrierProcesses({ site, user, pod, jobId }: LeftoverScope): Check {
  const nodeTree = new Set(descendantsOf(site.node.pid));
  const loginTree = new Set(descendantsOf(site.login.pid));
  const carrierDir = `${pod.plan.socketDir}/carrier`;
  const problems = processTable()
    .filter(
      (p) =>
        nodeTree.has(p.pid) ||
        (loginTree.has(p.pid) && p.comm !== 'sshd') ||
        (p.uid === user.uid && (p.cmdline.includes(carrierDir) || p.cmdline.includes(`--jobid=${jobId}`))),
    )
    .map((p) => `pid ${p.pid} (uid ${p.uid}): ${p.cmdline || p.comm}`);
  return { what: `no carrier process of ${user.name} (node sshd sessions, sshd -i, srun)`, problems };
}

/** Slurm: no step but the batch step (and none at all once the job has ended). */
async function extraSteps({ jobId }: LeftoverScope): Promise<Check> {
  const steps = await stepsOf(jobId);
  return {
    what: `no extra Slurm step in job ${jobId}`,
    problems: steps.filter((s) => !s.endsWith('.batch') && !s.endsWith('.extern')),
  };
}

/** The tunnel is gone (the job may still run): Redis, lease, queues, sockets, carriers, steps. */
export async function tunnelLeftovers(scope: LeftoverScope): Promise<Check[]> {
  return [
    await redisKeys(scope),
    await lease(scope),
    await queuedJobs(scope),
    await socketFiles(scope),
    carrierProcesses(scope),
    await extraSteps(scope),
  ];
}

/** After the job ended: it has, its trap removed the socket dir, and no process of it is left. */
export async function jobLeftovers(scope: LeftoverScope): Promise<Check[]> {
  const { state } = await jobState(scope.jobId);
  const dir = scope.pod.plan.socketDir;
  const relay = processTable()
    .filter((p) => p.uid === scope.user.uid && p.cmdline.includes(dir))
    .map((p) => `pid ${p.pid}: ${p.cmdline}`);
  const steps = await stepsOf(scope.jobId);
  return [
    { what: `job ${scope.jobId} has ended (${state})`, problems: TERMINAL_STATES.has(state) ? [] : [state] },
    { what: `no socket dir (${dir})`, problems: (await exists(dir)) ? [`${dir} holds ${await listing(dir)}`] : [] },
    { what: 'no relay or other process of the job', problems: relay },
    { what: `no Slurm step of job ${scope.jobId}`, problems: steps },
    carrierProcesses(scope),
  ];
}

/**
 * Runs CHECKS until every one passes or MS have gone by (a process may take a moment to exit);
 * resolves with the last results.
 */
export async function settle(checks: () => Promise<Check[]>, ms: number): Promise<Check[]> {
  const deadline = Date.now() + ms;
  for (;;) {
    const results = await checks();
    if (results.every((c) => c.problems.length === 0) || Date.now() > deadline) return results;
    await sleep(250);
  }
}

export function failed(checks: readonly Check[]): string[] {
  return checks.flatMap((c) => c.problems.map((p) => `${c.what}: ${p}`));
}

/** Every key whose name contains `needle` (SCAN, not KEYS). */
export async function keysNaming(redis: Redis, needle: string, match = `*${needle}*`): Promise<string[]> {
  const found: string[] = [];
  let cursor = '0';
  do {
    const [next, keys] = await redis.scan(cursor, 'MATCH', match, 'COUNT', 1000);
    cursor = next;
    found.push(...keys);
  } while (cursor !== '0');
  return [...new Set(found)].sort();
}

/** BullMQ structures whose entries are job ids: lists, sorted sets and sets. */
const ID_LISTS = ['wait', 'active', 'paused'];
const ID_ZSETS = ['delayed', 'prioritized', 'completed', 'failed', 'waiting-children'];
const ID_SETS = ['stalled'];

/**
 * Where the fleet's queues still know the pod: BullMQ job ids (which carry the uid) in the queues' lists
 * and sets, job hashes whose data names the uid, and entries of the events stream (waiting, or
 * delivered and not acknowledged) or its dead letters. Returns `<key> <member>` lines. BullMQ's own
 * `:events` streams are left out: they are capped by BullMQ (maxLenEvents) and roll over by themselves.
 */
export async function queueEntriesNaming(
  redis: Redis,
  uid: string,
  { bullPrefix = 'bull', keyPrefix = DEFAULT_KEY_PREFIX }: { bullPrefix?: string; keyPrefix?: string } = {},
): Promise<string[]> {
  const queues = Object.values(QUEUE_NAMES);
  const prefix = bullPrefix;
  const stream = new EventStream(redis, new RedisKeys(keyPrefix));
  const found = [
    ...(await stream.waiting(uid)).map((e) => `${stream.key} ${e.id}`),
    ...(await stream.dead(uid)).map((e) => `${stream.deadKey} ${e.id}`),
  ];
  for (const queue of queues) {
    const base = `${prefix}:${queue}`;
    for (const list of ID_LISTS) {
      for (const id of await redis.lrange(`${base}:${list}`, '0', '-1')) {
        if (id.includes(uid) || (await jobNames(redis, base, id, uid))) found.push(`${base}:${list} ${id}`);
      }
    }
    for (const zset of ID_ZSETS) {
      for (const id of await redis.zrange(`${base}:${zset}`, '0', '-1')) {
        if (id.includes(uid) || (await jobNames(redis, base, id, uid))) found.push(`${base}:${zset} ${id}`);
      }
    }
    for (const set of ID_SETS) {
      for (const id of await redis.smembers(`${base}:${set}`)) {
        if (id.includes(uid)) found.push(`${base}:${set} ${id}`);
      }
    }
  }
  return found;
}

async function jobNames(redis: Redis, base: string, id: string, uid: string): Promise<boolean> {
  const data = await redis.hget(`${base}:${id}`, 'data');
  return data?.includes(uid) ?? false;
}
