import { execFile } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { ensureUser, type RunResult, runAs, type TestUser } from './users.js';

/**
 * The real single-node Slurm of the loopback site (ARCHITECTURE.md, "How it is tested"; the tests' and the demo's), brought up by
 * scripts/slurm-up.sh and stopped by scripts/slurm-down.sh. Its one node is `bhnode1` (resolves to 127.0.0.1; not this host's name), so
 * `%B` of every job is `bhnode1`. Jobs are submitted as an unprivileged user and remembered, so a
 * suite's afterAll can cancel every job it submitted with cancelSubmittedJobs().
 */

const execFileAsync = promisify(execFile);

export const SLURM_NODE = 'bhnode1';
/**
 * The second node, `bhnode2` (also 127.0.0.1), in partition `jobtmp` only: Slurm's job_container/tmpfs
 * gives each of its jobs a private /tmp, as sites that keep one user's jobs apart do (submit with
 * `-p jobtmp`). Its own slurmd, on port 6828.
 */
export const SLURM_PRIVATE_NODE = 'bhnode2';
export const SLURM_PRIVATE_PARTITION = 'jobtmp';

/**
 * How the private node tracks a job's processes, as scripts/slurm-up.sh configured it: `cgroup`
 * (proctrack/cgroup, where the cgroup v1 freezer hierarchy is mounted) or `process tree`
 * (proctrack/linuxproc): the two rules of the relay's job check.
 */
export function privateNodeTracking(): 'cgroup' | 'process tree' {
  const conf = readFileSync(`/etc/slurm/${SLURM_PRIVATE_NODE}/slurm.conf`, 'utf8');
  return /^ProctrackType=proctrack\/cgroup$/m.test(conf) ? 'cgroup' : 'process tree';
}
export const SLURM_UP = fileURLToPath(new URL('../../scripts/slurm-up.sh', import.meta.url));
export const SLURM_DOWN = fileURLToPath(new URL('../../scripts/slurm-down.sh', import.meta.url));

/** Slurm's final job states (and UNKNOWN: the controller no longer knows the job). */
export const TERMINAL_STATES = new Set([
  'BOOT_FAIL',
  'CANCELLED',
  'COMPLETED',
  'DEADLINE',
  'FAILED',
  'NODE_FAIL',
  'OUT_OF_MEMORY',
  'PREEMPTED',
  'TIMEOUT',
  'UNKNOWN',
]);

let upPromise: Promise<string> | undefined;

/**
 * Runs scripts/slurm-up.sh once per process (later calls share the result; a failure is not cached).
 * Resolves with the script's output. Asynchronous: never blocks the event loop.
 */
export function ensureSlurm(): Promise<string> {
  if (!upPromise) {
    upPromise = runSlurmUp().catch((error: unknown) => {
      upPromise = undefined;
      throw error;
    });
  }
  return upPromise;
}

/** Runs scripts/slurm-up.sh now (not cached); resolves with its output and how long it took. */
export async function runSlurmUp(env: Record<string, string> = {}): Promise<string> {
  try {
    const { stdout, stderr } = await execFileAsync(SLURM_UP, [], {
      env: { ...process.env, ...env },
      timeout: 150_000,
    });
    return stdout + stderr;
  } catch (error) {
    const e = error as { stdout?: string; stderr?: string; message: string };
    throw new Error(`scripts/slurm-up.sh failed: ${e.message}\n${e.stdout ?? ''}${e.stderr ?? ''}`);
  }
}

/** Which of Slurm's daemons run now (by their pid files, as the scripts keep them). */
export interface SlurmDaemons {
  munged: boolean;
  slurmctld: boolean;
  slurmd: boolean;
  /** The private node's slurmd (bhnode2). */
  privateSlurmd: boolean;
}

function runs(pidFile: string, comm: string): boolean {
  try {
    const pid = readFileSync(pidFile, 'utf8').trim();
    return /^\d+$/.test(pid) && readFileSync(`/proc/${pid}/comm`, 'utf8').trim() === comm;
  } catch {
    return false;
  }
}

export function slurmDaemons(): SlurmDaemons {
  return {
    munged: runs('/run/munge/munged.pid', 'munged'),
    slurmctld: runs('/run/slurmctld.pid', 'slurmctld'),
    slurmd: runs('/run/slurmd.pid', 'slurmd'),
    privateSlurmd: runs(`/run/slurmd-${SLURM_PRIVATE_NODE}.pid`, 'slurmd'),
  };
}

