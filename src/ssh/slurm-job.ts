import { isSlurmNodeName } from '../contract/host-names.js';
import { shellWord } from '../render/shell-quote.js';

/**
 * Finding a pod's Slurm job through the login node. interLink's Slurm plugin names the job after the
 * pod UID, so the job is found by name and user; squeue keeps finished jobs for MinJobAge seconds.
 */

/** Where a job is in its life, as the shadow session cares about it. */
export type JobPhase = 'pending' | 'running' | 'suspended' | 'ending' | 'ended';

/** squeue's compact states (`%t`), every one Slurm 22.05–24.x prints, with their long names (sacct's). */
const STATES: Readonly<Record<string, readonly [JobPhase, string]>> = {
  PD: ['pending', 'PENDING'],
  CF: ['pending', 'CONFIGURING'], // nodes booting
  RQ: ['pending', 'REQUEUED'],
  RH: ['pending', 'REQUEUE_HOLD'],
  RF: ['pending', 'REQUEUE_FED'],
  RD: ['pending', 'RESV_DEL_HOLD'],
  RS: ['running', 'RESIZING'],
  R: ['running', 'RUNNING'],
  SI: ['running', 'SIGNALING'],
  SO: ['running', 'STAGE_OUT'], // the batch script has ended
  S: ['suspended', 'SUSPENDED'],
  ST: ['suspended', 'STOPPED'], // SIGSTOP
  CG: ['ending', 'COMPLETING'],
  CD: ['ended', 'COMPLETED'],
  CA: ['ended', 'CANCELLED'],
  F: ['ended', 'FAILED'],
  TO: ['ended', 'TIMEOUT'],
  PR: ['ended', 'PREEMPTED'],
  NF: ['ended', 'NODE_FAIL'],
  BF: ['ended', 'BOOT_FAIL'],
  DL: ['ended', 'DEADLINE'],
  OOM: ['ended', 'OUT_OF_MEMORY'],
  SE: ['ended', 'SPECIAL_EXIT'],
  RV: ['ended', 'REVOKED'],
};

export function jobPhase(state: string): JobPhase {
  // An unknown state is treated as pending: waiting is safe, declaring the job over is not.
  return STATES[state]?.[0] ?? 'pending';
}

/** A compact state's long name (OOM → OUT_OF_MEMORY), as users know it from sacct; others as they are. */
export function slurmStateName(state: string): string {
  return STATES[state]?.[1] ?? state;
}

export interface SlurmJob {
  jobId: string;
  /** The job's name: the pod UID for the jobs interLink submits. */
  name: string;
  state: string;
  phase: JobPhase;
  /** The node running the batch script; empty until the job starts. */
  batchHost: string | undefined;
  /**
   * What the job's prelude said of itself through the job's comment (`backhaul: …`): why it could not
   * set up its tunnel (the relay could not listen). Absent otherwise.
   */
  note?: string;
}

/** The prefix of a comment the prelude's relay boot writes when it cannot bind (relay-boot.py `serve`). */
export const JOB_NOTE_PREFIX = 'backhaul: ';

const FIELD_SEPARATOR = '|';
const JOB_ID = /^\d+(?:_\d+)?$/;

/**
 * One `squeue` for the jobs of `user` with any of `jobNames`, in every state, one
 * `id|state|batchhost|name|comment` line each. The comment goes last: it is the only field that may hold
 * the separator (the names are pod UIDs, asked for by name).
 */
export function squeueCommand(user: string, jobNames: readonly string[]): string {
  if (jobNames.length === 0) throw new RangeError('squeueCommand: no job name');
  for (const name of jobNames) {
    // squeue splits --name at commas; pod UIDs never hold one.
    if (name.length === 0 || name.includes(','))
      throw new RangeError(`squeueCommand: bad job name ${JSON.stringify(name)}`);
  }
  return `squeue --noheader --all --states=all --user=${shellWord(user)} --name=${shellWord(jobNames.join(','))} --format='%i|%t|%B|%j|%k'`;
}

export function parseSqueue(output: string): SlurmJob[] {
  const jobs: SlurmJob[] = [];
  for (const line of output.split('\n')) {
    const [jobId, state, host, name = '', ...comment] = line.trim().split(FIELD_SEPARATOR);
    if (!jobId || !state || !JOB_ID.test(jobId)) continue;
    const batchHost = host && host !== 'n/a' && host !== '(null)' && isSlurmNodeName(host) ? host : undefined;
    const text = comment.join(FIELD_SEPARATOR);
    const note = text.startsWith(JOB_NOTE_PREFIX) ? text.slice(JOB_NOTE_PREFIX.length).slice(0, 500) : undefined;
    jobs.push({ jobId, name, state, phase: jobPhase(state), batchHost, ...(note ? { note } : {}) });
  }
  return jobs;
}

/**
 * The job that matters when several carry the pod's name (a requeue, an earlier attempt):
 * the newest one still alive, else the newest one.
 */
export function currentJob(jobs: readonly SlurmJob[]): SlurmJob | undefined {
  const newestFirst = [...jobs].sort((a, b) => compareJobIds(b.jobId, a.jobId));
  return newestFirst.find((j) => j.phase !== 'ended') ?? newestFirst[0];
}

function compareJobIds(a: string, b: string): number {
  const [aMain = 0, aTask = 0] = a.split('_').map(Number);
  const [bMain = 0, bTask = 0] = b.split('_').map(Number);
  return aMain - bMain || aTask - bTask;
}
