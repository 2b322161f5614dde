import { setTimeout as sleep } from 'node:timers/promises';
import { type Job, WaitingError, Worker } from 'bullmq';
import type { Redis } from 'ioredis';
import { carrierMode } from '../contract/carrier-mode.js';
import {
  type PodEvent,
  REPORT_STATES,
  SHADOW_PHASE_STATES,
  type ShadowPhaseState,
  stateHasTag,
  type TunnelIsolation,
} from '../machines/pod-machine.js';
import type { FleetDeps } from '../pods/fleet-deps.js';
import { type PodView, readPod } from '../pods/pod-reader.js';
import { QUEUE_NAMES, type SessionJobData, sendEvent } from '../pods/queues.js';
import { siteIsolation } from '../site/doctor/isolation-check.js';
import { CarrierSlots } from '../ssh/carrier-slots.js';
import { sshCryptoPath } from '../ssh/crypto-path.js';
import { dataPlane } from '../ssh/data-plane-meter.js';
import { dialRulesOf } from '../ssh/endpoint-dial.js';
import type { SessionTraffic } from '../ssh/forward-traffic.js';
import { NO_CLUSTER_DIRECTORY, type ServiceDirectory } from '../ssh/service-directory.js';
import type { ShadowEnd, ShadowPhase } from '../ssh/shadow-session.js';
import { ShadowSession, type ShadowSessionOptions } from '../ssh/shadow-session.js';
import { openSiteAccess, type SiteAccess } from '../ssh/site-access.js';
import { autoTunnelThreads, type Shadow, TunnelThreads } from '../ssh/tunnel-threads.js';
import { RedisEpoch, recoveryWindowMs } from '../store/redis-epoch.js';

/**
 * BullMQ lock settings for shadows. A killed host stops renewing its job locks; the stall check moves
 * its jobs back to wait within lockDuration + stalledInterval (about 6 s), another host takes them and
 * its lease once the old one expires (LeaseTTL). A stall is not a failure: maxStalledCount is high.
 */
export const SESSION_LOCKS = { lockDuration: 4_000, stalledInterval: 2_000, maxStalledCount: 100_000 } as const;

/** How often a session host writes what its shadows' forwards carry, at most (publishTraffic). */
export const TRAFFIC_WRITE_MS = 5_000;
const TRAFFIC_REFRESH_MS = 300_000;
const TRAFFIC_TTL_S = 900;

export type SessionOutcome = ShadowEnd | { type: 'STALE'; reason: string } | { type: 'HANDED_OVER' };

/**
 * A shadow this host holds: its lease's current token (a new one once re-asserted after Redis lost its
 * data) and how far its reports got, so that a rebuilt pod record can be told (SHADOW_HELD).
 */
interface HeldShadow {
  uid: string;
  generation: number;
  fence: number;
  session: Shadow;
  /** The state its reports put the pod in: waitingBatchHost from the start (it holds the lease). */
  reached: ShadowPhaseState;
  batchHost?: string;
  jobId?: string;
  addresses?: string[];
  isolation?: TunnelIsolation;
}

/** What a host tells a rebuilt pod record of a shadow it kept. */
function heldEvent(held: HeldShadow, hostId: string, at: number): PodEvent {
  return {
    type: 'SHADOW_HELD',
    host: hostId,
    phase: held.reached,
    generation: held.generation,
    lease: held.fence,
    ...(held.batchHost && held.jobId ? { batchHost: held.batchHost, jobId: held.jobId } : {}),
    ...(held.addresses ? { addresses: held.addresses } : {}),
    ...(held.isolation ? { isolation: held.isolation } : {}),
    at,
  };
}

/** The phase a shadow reports, stamped: the event its machine reads, fenced by the lease's token. */
function eventOf(phase: ShadowPhase, generation: number, lease: number, hostId: string, at: number): PodEvent {
  const stamp = { generation, lease, at };
  return phase.type === 'SHADOW_UP' ? { ...phase, ...stamp, host: hostId } : { ...phase, ...stamp };
}

