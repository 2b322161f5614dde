import type { Client } from 'ssh2';
import { execCapture } from '../ssh/remote-exec.js';
import { SessionError } from '../ssh/session-error.js';
import { currentJob, parseSqueue, type SlurmJob, squeueCommand } from './slurm-job.js';

/** The pod's job as squeue sees it now, through the login node; undefined when Slurm knows none. */
export async function findPodJob(login: Client, user: string, podUid: string): Promise<SlurmJob | undefined> {
  const result = await execCapture(login, squeueCommand(user, podUid), { timeoutMs: 30_000 });
  if (result.code !== 0) {
    const said = result.stderr.trim().split('\n').slice(-2).join(' | ');
    throw new SessionError('login-unreachable', `squeue failed on the login node (exit ${result.code}): ${said}`);
  }
  return currentJob(parseSqueue(result.stdout));
}
