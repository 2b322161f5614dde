import { randomUUID } from 'node:crypto';
import { chown, mkdir, readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { ANNOTATION } from '../../src/contract/annotations.js';
import { parseReverseRequest, type ReverseRequest, requestContext } from '../../src/contract/reverse-request.js';
import { parseSiteConfig, type SiteConfig } from '../../src/contract/site-config.js';
import { silentLogger } from '../../src/log.js';
import { type FleetDeps, fleetDeps } from '../../src/pods/fleet-deps.js';
import { sendEvent } from '../../src/pods/queues.js';
import { renderPrelude } from '../../src/render/prelude.js';
import { renderSessionPlan, type SessionPlan } from '../../src/render/session-plan.js';
import { createRedis } from '../../src/store/redis.js';
import {
  LOOPBACK_ENDPOINT_POLICY,
  type LoopbackSite,
  NO_CLUSTER_CHECKS,
  type NodeForwarding,
  startLoopbackSite,
} from '../sandbox/loopback-site.js';
import { jobState, sbatch, scancel, TERMINAL_STATES, waitForState } from '../sandbox/slurm.js';
import type { TestUser } from '../sandbox/users.js';
import { startWorker, stopWorker, type WorkerProcess, workerStarted, writeConfig } from '../sandbox/worker-process.js';
import type { Cleanup } from './cleanup.js';
import type { DemoDatabase, DemoService } from './service.js';

/**
 * The demo's moving parts, one function per part so the demo can narrate each and the end-to-end tests
 * can drive the same stack through other flows: the loopback site in one of the three carrier modes,
 * the fleet as `backhaul worker` processes, pods fed through the events queue (as `backhaul submit`
 * does) and their Slurm jobs (as interLink's Slurm plugin submits them). Every part registers its own
 * undo with the Cleanup it is given.
 */

import type { DemoMode } from './demo-options.js';

export { DEMO_MODES, type DemoMode } from './demo-options.js';

export const PYTHON = '/usr/bin/python3';

/** How each mode sets up the site: the node's own sshd allows forwarding only where the mode uses it. */
export const MODE_SITE: Record<
  DemoMode,
  { nodeForwarding: NodeForwarding; reverse: Record<string, string>; carrier: string }
> = {
  node: {
    nodeForwarding: 'allowed',
    reverse: { Sshd: 'node', NodeExec: 'ssh' },
    carrier: "the login node, then direct-tcpip to the compute node's own sshd (it allows unix-socket forwards)",
  },
  userspace: {
    nodeForwarding: 'refused',
    reverse: { Sshd: 'userspace', NodeExec: 'ssh' },
    carrier: "ssh to the compute node (its sshd refuses forwarding), then a user-space 'sshd -i' over that channel",
  },
  srun: {
    nodeForwarding: 'refused',
    reverse: { Sshd: 'userspace', NodeExec: 'srun' },
    carrier: "the login node only: 'srun --overlap' into the job starts a user-space 'sshd -i' on the batch host",
  },
};

export async function bringUpSite(mode: DemoMode, user: string, cleanup: Cleanup): Promise<LoopbackSite> {
  // Slurm is brought up (and, by the demo, stopped) separately: it is shared with whatever else runs here.
  const site = await startLoopbackSite({ nodeForwarding: MODE_SITE[mode].nodeForwarding, user, slurm: false });
  cleanup.add('stopped the login and node sshds, removed their keys and files', () => site.stop());
  return site;
}

export interface FleetSetup {
  mode: DemoMode;
  site: LoopbackSite;
  service: Pick<DemoService, 'fqdn' | 'address'>;
  /** More Services the fleet must find (the demo's two databases on one port). */
  databases?: readonly Pick<DemoDatabase, 'fqdn' | 'address'>[];
  redisUrl: string;
  /** A directory readable by the job user: config, logs, job output. */
  dir: string;
}

/** The site configuration of the demo: the loopback site in MODE, short timers, the service's alias. */
export function demoConfigData(setup: FleetSetup): Record<string, unknown> {
  const ssh = setup.site.siteConfig.Network.SSH;
  return {
    Network: {
      SSH: {
        ...ssh,
        NodeWaitTimeout: '2m',
        Reverse: { ...ssh.Reverse, ...MODE_SITE[setup.mode].reverse, PythonPath: PYTHON, WaitForForwards: '60s' },
      },
    },
    Backhaul: {
      EndpointPolicy: LOOPBACK_ENDPOINT_POLICY,
      Kubernetes: NO_CLUSTER_CHECKS,
      Redis: { URL: setup.redisUrl },
      // KeepaliveInterval stays at its default (2 s): an srun carrier on a busy machine can hold a
      // keepalive reply back behind a few MiB of data for longer than 1 s x 2.
      SocketCheckInterval: '1s',
      LeaseTTL: '3s',
      RetryBackoff: '500ms',
      HistoryTTL: '1h',
      HostAliases: Object.fromEntries(
        [setup.service, ...(setup.databases ?? [])].map((service) => [service.fqdn, service.address]),
      ),
    },
  };
}

export interface DemoFleet {
  config: SiteConfig;
  configPath: string;
  logFile: string;
  control: WorkerProcess;
  session: WorkerProcess;
  /** The demo's own connection to the fleet's Redis and queues (what `backhaul submit` opens). */
  deps: FleetDeps;
}

/** Where the workers of a fleet brought up in DIR log. */
export function fleetLogFile(dir: string): string {
  return join(dir, 'fleet.log');
}

/** Control and session roles as two `backhaul worker` processes, logging to a file in DIR. */
export async function bringUpFleet(setup: FleetSetup, cleanup: Cleanup): Promise<DemoFleet> {
  const data = demoConfigData(setup);
  const config = parseSiteConfig(data);
  const configPath = await writeConfig(setup.dir, 'site.yaml', data);
  const logFile = fleetLogFile(setup.dir);
  const redis = createRedis(setup.redisUrl, { kind: 'command', connectionName: 'backhaul-demo' });
  redis.on('error', () => undefined);
  const deps = fleetDeps(config, redis, silentLogger());
  cleanup.add("closed the demo's connection to Redis", async () => {
    await deps.queues.close().catch(() => undefined);
    redis.disconnect();
  });
  const control = startWorker(configPath, setup.redisUrl, 'control', 'demo-control', logFile);
  cleanup.add('stopped the control worker', () => stopWorker(control));
  const session = startWorker(configPath, setup.redisUrl, 'session', 'demo-session', logFile);
  cleanup.add('stopped the session host', () => stopWorker(session));
  await Promise.all([workerStarted(control, 60_000), workerStarted(session, 60_000)]);
  return { config, configPath, logFile, control, session, deps };
}

export interface DemoPod {
  uid: string;
  namespace: string;
  name: string;
  annotations: Record<string, string>;
  request: ReverseRequest;
  plan: SessionPlan;
}

/** A pod that asks for reverse forwards to ENDPOINTS (`host:port` entries); a fresh UUID as its UID. */
export function demoPod(config: SiteConfig, namespace: string, name: string, endpoints: string): DemoPod {
  const uid = randomUUID();
  const annotations = { [ANNOTATION.forwards]: endpoints };
  const request = parseReverseRequest(annotations, requestContext(config, namespace));
  if (!request) throw new Error('the demo pod has no reverse request');
  const plan = renderSessionPlan({ uid, namespace, name, nodeName: undefined, annotations }, request, config);
  return { uid, namespace, name, annotations, request, plan };
}

/**
 * POD_UPSERT through the events queue, as `backhaul submit` (and the pod watcher) send it; returns its
 * time. With CLEANUP, a pod still known at cleanup (the demo failed or was interrupted) is deleted
 * then, while the fleet still runs, so a shared Redis keeps nothing of it but its history.
 */
export async function submitPod(deps: FleetDeps, pod: DemoPod, cleanup?: Cleanup): Promise<number> {
  const at = deps.now();
  const { namespace, name, annotations } = pod;
  await sendEvent(deps.queues, pod.uid, { type: 'POD_UPSERT', namespace, name, annotations, at });
  cleanup?.add(`deleted the pod ${namespace}/${name} (if the fleet still knew it)`, async () => {
    if (!(await deps.store.load(pod.uid))) return;
    await deletePod(deps, pod);
    const deadline = Date.now() + 20_000;
    while (await deps.store.load(pod.uid)) {
      if (Date.now() > deadline) throw new Error('still known to the fleet 20 s after POD_DELETED');
      await sleep(200);
    }
  });
  return at;
}

/** POD_DELETED, as the pod watcher sends it when the pod is gone; returns its time. */
export async function deletePod(deps: FleetDeps, pod: DemoPod): Promise<number> {
  const at = deps.now();
  await sendEvent(deps.queues, pod.uid, { type: 'POD_DELETED', at });
  return at;
}

export interface PodJob {
  jobId: string;
  output: string;
  script: string;
}

/**
 * The pod's Slurm job as interLink's Slurm plugin submits it: as the job user, named after the pod UID,
 * the batch script starting with the prelude, then BODY. Output goes to `<dir>/job/<uid>.out`.
 */
export async function submitJob(
  config: SiteConfig,
  user: TestUser,
  dir: string,
  pod: DemoPod,
  body: string,
  cleanup: Cleanup,
): Promise<PodJob> {
  const jobDir = join(dir, 'job');
  await mkdir(jobDir, { recursive: true, mode: 0o755 });
  await chown(jobDir, user.uid, user.gid);
  const script = `#!/bin/bash\n${renderPrelude(pod.request, config.Network.SSH.Reverse)}${body}`;
  const output = join(jobDir, `${pod.uid}.out`);
  const jobId = await sbatch(user, script, { jobName: pod.uid, output, chdir: jobDir });
  cleanup.add(`cancelled Slurm job ${jobId} (if it still ran)`, async () => {
    await scancel(jobId);
    await waitForJobEnd(jobId, 30_000);
  });
  return { jobId, output, script };
}

/**
 * Waits until the job's output has a line matching DONE; fails early when the job ends without one,
 * with the output so far. TICK runs at every poll (the demo prints the pod's transitions meanwhile).
 */
export async function waitForOutput(
  job: PodJob,
  done: RegExp,
  timeoutMs: number,
  tick: () => Promise<unknown> = async () => undefined,
): Promise<string> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    await tick();
    const text = await readFile(job.output, 'utf8').catch(() => '');
    if (done.test(text)) return text;
    const { state } = await jobState(job.jobId);
    if (TERMINAL_STATES.has(state) && state !== 'UNKNOWN') {
      throw new Error(`job ${job.jobId} ended ${state} before its workload finished; its output:\n${text}`);
    }
    if (Date.now() > deadline) {
      throw new Error(`job ${job.jobId} (${state}): no result after ${timeoutMs / 1000} s; its output:\n${text}`);
    }
    await sleep(200);
  }
}

/** Waits until the job is in a final state; resolves with it. */
export async function waitForJobEnd(jobId: string, timeoutMs: number): Promise<string> {
  return (await waitForState(jobId, [...TERMINAL_STATES], timeoutMs)).state;
}
