import { availableParallelism } from 'node:os';
import { Worker } from 'node:worker_threads';
import type { DataPlaneReport } from '../metrics/data-plane-metrics.js';
import type { SessionTraffic } from './forward-traffic.js';
import { HopPipeServer } from './hop-pipes.js';
import type { LoginHops } from './login-hop.js';
import { LoginHopService } from './login-hop-service.js';
import { NO_CLUSTER_DIRECTORY, type ServiceDirectory } from './service-directory.js';
import type { ShadowEnd, ShadowSessionOptions } from './shadow-session.js';
import type { SiteAccess, SiteAccessData } from './site-access.js';
import type { FromThread, HopCall, HopValue, ToThread, TunnelThreadData } from './tunnel-protocol.js';

/** What the session host holds of a shadow: a ShadowSession here, or one in a tunnel thread. */
export interface Shadow {
  /** Runs the shadow to its end; never rejects. */
  run(): Promise<ShadowEnd>;
  /** Ends it and waits until its teardown is over; idempotent. */
  close(reason?: string): Promise<void>;
  /** What its forwards carried so far (from a tunnel thread: as of its last report, every couple of seconds). */
  traffic(): SessionTraffic | undefined;
}

export interface TunnelThreadsLog {
  warn(detail: Record<string, unknown>, message: string): void;
  info(detail: Record<string, unknown>, message: string): void;
}

/** Where a tunnel thread's login connections live (see TunnelThreads.start). */
export type TunnelLogin = 'shared' | 'per-thread';

/** `Backhaul.TunnelThreads: auto`: one per core, at most 8 (the session host's own thread carries no bytes). */
export function autoTunnelThreads(): number {
  return Math.max(1, Math.min(8, availableParallelism()));
}

/**
 * The thread's code: the compiled module next to this one, or (running from the TypeScript sources,
 * in tests and benchmarks) a bootstrap that has tsx compile it.
 */
function threadEntry(): URL {
  return import.meta.url.endsWith('.ts')
    ? new URL('./tunnel-thread.dev.mjs', import.meta.url)
    : new URL('./tunnel-thread.js', import.meta.url);
}

interface Held {
  opts: ShadowSessionOptions;
  /** Aborts a carrier slot still being waited for, and gives back one taken (at the shadow's end). */
  slot: AbortController;
  releaseSlot?: () => void;
  ended: Promise<ShadowEnd>;
  end(end: ShadowEnd): void;
  closing: Promise<void> | undefined;
  done: boolean;
  traffic?: SessionTraffic;
}

/** One worker thread, its shadows and what it borrowed from the login pool. */
class TunnelThread {
  readonly held = new Map<string, Held>();
  private readonly worker: Worker;
  readonly service: LoginHopService;
  readonly ready: Promise<void>;
  exited = false;
  private stopping = false;
  private readonly heapAsks = new Map<number, (usedBytes: number) => void>();
  private nextHeapAsk = 1;

  constructor(
    readonly index: number,
    pool: LoginHops,
    pipes: HopPipeServer,
    ownLogin: SiteAccessData | undefined,
    private readonly directory: ServiceDirectory,
    private readonly log: TunnelThreadsLog,
    private readonly onReport: (report: DataPlaneReport) => void,
    private readonly onExit: (thread: TunnelThread, why: string) => void,
  ) {
    const data: TunnelThreadData = {
      pipeSocket: pipes.path,
      ...(ownLogin ? { access: ownLogin } : {}),
      fleetAddresses: [...directory.fleetAddresses()],
    };
    this.worker = new Worker(threadEntry(), { workerData: data, name: `tunnel-${index}` });
    this.service = new LoginHopService(pool, pipes, (message) => this.send(message));
    this.ready = new Promise((resolve, reject) => {
      this.worker.once('error', reject);
      const onReady = (message: FromThread) => {
        if (message.type !== 'ready') return;
        this.worker.off('message', onReady);
        this.worker.off('error', reject);
        resolve();
      };
      this.worker.on('message', onReady);
    });
    this.worker.on('message', (message: FromThread) => this.receive(message));
    let why = 'exited';
    this.worker.on('error', (err) => {
      why = `crashed: ${err.message}`;
      log.warn({ thread: index, err: err.message }, 'tunnel thread crashed');
    });
    this.worker.once('exit', (code) => {
      this.exited = true;
      for (const answer of this.heapAsks.values()) answer(0);
      this.heapAsks.clear();
      this.service.releaseAll();
      if (!this.stopping) this.onExit(this, `tunnel thread ${index} ${why} (exit code ${code})`);
    });
  }

