/**
 * Pod snapshots in Redis with compare-and-set (ARCHITECTURE.md, "Redis keys and queues"): `<prefix>pod:<uid>` holds the snapshot
 * and a `gen` counter; a write names the gen it read and fails if another writer came first, so the
 * control worker's load → transition → write loop never loses an update. Each write also updates the
 * indexes and appends the transition to the pod's capped history stream, in the same script.
 */
import type { Redis } from 'ioredis';
import { RedisKeys } from './keys.js';
import { script } from './scripts.js';

/** A pod's record as stored. */
export interface StoredPod {
  uid: string;
  /** The snapshot, parsed from JSON (the raw text when it is not JSON: restore will say why). */
  snapshot: unknown;
  /** Machine version the snapshot was written by, as stored. */
  version: string;
  /** Compare-and-set counter: 1 at creation, +1 per write. */
  gen: number;
  state: string;
  /** Redis clock, ms. */
  updatedAt: number;
  namespace: string;
  name: string;
  /** Effects written with this gen and not yet cleared (parsed JSON), or null. */
  outbox: unknown;
}

/** What a writer stores. */
export interface PodWrite {
  snapshot: unknown;
  version: string | number;
  state: string;
  namespace: string;
  name: string;
  /** The transition, appended to the history in the same step. */
  history?: HistoryEntry | null;
  /** When the deadline the state holds falls due (ms), indexed in the same step; none when absent. */
  deadlineAt?: number | null;
  /** The effects the transition asked for, kept in the record until cleared (an outbox); none when absent or empty. */
  effects?: readonly unknown[] | null;
  /** The session plan the transition's render made (JSON), kept beside the snapshot for launch to read. */
  plan?: string | null;
  /** Look at the pod again this many ms after the write (the review index); never when absent or null. */
  reviewAfterMs?: number | null;
  /**
   * Creation only: the time of the event creating the record. A pod whose history ends in `done` at or
   * after it is not created again (events of one pod are not ordered: the event predates the pod's end).
   */
  createdBy?: number;
}

export type CreateResult = 'created' | 'exists' | 'finished';

export interface HistoryEntry {
  /** Time of the event (ms). */
  at: number;
  event: string;
  from: string;
  to: string;
  generation?: number;
  /** Free text, e.g. the error or the effects asked for. */
  detail?: string;
}

export interface HistoryRecord extends HistoryEntry {
  /** Stream id (Redis clock). */
  id: string;
}

export type CasResult =
  | { ok: true; gen: number }
  | { ok: false; reason: 'conflict'; gen: number }
  | { ok: false; reason: 'missing' };

export type RemoveResult = 'removed' | 'absent' | 'conflict';

/** What an applier decides from the current record: maybe a write, and a value for the caller. */
export interface ApplyDecision<T> {
  write?: PodWrite;
  value: T;
}

export interface ApplyOutcome<T> {
  value: T;
  written: boolean;
  /** Nothing written because the pod finished after the creating event (PodWrite.createdBy). */
  finished?: true;
  /** The record's gen after the call (null: no record). */
  gen: number | null;
  /** Loads made; conflicts = attempts − 1 when it was finally written. */
  attempts: number;
  conflicts: number;
}

export interface SnapshotStoreOptions {
  /** Called on each compare-and-set conflict (for metrics). */
  onConflict?: () => void;
  keys?: RedisKeys;
  /** Approximate cap of each history stream (XADD MAXLEN ~). */
  historyMaxLen?: number;
  /** Give up after this many conflicting attempts in applyWithRetry. */
  maxApplyAttempts?: number;
}

export class CasRetriesExhaustedError extends Error {
  override readonly name = 'CasRetriesExhaustedError';
  constructor(
    readonly uid: string,
    readonly attempts: number,
  ) {
    super(`pod ${uid}: still conflicting after ${attempts} compare-and-set attempts`);
  }
}

export class SnapshotStore {
  readonly keys: RedisKeys;
  readonly historyMaxLen: number;
  readonly maxApplyAttempts: number;
  private readonly onConflict: (() => void) | undefined;

