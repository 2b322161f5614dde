/**
 * Runtime checks for what crosses a boundary into the pod machine: its input, stored snapshots and
 * events arriving as JSON from the events stream. The types in pod-types.ts are the contract; these schemas are
 * checked against them at compile time.
 */
import { z } from 'zod';
import { ERROR_KIND_NAMES } from './error-kinds.js';
import {
  DEADLINE_NAMES,
  type PodAction,
  type PodContext,
  type PodEvent,
  type PodInput,
  SHADOW_PHASE_STATES,
  STEPS,
} from './pod-types.js';

const ms = z.number().int().nonnegative();
const positiveMs = z.number().int().positive();
const text = z.string().min(1);
const annotations = z.record(z.string(), z.string());

const limits = {
  retryLimit: z.number().int().positive(),
  backoffBaseMs: ms,
  backoffMaxMs: ms,
  nodeWaitTimeoutMs: positiveMs,
  phaseTimeoutMs: positiveMs,
};

export const podInputSchema = z
  .object({ uid: text, namespace: text, name: text, annotations: annotations.optional(), ...limits })
  .refine((input) => input.backoffMaxMs >= input.backoffBaseMs, {
    message: 'backoffMaxMs must be at least backoffBaseMs',
    path: ['backoffMaxMs'],
  }) satisfies z.ZodType<PodInput>;

/** One loopback address per Service group; a pod has at most 64 forwards. */
/** The render step's plan: a digest of the site configuration, and the plan as JSON (its shape is render's). */
export const renderedPlan = z.object({
  site: z.string().regex(/^[0-9a-f]{64}$/, 'a SHA-256 digest in hex'),
  plan: z.record(z.string(), z.unknown()),
});
const relayAddresses = z.array(z.string().min(1).max(15)).min(1).max(64);
const isolation = z.object({ relay: z.enum(['job', 'user']), sockets: z.enum(['job', 'user']) });

const errorKind = z.enum(ERROR_KIND_NAMES);
const podError = z.object({ kind: errorKind, message: z.string(), permanent: z.boolean() });

export const podContextSchema = z.object({
  uid: text,
  namespace: text,
  name: text,
  annotations,
  ...limits,
  createdAt: ms,
  generation: ms,
  attempts: ms,
  backoffMs: ms,
  deadline: z.object({ name: z.enum(DEADLINE_NAMES), at: ms, generation: ms }).nullable(),
  host: z.string().nullable(),
  jobId: z.string().nullable(),
  batchHost: z.string().nullable(),
  lastError: z.object({ kind: errorKind, message: z.string(), at: ms }).nullable(),
  forwardsReadyAt: ms.nullable(),
  relayAddresses: relayAddresses.optional(),
  isolation: isolation.optional(),
  podDeleted: z.boolean(),
  teardownReason: z.string().nullable(),
}) satisfies z.ZodType<PodContext>;

/** A Slurm job state's name (JobEndedEvent.jobState): it reaches an Event's message and `status`, so nothing else. */
export const jobStateName = z.string().regex(/^[A-Z][A-Z0-9_]{0,63}$/, 'a Slurm job state (capitals, digits and _)');

const at = { at: ms };
const gen = { generation: ms };
/** A report: the generation it is about and, from a session, its lease's fencing token (the reaper sends none). */
const report = { generation: ms, lease: ms.optional() };
const step = z.enum(STEPS);

export const podEventSchema = z.discriminatedUnion('type', [
  z.object({ type: z.literal('POD_UPSERT'), ...at, namespace: text, name: text, annotations }),
  z.object({ type: z.literal('POD_DELETED'), ...at }),
  z.object({ type: z.literal('RETRY'), ...at }),
  z.object({ type: z.literal('TEARDOWN'), ...at, reason: z.string() }),
  z.object({ type: z.literal('STEP_DONE'), ...at, step, generation: ms.optional(), plan: renderedPlan.optional() }),
  z.object({ type: z.literal('STEP_FAILED'), ...at, step, generation: ms.optional(), error: podError.optional() }),
  z.object({ type: z.literal('DEADLINE'), ...at, name: z.enum(DEADLINE_NAMES), ...gen }),
  z.object({ type: z.literal('SHADOW_UP'), ...at, ...report, host: text }),
  z.object({ type: z.literal('BATCH_HOST'), ...at, ...report, batchHost: text, jobId: text }),
  z.object({ type: z.literal('CARRIER_OPEN'), ...at, ...report }),
  z.object({
    type: z.literal('FORWARDS_READY'),
    ...at,
    ...report,
    addresses: relayAddresses.optional(),
    isolation: isolation.optional(),
  }),
  z.object({
    type: z.literal('SHADOW_HELD'),
    ...at,
    ...report,
    host: text,
    phase: z.enum(SHADOW_PHASE_STATES),
    batchHost: text.optional(),
    jobId: text.optional(),
    addresses: relayAddresses.optional(),
    isolation: isolation.optional(),
  }),
  z.object({ type: z.literal('SOCKETS_VANISHED'), ...at, ...report }),
  z.object({
    type: z.literal('JOB_ENDED'),
    ...at,
    ...report,
    jobState: jobStateName.optional(),
    trapMissed: z.literal(true).optional(),
    note: z.string().min(1).max(500).optional(),
  }),
  z.object({ type: z.literal('CARRIER_LOST'), ...at, ...report, reason: z.string() }),
  z.object({ type: z.literal('SESSION_FAILED'), ...at, ...report, error: podError }),
]) satisfies z.ZodType<PodEvent>;

/** The effects a transition asks for, as stored in a pod's outbox and read back by another worker. */
export const podActionsSchema = z.array(
  z.discriminatedUnion('type', [
    z.object({
      type: z.literal('runStep'),
      params: z.object({ step, ...gen, delayMs: ms.optional() }),
    }),
    z.object({ type: z.literal('stopShadow'), params: z.object({ ...gen, reason: z.string() }) }),
  ]),
) satisfies z.ZodType<PodAction[]>;

/** An event from a queue job, checked; or the first problem found. */
export function parsePodEvent(data: unknown): { ok: true; event: PodEvent } | { ok: false; message: string } {
  const result = podEventSchema.safeParse(data);
  if (result.success) return { ok: true, event: result.data };
  return { ok: false, message: describeIssue(result.error.issues[0]) };
}

/** The stored envelope, read loosely first so a newer version is told apart from a broken snapshot. */
export const persistedEnvelopeSchema = z.object({
  version: z.union([z.number(), z.string()]),
  state: z.string(),
  context: z.unknown(),
});

export type RestoreErrorKind = 'invalid-snapshot' | 'unknown-version' | 'unknown-state' | 'invalid-context';

/** Why a stored snapshot cannot be restored. Returned, never thrown: `status` shows it. */
export class RestoreError extends Error {
  override readonly name = 'RestoreError';
  readonly kind: RestoreErrorKind;
  readonly version: number | string | undefined;
  readonly state: string | undefined;

  constructor(kind: RestoreErrorKind, message: string, found: { version?: number | string; state?: string } = {}) {
    super(message);
    this.kind = kind;
    this.version = found.version;
    this.state = found.state;
  }

  toJSON(): { kind: RestoreErrorKind; message: string; version?: number | string; state?: string } {
    return { kind: this.kind, message: this.message, version: this.version, state: this.state };
  }
}

export function describeIssue(issue: z.core.$ZodIssue | undefined): string {
  if (!issue) return 'invalid';
  const path = issue.path.length > 0 ? issue.path.map(String).join('.') : '(root)';
  return `${path}: ${issue.message}`;
}