/** Keeps how far a shadow's reports got, for SHADOW_HELD. */
function noteReached(held: HeldShadow, phase: ShadowPhase): void {
  const state = REPORT_STATES[phase.type];
  if (state && SHADOW_PHASE_STATES.indexOf(state) > SHADOW_PHASE_STATES.indexOf(held.reached)) held.reached = state;
  if (phase.type === 'BATCH_HOST') {
    held.batchHost = phase.batchHost;
    held.jobId = phase.jobId;
  }
  if (phase.type === 'FORWARDS_READY') {
    if (phase.addresses) held.addresses = phase.addresses;
    if (phase.isolation) held.isolation = phase.isolation;
  }
}

/**
 * A session host: a BullMQ worker whose long-running jobs each hold one ShadowSession, fenced by the
 * pod's lease. Concurrency is its capacity. On stop it hands its shadows back to the queue so another
 * host takes them over at once.
 */
export class SessionHost {
  readonly worker: Worker<SessionJobData, SessionOutcome>;
  private readonly sessions = new Map<string, HeldShadow>();
  /** Each session job being processed here, by job id (see process). */
  private readonly holding = new Map<string, Promise<SessionOutcome>>();
  private handingOver = false;
  private readonly heartbeat: NodeJS.Timeout;
  /** Whether Redis lost its data since this host last looked (its leases and registration with it). */
  private readonly epoch: RedisEpoch;
  private recovery: Promise<boolean> | undefined;
  /** Session jobs whose lock could not be renewed, already said once (see the worker's error handler). */
  private readonly lockLost = new Set<string>();
  /** What was last written of each shadow's traffic, and when (publishTraffic). */
  private readonly trafficWritten = new Map<string, { traffic: SessionTraffic; text: string; at: number }>();
  private readonly trafficTimer: NodeJS.Timeout;
  /** Carriers held at once, overall and per namespace (Backhaul.SessionCapacity, NamespaceCapacity). */
  private readonly slots: CarrierSlots;

  private constructor(
    private readonly deps: FleetDeps,
    private readonly access: SiteAccess,
    /** Where the carriers run; undefined: on this thread (`Backhaul.TunnelThreads: 0`). */
    private readonly tunnels: TunnelThreads | undefined,
    readonly hostId: string,
    connection: Redis,
    private readonly directory: ServiceDirectory,
  ) {
    const b = deps.config.Backhaul;
    this.slots = new CarrierSlots(b.SessionCapacity, b.NamespaceCapacity ?? b.SessionCapacity);
    this.worker = new Worker<SessionJobData, SessionOutcome>(
      QUEUE_NAMES.sessions,
      (job, token) => this.process(job, token),
      {
        connection,
        // Pending shadows hold no carrier slot: the worker takes as many as both capacities allow.
        concurrency: b.SessionCapacity + b.PendingCapacity,
        ...SESSION_LOCKS,
        ...(deps.bullPrefix ? { prefix: deps.bullPrefix } : {}),
      },
    );
    this.worker.on('error', (err) => {
      // A job Redis lost (restarted empty) or whose lock lapsed: BullMQ says so at every renewal, for as
      // long as the session lives on under its lease. Once is enough.
      const lost = /^could not renew lock for job (.+)$/.exec(err.message)?.[1];
      if (lost === undefined) return deps.log.error({ err }, 'session host worker error');
      if (this.lockLost.has(lost)) return;
      this.lockLost.add(lost);
      deps.log.warn(
        { job: lost },
        'a session job lost its lock (Redis lost the job, or it stalled): its shadow goes on under its lease',
      );
    });
    this.worker.on('completed', (job) => this.lockLost.delete(job.id ?? ''));
    this.worker.on('failed', (job) => this.lockLost.delete(job?.id ?? ''));
    this.epoch = new RedisEpoch(deps.redis, deps.keys, recoveryWindowMs(b.LeaseTTL));
    this.trafficTimer = setInterval(() => void this.publishTraffic(), TRAFFIC_WRITE_MS);
    this.trafficTimer.unref();
    this.heartbeat = setInterval(() => {
      if (this.handingOver) return;
      deps.hosts
        .heartbeat(hostId, this.sessions.size)
        // Not registered: Redis lost its data, or pruned this host after a long stall; either way it registers again.
        .then(async (known) => {
          if (known || (await this.recover())) return;
          await deps.hosts.register(hostId, b.SessionCapacity, this.sessions.size);
        })
        .catch(() => undefined);
    }, 2_000).unref();
  }