  constructor(
    private readonly redis: Redis,
    opts: SnapshotStoreOptions = {},
  ) {
    this.keys = opts.keys ?? new RedisKeys();
    this.historyMaxLen = opts.historyMaxLen ?? 1_000;
    this.maxApplyAttempts = opts.maxApplyAttempts ?? 200;
    this.onConflict = opts.onConflict;
  }

  async load(uid: string): Promise<StoredPod | null> {
    return parseStored(uid, await this.redis.hmget(this.keys.pod(uid), ...RECORD_FIELDS));
  }

  /** The session plan stored beside the pod's snapshot (JSON, as written), or null. */
  async plan(uid: string): Promise<string | null> {
    return this.redis.hget(this.keys.pod(uid), 'plan');
  }

  async loadMany(uids: readonly string[]): Promise<(StoredPod | null)[]> {
    if (uids.length === 0) return [];
    const pipeline = this.redis.pipeline();
    for (const uid of uids) pipeline.hmget(this.keys.pod(uid), ...RECORD_FIELDS);
    const replies = (await pipeline.exec()) ?? [];
    return uids.map((uid, i) => {
      const [err, hash] = replies[i] ?? [null, {}];
      if (err) throw err;
      return parseStored(uid, hash as (string | null)[]);
    });
  }

  /** Stores a pod's first record; nothing is written when it has one, or it finished after `createdBy`. */
  async create(uid: string, write: PodWrite): Promise<CreateResult> {
    const reply = await script('pod-create').run(this.redis, this.casKeys(uid), [
      uid,
      ...recordArgs(write),
      write.createdBy === undefined ? '' : String(write.createdBy),
      reviewArg(write),
      this.historyMaxLen,
      ...historyFields(write.history),
    ]);
    return reply === 1 ? 'created' : reply === -1 ? 'finished' : 'exists';
  }

  /** Writes only if the stored gen is still `expectedGen`. */
  async compareAndSet(uid: string, expectedGen: number, write: PodWrite): Promise<CasResult> {
    const reply = (await script('pod-cas').run(this.redis, this.casKeys(uid), [
      uid,
      expectedGen,
      ...recordArgs(write),
      reviewArg(write),
      this.historyMaxLen,
      write.plan ?? '',
      ...historyFields(write.history),
    ])) as [number, number];
    const [status, gen] = reply;
    if (status === 1) return { ok: true, gen };
    if (status === 0) return { ok: false, reason: 'conflict', gen };
    return { ok: false, reason: 'missing' };
  }

  /**
   * Load → decide → compare-and-set, again on each conflict. `decide` sees the current record (null
   * when there is none: returning a write then creates it) and may run several times: keep it free of
   * side effects; its value from the attempt that was written (or that wrote nothing) is returned.
   */
  async applyWithRetry<T>(
    uid: string,
    decide: (current: StoredPod | null) => ApplyDecision<T> | Promise<ApplyDecision<T>>,
  ): Promise<ApplyOutcome<T>> {
    for (let attempts = 1; attempts <= this.maxApplyAttempts; attempts += 1) {
      const current = await this.load(uid);
      const { write, value } = await decide(current);
      if (!write) return { value, written: false, gen: current?.gen ?? null, attempts, conflicts: attempts - 1 };
      if (current === null) {
        const created = await this.create(uid, write);
        if (created === 'created') return { value, written: true, gen: 1, attempts, conflicts: attempts - 1 };
        if (created === 'finished') {
          return { value, written: false, finished: true, gen: null, attempts, conflicts: attempts - 1 };
        }
      } else {
        const result = await this.compareAndSet(uid, current.gen, write);
        if (result.ok) return { value, written: true, gen: result.gen, attempts, conflicts: attempts - 1 };
      }
      this.onConflict?.();
      // Someone else wrote first: back off a little once the pod is contended, then read again.
      if (attempts > 2) await sleep(Math.random() * Math.min(20, attempts));
    }
    throw new CasRetriesExhaustedError(uid, this.maxApplyAttempts);
  }

  /**
   * Forgets a pod: record, index entries and lease go; the history stays for `historyTtlSeconds`.
   * With `expectedGen`, only if nobody wrote since it was read.
   */
  async remove(uid: string, historyTtlSeconds: number, expectedGen?: number): Promise<RemoveResult> {
    const reply = await script('pod-remove').run(
      this.redis,
      [...this.casKeys(uid), this.keys.lease(uid), this.keys.leases()],
      [uid, Math.max(1, Math.ceil(historyTtlSeconds)), expectedGen === undefined ? '' : expectedGen],
    );
    return reply === 1 ? 'removed' : reply === 0 ? 'absent' : 'conflict';
  }

