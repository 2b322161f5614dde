import type { Client } from 'ssh2';

/** ssh2's own receive window per channel, and what every channel gets at least: it costs no budget. */
export const BASE_WINDOW = 2 * 1024 * 1024;
/**
 * The rate one channel should reach on a long path: a window of RTT × this covers it. About what one
 * SSH connection moves on one core here (aes128-gcm both ends); more window than the core can fill
 * only lets a stalled reader hold more.
 */
export const PATH_RATE_BYTES_PER_S = 400 * 1000 * 1000;
/** Backhaul.ChannelWindowMax when the site sets none. */
export const DEFAULT_MAX_WINDOW = 16 * 1024 * 1024;
/** Backhaul.ChannelWindowBudget when the site sets none: window above BASE_WINDOW, per tunnel thread. */
export const DEFAULT_WINDOW_BUDGET = 256 * 1024 * 1024;

/** The window that covers the path's bandwidth-delay product: RTT × PATH_RATE, within [BASE_WINDOW, MAX]. */
export function windowForRtt(rttMs: number, maxWindow = DEFAULT_MAX_WINDOW): number {
  const rtt = Number.isFinite(rttMs) && rttMs > 0 ? rttMs : 0;
  const bdp = Math.ceil((rtt / 1000) * PATH_RATE_BYTES_PER_S);
  return Math.max(BASE_WINDOW, Math.min(maxWindow, bdp));
}

/** The part of ssh2 that patches/ssh2+1.17.0.patch adds: checked, so an ssh2 without it fails loudly. */
interface PatchedClient {
  channelWindow?: number;
  ping(cb: (err?: Error) => void): void;
}

function patched(client: Client): PatchedClient {
  const c = client as unknown as PatchedClient;
  if (typeof c.ping !== 'function') {
    throw new Error('ssh2 lacks backhaul\'s patch (Client.ping, channelWindow): run "npx patch-package"');
  }
  return c;
}

/**
 * One keepalive@openssh.com round trip of the connection, in ms (what the transport and the sshd add
 * to the path: through a jump, the whole way to the node). Rejects when the connection is gone.
 */
export function pingMs(client: Client): Promise<number> {
  const c = patched(client);
  const started = performance.now();
  return new Promise((resolve, reject) => {
    c.ping((err) => (err ? reject(err) : resolve(performance.now() - started)));
  });
}

/**
 * When a connection's round trip is sampled, in ms from the first sample: a few early ones (the first
 * of a new connection waits behind its own set-up: forward requests, exec channels, a busy machine; on
 * loopback it read 10-64 ms where the path takes 0.1), then two later ones. Keepalives do the rest.
 */
export const RTT_SAMPLES_MS: readonly number[] = [0, 250, 1_000, 5_000, 30_000];

/**
 * A path's round trip as the smallest sample seen: queueing only adds to a sample, so the smallest is
 * the path (as TCP's min_rtt). Windows sized from a high sample cost more than memory: a site sshd
 * holding megabytes in its channel buffers spent twice the CPU per byte on loopback.
 */
export class RttEstimate {
  private min: number | undefined;

  /** The smallest sample so far, undefined before the first. */
  get ms(): number | undefined {
    return this.min;
  }

  /** True when SAMPLE lowered the estimate. */
  sample(ms: number): boolean {
    if (!(Number.isFinite(ms) && ms >= 0)) return false;
    if (this.min !== undefined && ms >= this.min) return false;
    this.min = ms;
    return true;
  }
}

/**
 * Pings CLIENT at each of AT_MS (from now) into ESTIMATE, calling ONLOWER when a sample lowers it. Stops at
 * the first failed ping (the connection is gone) or when the returned function is called. Its timers do not
 * keep the process alive.
 */
export function sampleRtt(
  client: Client,
  estimate: RttEstimate,
  onLower: (ms: number) => void = () => undefined,
  atMs: readonly number[] = RTT_SAMPLES_MS,
  /** Every sample, with its index in AT_MS. */
  onSample: (ms: number, index: number) => void = () => undefined,
): () => void {
  const timers: NodeJS.Timeout[] = [];
  let stopped = false;
  const stop = () => {
    stopped = true;
    for (const t of timers) clearTimeout(t);
  };
  for (const [index, at] of atMs.entries()) {
    const timer = setTimeout(() => {
      if (stopped) return;
      pingMs(client).then((ms) => {
        if (stopped) return;
        onSample(ms, index);
        if (estimate.sample(ms)) onLower(ms);
      }, stop);
    }, at);
    timer.unref();
    timers.push(timer);
  }
  return stop;
}

/** Channels the connection makes or accepts from now on advertise WINDOW bytes (ssh2's own is BASE_WINDOW). */
export function setChannelWindow(client: Client, window: number): void {
  patched(client).channelWindow = window;
}

export function channelWindowOf(client: Client): number {
  return patched(client).channelWindow ?? BASE_WINDOW;
}

/** A window given to one channel; release() once the channel is closed. */
export interface WindowGrant {
  readonly window: number;
  release(): void;
}

/**
 * How much receive window the channels of one thread may hold beyond BASE_WINDOW all together. A window
 * is a promise to buffer: a channel whose reader stalls (an endpoint that stopped reading) holds up to
 * its window in memory, so 1,000 stalled channels at 16 MiB would be 16 GiB. Windows above the base are
 * granted from this budget while it lasts; channels beyond it get the base, as before tuning.
 */
export class WindowBudget {
  private granted = 0;

  constructor(readonly budget = DEFAULT_WINDOW_BUDGET) {}

  /** Bytes granted beyond BASE_WINDOW to channels not yet released. */
  get inUse(): number {
    return this.granted;
  }

  grant(want: number): WindowGrant {
    if (!(want > BASE_WINDOW)) return { window: BASE_WINDOW, release: () => undefined };
    const extra = Math.max(0, Math.min(want - BASE_WINDOW, this.budget - this.granted));
    this.granted += extra;
    let released = false;
    return {
      window: BASE_WINDOW + extra,
      release: () => {
        if (released) return;
        released = true;
        this.granted -= extra;
      },
    };
  }
}

let threadBudget: WindowBudget | undefined;

/**
 * The budget of this thread (a module per worker thread: each tunnel thread has its own), made with
 * BYTES the first time it is asked for; later calls share it.
 */
export function threadWindowBudget(bytes = DEFAULT_WINDOW_BUDGET): WindowBudget {
  threadBudget ??= new WindowBudget(bytes);
  return threadBudget;
}
