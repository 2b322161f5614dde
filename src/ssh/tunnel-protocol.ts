import type { DataPlaneReport } from '../metrics/data-plane-metrics.js';
import type { SessionTraffic } from './forward-traffic.js';
import type { RunOptions } from './login-hop.js';
import type { ExecResult } from './remote-exec.js';
import type { ServiceAnswer } from './service-directory.js';
import type { ShadowEnd, ShadowPhase, ShadowSessionOptions } from './shadow-session.js';
import type { SiteAccessData } from './site-access.js';
import type { SlurmJob } from './slurm-job.js';

/**
 * The messages between a session host and its tunnel threads (tunnel-threads.ts, tunnel-thread.ts).
 * The session host keeps the login connections (the outer SSH layer of every tunnel); a thread runs
 * shadows (carrier, forwards, endpoint sockets: the inner layer). A login channel a thread uses as a
 * byte stream (a jump, `sshd -i`) reaches it through a unix socket (hop-pipes.ts); the rest are calls.
 * Every message is structured-cloned: plain data only.
 */

/**
 * What a thread needs to run one shadow: ShadowSessionOptions without the callbacks and the pool, so
 * that every plain-data option reaches the thread (a field listed by hand here was once left behind).
 */
export type ShadowStart = Omit<ShadowSessionOptions, ShadowCallbacks> & {
  /** The session host answers `fence` calls for this shadow (its options had a fence). */
  fenced: boolean;
  /** The session host answers `slot` calls for this shadow (its options had a carrierSlot). */
  slotted: boolean;
};

/** The options that are functions or live objects: the thread provides its own (tunnel-thread.ts). */
export type ShadowCallbacks = 'pool' | 'onPhase' | 'log' | 'fence' | 'directory' | 'carrierSlot';

/** The login hop's methods, as calls from a thread to the session host. */
export type HopCall =
  | { method: 'acquire'; sessions: number }
  | { method: 'release'; lease: number }
  | { method: 'jump'; lease: number; host: string; port: number }
  | { method: 'exec'; lease: number; command: string }
  | { method: 'run'; lease: number; command: string; opts: RunOptions }
  | { method: 'findJob'; lease: number; user: string; jobName: string }
  /** Whether the session host still holds the lease of shadow `shadow`'s pod (ShadowSessionOptions.fence). */
  | { method: 'fence'; shadow: string }
  /** A Service as the session host's directory has it (the Kubernetes API). */
  | { method: 'service'; namespace: string; name: string }
  /** A carrier slot for shadow `shadow` (ShadowSessionOptions.carrierSlot); given back when the shadow ends. */
  | { method: 'slot'; shadow: string; namespace: string };

export type HopValue =
  | { lease: number }
  | { pipe: string }
  | ExecResult
  | { job: SlurmJob | undefined }
  | { held: boolean }
  | { service: ServiceAnswer }
  | null;

/** An error crossing the thread boundary, rebuilt as a SessionError when it had a kind. */
export interface WireError {
  message: string;
  kind?: string;
}

export type ToThread =
  | { type: 'start'; id: string; shadow: ShadowStart }
  | { type: 'close'; id: string; reason: string }
  | { type: 'reply'; call: number; ok: true; value: HopValue }
  | { type: 'reply'; call: number; ok: false; error: WireError }
  /** stderr of an exec pipe (what the user-space sshd says when it does not start). */
  | { type: 'stderr'; pipe: string; data: Uint8Array }
  /** The fleet's own addresses changed (ServiceDirectory.fleetAddresses). */
  | { type: 'fleet-addresses'; addresses: string[] }
  /** How much heap the thread uses; `collect`: after a full GC, where the process exposes gc (benches). */
  | { type: 'heap'; call: number; collect: boolean };

export type FromThread =
  | { type: 'ready' }
  | { type: 'phase'; id: string; phase: ShadowPhase }
  | { type: 'end'; id: string; end: ShadowEnd }
  | { type: 'log'; id: string; level: 'info' | 'warn'; message: string; detail?: Record<string, unknown> }
  | { type: 'call'; call: number; request: HopCall }
  | { type: 'heap'; call: number; usedBytes: number }
  /** What the thread's forwarded connections did since the last report (data-plane-meter.ts). */
  | { type: 'metrics'; report: DataPlaneReport }
  /** What a shadow's forwards carried, when it changed (forward-traffic.ts). */
  | { type: 'traffic'; id: string; traffic: SessionTraffic };

export interface TunnelThreadData {
  /** Where a thread connects for its byte pipes (a unix socket in a 0700 directory of the session host). */
  pipeSocket: string;
  /** With `login: 'per-thread'`: the site, for the thread's own login connections (no pipes, no calls). */
  access?: SiteAccessData;
  /** The fleet's own addresses when the thread starts; updates come as `fleet-addresses`. */
  fleetAddresses: string[];
}