  start(id: string, opts: ShadowSessionOptions): Shadow {
    let end: (end: ShadowEnd) => void = () => undefined;
    const ended = new Promise<ShadowEnd>((resolve) => {
      end = resolve;
    });
    const held: Held = {
      opts,
      slot: new AbortController(),
      ended,
      end: (e) => end(e),
      closing: undefined,
      done: false,
    };
    this.held.set(id, held);
    const { pool: _pool, onPhase: _onPhase, log: _log, directory: _directory, fence, carrierSlot, ...data } = opts;
    let started = false;
    return {
      run: () => {
        if (!started) {
          started = true;
          this.send({
            type: 'start',
            id,
            shadow: { ...data, fenced: fence !== undefined, slotted: carrierSlot !== undefined },
          });
        }
        return ended;
      },
      close: (reason = 'closed') => {
        if (held.done) return Promise.resolve();
        held.closing ??= (async () => {
          if (!started) {
            this.finish(id, { type: 'CLOSED', reason });
            return;
          }
          this.send({ type: 'close', id, reason });
          await ended;
        })();
        return held.closing;
      },
      traffic: () => held.traffic,
    };
  }

  /** Ends every shadow it held as lost (the thread is gone), reporting it like a lost carrier. */
  abandon(why: string): void {
    for (const [id, held] of this.held) {
      if (!held.closing) held.opts.onPhase({ type: 'CARRIER_LOST', reason: why });
      this.finish(id, held.closing ? { type: 'CLOSED', reason: why } : { type: 'CARRIER_LOST', reason: why });
    }
  }

  /** Ends the thread as a crash would: its shadows are abandoned and it is replaced. */
  async kill(): Promise<void> {
    await this.worker.terminate();
  }

  async stop(): Promise<void> {
    this.stopping = true;
    await this.worker.terminate();
    this.service.releaseAll();
  }

  private finish(id: string, end: ShadowEnd): void {
    const held = this.held.get(id);
    if (!held) return;
    held.done = true;
    this.held.delete(id);
    held.slot.abort();
    held.releaseSlot?.();
    held.end(end);
  }

  /** Sends the thread the value of a call the session host answers itself, or its error. */
  private reply(call: number, value: Promise<HopValue>): void {
    value.then(
      (v) => this.send({ type: 'reply', call, ok: true, value: v }),
      (err: unknown) => this.send({ type: 'reply', call, ok: false, error: { message: String(err) } }),
    );
  }

  /** The calls a thread makes of its shadow's callbacks and of the session host's directory. */
  private answer(call: number, request: Extract<HopCall, { method: 'fence' | 'service' | 'slot' }>): void {
    switch (request.method) {
      case 'fence': {
        const fence = this.held.get(request.shadow)?.opts.fence;
        this.reply(
          call,
          (fence ? fence() : Promise.resolve(false)).then((held) => ({ held })),
        );
        return;
      }
      case 'service':
        this.reply(
          call,
          this.directory.lookup({ namespace: request.namespace, name: request.name }).then((service) => ({ service })),
        );
        return;
      case 'slot': {
        const held = this.held.get(request.shadow);
        const acquire = held?.opts.carrierSlot;
        if (!held || !acquire) {
          this.reply(call, Promise.resolve(null));
          return;
        }
        const taken = acquire(request.namespace, held.slot.signal).then((release) => {
          // Given back when the shadow ends (finish), or at once if it ended while waiting.
          if (held.done) release();
          else held.releaseSlot = release;
          return null;
        });
        this.reply(call, taken);
        return;
      }
    }
  }

  send(message: ToThread): void {
    if (!this.exited) this.worker.postMessage(message);
  }

  private receive(message: FromThread): void {
    switch (message.type) {
      case 'call':
        if (
          message.request.method === 'fence' ||
          message.request.method === 'service' ||
          message.request.method === 'slot'
        ) {
          this.answer(message.call, message.request);
        } else this.service.serve(message.call, message.request);
        return;
      case 'phase':
        this.held.get(message.id)?.opts.onPhase(message.phase);
        return;
      case 'log': {
        const log = this.held.get(message.id)?.opts.log;
        if (log) log[message.level](message.message, message.detail);
        return;
      }
      case 'end':
        this.finish(message.id, message.end);
        return;
      case 'metrics':
        this.onReport(message.report);
        return;
      case 'traffic': {
        const held = this.held.get(message.id);
        if (held) held.traffic = message.traffic;
        return;
      }
      case 'heap':
        this.heapAsks.get(message.call)?.(message.usedBytes);
        this.heapAsks.delete(message.call);
        return;
      case 'ready':
        return;
    }
  }

  /** The thread's V8 heap in use (bytes); 0 when it has exited. */
  heapUsed(collect: boolean): Promise<number> {
    if (this.exited) return Promise.resolve(0);
    const call = this.nextHeapAsk++;
    return new Promise((resolve) => {
      this.heapAsks.set(call, resolve);
      this.send({ type: 'heap', call, collect });
    });
  }
}

/**
 * A session host's tunnel threads. Each shadow runs in the least loaded thread, which holds its
 * carrier, forwards and endpoint sockets on its own event loop and small heap: the tunnels of one
 * session host use as many cores as there are threads, and the host's own thread (BullMQ, leases,
 * Redis) carries no bytes. The login connections are each thread's own ('per-thread') or the host's
 * ('shared': the outer SSH layer on the host's thread, the inner one in the tunnel thread). A thread
 * that dies ends its shadows as lost carriers (their pods' machines relaunch them) and is replaced.
 */