  /** Learns the fleet's epoch before anything is held here (a loss is told by a later change). */
  private async begin(): Promise<void> {
    await this.epoch.check();
    await this.deps.hosts.register(this.hostId, this.deps.config.Backhaul.SessionCapacity, 0);
  }

  /** `directory`: where Services are looked up for the dials (the Kubernetes API), see ClusterDirectory. */
  static async start(
    deps: FleetDeps,
    hostId: string,
    connection: Redis,
    directory: ServiceDirectory = NO_CLUSTER_DIRECTORY,
  ): Promise<SessionHost> {
    const access = await openSiteAccess(deps.config);
    const crypto = sshCryptoPath();
    deps.metrics.sshCrypto.set(
      { path: crypto.native ? 'native' : 'javascript', patched: crypto.patched ? 'yes' : 'no' },
      1,
    );
    if (crypto.ok) deps.log.info({ sshCrypto: crypto.description }, 'ssh crypto');
    else deps.log.warn({ sshCrypto: crypto.description, fix: crypto.fix }, 'ssh crypto is the slow path');
    const wanted = deps.config.Backhaul.TunnelThreads;
    const count = wanted === 'auto' ? autoTunnelThreads() : wanted;
    const tunnels =
      count > 0
        ? await TunnelThreads.start(
            access,
            {
              threads: count,
              login: deps.config.Backhaul.TunnelLogin,
              directory,
              onReport: (report) => deps.metrics.dataPlane.apply(report),
            },
            {
              info: (detail, message) => deps.log.info(detail, message),
              warn: (detail, message) => deps.log.warn(detail, message),
            },
          )
        : undefined;
    if (tunnels) deps.metrics.reportTunnelLoads(() => tunnels.loads);
    // Shadows on this thread (TunnelThreads 0) meter here; tunnel threads send theirs.
    deps.metrics.dataPlane.reportFrom(() => dataPlane.flush());
    if (tunnels && !process.execArgv.includes('--single-threaded-gc')) {
      deps.log.info(
        { hint: 'node --single-threaded-gc bin/backhaul.js worker ...' },
        "node runs V8's background GC: on hosts with few cores the tunnels move less (docs/history/performance-notebook.md)",
      );
    }
    // What separates pods of the site user on this site (docs/SECURITY.md); each relay reports its own.
    const isolation = siteIsolation(
      carrierMode(deps.config.Network.SSH.Reverse),
      deps.config.Network.SSH.Reverse.SocketRoot,
      undefined,
    );
    deps.log.info(
      { relay: isolation.relay, sockets: isolation.sockets, detail: isolation.detail },
      'tunnel isolation of this site (backhaul doctor asks Slurm for more)',
    );
    const host = new SessionHost(deps, access, tunnels, hostId, connection, directory);
    await host.begin();
    return host;
  }

  get load(): number {
    return this.sessions.size;
  }

  /** The V8 heap its tunnel threads use (bytes, one per thread; none with TunnelThreads 0). */
  tunnelHeapUsed(collect = false): Promise<number[]> {
    return this.tunnels?.heapUsed(collect) ?? Promise.resolve([]);
  }

  /**
   * Stops taking shadows and hands the ones it holds back: each session closes (its sockets go), its
   * lease is released and its job returns to the queue for another host.
   */
  async stop(): Promise<void> {
    this.handingOver = true;
    const closing = this.worker.close();
    await Promise.all([...this.sessions.values()].map((held) => held.session.close('session host stopping')));
    await closing;
    clearInterval(this.heartbeat);
    clearInterval(this.trafficTimer);
    await this.deps.hosts.unregister(this.hostId).catch(() => undefined);
    await this.tunnels?.close();
    this.access.pool.close();
  }

