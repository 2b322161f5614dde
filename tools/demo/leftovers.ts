import { readdir, stat } from 'node:fs/promises';
import { setTimeout as sleep } from 'node:timers/promises';
import type { FleetDeps } from '../../src/pods/fleet-deps.js';
import type { LoopbackSite } from '../sandbox/loopback-site.js';
import { descendantsOf, processTable } from '../sandbox/processes.js';
import { jobState, stepsOf, TERMINAL_STATES } from '../sandbox/slurm.js';
import type { TestUser } from '../sandbox/users.js';
import type { DemoPod } from './stack.js';

/**
 * What a pod may leave behind (ARCHITECTURE.md §7: no stale socket, process, lease or Redis key after
 * teardown), checked from the outside: the node's files, the process table, Slurm and Redis.
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
  const problems: string[] = [];
  let cursor = '0';
  do {
    const [next, keys] = await deps.redis.scan(cursor, 'MATCH', `${deps.keys.prefix}*${pod.uid}*`, 'COUNT', 1000);
    cursor = next;
    problems.push(...keys.filter((k) => k !== deps.keys.history(pod.uid)).map((k) => `key ${k}`));
  } while (cursor !== '0');
  if ((await deps.redis.zscore(deps.keys.pods(), pod.uid)) !== null) problems.push(`${deps.keys.pods()} lists it`);
  if (await deps.redis.hexists(deps.keys.podsByName(), `${pod.namespace}/${pod.name}`))
    problems.push(`${deps.keys.podsByName()} names it`);
  if ((await deps.redis.exists(deps.keys.history(pod.uid))) === 0) problems.push('its history is gone too');
  return { what: `Redis: no key of the pod but its history (${deps.keys.history(pod.uid)})`, problems };
}

async function lease({ deps, pod }: LeftoverScope): Promise<Check> {
  const held = await deps.leases.get(pod.uid);
  return {
    what: `no lease (${deps.keys.lease(pod.uid)})`,
    problems: held ? [`held by ${held.holder}, generation ${held.generation}`] : [],
  };
}

/**
 * Nothing of the pod waiting, running or delayed: BullMQ's steps and shadows (finished jobs are kept a
 * while, by design), and events in the stream not yet applied, or buried.
 */
async function queuedJobs({ deps, pod }: LeftoverScope): Promise<Check> {
  const problems: string[] = [];
  const pending = ['wait', 'active', 'delayed', 'prioritized', 'waiting-children'] as const;
  for (const queue of [deps.queues.steps, deps.queues.sessions]) {
    for (const job of await queue.getJobs([...pending], 0, -1)) {
      const data = job?.data as { uid?: string } | undefined;
      if (data?.uid === pod.uid) problems.push(`${queue.name} job ${job.id} (${await job.getState()})`);
    }
  }
  for (const e of await deps.queues.events.waiting(pod.uid)) problems.push(`event ${e.id} not applied: ${e.event}`);
  for (const e of await deps.queues.events.dead(pod.uid)) problems.push(`event ${e.id} buried: ${e.reason}`);
  return { what: 'no queued, running or delayed job or event of the pod', problems };
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
