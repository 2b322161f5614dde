import { setTimeout as sleep } from 'node:timers/promises';
import type { Client, ClientChannel } from 'ssh2';
import { SOCKS_SOCKET } from '../contract/derivations.js';
import { jobStateName } from '../machines/pod-schema.js';
import type { ShadowPhase, TunnelIsolation } from '../machines/pod-types.js';
import {
  DEAD_JOB_DIR_REMOVED,
  PREPARE_DIR_MISSING,
  parseForwardsUp,
  parseRelayIsolation,
  parseRelayReady,
  parseSocketInodes,
  renderForwardsUp,
  renderPrepareSockets,
  renderRemoveOwnSockets,
  renderSocketInodes,
  renderSocketWatch,
  WATCH_RELAY_DEAD,
  WATCH_VANISHED,
} from '../render/node-scripts.js';
import { parseDelivery, renderDeliverRelay } from '../render/relay-delivery.js';
import { RELAY_HANDOFF, relaySource } from '../render/relay-source.js';
import type { SessionPlan } from '../render/session-plan.js';
import { shellQuote } from '../render/shell-quote.js';
import { type Carrier, type CarrierSite, openCarrier } from './carrier.js';
import { threadWindowBudget, windowForRtt } from './channel-window.js';
import { type DialRules, EndpointDialer } from './endpoint-dial.js';
import type { SessionTraffic } from './forward-traffic.js';
import type { LoginHopLease, LoginHops } from './login-hop.js';
import { execCapture, openExec } from './remote-exec.js';
import { type ForwardLog, type ForwardStats, ReverseForwards } from './reverse-forwards.js';
import type { ServiceDirectory } from './service-directory.js';
import { isSessionError, SessionError } from './session-error.js';
import { type SlurmJob, slurmStateName } from './slurm-job.js';
import { SocksForward } from './socks-forward.js';

export type { ShadowPhase };

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
  /** How often squeue is asked, while the forwards are held, whether the job still runs. */
  jobCheckMs?: number;
  /** How endpoints are dialled: host aliases and the endpoint policy, checked on every connection. */
  dialRules: DialRules;
  /** Where Services are looked up (the Kubernetes API) and the fleet's own addresses; none: aliases only. */
  directory?: ServiceDirectory;
  /**
   * A carrier slot of the session host (CarrierSlots), taken once the job runs and before BATCH_HOST is
   * reported; the release is called at the end. Absent: no limit (tests of the session alone).
   */
  carrierSlot?: (namespace: string, signal: AbortSignal) => Promise<() => void>;
  /**
   * Whether this session still holds its pod's lease, asked right before anything is bound on the
   * node: a session that lost it (a stale host, woken after another took over) must not take the
   * sockets back. Absent: always (tests of the session alone).
   */
  fence?: () => Promise<boolean>;
}

/** Exec channels a carrier of each mode keeps open on the login node (they count against MaxSessions). */
const LOGIN_SESSIONS = { node: 0, userspace: 0, srun: 1 } as const;

/** How long close() waits for a setup step under way to notice and stop, before cleaning up anyway. */
const SETUP_SETTLE_MS = 15_000;
/** Each step of giving things back (cancel the forwards, remove the sockets) waits at most this long. */
const RELEASE_STEP_MS = 5_000;
/**
 * After the socket dir vanished (the prelude's EXIT trap removes it as the batch script ends), squeue is
 * asked again this often, this long, for the job's end: slurmctld hears of it a moment after the trap ran,
 * and the pod's Event should say how the job ended (COMPLETED, FAILED), not only that its sockets went.
 */
const VANISHED_ASK_EVERY_MS = 500;
const VANISHED_ASK_FOR_MS = 5_000;

/** JOB_ENDED for a job that has ended or is ending; undefined for one that may still run. */
function endOf(job: SlurmJob): ShadowEnd | undefined {
  if (job.phase !== 'ended' && job.phase !== 'ending') return undefined;
  // The prelude's own word on why it failed (the job's comment), for the pod's Event.
  return { type: 'JOB_ENDED', ...jobStateOf(job.state), ...(job.note ? { note: job.note } : {}) };
}

