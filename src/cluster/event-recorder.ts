import { hostname } from 'node:os';
import { CoreV1Api, type KubeConfig, PatchStrategy, setHeaderOptions } from '@kubernetes/client-node';
import type { Logger } from '../log.js';
import { systemClock } from '../pods/clock.js';
import {
  type EventSpec,
  eventName,
  eventObject,
  type InvolvedPod,
  type KubeEventType,
  repeatPatch,
} from '../render/kube-events.js';
import { describeKubeError, kubeCall, statusCodeOf } from './kube-api.js';

export interface EventRecorderOptions {
  log: Logger;
  /** `source.component` and `reportingComponent`. */
  component?: string;
  /** `source.host` and `reportingInstance` (default: this host's name). */
  instance?: string;
  now?: () => number;
  /** A repeat within this window patches the existing Event (count, lastTimestamp) instead of creating one. */
  aggregateWindowMs?: number;
  /** After this many distinct messages of one reason on one pod within the window, they share one Event. */
  similarLimit?: number;
  /** Spam filter per pod: at most `burst` API calls at once, then one per `refillMs`. */
  burst?: number;
  refillMs?: number;
  /** Events remembered for aggregation (least recently used ones are forgotten first). */
  maxEntries?: number;
}

interface Entry {
  key: string;
  pod: InvolvedPod;
  spec: EventSpec;
  name: string;
  count: number;
  first: number;
  last: number;
  /** Whether the Event exists on the server (under `name`). */
  created: boolean;
  /** Whether the server is behind `count` (a call is due). */
  dirty: boolean;
  queued: boolean;
  pending: Promise<void>;
}

interface Bucket {
  tokens: number;
  at: number;
}

const COMBINED = '(combined from similar events): ';

/**
 * Records core/v1 Events on pods, the way client-go's recorder does: a repeat of the same Event within
 * the aggregation window patches its `count` and `lastTimestamp` instead of creating another object;
 * many different messages of one reason on one pod are combined into one Event; a per-pod token bucket
 * keeps a flapping pod from flooding the API server (repeats it holds back are still counted and go out
 * with the next call). Recording never throws and never blocks its caller: failures are logged.
 */
export class EventRecorder {
  private readonly entries = new Map<string, Entry>();
  private readonly similar = new Map<string, { start: number; messages: Set<string> }>();
  private readonly buckets = new Map<string, Bucket>();
  private readonly inFlight = new Set<Promise<void>>();
  private sequence = 0;
  private readonly component: string;
  private readonly instance: string;
  private readonly now: () => number;
  private readonly window: number;
  private readonly similarLimit: number;
  private readonly burst: number;
  private readonly refillMs: number;
  private readonly maxEntries: number;
  private readonly log: Logger;

  constructor(
    private readonly api: CoreV1Api,
    opts: EventRecorderOptions,
  ) {
    this.log = opts.log;
    this.component = opts.component ?? 'backhaul';
    this.instance = opts.instance ?? hostname();
    this.now = opts.now ?? systemClock;
    this.window = opts.aggregateWindowMs ?? 10 * 60_000;
    this.similarLimit = opts.similarLimit ?? 10;
    this.burst = opts.burst ?? 25;
    this.refillMs = opts.refillMs ?? 5 * 60_000;
    this.maxEntries = opts.maxEntries ?? 4_096;
  }

  static fromKubeConfig(kubeConfig: KubeConfig, opts: EventRecorderOptions): EventRecorder {
    return new EventRecorder(kubeConfig.makeApiClient(CoreV1Api), opts);
  }

  /** Records one occurrence; the API calls happen in the background (see `flush`). */
  record(pod: InvolvedPod, type: KubeEventType, reason: string, message: string): void {
    const now = this.now();
    const similarKey = `${pod.uid}\u0000${type}\u0000${reason}`;
    const combined = this.isCombined(similarKey, message, now);
    const spec: EventSpec = { type, reason, message: combined ? `${COMBINED}${message}` : message };
    // Combined occurrences share one Event whatever their message (the latest is shown).
    const key = combined ? `${similarKey}\u0000${COMBINED}` : `${similarKey}\u0000${message}`;
    let entry = this.entries.get(key);
    if (entry && now - entry.last <= this.window) {
      entry.count += 1;
      entry.last = now;
      entry.spec = spec;
      entry.dirty = true;
      this.entries.delete(key); // keep the map in least-recently-used order
    } else {
      entry = {
        key,
        pod,
        spec,
        name: eventName(pod.name, now, this.sequence++),
        count: 1,
        first: now,
        last: now,
        created: false,
        dirty: true,
        queued: false,
        pending: Promise.resolve(),
      };
    }
    this.entries.set(key, entry);
    this.prune();
    if (!this.take(pod.uid, now)) {
      this.log.debug({ pod: `${pod.namespace}/${pod.name}`, reason: spec.reason }, 'event held back (spam filter)');
      return;
    }
    this.schedule(entry);
  }

