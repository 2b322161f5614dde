import { setTimeout as sleep } from 'node:timers/promises';
import type { Client, ClientChannel } from 'ssh2';
import {
  PREPARE_DIR_MISSING,
  renderPrepareSockets,
  renderRemoveSockets,
  renderSocketWatch,
  WATCH_VANISHED,
} from '../render/node-scripts.js';
import type { SessionPlan } from '../render/session-plan.js';
import type { SlurmJob } from '../site/slurm-job.js';
import { type Carrier, type CarrierSite, openCarrier } from './carrier.js';
import type { HostAliases } from './host-aliases.js';
import type { LoginHopLease, LoginHops } from './login-hop.js';
import { execCapture, openExec } from './remote-exec.js';
import { type ForwardLog, type ForwardStats, ReverseForwards } from './reverse-forwards.js';
import { isSessionError, SessionError } from './session-error.js';
import { SocksForward } from './socks-forward.js';

/** The phases a shadow reports to its pod's machine (DESIGN §4.7). */
export type ShadowPhase =
  | { type: 'SHADOW_UP' }
  | { type: 'BATCH_HOST'; batchHost: string; jobId: string }
  | { type: 'CARRIER_OPEN' }
  | { type: 'FORWARDS_READY' }
  | { type: 'SOCKETS_VANISHED' }
  | { type: 'JOB_ENDED'; state: string }
  | { type: 'CARRIER_LOST'; reason: string }
  | { type: 'SESSION_FAILED'; error: { kind: string; message: string; permanent: boolean } };

export type ShadowEnd =
  | Extract<ShadowPhase, { type: 'SOCKETS_VANISHED' | 'JOB_ENDED' | 'CARRIER_LOST' | 'SESSION_FAILED' }>
  | { type: 'CLOSED'; reason: string };

export interface ShadowSessionOptions {
  plan: SessionPlan;
  /** The session host's LoginPool, or in a tunnel thread its proxy (tunnel-thread.ts). */
  pool: LoginHops;
  site: CarrierSite;
  onPhase: (phase: ShadowPhase) => void;
  log: ForwardLog & { info(message: string, detail?: Record<string, unknown>): void };
  nodeWaitTimeoutMs: number;
  /** How often squeue is asked while the job is pending. */
  jobPollMs?: number;
  /** How often the node checks that the socket dir and sockets are still there. */
  socketCheckMs?: number;
  /** How long a just-started job gets to run its prelude (make the socket dir). */
  preludeWaitMs?: number;
  /** `Backhaul.HostAliases`: endpoint names dialed by address. */
  hostAliases?: HostAliases;
}

/** Exec channels a carrier of each mode keeps open on the login node (they count against MaxSessions). */
const LOGIN_SESSIONS = { node: 0, userspace: 0, srun: 1 } as const;

/**
 * The cluster-side half of one pod's tunnel: wait for the job's batch host, open a carrier, bind the
 * forwards, then hold them until the sockets vanish, the job ends, the carrier is lost or `close()`.
 * It knows nothing of Redis or queues: it reports phases through `onPhase` and `run()` settles with
 * the end. `close()` is idempotent and leaves no socket, process, step or channel behind.
 */
export class ShadowSession {
  private readonly abort = new AbortController();
  private login: LoginHopLease | undefined;
  private carrier: Carrier | undefined;
  private forwards: ReverseForwards | undefined;
  private socks: SocksForward | undefined;
  private watch: ClientChannel | undefined;
  private closing: Promise<void> | undefined;
  private closeReason = 'closed';
  private job: SlurmJob | undefined;

  constructor(private readonly opts: ShadowSessionOptions) {}

  get stats(): ForwardStats | undefined {
    return this.forwards?.stats;
  }

  get batchJob(): SlurmJob | undefined {
    return this.job;
  }

  /** Runs the session to its end; never rejects (failures end as SESSION_FAILED). */
  async run(): Promise<ShadowEnd> {
    try {
      const end = await this.runPhases();
      this.report(end);
      await this.close(end.type);
      return end;
    } catch (err) {
      if (this.abort.signal.aborted) return { type: 'CLOSED', reason: this.closeReason };
      const error = isSessionError(err)
        ? err
        : new SessionError('carrier-lost', (err as Error).message, { cause: err });
      const end: ShadowEnd =
        error.kind === 'carrier-lost'
          ? { type: 'CARRIER_LOST', reason: error.message }
          : { type: 'SESSION_FAILED', error: { kind: error.kind, message: error.message, permanent: error.permanent } };
      this.report(end);
      await this.close(error.message);
      return end;
    }
  }

  close(reason = 'closed'): Promise<void> {
    if (!this.closing) {
      this.closeReason = reason;
      this.abort.abort();
      this.closing = this.teardown();
    }
    return this.closing;
  }

  private report(phase: ShadowPhase | ShadowEnd): void {
    if (phase.type === 'CLOSED' || this.abort.signal.aborted) return;
    this.opts.onPhase(phase);
  }

