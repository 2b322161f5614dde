import type { ErrorKind, PodError } from './error-kinds.js';

export type { PodError };
/**
 * The vocabulary of one pod's reverse setup (ARCHITECTURE.md, "Carriers and shadow sessions", "The machine"): state names, events, context and the
 * effects the machine asks for. Plain data only — every value here survives JSON.stringify/parse, so a
 * snapshot stored in Redis and events carried by BullMQ jobs come back exactly as they left.
 */

/** The steps the control worker runs as step jobs. */
export const STEPS = ['validate', 'render', 'launch', 'teardown'] as const;
export type StepName = (typeof STEPS)[number];

/** States that hold a deadline; a deadline is named after its state. */
export const DEADLINE_NAMES = [
  'launchingShadow',
  'waitingBatchHost',
  'openingCarrier',
  'establishingForwards',
] as const;
export type DeadlineName = (typeof DEADLINE_NAMES)[number];

/** The last error the pod met, kept in context for `status`. */
export interface PodLastError {
  kind: ErrorKind;
  message: string;
  at: number;
}

/** A deadline kept in context; the store indexes it and the control role delivers it as a DEADLINE event when due. */
export interface PodDeadline {
  name: DeadlineName;
  /** Epoch ms. */
  at: number;
  generation: number;
}

/** Limits for one pod, from the site configuration. */
export interface PodLimits {
  /** Shadow launches allowed in a row without reaching FORWARDS_READY (RETRY starts a new count). */
  retryLimit: number;
  backoffBaseMs: number;
  backoffMaxMs: number;
  /** How long the job may take to get a batch host (Network.SSH.NodeWaitTimeout). */
  nodeWaitTimeoutMs: number;
  /** Deadline of launchingShadow, openingCarrier and establishingForwards. */
  phaseTimeoutMs: number;
}

export interface PodInput extends PodLimits {
  uid: string;
  namespace: string;
  name: string;
  annotations?: Record<string, string>;
}

export interface PodContext extends PodLimits {
  uid: string;
  namespace: string;
  name: string;
  annotations: Record<string, string>;
  /** Epoch ms of startPod. */
  createdAt: number;
  /** Number of the current shadow: 0 before the first launch, +1 at each launch. */
  generation: number;
  /** Shadow launches since the last FORWARDS_READY or RETRY. */
  attempts: number;
  /** Backoff applied before the current generation's launch. */
  backoffMs: number;
  deadline: PodDeadline | null;
  /** Session host holding the current shadow. */
  host: string | null;
  /** Slurm job id and batch host, as last reported (kept across generations: teardown cleans that node). */
  jobId: string | null;
  batchHost: string | null;
  lastError: PodLastError | null;
  forwardsReadyAt: number | null;
  /**
   * The addresses the job's relay holds, one per Service group, as last reported (FORWARDS_READY);
   * absent until then.
   */
  relayAddresses?: string[];
  /**
   * What separates the tunnel from other jobs of the site user, as the relay found it (FORWARDS_READY):
   * `relay: job` the relay admits only the job's processes; `sockets: job` the sockets are on a mount
   * of the job's own. Absent from a relay too old to say.
   */
  isolation?: TunnelIsolation;
  podDeleted: boolean;
  /** Why the pod is being torn down (TEARDOWN's reason, 'pod-deleted', 'job-ended', 'sockets-vanished'). */
  teardownReason: string | null;
}

/**
 * A session plan as the render step made it (src/render/session-plan.ts: plain JSON, opaque to the
 * machine, which does not keep it: the store keeps it beside the pod's snapshot, written with the
 * transition that leaves `rendering`), with the digest of the site configuration it was rendered from: a
 * launch under another configuration renders it again, and says so.
 */
export interface RenderedPlan {
  site: string;
  plan: Record<string, unknown>;
}

// ---- events: every event carries `at` (epoch ms); the machine never reads the clock ----

interface Timed {
  at: number;
}
/**
 * Session phase reports carry the generation of the shadow that sent them, and the fencing token of
 * its lease: a session host that lost the lease (stopped, then woken after another took the shadow
 * over with the same generation) is told apart by the token (the control worker drops its reports).
 */
interface Report extends Timed {
  generation: number;
  lease?: number;
}

export interface PodUpsertEvent extends Timed {
  type: 'POD_UPSERT';
  namespace: string;
  name: string;
  annotations: Record<string, string>;
}
export interface PodDeletedEvent extends Timed {
  type: 'POD_DELETED';
}
export interface RetryEvent extends Timed {
  type: 'RETRY';
}
export interface TeardownEvent extends Timed {
  type: 'TEARDOWN';
  reason: string;
}
export interface StepDoneEvent extends Timed {
  type: 'STEP_DONE';
  step: StepName;
  generation?: number;
  /** The render step's plan (the render step only; stored by the control worker, not by the machine). */
  plan?: RenderedPlan;
}
export interface StepFailedEvent extends Timed {
  type: 'STEP_FAILED';
  step: StepName;
  generation?: number;
  error?: PodError;
}
export interface DeadlineEvent extends Timed {
  type: 'DEADLINE';
  name: DeadlineName;
  generation: number;
}
export interface ShadowUpEvent extends Report {
  type: 'SHADOW_UP';
  host: string;
}
export interface BatchHostEvent extends Report {
  type: 'BATCH_HOST';
  batchHost: string;
  jobId: string;
}
export interface CarrierOpenEvent extends Report {
  type: 'CARRIER_OPEN';
}
export interface ForwardsReadyEvent extends Report {
  type: 'FORWARDS_READY';
  /** The addresses the job's relay holds, one per Service group (absent when the shadow could not read them). */
  addresses?: string[];
  isolation?: TunnelIsolation;
}