/** A job's state as its pod's machine reads it: the long name; left out when squeue printed no such name. */
function jobStateOf(state: string): { jobState?: string } {
  const name = slurmStateName(state);
  return jobStateName.safeParse(name).success ? { jobState: name } : {};
}

/**
 * Waits for `work` at most `ms`: a teardown must end even when the node does not answer. Its value, or
 * undefined when it failed or took longer.
 */
async function within<T>(work: Promise<T> | undefined, ms: number): Promise<T | undefined> {
  if (!work) return undefined;
  let timer: NodeJS.Timeout | undefined;
  const value = await Promise.race([
    work.catch(() => undefined),
    new Promise<undefined>((resolve) => {
      timer = setTimeout(() => resolve(undefined), ms);
    }),
  ]);
  clearTimeout(timer);
  return value;
}

/**
 * The cluster-side half of one pod's tunnel: wait for the job's batch host, open a carrier, bind the
 * forwards, then hold them until the sockets vanish, the job ends, the carrier is lost or `close()`.
 * It knows nothing of Redis or queues: it reports phases through `onPhase` and `run()` settles with
 * the end. `close()` is idempotent and leaves no socket, process, step or channel behind:
 * - every step of the setup stops at its next checkpoint once closing, and what it obtained meanwhile
 *   (a login lease, a carrier, bound forwards) is given back, also when it arrives after the teardown;
 * - nothing is bound after the lease is lost (`fence`), and the teardown removes only the sockets this
 *   session bound (by inode), never a successor's.
 */
export class ShadowSession {
  private readonly abort = new AbortController();
  private login: LoginHopLease | undefined;
  private carrier: Carrier | undefined;
  private forwards: ReverseForwards | undefined;
  private watch: ClientChannel | undefined;
  /** The sockets this session bound on the node, path → inode. */
  private readonly owned = new Map<string, string>();
  private closing: Promise<void> | undefined;
  private closeReason = 'closed';
  private releaseSlot: (() => void) | undefined;
  private job: SlurmJob | undefined;
  /** Settles when the setup (lease to forwards) has finished or stopped. */
  private settingUp: Promise<void> = Promise.resolve();
  /** The teardown ran: what the setup still obtains is released at once. */
  private tornDown = false;
  /** The forwards' counters, kept after they are cancelled. */
  private forwardStats: ForwardStats | undefined;
  /** A newer job of the pod, seen while this one was held: the socket dir is that job's, not to remove. */
  private successorJob: string | undefined;
  /** The removal of the sockets and a dead job's dir, before JOB_ENDED is reported (see clearDeadJob). */
  private clearing: Promise<boolean> | undefined;

  constructor(private readonly opts: ShadowSessionOptions) {}

  get stats(): ForwardStats | undefined {
    return this.forwardStats;
  }

  get batchJob(): SlurmJob | undefined {
    return this.job;
  }

  /** What its forwards carried so far, and the carrier's last round trip; undefined before the forwards. */
  traffic(): SessionTraffic | undefined {
    if (!this.forwards) return undefined;
    const rttMs = this.carrier?.lastRttMs;
    return {
      ...(rttMs === undefined ? {} : { rttMs: Math.round(rttMs * 1000) / 1000 }),
      forwards: this.forwards.traffic.snapshot(),
    };
  }