  private async runPhases(): Promise<ShadowEnd> {
    const { plan } = this.opts;
    this.login = await this.opts.pool.acquire(LOGIN_SESSIONS[plan.carrier.mode]);
    this.report({ type: 'SHADOW_UP' });

    const job = await this.waitForBatchHost();
    if (job.phase === 'ended' || job.phase === 'ending') return { type: 'JOB_ENDED', state: job.state };
    this.job = job;
    const batchHost = job.batchHost ?? '';
    this.report({ type: 'BATCH_HOST', batchHost, jobId: job.jobId });

    this.carrier = await this.openCarrierWhenReady({ jobId: job.jobId, batchHost });
    this.report({ type: 'CARRIER_OPEN' });

    const socketPaths = plan.forwards.map((f) => f.socketPath);
    const { client, serverMessages } = this.carrier;
    this.forwards = new ReverseForwards(
      client,
      plan.forwards.map((f) => ({ socketPath: f.socketPath, dialHost: f.dialHost, port: f.port })),
      serverMessages,
      this.opts.log,
      { hostAliases: this.opts.hostAliases ?? {} },
    );
    await this.forwards.establish();
    if (plan.socks !== null) {
      this.opts.log.warn('SOCKS listener on the batch host is open to every user of that node', {
        pod: `${plan.namespace}/${plan.name}`,
        port: plan.socks,
      });
      this.socks = new SocksForward(client, plan.socks, serverMessages, this.opts.log, this.opts.hostAliases);
      await this.socks.establish();
    }
    this.report({ type: 'FORWARDS_READY' });

    const intervalS = Math.max(1, Math.round((this.opts.socketCheckMs ?? 3_000) / 1000));
    const vanished = this.watchSockets(client, plan.socketDir, socketPaths, intervalS);
    const lost = this.carrier.lost.then((reason) => ({ lost: reason }));
    const outcome = await Promise.race([vanished.then(() => ({ lost: undefined })), lost]);
    this.abortIfClosing();
    const now = await this.jobNow().catch(() => undefined);
    if (now && (now.phase === 'ended' || now.phase === 'ending')) return { type: 'JOB_ENDED', state: now.state };
    if (outcome.lost !== undefined) return { type: 'CARRIER_LOST', reason: outcome.lost };
    return { type: 'SOCKETS_VANISHED' };
  }

  private async jobNow(): Promise<SlurmJob | undefined> {
    if (!this.login) return undefined;
    return this.login.hop.findJob(this.opts.site.user, this.opts.plan.uid);
  }

  private async waitForBatchHost(): Promise<SlurmJob> {
    const deadline = Date.now() + this.opts.nodeWaitTimeoutMs;
    const pollMs = this.opts.jobPollMs ?? 2_000;
    let lastState = 'not submitted';
    for (;;) {
      this.abortIfClosing();
      const job = await this.jobNow();
      if (job) {
        lastState = job.state;
        if (job.phase === 'ended' || job.phase === 'ending') return job;
        if (job.phase === 'running' && job.batchHost) return job;
      }
      if (Date.now() >= deadline) {
        throw new SessionError(
          'job-not-running',
          `the job of pod ${this.opts.plan.uid} did not start within ${this.opts.nodeWaitTimeoutMs} ms (last state: ${lastState})`,
        );
      }
      await sleep(pollMs, undefined, { signal: this.abort.signal }).catch(() => undefined);
    }
  }

  /** The prelude makes the socket dir right after the job starts: give it a moment before giving up. */
  private async openCarrierWhenReady(job: { jobId: string; batchHost: string }): Promise<Carrier> {
    const { plan, site } = this.opts;
    const deadline = Date.now() + (this.opts.preludeWaitMs ?? 30_000);
    for (;;) {
      this.abortIfClosing();
      const login = this.login;
      if (!login) throw new SessionError('closed', 'closed');
      try {
        const carrier = await openCarrier(login.hop, site, {
          mode: plan.carrier.mode,
          job,
          socketDir: plan.socketDir,
          socksPort: plan.socks ?? undefined,
        });
        if (carrier.mode === 'node') await this.prepareSockets(carrier);
        return carrier;
      } catch (err) {
        if (!isSessionError(err, 'job-not-running') || Date.now() >= deadline) throw err;
        await sleep(1_000, undefined, { signal: this.abort.signal }).catch(() => undefined);
      }
    }
  }

  private async prepareSockets(carrier: Carrier): Promise<void> {
    const { plan } = this.opts;
    const paths = plan.forwards.map((f) => f.socketPath);
    const result = await execCapture(carrier.client, '/bin/sh -s', {
      stdin: renderPrepareSockets(plan.socketDir, paths),
    });
    if (result.code === 0) return;
    carrier.close();
    if (result.code === PREPARE_DIR_MISSING) {
      throw new SessionError(
        'job-not-running',
        `the socket dir ${plan.socketDir} does not exist yet (the prelude has not run)`,
      );
    }
    throw new SessionError(
      'bootstrap-failed',
      `the socket dir ${plan.socketDir} is unusable: ${result.stderr.trim() || `exit ${result.code}`}`,
    );
  }

  private async watchSockets(client: Client, dir: string, paths: readonly string[], intervalS: number): Promise<void> {
    const channel = await openExec(client, '/bin/sh -s');
    this.watch = channel;
    return new Promise((resolve) => {
      let seen = '';
      channel.on('data', (chunk: Buffer) => {
        // Only the tail matters: the rest is the keepalive dots.
        seen = (seen + chunk.toString('latin1')).slice(-64);
        if (seen.includes(WATCH_VANISHED)) resolve();
      });
      channel.stderr.resume();
      channel.on('close', () => resolve());
      channel.end(renderSocketWatch(dir, paths, intervalS));
    });
  }

  private abortIfClosing(): void {
    if (this.abort.signal.aborted) throw new SessionError('closed', this.closeReason);
  }

  private async teardown(): Promise<void> {
    const carrier = this.carrier;
    const paths = this.opts.plan.forwards.map((f) => f.socketPath);
    await this.socks?.cancel().catch(() => undefined);
    await this.forwards?.cancel().catch(() => undefined);
    this.watch?.close();
    if (carrier) {
      // sshd never unlinks forwarded sockets: remove ours while the carrier can still reach the node.
      await execCapture(carrier.client, '/bin/sh -s', { stdin: renderRemoveSockets(paths), timeoutMs: 5_000 }).catch(
        () => undefined,
      );
      carrier.close();
    }
    this.login?.release();
    this.login = undefined;
  }
}