  /**
   * Claims up to `limit` pods whose deadline is due at `now`: each is due again `claimMs` later unless
   * a new state is stored first (which re-indexes or withdraws its deadline).
   */
  async claimDueDeadlines(now: number, claimMs: number, limit = 100): Promise<string[]> {
    return (await script('deadlines-claim').run(
      this.redis,
      [this.keys.deadlines()],
      [now, claimMs, limit],
    )) as string[];
  }

  /** Up to `limit` pods due for a look at `now` (ms), by the review index alone. */
  dueForReview(now: number, limit: number): Promise<string[]> {
    return this.redis.zrangebyscore(this.keys.review(), '-inf', String(now), 'LIMIT', 0, limit);
  }

  /**
   * When to look at the pod again (ms; null: not until a new state says so). Only while the pod is still
   * at gen `gen`: a state stored meanwhile set its own time, which stands; a forgotten pod gets none.
   */
  async setReview(uid: string, gen: number, at: number | null): Promise<boolean> {
    const reply = await script('review-set').run(
      this.redis,
      [this.keys.pod(uid), this.keys.review()],
      [uid, gen, at === null ? '' : Math.round(at)],
    );
    return reply === 1;
  }

  /** The effects written with gen `gen` have run: clears them unless a later write replaced them. */
  async clearOutbox(uid: string, gen: number): Promise<boolean> {
    const reply = await script('outbox-clear').run(this.redis, [this.keys.pod(uid), this.keys.outbox()], [uid, gen]);
    return reply === 1;
  }

  /** When the pod's uncleared effects were written (Redis clock, ms), or null when it has none. */
  async outboxSince(uid: string): Promise<number | null> {
    const score = await this.redis.zscore(this.keys.outbox(), uid);
    return score === null ? null : Number(score);
  }

  /** Claims up to `limit` pods whose effects have waited more than `ageMs` (their writer died); each for `ageMs`. */
  async claimLeftEffects(ageMs: number, limit = 100): Promise<string[]> {
    return (await script('outbox-claim').run(this.redis, [this.keys.outbox()], [ageMs, limit])) as string[];
  }

  /** How many pods are in each state (one pipeline over the index: for metrics). */
  async countByState(): Promise<Record<string, number>> {
    const uids = await this.list();
    if (uids.length === 0) return {};
    const pipeline = this.redis.pipeline();
    for (const uid of uids) pipeline.hget(this.keys.pod(uid), 'state');
    const counts: Record<string, number> = {};
    for (const [err, state] of (await pipeline.exec()) ?? []) {
      if (err || typeof state !== 'string') continue;
      counts[state] = (counts[state] ?? 0) + 1;
    }
    return counts;
  }

  /** Every known pod's uid, least recently updated first. */
  async list(): Promise<string[]> {
    return this.redis.zrange(this.keys.pods(), '0', '-1');
  }

  async uidByName(namespace: string, name: string): Promise<string | null> {
    return this.redis.hget(this.keys.podsByName(), `${namespace}/${name}`);
  }

  /**
   * Every known pod named namespace/name (a pod deleted and created again, or two submitted without a
   * UID, share it): read from the records, since the by-name index keeps only the latest.
   */
  async podsByName(namespace: string, name: string): Promise<StoredPod[]> {
    const pods = await this.loadMany(await this.list());
    return pods.filter((p): p is StoredPod => p !== null && p.namespace === namespace && p.name === name);
  }

  /** The pod's history, oldest first (the last `count` entries when given). */
  /** Whether the pod has a history (kept for HistoryTTL after its record was forgotten). */
  async hasHistory(uid: string): Promise<boolean> {
    return (await this.redis.exists(this.keys.history(uid))) === 1;
  }

  async history(uid: string, count?: number): Promise<HistoryRecord[]> {
    const key = this.keys.history(uid);
    const entries =
      count === undefined
        ? await this.redis.xrange(key, '-', '+')
        : (await this.redis.xrevrange(key, '+', '-', 'COUNT', String(count))).reverse();
    return entries.map(([id, fields]) => parseHistory(id, fields));
  }