export class TunnelThreads {
  private readonly threads: TunnelThread[] = [];
  private nextId = 1;
  private closed = false;

  private readonly unsubscribe: () => void;

  private constructor(
    private readonly access: SiteAccess,
    private readonly login: TunnelLogin,
    private readonly pipes: HopPipeServer,
    private readonly directory: ServiceDirectory,
    private readonly log: TunnelThreadsLog,
    private readonly onReport: (report: DataPlaneReport) => void,
  ) {
    this.unsubscribe = directory.onFleetAddresses((addresses) => {
      for (const thread of this.threads) thread.send({ type: 'fleet-addresses', addresses: [...addresses] });
    });
  }

  /**
   * `login: 'shared'`: the threads use this host's login pool through byte pipes (a tunnel's two SSH
   * layers on two threads); `'per-thread'`: each thread opens its own login connections (a tunnel's
   * bytes stay in one thread, with no pipe to copy through).
   */
  static async start(
    access: SiteAccess,
    opts: {
      threads: number;
      login: TunnelLogin;
      directory?: ServiceDirectory;
      /** Each thread's data-plane report (every couple of seconds): the session host's metrics take them. */
      onReport: (report: DataPlaneReport) => void;
    },
    log: TunnelThreadsLog,
  ): Promise<TunnelThreads> {
    const count = opts.threads;
    if (!Number.isInteger(count) || count < 1) throw new RangeError(`tunnel threads: ${count}, expected 1 or more`);
    const pipes = await HopPipeServer.start();
    if (pipes.staleRemoved.length > 0) {
      log.info({ removed: pipes.staleRemoved }, 'removed the pipe dirs of session hosts that died without stopping');
    }
    const threads = new TunnelThreads(
      access,
      opts.login,
      pipes,
      opts.directory ?? NO_CLUSTER_DIRECTORY,
      log,
      opts.onReport,
    );
    try {
      for (let i = 0; i < count; i++) threads.threads.push(threads.spawn(i));
      await Promise.all(threads.threads.map((t) => t.ready));
    } catch (err) {
      await threads.close();
      throw err;
    }
    log.info({ threads: count, login: opts.login }, 'tunnel threads started');
    return threads;
  }

  get size(): number {
    return this.threads.length;
  }

  /** Shadows held, per thread (for status and tests). */
  get loads(): number[] {
    return this.threads.map((t) => t.held.size);
  }

  /**
   * Each thread's V8 heap in use (bytes): the shadows' carriers and forwards live there, not on the
   * session host's own thread. `collect`: after full GCs, where the process runs with --expose-gc.
   */
  heapUsed(collect = false): Promise<number[]> {
    return Promise.all(this.threads.map((t) => t.heapUsed(collect)));
  }

  /** Login leases the threads hold (each shadow holds one from SHADOW_UP to its end). */
  get loginLeases(): number {
    return this.threads.reduce((n, t) => n + t.service.leased, 0);
  }

  /** A shadow in the least loaded thread; `opts.pool` is not used (the thread's hops are the pool's). */
  startShadow(opts: ShadowSessionOptions): Shadow {
    if (this.closed) throw new Error('tunnel threads are closed');
    const thread = this.threads.reduce((a, b) => (b.held.size < a.held.size ? b : a));
    // The window budget is the session host's; each thread holds its share (channel-window.ts).
    const budget = opts.site.channelWindowBudget;
    const site =
      budget === undefined
        ? opts.site
        : { ...opts.site, channelWindowBudget: Math.floor(budget / this.threads.length) };
    return thread.start(`s${this.nextId++}`, { ...opts, site });
  }

  /**
   * Ends thread `index` as a crash would (its shadows end as lost carriers, a new thread takes its
   * place): the fault tests use it, as could an operator with a stuck thread.
   */
  async killThread(index: number): Promise<void> {
    const thread = this.threads[index];
    if (!thread) throw new RangeError(`no tunnel thread ${index} (there are ${this.threads.length})`);
    await thread.kill();
  }

  async close(): Promise<void> {
    this.closed = true;
    this.unsubscribe();
    await Promise.all(this.threads.map((t) => t.stop()));
    for (const t of this.threads) t.abandon('session host stopping');
    await this.pipes.close();
  }

  private spawn(index: number): TunnelThread {
    const ownLogin = this.login === 'per-thread' ? this.access.data : undefined;
    return new TunnelThread(
      index,
      this.access.pool,
      this.pipes,
      ownLogin,
      this.directory,
      this.log,
      this.onReport,
      (thread, why) => this.replace(thread, why),
    );
  }

  private replace(thread: TunnelThread, why: string): void {
    this.log.warn(
      { thread: thread.index, why },
      'tunnel thread ended: its shadows are lost, a new thread takes its place',
    );
    thread.abandon(why);
    if (this.closed) return;
    const at = this.threads.indexOf(thread);
    const next = this.spawn(thread.index);
    if (at >= 0) this.threads[at] = next;
    next.ready.catch((err: unknown) =>
      this.log.warn({ thread: thread.index, err: String(err) }, 'tunnel thread did not start'),
    );
  }
}