  /**
   * A job whose lock ran out while this host held it (a Redis outage longer than lockDuration) is put
   * back to wait by the stall check and may come back to this very host while its first processing
   * still holds the shadow (its lease renewed by its token). The second processing then stands for the
   * first instead of starting a second session: a new lease would fence the first session, whose
   * teardown would remove the sockets of the new one (SOCKETS_VANISHED: the pod torn down).
   */
  private process(job: Job<SessionJobData>, token: string | undefined): Promise<SessionOutcome> {
    const key = job.id ?? `${job.data.uid}:${job.data.generation}`;
    const earlier = this.holding.get(key);
    if (earlier) return this.adopt(job, token, earlier);
    const holding = this.hold(job, token);
    this.holding.set(key, holding);
    const forget = () => {
      if (this.holding.get(key) === holding) this.holding.delete(key);
    };
    holding.then(forget, forget);
    return holding;
  }

  private async adopt(
    job: Job<SessionJobData>,
    token: string | undefined,
    earlier: Promise<SessionOutcome>,
  ): Promise<SessionOutcome> {
    const { uid, generation } = job.data;
    this.deps.log.info({ uid, generation, host: this.hostId }, 'session job back after a stall: its session goes on');
    try {
      return await earlier;
    } catch (err) {
      // The first processing handed the shadow back with its stale job token: hand the job back with ours.
      if (this.handingOver) return this.handBack(job, token, undefined);
      throw err;
    }
  }

  private async hold(job: Job<SessionJobData>, token: string | undefined): Promise<SessionOutcome> {
    const { uid, generation, plan } = job.data;
    const { deps } = this;
    const log = deps.log.child({ uid, generation, host: this.hostId });
    const ttl = deps.config.Backhaul.LeaseTTL;

    const stale = await this.staleReason(uid, generation);
    if (stale) return { type: 'STALE', reason: stale };

    // Fencing: one session per pod. After a crash, the dead host's lease must expire first.
    let lease: { token: number } | undefined;
    while (!lease) {
      if (this.handingOver) return this.handBack(job, token, undefined);
      const got = await deps.leases.acquire(uid, this.hostId, generation, ttl);
      if (got.ok) lease = got.lease;
      else if (got.reason === 'older-generation') return { type: 'STALE', reason: 'a newer shadow holds the lease' };
      else if (got.reason === 'reasserted' && got.current.generation === generation)
        // The record rebuilt after a loss of Redis's data launched the shadow that host kept: it is this one.
        return { type: 'STALE', reason: `${got.current.holder} kept this shadow through a loss of Redis's data` };
      else await sleep(Math.min(500, ttl / 4));
      const again = await this.staleReason(uid, generation);
      if (again) {
        if (lease) await deps.leases.release(uid, lease.token);
        return { type: 'STALE', reason: again };
      }
    }
    // The lease's token: replaced when this host re-asserts the lease after Redis lost its data.
    let held: HeldShadow | undefined;
    const fence = () => held?.fence ?? lease.token;

    const options: ShadowSessionOptions = {
      // Asked right before anything is bound on the node: a host that lost the lease binds nothing.
      fence: async () => (await deps.leases.get(uid))?.token === fence(),
      plan,
      pool: this.access.pool,
      site: this.access.carrier,
      nodeWaitTimeoutMs: deps.config.Network.SSH.NodeWaitTimeout,
      socketCheckMs: deps.config.Backhaul.SocketCheckInterval,
      jobCheckMs: deps.config.Backhaul.JobCheckInterval,
      dialRules: dialRulesOf(deps.config),
      directory: this.directory,
      carrierSlot: (namespace, signal) => this.slots.acquire(namespace, signal),
      log: {
        warn: (message, detail) => log.warn(detail ?? {}, message),
        info: (message, detail) => log.info(detail ?? {}, message),
      },
      onPhase: (phase) => {
        log.info(
          {
            phase: phase.type,
            ...(phase.type === 'FORWARDS_READY' && phase.isolation ? { isolation: phase.isolation } : {}),
          },
          'shadow phase',
        );
        if (held) noteReached(held, phase);
        sendEvent(deps.queues, uid, eventOf(phase, generation, fence(), this.hostId, deps.now())).catch((err) =>
          log.error({ err }, 'could not report a phase'),
        );
      },
    };
    const session: Shadow = this.tunnels ? this.tunnels.startShadow(options) : new ShadowSession(options);
    held = { uid, generation, fence: lease.token, session, reached: 'waitingBatchHost' };
    const mine = held;
    this.sessions.set(uid, mine);
    deps.metrics.shadowsHeld.inc();
    // Losing the lease (revoked by teardown, taken after an expiry) closes the session at once. A renewal
    // after expiresAt still succeeds while nobody has taken the lease, so a Redis outage does not end it;
    // a lease Redis lost with all its data is re-asserted (recover) instead.
    const renew = setInterval(
      () => {
        const token = mine.fence;
        deps.leases.renew(uid, token, ttl).then(
          async (r) => {
            if (r.ok) return;
            await this.recover().catch((err: unknown) => log.warn({ err }, 'could not look for a loss of Redis data'));
            if (mine.fence === token) void session.close(`lease ${r.reason}`);
          },
          (err) => log.warn({ err }, 'lease renewal failed'),
        );
      },
      Math.max(250, Math.floor(ttl / 3)),
    );
    try {
      const end = await session.run();
      deps.metrics.sessionEnds.inc({ end: end.type });
      if (end.type === 'JOB_ENDED' && end.trapMissed) deps.metrics.jobsEndedWithoutTrap.inc();
      if (end.type === 'CLOSED' && this.handingOver) return await this.handBack(job, token, mine.fence);
      return end;
    } finally {
      deps.metrics.shadowsHeld.dec();
      clearInterval(renew);
      // After a stall (its job lock ran out, e.g. in a Redis outage) this host may have taken the same
      // job again: that newer session is the pod's now and must stay known (stop() closes what is here).
      if (this.sessions.get(uid) === mine) {
        this.sessions.delete(uid);
        this.trafficWritten.delete(uid);
        await deps.redis.del(deps.keys.traffic(uid)).catch(() => 0);
      }
      if (!this.handingOver) await deps.leases.release(uid, mine.fence).catch(() => false);
    }
  }