/** What separates a pod's tunnel from the other jobs of its Unix user (src/render/node-scripts.ts parses it). */
export interface TunnelIsolation {
  relay: 'job' | 'user';
  sockets: 'job' | 'user';
}
/** The phases a shadow reports up to, as the states its pod is in after each report. */
export const SHADOW_PHASE_STATES = ['waitingBatchHost', 'openingCarrier', 'establishingForwards', 'active'] as const;
export type ShadowPhaseState = (typeof SHADOW_PHASE_STATES)[number];

/**
 * A session host still holds a live shadow of this pod after Redis lost its data (the pod's record was
 * rebuilt from the API server, at generation 0): the record takes that shadow as its own (its generation,
 * host, how far it got) instead of launching another. Sent, with the re-asserted lease's token, until the
 * record shows it.
 */
export interface ShadowHeldEvent extends Report {
  type: 'SHADOW_HELD';
  host: string;
  /** The state the shadow's reports so far put its pod in. */
  phase: ShadowPhaseState;
  batchHost?: string;
  jobId?: string;
  addresses?: string[];
  isolation?: TunnelIsolation;
}
export interface SocketsVanishedEvent extends Report {
  type: 'SOCKETS_VANISHED';
}
export interface JobEndedEvent extends Report {
  type: 'JOB_ENDED';
  /**
   * The job's state as the session last saw it, by its long name (OUT_OF_MEMORY, CANCELLED, COMPLETING…;
   * GONE when squeue no longer lists it); absent when squeue printed no such name.
   */
  jobState?: string;
  /** The job ended without its trap: its socket dir was left on the node, and the session removed it. */
  trapMissed?: true;
  /** Why the job's prelude could not set up the tunnel, in its own words (the job's comment). */
  note?: string;
}
export interface CarrierLostEvent extends Report {
  type: 'CARRIER_LOST';
  reason: string;
}
export interface SessionFailedEvent extends Report {
  type: 'SESSION_FAILED';
  error: PodError;
}

export type SessionReport =
  | ShadowUpEvent
  | BatchHostEvent
  | CarrierOpenEvent
  | ForwardsReadyEvent
  | ShadowHeldEvent
  | SocketsVanishedEvent
  | JobEndedEvent
  | CarrierLostEvent
  | SessionFailedEvent;

/** What a session host stamps on a shadow's report: when, which shadow (generation), its lease's token, its own id. */
type Stamp = 'at' | 'generation' | 'lease' | 'host';
type Unstamped<E> = E extends unknown ? Omit<E, Stamp> : never;
/**
 * What a shadow session reports, in the machine's own words: its session reports as the session host
 * sends them, before it stamps them (SHADOW_HELD is the host's own, not a session's).
 */
export type ShadowPhase = Unstamped<Exclude<SessionReport, ShadowHeldEvent>>;

export type PodEvent =
  | PodUpsertEvent
  | PodDeletedEvent
  | RetryEvent
  | TeardownEvent
  | StepDoneEvent
  | StepFailedEvent
  | DeadlineEvent
  | SessionReport;

export type PodEventType = PodEvent['type'];

export const SESSION_REPORT_TYPES = [
  'SHADOW_UP',
  'BATCH_HOST',
  'CARRIER_OPEN',
  'FORWARDS_READY',
  'SHADOW_HELD',
  'SOCKETS_VANISHED',
  'JOB_ENDED',
  'CARRIER_LOST',
  'SESSION_FAILED',
] as const satisfies readonly SessionReport['type'][];

export const POD_EVENT_TYPES = [
  'POD_UPSERT',
  'POD_DELETED',
  'RETRY',
  'TEARDOWN',
  'STEP_DONE',
  'STEP_FAILED',
  'DEADLINE',
  ...SESSION_REPORT_TYPES,
] as const satisfies readonly PodEventType[];

// ---- effects: named actions whose params the control worker reads from transition()'s action list ----

export interface RunStepParams {
  step: StepName;
  /** The pod's generation when the step was asked for; `launch` starts the shadow of this generation. */
  generation: number;
  /** `launch` only: backoff to wait before starting the shadow (0 for an immediate launch). */
  delayMs?: number;
}
/** Stop the shadow session of `generation` (lease, session job) without touching the node. */
export interface StopShadowParams {
  generation: number;
  reason: string;
}

export const POD_ACTION_TYPES = ['runStep', 'stopShadow'] as const;
export type PodActionType = (typeof POD_ACTION_TYPES)[number];

export type PodAction = { type: 'runStep'; params: RunStepParams } | { type: 'stopShadow'; params: StopShadowParams };