  /** Runs the session to its end; never rejects (failures end as SESSION_FAILED). */
  async run(): Promise<ShadowEnd> {
    try {
      const setUp = this.setUp();
      this.settingUp = setUp.then(
        () => undefined,
        () => undefined,
      );
      const held = (await setUp) ?? (await this.hold());
      const end = held.type === 'JOB_ENDED' ? await this.clearDeadJob(held) : held;
      this.report(end);
      await this.close(end.type);
      return end;
    } catch (err) {
      if (this.abort.signal.aborted) {
        await this.close(this.closeReason);
        return { type: 'CLOSED', reason: this.closeReason };
      }
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

  /** Up to FORWARDS_READY; an end instead when the job ended before. Stops at every checkpoint once closing. */
  private async setUp(): Promise<ShadowEnd | undefined> {
    const { plan } = this.opts;
    this.login = await this.opts.pool.acquire(LOGIN_SESSIONS[plan.carrier.mode]);
    await this.checkpoint();
    this.report({ type: 'SHADOW_UP' });

    const job = await this.waitForBatchHost();
    await this.checkpoint();
    const endedBefore = endOf(job);
    if (endedBefore) return endedBefore;
    if (this.opts.carrierSlot) {
      // Waiting for a slot is waiting for the job's tunnel: the pod stays in waitingBatchHost meanwhile.
      this.releaseSlot = await this.opts.carrierSlot(plan.namespace, this.abort.signal);
      await this.checkpoint();
    }
    this.job = job;
    const batchHost = job.batchHost ?? '';
    this.report({ type: 'BATCH_HOST', batchHost, jobId: job.jobId });

    const endedWaiting = await this.openCarrierWhenReady({ jobId: job.jobId, batchHost });
    if (endedWaiting) return endedWaiting;
    this.report({ type: 'CARRIER_OPEN' });

    const carrier = this.carrier;
    if (!carrier) throw new SessionError('closed', this.closeReason);
    try {
      await this.deliverRelay(carrier);
    } catch (err) {
      // A job cancelled meanwhile (its boot gone with scancel's TERM) is the reason, and the session's end.
      const ended = isSessionError(err) ? await this.endedMeanwhile(carrier) : undefined;
      if (ended) return ended;
      throw err;
    }
    await this.checkpoint();
    const { client, serverMessages } = carrier;
    // The pod's endpoints are dialled as a pod of its namespace, forwards and SOCKS alike.
    const dialer = new EndpointDialer(this.opts.dialRules, plan.namespace, this.opts.directory);
    this.forwards = new ReverseForwards(
      client,
      [
        ...plan.forwards.map((f) => ({ socketPath: f.socketPath, dialHost: f.dialHost, port: f.port })),
        // SOCKS is one more socket, behind the relay's owner check like the forwards'.
        ...(plan.socks === null
          ? []
          : [{ socketPath: `${plan.socketDir}/${SOCKS_SOCKET}`, socks: new SocksForward(this.opts.log, dialer) }]),
      ],
      serverMessages,
      this.opts.log,
      {
        dialer,
        // Sized to the path once its round trip is known (the first forwards of a carrier may come before).
        window: () =>
          threadWindowBudget(this.opts.site.channelWindowBudget).grant(
            windowForRtt(carrier.rttMs ?? 0, this.opts.site.channelWindowMax),
          ),
      },
    );
    this.forwardStats = this.forwards.stats;
    await this.checkFence();
    try {
      await this.forwards.establish(this.abort.signal);
    } catch (err) {
      // Whatever got bound is this session's, also when a later bind failed: note it to remove it.
      await this.recordOwnSockets(carrier, this.forwards.boundPaths);
      const ended = isSessionError(err, 'forwarding-refused') ? await this.endedMeanwhile(carrier) : undefined;
      if (ended) return ended;
      throw err;
    }
    const relay = await this.forwardsUp(carrier, this.forwards.boundPaths);
    await this.checkpoint();
    this.report({
      type: 'FORWARDS_READY',
      ...(relay?.addresses ? { addresses: relay.addresses } : {}),
      ...(relay?.isolation ? { isolation: relay.isolation } : {}),
    });
    return undefined;
  }

  /** Holds the forwards until the sockets vanish, the carrier is lost or the job ends. */
  private async hold(): Promise<ShadowEnd> {
    const { plan } = this.opts;
    const carrier = this.carrier;
    if (!carrier) throw new SessionError('closed', this.closeReason);
    const intervalS = Math.max(1, Math.round((this.opts.socketCheckMs ?? 3_000) / 1000));
    const socketPaths = plan.forwards.map((f) => f.socketPath);
    const vanished = this.watchSockets(carrier.client, plan.socketDir, socketPaths, intervalS);
    const lost = carrier.lost.then((reason) => ({ lost: reason }));
    const jobGone = this.untilJobEnds().then((gone) => ({ lost: undefined, gone }));
    const outcome = await Promise.race([vanished.then((watched) => ({ lost: undefined, watched })), lost, jobGone]);
    this.abortIfClosing();
    if ('gone' in outcome) return outcome.gone;
    // The watch saw the dir go (the trap ran): the job is ending, whatever happens to the carrier meanwhile
    // (an srun carrier is a step of the job and ends with it). Anything else: squeue's word once.
    const ended =
      'watched' in outcome && outcome.watched === 'vanished' ? await this.endingJob() : await this.jobEnded();
    this.abortIfClosing();
    if (ended) return ended;
    if (outcome.lost !== undefined) return { type: 'CARRIER_LOST', reason: outcome.lost };
    if ('watched' in outcome && outcome.watched === 'relay-dead') {
      const where = this.job ? ` in job ${this.job.jobId} on ${this.job.batchHost ?? '?'}` : '';
      throw new SessionError(
        'relay-dead',
        `the relay of pod ${plan.namespace}/${plan.name}${where} has died (none of its processes is left): the workload cannot reach its forwards, and another user of the node could listen on its address. The job's log has the relay's last messages; delete the pod to run it again`,
      );
    }
    return { type: 'SOCKETS_VANISHED' };
  }

  /**
   * A bind the node sshd refused is the site's configuration (permanent) unless the job ended meanwhile
   * (scancel): its trap removed the socket dir, so the bind had nowhere to go. That is the job's end.
   */
  private async endedMeanwhile(carrier: Carrier): Promise<ShadowEnd | undefined> {
    const ended = await this.jobEnded();
    if (ended) return ended;
    const dir = await execCapture(carrier.client, `test -d ${shellQuote(this.opts.plan.socketDir)}`, {
      timeoutMs: 10_000,
    }).catch(() => undefined);
    // Only test's own "no" (status 1) says the dir is gone: a channel that closed without a status (its
    // shell killed) or a signal says nothing, and the refusal stands.
    return dir?.code === 1 ? { type: 'SOCKETS_VANISHED' } : undefined;
  }

  /**
   * Resolves when squeue says the held job has ended, is ending or is no longer listed (purged after
   * MinJobAge); rejects when the session closes. The node's watch sees the job's trap remove the socket
   * dir, but a job killed before its trap could run (SIGKILL, the OOM killer, a TERM before the trap was
   * set) leaves the dir and the sockets, which the node's sshd keeps listening on: without this the
   * forwards would be held for a job that is gone. squeue failing is not an answer: asked again.
   */
  private async untilJobEnds(): Promise<ShadowEnd> {
    const everyMs = this.opts.jobCheckMs ?? 15_000;
    const jobId = this.job?.jobId;
    for (;;) {
      await sleep(everyMs, undefined, { signal: this.abort.signal });
      let job: SlurmJob | undefined;
      try {
        job = await this.jobNow();
      } catch {
        continue;
      }
      this.abortIfClosing();
      if (!job) return { type: 'JOB_ENDED', jobState: 'GONE' };
      if (jobId !== undefined && job.jobId !== jobId) {
        // The socket dir is the newer job's now: the teardown must leave it.
        this.successorJob = job.jobId;
        return { type: 'JOB_ENDED', jobState: `REPLACED_BY_${job.jobId}` };
      }
      const end = endOf(job);
      if (end) return end;
    }
  }

  /** JOB_ENDED when squeue says the pod's job (this one, when given) has ended or is ending; else undefined, also when squeue fails. */
  private async jobEnded(jobId?: string): Promise<ShadowEnd | undefined> {
    const job = await this.jobNow().catch(() => undefined);
    if (!job || (jobId !== undefined && job.jobId !== jobId)) return undefined;
    return endOf(job);
  }

  /** The job's end once squeue shows it, asked for a few seconds (VANISHED_ASK_FOR_MS); undefined if it does not. */
  private async endingJob(): Promise<ShadowEnd | undefined> {
    const until = performance.now() + VANISHED_ASK_FOR_MS;
    for (;;) {
      const ended = await this.jobEnded();
      if (ended || performance.now() >= until) return ended;
      await sleep(VANISHED_ASK_EVERY_MS, undefined, { signal: this.abort.signal }).catch(() => undefined);
      if (this.abort.signal.aborted) return undefined;
    }
  }

  private async jobNow(): Promise<SlurmJob | undefined> {
    if (!this.login) return undefined;
    return this.login.hop.findJob(this.opts.site.user, this.opts.plan.uid);
  }

  private async waitForBatchHost(): Promise<SlurmJob> {
    const deadline = performance.now() + this.opts.nodeWaitTimeoutMs;
    const pollMs = this.opts.jobPollMs ?? 2_000;
    let lastState = 'not submitted';
    for (;;) {
      this.abortIfClosing();
      const job = await this.jobNow();
      this.abortIfClosing();
      if (job) {
        lastState = job.state;
        if (endOf(job)) return job;
        if (job.phase === 'running' && job.batchHost) return job;
      }
      if (performance.now() >= deadline) {
        throw new SessionError(
          'job-not-running',
          `the job of pod ${this.opts.plan.uid} did not start within ${this.opts.nodeWaitTimeoutMs} ms (last state: ${lastState})`,
        );
      }
      await sleep(pollMs, undefined, { signal: this.abort.signal }).catch(() => undefined);
    }
  }

  /**
   * Opens the carrier once the job's prelude has made the socket dir, which it does right after the job
   * starts: tries every second for up to PreludeWait. A job that ends meanwhile
   * (cancelled before its script ran) ends the session as JOB_ENDED when a try fails, not as a failed
   * launch when the wait runs out or srun refuses the gone job (either would relaunch the pod only to
   * find the job gone: a retry spent and up to PreludeWait lost).
   */
  private async openCarrierWhenReady(job: { jobId: string; batchHost: string }): Promise<ShadowEnd | undefined> {
    const { plan, site } = this.opts;
    const deadline = performance.now() + (this.opts.preludeWaitMs ?? 30_000);
    for (;;) {
      this.abortIfClosing();
      const login = this.login;
      if (!login) throw new SessionError('closed', 'closed');
      try {
        const carrier = await openCarrier(login.hop, site, {
          mode: plan.carrier.mode,
          job,
          socketDir: plan.socketDir,
        });
        // Kept at once, so that a teardown (now or later) closes it.
        this.carrier = carrier;
        await this.checkpoint();
        if (carrier.mode === 'node') {
          await this.checkFence();
          await this.prepareSockets(carrier);
          await this.checkpoint();
        }
        return undefined;
      } catch (err) {
        if (this.carrier && !this.abort.signal.aborted) {
          this.carrier.close();
          this.carrier = undefined;
        }
        if (this.abort.signal.aborted) throw err;
        // Whatever failed (no socket dir yet, srun refused: "job has expired"), a job that has ended is the
        // reason, and the session's end.
        const ended = await this.jobEnded(job.jobId);
        if (ended) return ended;
        if (!isSessionError(err, 'job-not-running') || performance.now() >= deadline) throw err;
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

  /**
   * The relay and the Services' names, into a job whose prelude carries only the boot (a prelude of
   * before it has its own: nothing to do). Before any socket is bound, so the workload, which waits for
   * the sockets, never meets the boot instead of the relay.
   */
  private async deliverRelay(carrier: Carrier): Promise<void> {
    const { plan } = this.opts;
    if (plan.forwards.length === 0 && plan.socks === null) return;
    const script = renderDeliverRelay({
      socketDir: plan.socketDir,
      uid: plan.uid,
      forwards: plan.forwards,
      relay: relaySource(),
    });
    const result = await execCapture(carrier.client, '/bin/sh -s', { stdin: script, timeoutMs: 30_000 });
    if (result.code === PREPARE_DIR_MISSING) {
      throw new SessionError('job-not-running', `the socket dir ${plan.socketDir} does not exist (the job has ended?)`);
    }
    const outcome = parseDelivery(result.stdout);
    switch (outcome?.outcome) {
      case 'delivered':
        return;
      case 'embedded':
        this.opts.log.info('the job carries its own relay (a prelude of before the relay boot): nothing to deliver', {
          socketDir: plan.socketDir,
        });
        return;
      case 'unsupported':
        throw new SessionError(
          'bootstrap-failed',
          `the job's prelude asks for the relay hand-off "${outcome.detail}", which this fleet does not speak (it speaks "${RELAY_HANDOFF}"): upgrade the fleet`,
        );
      case 'noBoot':
        throw new SessionError(
          'bootstrap-failed',
          `the job's relay boot did not say ready in ${plan.socketDir} (${outcome.detail || 'no ready line'}); its messages are in the job's error output`,
        );
      case 'gone':
        throw new SessionError(
          'bootstrap-failed',
          `the job's relay boot in ${plan.socketDir} ended before the relay could take over (the job is ending?)`,
        );
      case 'silent':
        throw new SessionError(
          'bootstrap-failed',
          `the relay delivered into ${plan.socketDir} did not start within 10 s; its messages are in the job's error output`,
        );
      default:
        throw new SessionError(
          'bootstrap-failed',
          `delivering the relay into ${plan.socketDir} failed: ${result.stderr.trim() || `exit ${result.code}`}`,
        );
    }
  }

  /**
   * Once the forwards are bound, one exec: notes the inode of every socket this session bound (for its
   * teardown to remove exactly those) and reads the addresses the job's relay holds (its ready file: the
   * derived ones unless one was taken on the node) and its isolation. The relay part is undefined when
   * unreadable (an older prelude, a slow node), which fails nothing.
   */
  private async forwardsUp(
    carrier: Carrier,
    paths: readonly string[],
  ): Promise<{ addresses: string[] | undefined; isolation: TunnelIsolation | undefined } | undefined> {
    const { plan } = this.opts;
    // A SOCKS-only pod has no relay: nothing to wait for.
    const relayDir = plan.forwards.length === 0 ? undefined : plan.socketDir;
    if (paths.length === 0 && relayDir === undefined) return undefined;
    const result = await execCapture(carrier.client, '/bin/sh -s', {
      stdin: renderForwardsUp(paths, relayDir),
      timeoutMs: 10_000,
    }).catch(() => undefined);
    if (!result) return undefined;
    const { inodes, relay } = parseForwardsUp(result.stdout, paths);
    for (const [path, inode] of inodes) this.owned.set(path, inode);
    if (result.code !== 0 || relay === undefined) return undefined;
    return { addresses: parseRelayReady(relay), isolation: parseRelayIsolation(relay) };
  }

  /** Notes the inode of every socket this session bound, for its teardown to remove exactly those. */
  private async recordOwnSockets(carrier: Carrier, paths: readonly string[]): Promise<void> {
    if (paths.length === 0) return;
    const result = await execCapture(carrier.client, '/bin/sh -s', {
      stdin: renderSocketInodes(paths),
      timeoutMs: 10_000,
    }).catch(() => undefined);
    if (!result) return;
    for (const [path, inode] of parseSocketInodes(result.stdout, paths)) this.owned.set(path, inode);
  }

  private async watchSockets(
    client: Client,
    dir: string,
    paths: readonly string[],
    intervalS: number,
  ): Promise<'vanished' | 'relay-dead' | 'closed'> {
    const channel = await openExec(client, '/bin/sh -s');
    this.watch = channel;
    if (this.tornDown) channel.close();
    return new Promise((resolve) => {
      let seen = '';
      channel.on('data', (chunk: Buffer) => {
        // Only the tail matters: the rest is the keepalive dots.
        seen = (seen + chunk.toString('latin1')).slice(-64);
        if (seen.includes(WATCH_VANISHED)) resolve('vanished');
        if (seen.includes(WATCH_RELAY_DEAD)) resolve('relay-dead');
      });
      channel.stderr.resume();
      channel.on('close', () => resolve('closed'));
      channel.end(renderSocketWatch(dir, paths, intervalS));
    });
  }

  private async checkFence(): Promise<void> {
    if (!this.opts.fence) return;
    const held = await this.opts.fence().catch(() => false);
    await this.checkpoint();
    if (!held) {
      // Another session host holds the pod now: end as closed (nothing to report), binding nothing.
      void this.close("the pod's lease is another session host's: nothing was bound");
      throw new SessionError('closed', this.closeReason);
    }
  }

  /** After each step of the setup: stop when closing; after the teardown, give back what arrived late. */
  private async checkpoint(): Promise<void> {
    if (!this.abort.signal.aborted) return;
    if (this.tornDown) await this.release();
    throw new SessionError('closed', this.closeReason);
  }

  private abortIfClosing(): void {
    if (this.abort.signal.aborted) throw new SessionError('closed', this.closeReason);
  }

  private async teardown(): Promise<void> {
    // A setup step under way stops at its next checkpoint; wait for it (bounded: every step is), so
    // that what it obtains is released here rather than left behind.
    await within(this.settingUp, SETUP_SETTLE_MS);
    this.tornDown = true;
    try {
      await this.release();
    } finally {
      // The carrier is closed: its slot is another shadow's.
      this.releaseSlot?.();
    }
  }

  /**
   * The job ended. If its trap did not run (SIGKILL, the OOM killer, a TERM before the trap was set), its
   * socket dir stayed: remove it with this session's sockets, in one exec (guarded on the node:
   * renderRemoveDeadJobDir), before JOB_ENDED is reported, so that the report can say so and the pod's
   * Kubernetes Event tells the user. Not when a newer job of the pod was seen (`successorJob`), nor
   * without a carrier (the job ended before the node was reached). Bounded: a node that does not answer
   * delays the report by RELEASE_STEP_MS at most, and the teardown removes the sockets then.
   */
  private async clearDeadJob(end: Extract<ShadowEnd, { type: 'JOB_ENDED' }>): Promise<ShadowEnd> {
    const carrier = this.carrier;
    if (!carrier || this.successorJob !== undefined || this.abort.signal.aborted) return end;
    const owned = new Map(this.owned);
    this.owned.clear();
    const clearing = this.removeOnNode(carrier, owned, this.opts.plan.socketDir).catch(() => {
      // The node did not answer: the teardown tries the sockets again; the dir stays, as after an srun carrier.
      for (const [path, inode] of owned) this.owned.set(path, inode);
      return false;
    });
    this.clearing = clearing;
    return (await within(clearing, RELEASE_STEP_MS)) ? { ...end, trapMissed: true } : end;
  }

  /**
   * Removes this session's sockets and, when given, the dead job's dir, in one exec. Whether a dir was
   * there to remove: the job died without its trap, which the site should hear of.
   */
  private async removeOnNode(
    carrier: Carrier,
    owned: ReadonlyMap<string, string>,
    deadJobDir?: string,
  ): Promise<boolean> {
    const { plan } = this.opts;
    const result = await execCapture(carrier.client, '/bin/sh -s', {
      stdin: renderRemoveOwnSockets(owned, deadJobDir),
      timeoutMs: RELEASE_STEP_MS,
    });
    if (!result.stdout.includes(DEAD_JOB_DIR_REMOVED)) return false;
    const job = this.job ? `job ${this.job.jobId} on ${this.job.batchHost ?? '?'}` : 'its job';
    this.opts.log.warn(
      `the ${job} of pod ${plan.namespace}/${plan.name} ended without running its trap (SIGKILL, the OOM killer, or a signal before the prelude set it); its socket dir ${plan.socketDir} was left and is now removed`,
      { pod: `${plan.namespace}/${plan.name}`, socketDir: plan.socketDir },
    );
    return true;
  }

  /** Gives back everything held; what is released is forgotten, so it can run again for late arrivals. */
  private async release(): Promise<void> {
    const forwards = this.forwards;
    const carrier = this.carrier;
    const login = this.login;
    this.forwards = undefined;
    this.carrier = undefined;
    this.login = undefined;
    // Cancelling waits for the node sshd's answers: a stopped or dead sshd never sends them.
    await within(forwards?.cancel(), RELEASE_STEP_MS);
    this.watch?.close();
    if (carrier) {
      // A dead job's clearing under way uses the carrier: let it end (it gives back what it did not remove).
      await within(this.clearing, RELEASE_STEP_MS);
      // sshd never unlinks forwarded sockets: remove ours while the carrier can still reach the node.
      const owned = new Map(this.owned);
      this.owned.clear();
      if (owned.size > 0) await within(this.removeOnNode(carrier, owned), RELEASE_STEP_MS);
      carrier.close();
    }
    login?.release();
  }
}
