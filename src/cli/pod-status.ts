import { z } from 'zod';
import type { PodReadDeps } from '../pods/fleet-deps.js';
import { podRecordOf } from '../pods/pod-reader.js';
import { jobIds } from '../pods/queues.js';
import type { HistoryRecord, StoredPod } from '../store/snapshot-store.js';

/** One pod as `status --json` prints it (ARCHITECTURE.md, "The command line"). */
export interface PodStatus {
  uid: string;
  namespace: string;
  name: string;
  state: string;
  generation: number | null;
  attempts: number | null;
  host: string | null;
  jobId: string | null;
  batchHost: string | null;
  /** The addresses the job's relay holds, one per Service group in annotation order; null until known. */
  relayAddresses: string[] | null;
  /** What separates the tunnel from other jobs of the site user (the relay's report); null until known. */
  isolation: { relay: 'job' | 'user'; sockets: 'job' | 'user' } | null;
  lastError: { kind: string; message: string; at: number } | null;
  /** The deadline the current state holds (DEADLINE is sent when it falls due). */
  deadline: { name: string; at: number } | null;
  /** When the pod entered its current state (ms), from the history. */
  since: number | null;
  /** Set when the stored snapshot cannot be read by this build (e.g. another machine version). */
  snapshotError: string | null;
  history: HistoryRecord[];
}

/** What the pod's forwards carry now, as its session host last wrote it (forward-traffic.ts). */
const trafficSchema = z.object({
  at: z.number(),
  host: z.string(),
  generation: z.number(),
  rttMs: z.number().optional(),
  forwards: z.array(
    z.object({
      forward: z.string(),
      open: z.number(),
      opened: z.number(),
      failed: z.number(),
      toService: z.number(),
      fromService: z.number(),
    }),
  ),
});
export type PodTraffic = z.infer<typeof trafficSchema>;

export interface PodDetail extends PodStatus {
  lease: { holder: string; generation: number; expiresAt: number } | null;
  /** Connections and bytes per forward while the shadow lives; null before its forwards, or once it ended. */
  traffic: PodTraffic | null;
  /** Effects of the last transition not run yet (the outbox), and since when (ms); null when none. */
  pendingEffects: { effects: unknown; since: number } | null;
  steps: { id: string; name: string; state: string; attempts: number; failedReason?: string }[];
  /** Events of the pod that could not be applied (the dead letters), oldest first. */
  deadEvents: { at: number; type: string; reason: string; delivery: number }[];
}

function eventType(text: string): string {
  try {
    const type = (JSON.parse(text) as { type?: unknown }).type;
    return typeof type === 'string' ? type : '?';
  } catch {
    return '(not JSON)';
  }
}

function statusOf(stored: StoredPod, history: HistoryRecord[]): PodStatus {
  const record = podRecordOf(stored);
  const entered = [...history].reverse().find((h) => h.to === stored.state && h.from !== h.to) ?? history[0];
  const base = {
    uid: stored.uid,
    namespace: stored.namespace,
    name: stored.name,
    since: entered?.at ?? null,
    history,
  };
  if (!record.ok) {
    return {
      ...base,
      state: stored.state,
      generation: null,
      attempts: null,
      host: null,
      jobId: null,
      batchHost: null,
      relayAddresses: null,
      isolation: null,
      lastError: null,
      deadline: null,
      snapshotError: record.error.message,
    };
  }
  const c = record.context;
  return {
    ...base,
    state: record.state,
    generation: c.generation,
    attempts: c.attempts,
    host: c.host,
    jobId: c.jobId,
    batchHost: c.batchHost,
    relayAddresses: c.relayAddresses ?? null,
    isolation: c.isolation ?? null,
    lastError: c.lastError,
    deadline: c.deadline ? { name: c.deadline.name, at: c.deadline.at } : null,
    snapshotError: null,
  };
}

export async function podStatuses(deps: PodReadDeps, historyCount = 20): Promise<PodStatus[]> {
  const uids = await deps.store.list();
  // Two pipelines for the whole fleet, not a round trip per pod.
  const [stored, histories] = await Promise.all([
    deps.store.loadMany(uids),
    deps.store.historyMany(uids, historyCount),
  ]);
  const out: PodStatus[] = [];
  for (const [i, record] of stored.entries()) {
    if (record) out.push(statusOf(record, histories[i] ?? []));
  }
  return out.sort((a, b) => `${a.namespace}/${a.name}`.localeCompare(`${b.namespace}/${b.name}`));
}

export async function podDetail(deps: PodReadDeps, uid: string): Promise<PodDetail | null> {
  const stored = await deps.store.load(uid);
  if (!stored) return null;
  const status = statusOf(stored, await deps.store.history(uid));
  const lease = await deps.leases.get(uid);
  const traffic = await readTraffic(deps, uid);
  const effectsSince = stored.outbox === null ? null : await deps.store.outboxSince(uid);
  const steps: PodDetail['steps'] = [];
  const generation = status.generation ?? 0;
  // validate and render run at generation 0 (and again at the current one after a RETRY).
  const ids = new Set([
    jobIds.step(uid, 'validate', 0),
    jobIds.step(uid, 'render', 0),
    jobIds.step(uid, 'validate', generation),
    jobIds.step(uid, 'render', generation),
    jobIds.step(uid, 'launch', generation),
    jobIds.step(uid, 'teardown', generation),
  ]);
  for (const id of ids) {
    const job = await deps.queues.steps.getJob(id);
    if (!job) continue;
    steps.push({
      id,
      name: job.name,
      state: await job.getState(),
      attempts: job.attemptsMade,
      ...(job.failedReason ? { failedReason: job.failedReason } : {}),
    });
  }
  const session = await deps.queues.sessions.getJob(jobIds.session(uid, generation));
  if (session)
    steps.push({
      id: session.id ?? '',
      name: 'shadow',
      state: await session.getState(),
      attempts: session.attemptsMade,
    });
  const dead = await deps.queues.events.dead(uid);
  return {
    ...status,
    lease: lease ? { holder: lease.holder, generation: lease.generation, expiresAt: lease.expiresAt } : null,
    traffic,
    pendingEffects: stored.outbox === null ? null : { effects: stored.outbox, since: effectsSince ?? 0 },
    steps,
    deadEvents: dead.map((d) => ({
      at: Number(d.id.split('-')[0]),
      type: eventType(d.event),
      reason: d.reason,
      delivery: d.delivery,
    })),
  };
}

/** The traffic its session host wrote; null when there is none, or it cannot be read (a newer host's?). */
async function readTraffic(deps: PodReadDeps, uid: string): Promise<PodTraffic | null> {
  const text = await deps.redis.get(deps.keys.traffic(uid));
  if (text === null) return null;
  try {
    const parsed = trafficSchema.safeParse(JSON.parse(text));
    return parsed.success ? parsed.data : null;
  } catch {
    return null;
  }
}