  /** The last `count` history entries of each pod, oldest first, in one pipeline (for `status` of a fleet). */
  async historyMany(uids: readonly string[], count: number): Promise<HistoryRecord[][]> {
    if (uids.length === 0) return [];
    const pipeline = this.redis.pipeline();
    for (const uid of uids) pipeline.xrevrange(this.keys.history(uid), '+', '-', 'COUNT', String(count));
    const replies = (await pipeline.exec()) ?? [];
    return uids.map((_, i) => {
      const [err, entries] = replies[i] ?? [null, []];
      if (err) throw err;
      return (entries as [string, string[]][]).map(([id, fields]) => parseHistory(id, fields)).reverse();
    });
  }

  private podKeys(uid: string): string[] {
    return [this.keys.pod(uid), this.keys.pods(), this.keys.podsByName(), this.keys.history(uid)];
  }

  private casKeys(uid: string): string[] {
    return [...this.podKeys(uid), this.keys.deadlines(), this.keys.outbox(), this.keys.review()];
  }
}

/** What a load reads of a pod's hash (not its plan: only a launch needs that). */
const RECORD_FIELDS = ['gen', 'snapshot', 'version', 'state', 'updatedAt', 'namespace', 'name', 'outbox'] as const;

function parseStored(uid: string, values: readonly (string | null)[]): StoredPod | null {
  const hash: Partial<Record<(typeof RECORD_FIELDS)[number], string>> = {};
  RECORD_FIELDS.forEach((field, i) => {
    const value = values[i];
    if (value !== null && value !== undefined) hash[field] = value;
  });
  if (hash.gen === undefined) return null;
  const raw = hash.snapshot ?? '';
  let snapshot: unknown;
  try {
    snapshot = JSON.parse(raw);
  } catch {
    snapshot = raw;
  }
  return {
    uid,
    snapshot,
    version: hash.version ?? '',
    gen: Number(hash.gen),
    state: hash.state ?? '',
    updatedAt: Number(hash.updatedAt ?? 0),
    namespace: hash.namespace ?? '',
    name: hash.name ?? '',
    outbox: parseJson(hash.outbox),
  };
}

function parseJson(raw: string | undefined): unknown {
  if (raw === undefined) return null;
  try {
    return JSON.parse(raw);
  } catch {
    return null;
  }
}

function effectsArg(write: PodWrite): string {
  return write.effects && write.effects.length > 0 ? JSON.stringify(write.effects) : '';
}

function reviewArg(write: PodWrite): string {
  return write.reviewAfterMs === undefined || write.reviewAfterMs === null
    ? ''
    : String(Math.max(0, Math.round(write.reviewAfterMs)));
}

/** The record's fields as pod-create.lua and pod-cas.lua take them, in the same places of both. */
function recordArgs(write: PodWrite): string[] {
  return [
    JSON.stringify(write.snapshot),
    String(write.version),
    write.state,
    write.namespace,
    write.name,
    deadlineArg(write),
    effectsArg(write),
  ];
}

function deadlineArg(write: PodWrite): string {
  return write.deadlineAt === undefined || write.deadlineAt === null ? '' : String(Math.round(write.deadlineAt));
}

function historyFields(entry: HistoryEntry | null | undefined): string[] {
  if (!entry) return [];
  const fields: string[] = [];
  for (const [field, value] of Object.entries(entry)) {
    if (value !== undefined) fields.push(field, String(value));
  }
  return fields;
}

function parseHistory(id: string, fields: string[]): HistoryRecord {
  const map = new Map<string, string>();
  for (let i = 0; i + 1 < fields.length; i += 2) map.set(fields[i] ?? '', fields[i + 1] ?? '');
  const generation = map.get('generation');
  const detail = map.get('detail');
  return {
    id,
    at: Number(map.get('at') ?? 0),
    event: map.get('event') ?? '',
    from: map.get('from') ?? '',
    to: map.get('to') ?? '',
    ...(generation === undefined ? {} : { generation: Number(generation) }),
    ...(detail === undefined ? {} : { detail }),
  };
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}