/** Runs scripts/slurm-down.sh (slurmd, slurmctld, and munged unless KEEPMUNGE). */
export async function stopSlurm(keepMunge: boolean): Promise<void> {
  try {
    await execFileAsync(SLURM_DOWN, [], {
      env: { ...process.env, BH_SLURM_KEEP_MUNGE: keepMunge ? '1' : '0' },
      timeout: 60_000,
    });
  } catch (error) {
    const e = error as { stdout?: string; stderr?: string; message: string };
    throw new Error(`scripts/slurm-down.sh failed: ${e.message}\n${e.stdout ?? ''}${e.stderr ?? ''}`);
  }
}

const submitted = new Set<string>();

export interface SbatchOptions {
  jobName?: string;
  /** `--output`; default /dev/null. `%j` is the job id. */
  output?: string;
  /** Working directory of the job (default the user's home: the caller's cwd may be closed to them). */
  chdir?: string;
  /** More sbatch arguments, e.g. ['--cpus-per-task=1']. */
  args?: string[];
}

async function asUser(user: TestUser | string): Promise<TestUser> {
  return typeof user === 'string' ? ensureUser(user) : user;
}

/** Submits SCRIPTTEXT (must start with `#!`) as USER; resolves with the job id. */
export async function sbatch(
  user: TestUser | string,
  scriptText: string,
  options: SbatchOptions = {},
): Promise<string> {
  const u = await asUser(user);
  if (!scriptText.startsWith('#!')) throw new Error('a batch script must start with #!');
  const args = ['--parsable', `--output=${options.output ?? '/dev/null'}`, `--chdir=${options.chdir ?? u.home}`];
  if (options.jobName !== undefined) args.push(`--job-name=${options.jobName}`);
  args.push(...(options.args ?? []));
  const result = await runAs(u, 'sbatch', args, { input: scriptText, cwd: u.home, timeoutMs: 30_000 });
  const jobId = result.stdout.trim().split(';')[0] ?? '';
  if (result.code !== 0 || !/^\d+$/.test(jobId)) {
    throw new Error(
      `sbatch as ${u.name} failed (${result.code ?? result.signal}): ${result.stderr.trim() || result.stdout.trim()}`,
    );
  }
  submitted.add(jobId);
  return jobId;
}

export interface JobState {
  /** RUNNING, PENDING, COMPLETING, CANCELLED, ... or UNKNOWN when the controller has no record. */
  state: string;
  /** `%B`: the batch host, '' while there is none. */
  batchHost: string;
}

/** The job's state and batch host from `squeue -t all` (which also lists finished jobs for MinJobAge). */
export async function jobState(jobId: string): Promise<JobState> {
  try {
    const { stdout } = await execFileAsync('squeue', ['-h', '-t', 'all', '-j', jobId, '-o', '%T|%B']);
    const line = stdout.trim().split('\n')[0] ?? '';
    if (line === '') return { state: 'UNKNOWN', batchHost: '' };
    const [state = 'UNKNOWN', host = ''] = line.split('|');
    return { state, batchHost: host === 'n/a' || host === '(null)' ? '' : host };
  } catch (error) {
    const e = error as { stderr?: string; message: string };
    if (/Invalid job id/i.test(e.stderr ?? '')) return { state: 'UNKNOWN', batchHost: '' };
    throw new Error(`squeue -j ${jobId} failed: ${e.stderr?.trim() || e.message}`);
  }
}

/** `squeue`'s line for each of JOB_IDS (id, state, reason, batch host), for a failed test to print. */
export async function queueReport(jobIds: readonly string[]): Promise<string> {
  if (jobIds.length === 0) return '';
  const { stdout, stderr } = await execFileAsync('squeue', [
    '-h',
    '-t',
    'all',
    '-j',
    jobIds.join(','),
    '-o',
    '%i %T %r %B',
  ]).catch((error: { stdout?: string; stderr?: string; message: string }) => ({
    stdout: '',
    stderr: error.stderr ?? error.message,
  }));
  return `${stdout.trim()}${stderr.trim() === '' ? '' : ` (squeue: ${stderr.trim()})`}`;
}

/**
 * Polls until the job is in one of STATES. Rejects on timeout, and at once when the job reached a
 * final state that is not among STATES (e.g. waiting for RUNNING but it FAILED).
 */
