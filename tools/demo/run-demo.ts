import { access, chmod, lstat, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { CliError, EXIT } from '../../src/cli/exit-codes.js';
import { PodFollower } from '../../src/cli/pod-follow.js';
import { DEFAULT_SOCKET_ROOT, socketRootOf } from '../../src/contract/site-config.js';
import { readPod } from '../../src/pods/pod-reader.js';
import type { HistoryEntry } from '../../src/store/snapshot-store.js';
import { ensureSlurm, SLURM_NODE, SLURM_UP, scancel, slurmDaemons, stopSlurm } from '../sandbox/slurm.js';
import { ensureUser, lookupUser, removeUser, type TestUser } from '../sandbox/users.js';
import { BIN } from '../sandbox/worker-process.js';
import { Cleanup } from './cleanup.js';
import { type Check, failed, jobLeftovers, type LeftoverScope, settle, tunnelLeftovers } from './leftovers.js';
import { bytes, Printer, seconds, stateLine } from './output.js';
import { DEMO_PACKAGES, installCommand, installPackages, missingPackages } from './packages.js';
import { demoRedis } from './redis.js';
import { startDatabases, startService } from './service.js';
import {
  bringUpFleet,
  bringUpSite,
  type DemoMode,
  deletePod,
  demoPod,
  fleetLogFile,
  MODE_SITE,
  submitJob,
  submitPod,
  waitForJobEnd,
  waitForOutput,
} from './stack.js';
import { WORKLOAD_DONE, workloadScript } from './workload.js';

/**
 * `backhaul demo`: the whole flow on one machine, on loopback, narrated. It starts what it needs
 * (Redis, the loopback site with real Slurm, an in-cluster service, the fleet as separate processes),
 * takes one pod through submit → forwards → workload → delete → teardown, proves nothing is left and
 * undoes everything it started, on success and on failure alike.
 */

import { DEFAULT_DEMO_BYTES, DEMO_USER } from './demo-options.js';

export { DEFAULT_DEMO_BYTES, DEMO_USER } from './demo-options.js';

export interface DemoOptions {
  mode: DemoMode;
  /** The Redis to try first (database 15 of it is used). */
  redis: string;
  user?: string;
  bytes?: number;
  write?: (text: string) => void;
}

const PHASES = [
  'Checking this machine',
  'Redis',
  'The HPC site on loopback',
  'The in-cluster services',
  'The fleet',
  'Submitting the pod and its Slurm job',
  'The workload in the job',
  'Deleting the pod',
  'Checking that nothing is left',
] as const;

interface Timings {
  submitAt: number;
  activeAt: number;
  batchHostAt: number | undefined;
  deletedAt: number;
  goneAt: number;
}

function at(history: readonly HistoryEntry[], match: (h: HistoryEntry) => boolean): number | undefined {
  return history.find(match)?.at;
}

async function checkMachine(out: Printer, dir: string): Promise<void> {
  const root = process.getuid?.() === 0;
  const missing = await missingPackages();
  if (missing.length > 0 && !root) {
    throw new Error(`missing Debian packages: ${missing.join(' ')}; run as root: ${installCommand(missing)}`);
  }
  if (missing.length > 0) {
    out.line(`installing ${missing.join(' ')} (apt-get, log in ${dir}/apt.log) ...`);
    const started = Date.now();
    await installPackages(missing, join(dir, 'apt.log'));
    out.ok(`installed ${missing.join(' ')} in ${seconds(Date.now() - started)}`);
  } else {
    out.ok(`packages present: ${DEMO_PACKAGES.join(' ')}`);
  }
  if (!root) {
    throw new Error(
      `the demo needs root: it starts sshd, munge and Slurm daemons and creates the job user; run it with sudo`,
    );
  }
  out.ok('running as root');
  await access(SLURM_UP).catch(() => {
    throw new Error(`${SLURM_UP} is missing: run the demo from a checkout of backhaul`);
  });
  await access(BIN);
}

async function siteUser(name: string, cleanup: Cleanup, out: Printer): Promise<TestUser> {
  const existed = await lookupUser(name);
  const user = await ensureUser(name);
  if (!existed) cleanup.add(`removed the user ${name}`, () => removeUser(name));
  out.ok(
    `job user ${user.name} (uid ${user.uid})${existed ? ', already there (kept)' : ': created, removed at the end'}`,
  );
  if (!existed) {
    // The job makes the user's socket root on the node (SocketRoot, /tmp/backhaul-%u) and nothing of the
    // user's removes it, userdel included. One there now was left by an earlier user of this name, whose
    // uid is another's by now: the job would refuse it as someone else's.
    const socketRoot = socketRootOf(DEFAULT_SOCKET_ROOT, name);
    const left = await lstat(socketRoot).catch(() => undefined);
    if (left) {
      await rm(socketRoot, { recursive: true, force: true });
      out.ok(`removed ${socketRoot}, left by an earlier user ${name} (uid ${left.uid})`);
    }
    cleanup.add(`removed the job user's socket root ${socketRoot}`, () =>
      rm(socketRoot, { recursive: true, force: true }),
    );
  }
  return user;
}

async function bringUpSlurm(cleanup: Cleanup, out: Printer): Promise<void> {
  const before = slurmDaemons();
  const started = Date.now();
  await ensureSlurm();
  const now = slurmDaemons();
  const startedNow = (Object.keys(now) as (keyof typeof now)[]).filter((d) => now[d] && !before[d]);
  if (startedNow.length === 0) {
    out.ok(`Slurm: munged, slurmctld and slurmd already running, node ${SLURM_NODE} (left as they are)`);
    return;
  }
  cleanup.add('stopped Slurm (the demo started it)', () => stopSlurm(before.munged));
  out.ok(
    `Slurm: started ${startedNow.join(', ')} in ${seconds(Date.now() - started)}, node ${SLURM_NODE} = 127.0.0.1 (stopped at the end)`,
  );
}

function failure(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

export async function runDemo(options: DemoOptions): Promise<void> {
  const { mode } = options;
  const write = options.write ?? ((text: string) => process.stdout.write(text));
  const out = new Printer(PHASES.length, write);
  const cleanup = new Cleanup();
  const startedAt = Date.now();
  const dir = await mkdtemp(join(tmpdir(), 'backhaul-demo-'));
  await chmod(dir, 0o755); // the job user writes its output below it
  let phase = 'starting';
  let logFile: string | undefined;

  const undo = (): Promise<string[]> => {
    if (cleanup.pending > 0) out.raw('\nCleaning up\n');
    return cleanup.run((name, problem) => (problem === undefined ? out.ok(name) : out.bad(`${name}: ${problem}`)));
  };
  // Ctrl-C: undo everything, then exit 130. The phase under way is left hanging (it may fail as its
  // parts go away; that is not reported).
  let interruptedBy: NodeJS.Signals | undefined;
  const interrupted = (signal: NodeJS.Signals) => {
    interruptedBy = signal;
    write(`\n${signal}: stopping the demo\n`);
    void undo()
      .then(() => rm(dir, { recursive: true, force: true }))
      .finally(() => process.exit(130));
  };
  const unlessInterrupted = async (): Promise<void> => {
    if (interruptedBy) await new Promise(() => undefined);
  };
  process.once('SIGINT', interrupted);
  process.once('SIGTERM', interrupted);

  const took: string[] = [];
  const step = async <T>(title: (typeof PHASES)[number], run: () => Promise<T>): Promise<T> => {
    const n = PHASES.indexOf(title) + 1;
    phase = `[${n}/${PHASES.length}] ${title}`;
    out.heading(title);
    const started = Date.now();
    const value = await run();
    took.push(`${n}: ${((Date.now() - started) / 1000).toFixed(1)}`);
    return value;
  };

  write(`backhaul demo, mode ${mode}: the carrier goes through ${MODE_SITE[mode].carrier}\n`);
  let summary: string[] = [];
  let error: unknown;
  try {
    await step('Checking this machine', () => checkMachine(out, dir));

    const redis = await step('Redis', async () => {
      const r = await demoRedis(options.redis, dir);
      if (r.private) cleanup.add('stopped the private redis-server', () => r.stop());
      out.ok(`using ${r.description}`);
      return r;
    });

    const { site, user } = await step('The HPC site on loopback', async () => {
      await bringUpSlurm(cleanup, out);
      const user = await siteUser(options.user ?? DEMO_USER, cleanup, out);
      const site = await bringUpSite(mode, user.name, cleanup);
      out.ok(`login node: sshd on 127.0.0.1:${site.loginPort} (pid ${site.login.pid})`);
      const forwarding = site.nodeForwarding === 'allowed' ? 'allows' : 'refuses';
      out.ok(
        `compute node ${site.nodeHost}: its own sshd on 127.0.0.1:${site.nodePort} (pid ${site.node.pid}), ${forwarding} forwarding`,
      );
      out.ok(`host keys pinned in ${site.knownHostsPath}; one client key authorized for ${user.name}`);
      return { site, user };
    });

    const { service, databases } = await step('The in-cluster services', async () => {
      const service = await startService();
      cleanup.add('stopped the in-cluster service', () => service.close());
      out.ok(`${service.fqdn}:${service.port}: an HTTP server on ${service.address}:${service.port}`);
      const databases = await startDatabases();
      cleanup.add('stopped the two databases', () =>
        Promise.all(databases.map((db) => db.close())).then(() => undefined),
      );
      for (const db of databases) {
        out.ok(`${db.fqdn}:${db.port}: a database stand-in on ${db.address}:${db.port} (answers with its name)`);
      }
      out.line(`these names do not resolve on this machine; the fleet finds them through its site configuration,`);
      out.line(`Backhaul.HostAliases (name → address), as cluster DNS would in a cluster`);
      return { service, databases };
    });

    const fleet = await step('The fleet', async () => {
      logFile = fleetLogFile(dir);
      const fleet = await bringUpFleet({ mode, site, service, databases, redisUrl: redis.url, dir }, cleanup);
      out.ok(`control worker: pid ${fleet.control.child.pid} (backhaul worker --roles control)`);
      out.ok(`session host:   pid ${fleet.session.child.pid} (backhaul worker --roles session)`);
      out.line(`site configuration ${fleet.configPath}; their logs go to ${fleet.logFile}`);
      return fleet;
    });
    const { deps } = fleet;

    // Two databases on one port: each Service gets its own address, so both keep 5432.
    const endpoints = [service, ...databases].map((s) => `${s.fqdn}:${s.port}`).join(' ');
    const pod = demoPod(fleet.config, 'demo', 'analysis', endpoints);
    let follower: PodFollower | undefined;
    const timings: Partial<Timings> = {};

    const job = await step('Submitting the pod and its Slurm job', async () => {
      out.line(`pod ${pod.namespace}/${pod.name}, uid ${pod.uid}`);
      out.line(`  interlink.eu/reverse-forwards: ${endpoints}`);
      for (const f of pod.plan.forwards) {
        out.line(`  ${f.dialHost}:${f.listenPort} → address ${f.bindAddress}, socket ${f.socketPath}`);
      }
      timings.submitAt = await submitPod(deps, pod, cleanup);
      out.ok('POD_UPSERT sent to the events queue, as `backhaul submit` (or the pod watcher) does');
      follower = new PodFollower(deps, pod.uid, { write, format: stateLine(timings.submitAt) });
      const body = workloadScript({
        host: service.fqdn,
        port: service.port,
        bytes: options.bytes ?? DEFAULT_DEMO_BYTES,
        databases: databases.map((db) => ({ host: db.fqdn, port: db.port, name: db.name })),
      });
      const job = await submitJob(fleet.config, user, dir, pod, body, cleanup);
      const preludeLines = job.script.split('\n').length - body.split('\n').length;
      out.ok(`Slurm job ${job.jobId} submitted as ${user.name}: job name = the pod UID,`);
      out.line(`  batch script = the prelude (${preludeLines} lines) + the workload`);
      out.line("the pod's machine, live (time, since submit, event, from → to):");
      const state = await follower.until((s) => s === 'active' || s === 'failed', 90_000);
      if (state !== 'active') {
        const view = await readPod(deps, pod.uid);
        const last = view?.context.lastError;
        throw new Error(`the pod ended ${state}${last ? `: ${last.kind}: ${last.message}` : ''}`);
      }
      const history = await deps.store.history(pod.uid);
      timings.activeAt = at(history, (h) => h.to === 'active') ?? Date.now();
      timings.batchHostAt = at(history, (h) => h.event === 'BATCH_HOST');
      out.ok(`forwards established ${seconds(timings.activeAt - timings.submitAt)} after submit`);
      return job;
    });

    const workload = await step('The workload in the job', async () => {
      out.line(`job output ${job.output}:`);
      const text = await waitForOutput(job, WORKLOAD_DONE, 90_000, async () => follower?.flush());
      for (const line of text.split('\n').filter((l) => l.startsWith('workload:'))) out.line(`  ${line}`);
      const status = Number(WORKLOAD_DONE.exec(text)?.[1]);
      if (status !== 0) throw new Error(`the workload exited ${status}; the job's output:\n${text}`);
      const traffic = service.traffic();
      out.ok(
        `the service answered ${traffic.requests} requests: ${bytes(traffic.bytesIn)} in, ${bytes(traffic.bytesOut)} out`,
      );
      out.ok(
        `the databases, both on port ${databases[0]?.port}: ${databases.map((db) => `${db.name} answered ${db.answered()}`).join(', ')}`,
      );
      await follower?.flush();
      return traffic;
    });

    await step('Deleting the pod', async () => {
      timings.deletedAt = await deletePod(deps, pod);
      out.ok('POD_DELETED sent, as the pod watcher does when the pod is deleted; the job keeps running');
      await follower?.until((s) => s === null, 60_000);
      timings.goneAt = Date.now();
      out.ok(`tunnel torn down, pod forgotten ${seconds(timings.goneAt - timings.deletedAt)} after POD_DELETED`);
    });

    await step('Checking that nothing is left', async () => {
      const scope: LeftoverScope = { deps, site, user, pod, jobId: job.jobId };
      const results: Check[] = await settle(() => tunnelLeftovers(scope), 15_000);
      out.checks(results);
      out.line(`interLink cancels the pod's job: scancel ${job.jobId}`);
      await scancel(job.jobId);
      await waitForJobEnd(job.jobId, 30_000);
      const after = await settle(() => jobLeftovers(scope), 15_000);
      out.checks(after);
      const problems = failed([...results, ...after]);
      if (problems.length > 0) throw new Error(`left behind: ${problems.join('; ')}`);
    });

    const t = timings as Timings;
    summary = [
      `submit → forwards established   ${seconds(t.activeAt - t.submitAt)} (includes Slurm starting the job)`,
      ...(t.batchHostAt === undefined
        ? []
        : [`batch host known → forwards up  ${seconds(t.activeAt - t.batchHostAt)}`]),
      `moved by the workload           ${bytes(workload.bytesIn + workload.bytesOut)} through the tunnel (${bytes(workload.bytesIn)} to the service, ${bytes(workload.bytesOut)} back)`,
      `POD_DELETED → pod forgotten     ${seconds(t.goneAt - t.deletedAt)}`,
    ];
  } catch (err) {
    await unlessInterrupted();
    error = err;
    out.raw(`\n✗ the demo failed in phase ${phase}:\n  ${failure(err).split('\n').join('\n  ')}\n`);
  }
  await unlessInterrupted();
  const cleanupFailures = await undo();
  process.removeListener('SIGINT', interrupted);
  process.removeListener('SIGTERM', interrupted);
  // The files (site configuration, the fleet's log, the job's output) are kept only to explain a failure.
  const keep = (error !== undefined || cleanupFailures.length > 0) && logFile !== undefined;
  if (!keep) await rm(dir, { recursive: true, force: true });

  if (error !== undefined || cleanupFailures.length > 0) {
    const where = keep ? ` (files kept in ${dir}; the fleet's log: ${logFile})` : '';
    const what = error !== undefined ? `phase ${phase}: ${failure(error).split('\n')[0]}` : 'cleaning up';
    throw new CliError(`the demo failed in ${what}${where}`, EXIT.failure);
  }
  out.raw(`\nSummary (mode ${mode})\n`);
  for (const line of summary) out.line(line);
  out.line(
    `whole demo                      ${seconds(Date.now() - startedAt)} (seconds per phase: ${took.join(', ')})`,
  );
}