  /** Records one of the specs rendered by src/render/kube-events.ts. */
  recordSpec(pod: InvolvedPod, spec: EventSpec): void {
    this.record(pod, spec.type, spec.reason, spec.message);
  }

  /** Waits for the API calls under way. */
  async flush(): Promise<void> {
    while (this.inFlight.size > 0) await Promise.all([...this.inFlight]);
  }

  /** Many different messages for one reason on one pod share one Event once they pass the limit. */
  private isCombined(similarKey: string, message: string, now: number): boolean {
    let group = this.similar.get(similarKey);
    if (!group || now - group.start > this.window) {
      group = { start: now, messages: new Set() };
      this.similar.set(similarKey, group);
    }
    if (group.messages.has(message)) return false;
    if (group.messages.size < this.similarLimit) {
      group.messages.add(message);
      return false;
    }
    return true;
  }

  private take(uid: string, now: number): boolean {
    const bucket = this.buckets.get(uid) ?? { tokens: this.burst, at: now };
    const refilled = Math.min(this.burst, bucket.tokens + (now - bucket.at) / this.refillMs);
    const ok = refilled >= 1;
    this.buckets.set(uid, { tokens: ok ? refilled - 1 : refilled, at: now });
    return ok;
  }

  private schedule(entry: Entry): void {
    if (entry.queued) return; // the call already queued will carry the latest count
    entry.queued = true;
    const run = entry.pending.then(async () => {
      entry.queued = false;
      await this.sync(entry);
    });
    entry.pending = run;
    this.inFlight.add(run);
    void run.finally(() => this.inFlight.delete(run));
  }

  private async sync(entry: Entry): Promise<void> {
    if (!entry.dirty) return;
    entry.dirty = false;
    const { pod } = entry;
    try {
      if (entry.created) {
        try {
          await this.patch(entry);
          return;
        } catch (err) {
          // The Event expired (the API server keeps them about an hour): start a new one.
          if (statusCodeOf(err) !== 404) throw err;
          entry.name = eventName(pod.name, this.now(), this.sequence++);
          entry.created = false;
        }
      }
      try {
        await this.create(entry);
        entry.created = true;
      } catch (err) {
        if (statusCodeOf(err) !== 409) throw err;
        entry.created = true;
        await this.patch(entry);
      }
    } catch (err) {
      entry.dirty = true;
      this.log.warn(
        { pod: `${pod.namespace}/${pod.name}`, reason: entry.spec.reason, err: describeKubeError(err) },
        'could not record a Kubernetes Event',
      );
    }
  }

  private async create(entry: Entry): Promise<void> {
    kubeCall('events.create');
    const body = eventObject(entry.pod, entry.spec, {
      name: entry.name,
      at: new Date(entry.first),
      component: this.component,
      instance: this.instance,
    });
    await this.api.createNamespacedEvent({
      namespace: entry.pod.namespace,
      body: { ...body, count: entry.count, lastTimestamp: new Date(entry.last) },
    });
  }

  private async patch(entry: Entry): Promise<void> {
    kubeCall('events.patch');
    await this.api.patchNamespacedEvent(
      {
        name: entry.name,
        namespace: entry.pod.namespace,
        body: repeatPatch(entry.count, new Date(entry.last), entry.spec.message),
      },
      setHeaderOptions('Content-Type', PatchStrategy.MergePatch),
    );
  }

  private prune(): void {
    while (this.entries.size > this.maxEntries) {
      const oldest = this.entries.keys().next();
      if (oldest.done) break;
      this.entries.delete(oldest.value);
    }
    if (this.similar.size > this.maxEntries) {
      const now = this.now();
      for (const [key, group] of this.similar) if (now - group.start > this.window) this.similar.delete(key);
    }
    if (this.buckets.size > this.maxEntries) {
      const now = this.now();
      for (const [uid, bucket] of this.buckets) {
        if (now - bucket.at > this.refillMs * this.burst) this.buckets.delete(uid);
      }
    }
  }
}