export async function waitForState(jobId: string, states: readonly string[], timeoutMs = 20_000): Promise<JobState> {
  const deadline = Date.now() + timeoutMs;
  let last: JobState = { state: 'UNKNOWN', batchHost: '' };
  for (;;) {
    last = await jobState(jobId);
    if (states.includes(last.state)) return last;
    if (TERMINAL_STATES.has(last.state) && last.state !== 'UNKNOWN') {
      throw new Error(`job ${jobId} ended ${last.state} while waiting for ${states.join('|')}`);
    }
    if (Date.now() > deadline) {
      throw new Error(`job ${jobId} still ${last.state} after ${timeoutMs} ms (waiting for ${states.join('|')})`);
    }
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

/** `scancel [ARGS] JOBID...` (as root). */
export async function scancel(jobId: string | readonly string[], args: string[] = []): Promise<void> {
  const ids = typeof jobId === 'string' ? [jobId] : [...jobId];
  if (ids.length === 0) return;
  try {
    await execFileAsync('scancel', [...args, ...ids]);
  } catch (error) {
    const e = error as { stderr?: string; message: string };
    // A job that already ended is not an error for a test's cleanup.
    if (/already completing or completed|Invalid job id/i.test(e.stderr ?? '')) return;
    throw new Error(`scancel ${ids.join(' ')} failed: ${e.stderr?.trim() || e.message}`);
  }
}

/** The job's steps as squeue lists them (`J.batch`, `J.0`, ...); [] when none or the job is gone. */
export async function stepsOf(jobId: string): Promise<string[]> {
  try {
    const { stdout } = await execFileAsync('squeue', ['-s', '-h', '-j', jobId, '-o', '%i']);
    return stdout
      .split('\n')
      .map((s) => s.trim())
      .filter((s) => s !== '');
  } catch (error) {
    const e = error as { stderr?: string; message: string };
    if (/Invalid job id/i.test(e.stderr ?? '')) return [];
    throw new Error(`squeue -s -j ${jobId} failed: ${e.stderr?.trim() || e.message}`);
  }
}

/**
 * `srun --jobid=J --overlap -u -N1 -n1 -w <node> ARGS...` as USER: a step inside the running job
 * (`--overlap` so it does not wait for the batch step's CPU, `-u` so output is not held back).
 */
export async function srunInJob(
  user: TestUser | string,
  jobId: string,
  command: readonly string[],
  options: { node?: string; timeoutMs?: number; input?: string } = {},
): Promise<RunResult> {
  const u = await asUser(user);
  const args = [`--jobid=${jobId}`, '--overlap', '-u', '-N1', '-n1', '-w', options.node ?? SLURM_NODE, ...command];
  return runAs(u, 'srun', args, {
    cwd: u.home,
    timeoutMs: options.timeoutMs ?? 30_000,
    ...(options.input !== undefined ? { input: options.input } : {}),
  });
}

/** Job ids submitted through sbatch() in this process and not yet cleaned up. */
export function submittedJobs(): string[] {
  return [...submitted];
}

/**
 * Cancels every job this process submitted and waits (up to TIMEOUTMS) until none of them is
 * PENDING, RUNNING or COMPLETING any more. For afterAll hooks.
 */
export async function cancelSubmittedJobs(timeoutMs = 20_000): Promise<void> {
  const jobs = [...submitted];
  if (jobs.length === 0) return;
  await scancel(jobs);
  const deadline = Date.now() + timeoutMs;
  const active = new Set(['PENDING', 'RUNNING', 'COMPLETING', 'CONFIGURING', 'SUSPENDED', 'REQUEUED', 'RESIZING']);
  for (const jobId of jobs) {
    for (;;) {
      const { state } = await jobState(jobId);
      if (!active.has(state)) break;
      if (Date.now() > deadline) throw new Error(`job ${jobId} still ${state} ${timeoutMs} ms after scancel`);
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
    submitted.delete(jobId);
  }
}

/** `scontrol ARGS...` as root, e.g. `['release', jobId]`; throws with scontrol's stderr. */
export async function scontrol(args: readonly string[]): Promise<void> {
  try {
    await execFileAsync('scontrol', [...args], { timeout: 30_000 });
  } catch (error) {
    const e = error as { stderr?: string; message: string };
    throw new Error(`scontrol ${args.join(' ')} failed: ${e.stderr?.trim() || e.message}`);
  }
}

/**
 * SIGKILLs every process of the job (`scontrol listpids`), as the OOM killer or KillWait's SIGKILL do:
 * no trap runs. Resolves with the pids killed.
 */
export async function killJobProcesses(jobId: string): Promise<number[]> {
  const { stdout } = await execFileAsync('scontrol', ['listpids', jobId], { timeout: 30_000 });
  const pids = stdout
    .split('\n')
    .slice(1)
    .map((line) => Number(line.trim().split(/\s+/)[0]))
    .filter((pid) => Number.isInteger(pid) && pid > 1);
  for (const pid of pids) {
    try {
      process.kill(pid, 'SIGKILL');
    } catch {
      // already gone
    }
  }
  return pids;
}