  /**
   * Writes what each shadow's forwards carry (`backhaul status POD`): when it changed since the last
   * write, and at least every TRAFFIC_REFRESH_MS so the key (TTL TRAFFIC_TTL_S) outlives an idle tunnel.
   * One pipeline for the host; idle shadows cost nothing between refreshes.
   */
  private async publishTraffic(): Promise<void> {
    const { deps } = this;
    const now = deps.now();
    const pipeline = deps.redis.pipeline();
    let writes = 0;
    for (const [uid, held] of this.sessions) {
      const traffic = held.session.traffic();
      if (!traffic) continue;
      const last = this.trafficWritten.get(uid);
      const due = !last || now - last.at >= TRAFFIC_REFRESH_MS;
      // A tunnel thread's shadow hands back the report it last sent until it sends another: nothing new.
      if (!due && last.traffic === traffic) continue;
      const body = { host: this.hostId, generation: held.generation, ...traffic };
      const text = JSON.stringify(body);
      if (!due && last.text === text) continue;
      pipeline.set(deps.keys.traffic(uid), JSON.stringify({ at: now, ...body }), 'EX', TRAFFIC_TTL_S);
      this.trafficWritten.set(uid, { traffic, text, at: now });
      writes += 1;
    }
    if (writes > 0) await pipeline.exec().catch(() => undefined);
  }

  /**
   * Redis lost its data (restarted empty; a replica promoted with no copy): the leases of the shadows held
   * here and this host's registration went with it, while the tunnels and their jobs live on. Each lease
   * is taken again (only re-assertions are granted in the recovery window, see lease-acquire.lua) and each
   * pod's rebuilt record is told of its shadow until it takes it. One look at a time; true when lost.
   */
  private recover(): Promise<boolean> {
    this.recovery ??= this.reassert().finally(() => {
      this.recovery = undefined;
    });
    return this.recovery;
  }

  private async reassert(): Promise<boolean> {
    const { deps } = this;
    const { lost } = await this.epoch.check();
    if (!lost || this.handingOver) return false;
    await deps.hosts.register(this.hostId, deps.config.Backhaul.SessionCapacity, this.sessions.size);
    const held = [...this.sessions.values()];
    deps.log.warn(
      { host: this.hostId, shadows: held.length },
      "Redis lost its data: re-asserting the leases of this host's shadows; their tunnels stay up",
    );
    await Promise.all(held.map((shadow) => this.reassertOne(shadow)));
    return true;
  }

