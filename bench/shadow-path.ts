/**
 * (c) as the fleet runs it: a pod's Slurm job starts with the real prelude (socket dir, relay on the
 * pod's loopback address), and a shadow session of the session host, in a tunnel thread or on the
 * host's own thread, opens the node carrier and binds the forwards. The benchmarks' clients then use
 * either the node sockets (the carrier alone) or the relay's address (what a workload dials).
 */

import { readFileSync } from 'node:fs';
import { chown, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseSiteConfig } from '../src/contract/site-config.js';
import { dialRulesOf } from '../src/ssh/endpoint-dial.js';
import { type ShadowPhase, ShadowSession, type ShadowSessionOptions } from '../src/ssh/shadow-session.js';
import { openSiteAccess, type SiteAccess } from '../src/ssh/site-access.js';
import { type Shadow, type TunnelLogin, TunnelThreads } from '../src/ssh/tunnel-threads.js';
import type { LoopbackSite } from '../tools/sandbox/loopback-site.js';
import { LOOPBACK_ENDPOINT_POLICY, NO_CLUSTER_CHECKS } from '../tools/sandbox/loopback-site.js';
import { jobScript, planFor, uid } from '../tools/sandbox/shadow-harness.js';
import { sbatch, scancel } from '../tools/sandbox/slurm.js';
import { onCleanup, PYTHON, safeReaddir, say, withTimeout } from './harness.js';

/** BENCH_TUNNEL_LOGIN: where tunnel threads get their login connections (per-thread, the default, or shared). */
export const TUNNEL_LOGIN: TunnelLogin = process.env.BENCH_TUNNEL_LOGIN === 'shared' ? 'shared' : 'per-thread';

export interface ShadowHost {
  access: SiteAccess;
  /** undefined: shadows on the benchmark's own thread (`Backhaul.TunnelThreads: 0`). */
  threads: TunnelThreads | undefined;
  config: ReturnType<typeof parseSiteConfig>;
  workdir: string;
  site: LoopbackSite;
}

/** A session host's data plane: its login pool and, with threads > 0, its tunnel threads. */
export async function startShadowHost(
  site: LoopbackSite,
  threads: number,
  backhaul: Record<string, unknown> = {},
): Promise<ShadowHost> {
  const config = parseSiteConfig({
    Network: {
      SSH: {
        ...site.siteConfig.Network.SSH,
        Reverse: { ...site.siteConfig.Network.SSH.Reverse, PythonPath: PYTHON, WaitForForwards: '60s' },
      },
    },
    Backhaul: {
      EndpointPolicy: LOOPBACK_ENDPOINT_POLICY,
      Kubernetes: NO_CLUSTER_CHECKS,
      KeepaliveInterval: '2s',
      TunnelThreads: threads,
      ...backhaul,
    },
  });
  const access = await openSiteAccess(config);
  onCleanup('login pool', () => access.pool.close());
  const log = {
    info: () => undefined,
    warn: (d: Record<string, unknown>, m: string) => say(`${m} ${JSON.stringify(d)}`),
  };
  // The bench reads its figures elsewhere: the threads' data-plane reports are dropped.
  const pool =
    threads > 0
      ? await TunnelThreads.start(access, { threads, login: TUNNEL_LOGIN, onReport: () => {} }, log)
      : undefined;
  if (pool) onCleanup('tunnel threads', () => pool.close());
  const workdir = await mkdtemp(join(tmpdir(), 'bh-bench-shadow-'));
  await chown(workdir, site.user.uid, site.user.gid);
  onCleanup('shadow work dir', () => rm(workdir, { recursive: true, force: true }));
  return { access, threads: pool, config, workdir, site };
}

export interface ShadowTunnel {
  /** The pod's UID (its job's name, its relay's --uid). */
  uid: string;
  /** The node socket of each forward, in the order asked. */
  sockets: string[];
  /** The relay's address and the listen port of each forward. */
  address: string;
  ports: number[];
  /** The pod's job, and when (performance.now()) it was submitted, its node was known and its forwards were up. */
  jobId: string;
  /** The node the job runs on (where a client of the relay must run, as a step of the job). */
  node: string;
  times: { submitted: number; batchHost: number; forwardsReady: number };
}

