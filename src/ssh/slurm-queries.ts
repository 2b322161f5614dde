import { setTimeout as sleep } from 'node:timers/promises';
import type { Client } from 'ssh2';
import { dataPlane } from './data-plane-meter.js';
import { execCapture, RemoteTimeoutError } from './remote-exec.js';
import { SessionError } from './session-error.js';
import { currentJob, parseSqueue, type SlurmJob, squeueCommand } from './slurm-job.js';

/** Names per squeue: keeps the command line short (a pod UID is 36 characters). */
const NAMES_PER_QUERY = 200;
/** Per attempt, channel open included: with the retries a lookup fails within about 50 s at worst. */
const QUERY_TIMEOUT_MS = 15_000;
/**
 * squeue only reads, so a failed one is asked again after these pauses before the lookups fail (and with
 * them every shadow waiting on the batch). The 1 in 40 squeue channels that bench:control once saw close
 * "without an exit status" with 500 shadows starting at once were execCapture missing statuses that came
 * in the channel's first read (src/ssh/remote-exec.ts); a slurmctld busy for a moment is what is left.
 */
const RETRY_PAUSES_MS = [250, 1_000];

interface Waiter {
  resolve(job: SlurmJob | undefined): void;
  reject(err: unknown): void;
}

/**
 * The pod jobs of one user, looked up through one login connection. Every shadow polls its job (every
 * 2 s while it is pending); one `squeue` each would be an RPC to slurmctld per pod per poll, the load
 * site administrators forbid. Lookups asked while a query runs wait for the next, which asks for all
 * of them at once: one query in flight per connection and user, with no added wait when idle.
 */
export class SlurmJobLookup {
  private queued = new Map<string, Waiter[]>();
  private running: Promise<void> | undefined;
  /** squeue commands run so far (for tests and metrics). */
  queries = 0;

  constructor(
    private readonly login: Client,
    private readonly user: string,
    private readonly timeoutMs = QUERY_TIMEOUT_MS,
  ) {}

  find(jobName: string): Promise<SlurmJob | undefined> {
    return new Promise((resolve, reject) => {
      const waiters = this.queued.get(jobName);
      if (waiters) waiters.push({ resolve, reject });
      else this.queued.set(jobName, [{ resolve, reject }]);
      this.kick();
    });
  }

  private kick(): void {
    if (this.running || this.queued.size === 0) return;
    const batch = this.queued;
    this.queued = new Map();
    this.running = this.query(batch).finally(() => {
      this.running = undefined;
      this.kick();
    });
  }

  private async query(batch: Map<string, Waiter[]>): Promise<void> {
    const names = [...batch.keys()];
    for (let i = 0; i < names.length; i += NAMES_PER_QUERY) {
      const chunk = names.slice(i, i + NAMES_PER_QUERY);
      try {
        const jobs = await this.squeueWithRetries(chunk);
        for (const name of chunk) {
          const job = currentJob(jobs.filter((j) => j.name === name));
          for (const waiter of batch.get(name) ?? []) waiter.resolve(job);
        }
      } catch (err) {
        for (const name of chunk) for (const waiter of batch.get(name) ?? []) waiter.reject(err);
      }
    }
  }

  private async squeueWithRetries(names: readonly string[]): Promise<SlurmJob[]> {
    for (let attempt = 0; ; attempt += 1) {
      try {
        return await this.squeue(names);
      } catch (err) {
        const pause = RETRY_PAUSES_MS[attempt];
        if (pause === undefined) throw err;
        await sleep(pause);
      }
    }
  }

  private async squeue(names: readonly string[]): Promise<SlurmJob[]> {
    this.queries += 1;
    const result = await execCapture(this.login, squeueCommand(this.user, names), {
      timeoutMs: this.timeoutMs,
    }).catch((err: unknown) => {
      dataPlane.squeueRan(true);
      // squeue that runs and does not finish waits for slurmctld (its own timeout is longer than ours).
      if (err instanceof RemoteTimeoutError && err.phase === 'run')
        throw new SessionError('slurm-unreachable', `squeue on the login node: ${err.message}`, { cause: err });
      throw new SessionError('login-unreachable', `squeue on the login node: ${(err as Error).message}`, {
        cause: err,
      });
    });
    if (result.code !== 0) {
      const said = result.stderr.trim().split('\n').slice(-2).join(' | ');
      const how =
        result.code !== null
          ? `exit ${result.code}`
          : result.signal
            ? `killed by ${result.signal}`
            : 'the channel closed without an exit status';
      dataPlane.squeueRan(true);
      // squeue that ran and failed: slurmctld does not answer; a channel that died: the login node.
      const kind = result.code !== null ? 'slurm-unreachable' : 'login-unreachable';
      throw new SessionError(kind, `squeue failed on the login node (${how})${said ? `: ${said}` : ''}`);
    }
    dataPlane.squeueRan(false);
    return parseSqueue(result.stdout);
  }
}

const lookups = new WeakMap<Client, Map<string, SlurmJobLookup>>();

/** The lookup shared by every caller of one login connection and user. */
export function jobLookup(login: Client, user: string, timeoutMs?: number): SlurmJobLookup {
  let byUser = lookups.get(login);
  if (!byUser) {
    byUser = new Map();
    lookups.set(login, byUser);
  }
  let lookup = byUser.get(user);
  if (!lookup) {
    lookup = new SlurmJobLookup(login, user, timeoutMs);
    byUser.set(user, lookup);
  }
  return lookup;
}

/** The pod's job as squeue sees it now, through the login node; undefined when Slurm knows none. */
export function findPodJob(
  login: Client,
  user: string,
  podUid: string,
  timeoutMs?: number,
): Promise<SlurmJob | undefined> {
  return jobLookup(login, user, timeoutMs).find(podUid);
}