  /**
   * Takes one shadow's lease again. A Redis that just came back may fail a call: it is tried again within
   * the recovery window (the epoch is known by now, so a later renewal would not look for the loss again,
   * and would end the session instead).
   */
  private async reassertOne(held: HeldShadow): Promise<void> {
    const { deps } = this;
    const log = deps.log.child({ uid: held.uid, generation: held.generation, host: this.hostId });
    const ttl = deps.config.Backhaul.LeaseTTL;
    const giveUpAt = performance.now() + recoveryWindowMs(ttl);
    for (let wait = 250; ; wait = Math.min(2 * wait, 2_000)) {
      try {
        const got = await deps.leases.acquire(held.uid, this.hostId, held.generation, ttl, { reassert: true });
        if (!got.ok) {
          void held.session.close(`lease ${got.reason} after Redis lost its data`);
          return;
        }
        held.fence = got.lease.token;
        deps.metrics.shadowsReasserted.inc();
        void this.tellRebuiltRecord(held, log);
        return;
      } catch (err) {
        if (performance.now() + wait > giveUpAt || this.sessions.get(held.uid) !== held) {
          log.warn({ err }, 'could not re-assert a lease after Redis lost its data: the session ends');
          void held.session.close('lease lost with Redis data, not re-asserted');
          return;
        }
        await sleep(wait);
      }
    }
  }

  /**
   * Sends SHADOW_HELD until the pod's record (rebuilt by the watch role from the API server) shows this
   * shadow: every second at first, then every 10 s for as long as the session lives. A record that went
   * on without it (a newer generation, torn down, failed) ends the session.
   */
  private async tellRebuiltRecord(held: HeldShadow, log: FleetDeps['log']): Promise<void> {
    const { deps } = this;
    for (let round = 0; this.sessions.get(held.uid) === held && !this.handingOver; round += 1) {
      const pod = await readPod(deps, held.uid).catch(() => null);
      const verdict = pod ? this.recordOnShadow(pod, held) : 'waits';
      if (verdict === 'took') {
        log.info({ state: pod?.state }, "the pod's rebuilt record took back its shadow");
        return;
      }
      if (verdict === 'went-on') {
        void held.session.close(`the pod's rebuilt record went on without this shadow (${pod?.state})`);
        return;
      }
      await sendEvent(deps.queues, held.uid, heldEvent(held, this.hostId, deps.now())).catch((err: unknown) =>
        log.warn({ err }, 'could not tell the pod of its shadow'),
      );
      await sleep(round < 30 ? 1_000 : 10_000);
    }
  }

  /**
   * What a rebuilt record says of a kept shadow: it `took` it (its generation, this host, running), it
   * `went-on` without it (a newer generation, or out of the shadow states past its first steps), or it
   * still `waits` (being validated and rendered, or launching before SHADOW_HELD reached it).
   */
  private recordOnShadow(pod: PodView, held: HeldShadow): 'took' | 'went-on' | 'waits' {
    const { state, context } = pod;
    if (context.generation === held.generation && context.host === this.hostId && stateHasTag(state, 'shadowRunning'))
      return 'took';
    if (state === 'validating' || state === 'rendering') return 'waits';
    return context.generation > held.generation || !stateHasTag(state, 'shadow') ? 'went-on' : 'waits';
  }

  /** Puts the shadow back in the queue for another host and frees the lease at once. */
  private async handBack(
    job: Job<SessionJobData>,
    token: string | undefined,
    fence: number | undefined,
  ): Promise<never> {
    if (fence !== undefined) await this.deps.leases.release(job.data.uid, fence).catch(() => false);
    await job.moveToWait(token);
    throw new WaitingError();
  }

  private async staleReason(uid: string, generation: number): Promise<string | undefined> {
    const pod = await readPod(this.deps, uid);
    if (!pod) return 'the pod is gone';
    if (pod.context.generation !== generation) return `the pod is at generation ${pod.context.generation}`;
    if (!stateHasTag(pod.state, 'shadow')) return `the pod is ${pod.state}`;
    return undefined;
  }
}