/**
 * One pod with a forward to each of `ports` (127.0.0.1 on this side; listen port = cluster port unless
 * `listenPorts` says otherwise): its job (prelude, then sleep) and its shadow, up to FORWARDS_READY.
 */
export async function openShadowTunnel(
  host: ShadowHost,
  ports: readonly number[],
  listenPorts: readonly number[] = ports,
): Promise<ShadowTunnel> {
  const podUid = uid();
  const h = { site: host.site, config: host.config, access: host.access, workdir: host.workdir };
  const plan = planFor(h, podUid, ports.map((p, i) => `${listenPorts[i]}:127.0.0.1:${p}`).join(' '));
  const submitted = performance.now();
  const jobId = await sbatch(host.site.user, jobScript(h, plan, 'sleep 7200\n'), { jobName: podUid });
  let batchHost = Number.NaN;
  let node = '';
  let forwardsUp = Number.NaN;
  onCleanup(`job ${jobId}`, () => scancel(jobId));
  const phases: ShadowPhase[] = [];
  let ready: () => void = () => undefined;
  const forwardsReady = new Promise<void>((resolve) => {
    ready = resolve;
  });
  const options: ShadowSessionOptions = {
    plan,
    pool: host.access.pool,
    site: host.access.carrier,
    nodeWaitTimeoutMs: 60_000,
    jobPollMs: 200,
    socketCheckMs: 3_000,
    dialRules: dialRulesOf(host.config),
    onPhase: (phase) => {
      phases.push(phase);
      if (phase.type === 'BATCH_HOST') {
        batchHost = performance.now();
        node = phase.batchHost;
      }
      if (phase.type === 'FORWARDS_READY') {
        forwardsUp = performance.now();
        ready();
      } else if (phase.type !== 'SHADOW_UP' && phase.type !== 'BATCH_HOST' && phase.type !== 'CARRIER_OPEN') {
        say(`shadow of ${podUid}: ${JSON.stringify(phase)}`);
      }
    },
    log: { info: () => undefined, warn: (m, d) => say(`shadow warning: ${m} ${JSON.stringify(d ?? {})}`) },
  };
  const shadow: Shadow = host.threads ? host.threads.startShadow(options) : new ShadowSession(options);
  const ended = shadow.run();
  onCleanup(`shadow of ${podUid}`, () => shadow.close('benchmark done'));
  await withTimeout(
    Promise.race([
      forwardsReady,
      ended.then((end) => Promise.reject(new Error(`the shadow ended before its forwards: ${JSON.stringify(end)}`))),
    ]),
    90_000,
    `forwards of ${podUid} (phases ${JSON.stringify(phases)})`,
  );
  return {
    uid: podUid,
    sockets: plan.forwards.map((f) => f.socketPath),
    address: plan.bindAddress,
    ports: plan.forwards.map((f) => f.listenPort),
    jobId,
    node,
    times: { submitted, batchHost, forwardsReady: forwardsUp },
  };
}

/** The relay the prelude of pod `podUid` started (a process of the job user), for CPU accounting. */
export function relayOf(userUid: number, podUid: string): number[] {
  const pids: number[] = [];
  for (const entry of safeReaddir('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const cmd = readFileSync(`/proc/${entry}/cmdline`, 'utf8');
      const owner = readFileSync(`/proc/${entry}/status`, 'utf8').match(/^Uid:\s+(\d+)/m)?.[1];
      if (Number(owner) === userUid && cmd.includes(`serve\0--uid=${podUid}\0`)) pids.push(Number(entry));
    } catch {
      // gone
    }
  }
  return pids;
}

/**
 * `srun` arguments that run a command as a step of JOBID on NODE, beside whatever runs there
 * (`--overlap`): a pod's relay admits only the processes of its job, so its clients run this way.
 */
export function srunInJob(jobId: string, node: string): string[] {
  return ['-u', '--overlap', `--jobid=${jobId}`, '-w', node, '-N1', '-n1'];
}
