import { setTimeout as sleep } from 'node:timers/promises';
import { CoreV1Api, type KubeConfig, type V1PodList, Watch } from '@kubernetes/client-node';
import type { Logger } from '../log.js';
import { type PodEvent, restorePod } from '../machines/pod-machine.js';
import { ANNOTATION } from '../spec/annotations.js';
import { CLUSTER_VERDICT, type ClusterVerdict, clusterChecksOn, formatVerdict } from '../spec/cluster-verdict.js';
import type { KubernetesConfig } from '../spec/site-config.js';
import type { StoredPod } from '../store/snapshot-store.js';
import type { FleetDeps } from '../workers/fleet-deps.js';
import { ClusterGate } from './cluster-gate.js';
import type { EventRecorder } from './event-recorder.js';
import { describeKubeError, kubeCall, statusCodeOf } from './kube-api.js';
import {
  classifyPod,
  type PodScope,
  type PodVerdict,
  podFingerprint,
  podFromObject,
  sameAnnotations,
  type WatchedPod,
} from './pod-info.js';

export interface PodWatcherOptions {
  /** Level-triggered reconcile period (default Backhaul.Kubernetes.ResyncInterval). */
  resyncMs?: number;
  /** Reconnect backoff: doubles from base to max, with jitter. */
  backoffBaseMs?: number;
  backoffMaxMs?: number;
  /** Asked of the server for each watch (default a random 5–10 min, as client-go does). */
  watchTimeoutSeconds?: number;
  /** Page size of lists. */
  listLimit?: number;
  /** How long the cluster gate keeps namespaces and NetworkPolicies it read (default CLUSTER_CACHE_MS). */
  clusterCacheMs?: number;
  /** Warning Events (a pod whose pre-exec lacks the prelude); none when undefined. */
  recorder?: EventRecorder;
}

type GoneEvent = Extract<PodVerdict, { kind: 'gone' }>;

/** One list+watch: all pods of a scope, or those of one virtual node (fieldSelector spec.nodeName). */
class PodStream {
  /** Live pods of this stream, by uid, as of the last event received. */
  cache = new Map<string, WatchedPod>();
  resourceVersion = '';
  synced = false;
  controller: AbortController | undefined;
  constructor(readonly nodeName: string | undefined) {}

  get label(): string {
    return this.nodeName ? `node ${this.nodeName}` : 'all nodes';
  }
}

/** Deduplication ids of the events the watcher sends (no ':' — ARCHITECTURE.md §3.8). */
export const watchEventIds = {
  upsert: (uid: string, resourceVersion: string) => `${uid}-upsert-${resourceVersion || 'x'}`,
  gone: (uid: string, event: GoneEvent) => `${uid}-${event.event === 'POD_DELETED' ? 'deleted' : 'teardown'}`,
};

/**
 * The watch role (ARCHITECTURE.md §3.9): keeps one machine per live pod that asks for reverse forwards on a
 * virtual node, and ends the machines of pods that are gone.
 *
 * Edge- and level-triggered: watch events are turned into POD_UPSERT / POD_DELETED as they come, and on
 * start (once every stream has listed) and then every ResyncInterval, the pods seen are compared with
 * the machines stored in Redis. Watches resume from the last resourceVersion (bookmarks keep it fresh);
 * a 410 Gone relists and diffs the list against what was known, so nothing is missed; errors reconnect
 * with backoff. Nothing is sent twice: a pod whose relevant fields did not change sends nothing (a
 * memo, then the stored machine), and events carry BullMQ deduplication ids.
 */
export class PodWatcher {
  private readonly core: CoreV1Api;
  private readonly watch: Watch;
  private readonly streams: PodStream[];
  private readonly scope: PodScope;
  private readonly log: Logger;
  /** uid → fingerprint sent (live) or 'gone'. */
  private readonly sent = new Map<string, string>();
  private readonly warned = new Set<string>();
  private chain: Promise<void> = Promise.resolve();
  private stopped = false;
  private readonly loops: Promise<void>[] = [];
  private resyncTimer: NodeJS.Timeout | undefined;
  private reconciles = 0;
  private readonly resyncMs: number;
  private readonly backoffBaseMs: number;
  private readonly backoffMaxMs: number;
  /** Namespace label and NetworkPolicies (Backhaul.Kubernetes); none when the site turns both off. */
  private readonly gate: ClusterGate | undefined;
  /** uid → the refusal last recorded as an Event (each refusal is recorded once). */
  private readonly refusals = new Map<string, string>();

  constructor(
    private readonly deps: FleetDeps,
    kubeConfig: KubeConfig,
    private readonly cfg: KubernetesConfig,
    private readonly opts: PodWatcherOptions = {},
  ) {
    this.core = kubeConfig.makeApiClient(CoreV1Api);
    this.watch = new Watch(kubeConfig);
    this.scope = { virtualNodes: cfg.VirtualNodes };
    this.streams =
      cfg.VirtualNodes.length > 0 ? cfg.VirtualNodes.map((n) => new PodStream(n)) : [new PodStream(undefined)];
    this.log = deps.log.child({ role: 'watch' });
    this.resyncMs = opts.resyncMs ?? cfg.ResyncInterval;
    this.backoffBaseMs = opts.backoffBaseMs ?? 500;
    this.backoffMaxMs = opts.backoffMaxMs ?? 30_000;
    this.gate = clusterChecksOn(cfg)
      ? new ClusterGate(kubeConfig, deps.config, deps.now, opts.clusterCacheMs)
      : undefined;
  }

  /** Starts the streams; resolves at once (see `synced` and `whenSynced`). */
  start(): void {
    if (this.cfg.VirtualNodes.length === 0) {
      this.log.warn(
        'Backhaul.Kubernetes.VirtualNodes is empty: pods with reverse annotations on any node get tunnels; list the interLink virtual nodes to narrow it',
      );
    }
    this.log.info(
      {
        namespace: this.cfg.Namespace ?? '(all)',
        nodes: this.cfg.VirtualNodes,
        podSelector: this.cfg.PodSelector,
      },
      'pod watcher starting',
    );
    for (const stream of this.streams) this.loops.push(this.run(stream));
    this.resyncTimer = setInterval(() => {
      if (this.synced) this.enqueue(() => this.reconcile());
    }, this.resyncMs);
    this.resyncTimer.unref();
  }

  /** Every stream has listed at least once (readiness). */
  get synced(): boolean {
    return this.streams.every((s) => s.synced);
  }

  /** How many level-triggered reconciles have completed. */
  get reconcileCount(): number {
    return this.reconciles;
  }

  /** Resolves once every stream has listed and the first reconcile is done. */
  async whenSynced(timeoutMs = 60_000): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    while (this.reconciles === 0) {
      if (Date.now() > deadline) throw new Error('the pod watcher did not sync in time');
      await sleep(50);
    }
  }

  /** Waits until every event received so far has been handled. */
  async idle(): Promise<void> {
    let current: Promise<void>;
    do {
      current = this.chain;
      await current;
    } while (current !== this.chain);
  }

  /** Runs a reconcile now (after the events at hand). */
  resync(): Promise<void> {
    return this.enqueue(() => this.reconcile());
  }

  async stop(): Promise<void> {
    this.stopped = true;
    if (this.resyncTimer) clearInterval(this.resyncTimer);
    for (const stream of this.streams) stream.controller?.abort();
    // A list under way cannot be aborted; do not let an unreachable API server hold up the shutdown.
    await Promise.race([Promise.all(this.loops), sleep(5_000)]);
    await this.idle();
    this.log.info('pod watcher stopped');
  }

  // ---- list + watch ----

  private async run(stream: PodStream): Promise<void> {
    let failures = 0;
    while (!this.stopped) {
      try {
        let listed = false;
        if (!stream.resourceVersion) {
          await this.relist(stream);
          listed = true;
          if (!stream.synced) {
            stream.synced = true;
            if (this.synced) this.enqueue(() => this.reconcile());
          }
        }
        if (this.stopped) break;
        const watchStarted = Date.now();
        const outcome = await this.watchOnce(stream);
        if (outcome.kind === 'expired') {
          this.log.info({ stream: stream.label, rv: stream.resourceVersion }, 'watch expired (410 Gone): relisting');
          stream.resourceVersion = '';
          // Expired at once after a fresh list: something is wrong with the server; do not spin.
          failures = listed && Date.now() - watchStarted < 1_000 ? failures + 1 : 0;
          if (failures > 0) await this.backoff(failures, stream, 'watch expired right after a list');
          continue;
        }
        if (outcome.kind === 'error') throw outcome.error;
        // A normal close (server timeout, or a connection dropped after events flowed): resume at once,
        // unless it ended without ever getting going.
        failures = outcome.received > 0 || outcome.durationMs > 10_000 ? 0 : failures + 1;
        if (failures > 0) await this.backoff(failures, stream, 'watch closed at once');
      } catch (err) {
        if (this.stopped) break;
        failures += 1;
        await this.backoff(failures, stream, describeKubeError(err));
      }
    }
  }

  private async backoff(failures: number, stream: PodStream, why: string): Promise<void> {
    const ceiling = Math.min(this.backoffMaxMs, this.backoffBaseMs * 2 ** Math.min(failures - 1, 20));
    const delay = Math.round(ceiling / 2 + (Math.random() * ceiling) / 2);
    this.log.warn({ stream: stream.label, failures, delayMs: delay, err: why }, 'pod watch interrupted: reconnecting');
    const until = Date.now() + delay;
    while (!this.stopped && Date.now() < until) await sleep(Math.min(100, until - Date.now()));
  }

  private listPage(stream: PodStream, cont: string | undefined): Promise<V1PodList> {
    kubeCall('pods.list');
    const common = {
      ...(stream.nodeName ? { fieldSelector: `spec.nodeName=${stream.nodeName}` } : {}),
      ...(this.cfg.PodSelector ? { labelSelector: this.cfg.PodSelector } : {}),
      limit: this.opts.listLimit ?? 500,
      ...(cont ? { _continue: cont } : {}),
    };
    return this.cfg.Namespace
      ? this.core.listNamespacedPod({ namespace: this.cfg.Namespace, ...common })
      : this.core.listPodForAllNamespaces(common);
  }

  /** A full list, diffed against what the stream knew: what vanished meanwhile is gone. */
  private async relist(stream: PodStream): Promise<void> {
    const items: unknown[] = [];
    let listRv = '';
    let cont: string | undefined;
    do {
      let page: V1PodList;
      try {
        page = await this.listPage(stream, cont);
      } catch (err) {
        // An expired continue token: start the list again.
        if (cont && statusCodeOf(err) === 410) {
          items.length = 0;
          cont = undefined;
          continue;
        }
        throw err;
      }
      if (!cont) listRv = page.metadata?.resourceVersion ?? '';
      items.push(...page.items);
      cont = page.metadata?._continue || undefined;
    } while (cont && !this.stopped);

    const before = stream.cache;
    const after = new Map<string, WatchedPod>();
    const seen = new Map<string, { pod: WatchedPod; verdict: PodVerdict }>();
    for (const item of items) {
      const pod = podFromObject(item);
      if (!pod) continue;
      const verdict = classifyPod(pod, this.scope);
      seen.set(pod.uid, { pod, verdict });
      if (verdict.kind === 'live') after.set(pod.uid, pod);
    }
    stream.cache = after;
    stream.resourceVersion = listRv;
    this.log.info({ stream: stream.label, rv: listRv, pods: items.length, live: after.size }, 'pods listed');
    for (const [uid, old] of before) {
      if (after.has(uid)) continue;
      const now = seen.get(uid);
      const gone: GoneEvent =
        now === undefined
          ? { kind: 'gone', event: 'POD_DELETED' }
          : now.verdict.kind === 'gone'
            ? now.verdict
            : { kind: 'gone', event: 'TEARDOWN', reason: 'reverse-annotations-removed' };
      this.enqueue(() => this.onGone(uid, old, gone));
    }
    for (const { pod, verdict } of seen.values()) {
      if (verdict.kind === 'live') this.enqueue(() => this.onLive(pod));
      else if (verdict.kind === 'gone' && !before.has(pod.uid)) this.enqueue(() => this.onGone(pod.uid, pod, verdict));
    }
  }

  private watchOnce(
    stream: PodStream,
  ): Promise<
    { kind: 'closed'; received: number; durationMs: number } | { kind: 'expired' } | { kind: 'error'; error: unknown }
  > {
    kubeCall('pods.watch');
    const path = this.cfg.Namespace ? `/api/v1/namespaces/${this.cfg.Namespace}/pods` : '/api/v1/pods';
    const timeoutSeconds = this.opts.watchTimeoutSeconds ?? 300 + Math.floor(Math.random() * 300);
    const params: Record<string, string | number | boolean | undefined> = {
      allowWatchBookmarks: true,
      resourceVersion: stream.resourceVersion,
      timeoutSeconds,
      fieldSelector: stream.nodeName ? `spec.nodeName=${stream.nodeName}` : undefined,
      labelSelector: this.cfg.PodSelector,
    };
    const started = Date.now();
    let received = 0;
    let expired = false;
    let failure: unknown;
    return new Promise((resolve) => {
      let watchdog: NodeJS.Timeout | undefined;
      const controllerRef: { current: AbortController | undefined } = { current: undefined };
      // The server ends the watch after timeoutSeconds and sends bookmarks meanwhile: silence well past
      // that means a dead connection the socket has not noticed.
      const arm = () => {
        if (watchdog) clearTimeout(watchdog);
        watchdog = setTimeout(
          () => {
            failure = new Error(`no data on the watch for ${timeoutSeconds + 30} s`);
            controllerRef.current?.abort();
          },
          (timeoutSeconds + 30) * 1000,
        );
        watchdog.unref();
      };
      let settled = false;
      const finish = (err: unknown) => {
        if (settled) return;
        settled = true;
        if (watchdog) clearTimeout(watchdog);
        stream.controller = undefined;
        if (expired) resolve({ kind: 'expired' });
        else if (statusCodeOf(err) === 410) resolve({ kind: 'expired' });
        else if (failure ?? (err && !isAbort(err))) resolve({ kind: 'error', error: failure ?? err });
        else resolve({ kind: 'closed', received, durationMs: Date.now() - started });
      };
      arm();
      this.watch
        .watch(
          path,
          params,
          (type, object) => {
            if (settled) return;
            arm();
            received += 1;
            const outcome = this.onWatchEvent(stream, type, object);
            if (outcome === 'expired') {
              expired = true;
              controllerRef.current?.abort();
              finish(null);
            } else if (outcome instanceof Error) {
              failure = outcome;
              controllerRef.current?.abort();
              finish(outcome);
            }
          },
          finish,
        )
        .then((controller) => {
          controllerRef.current = controller;
          stream.controller = controller;
          if (this.stopped || settled) controller.abort();
        }, finish);
    });
  }

  /** Applies one watch event to the stream's cache (synchronously) and queues what it means. */
  private onWatchEvent(stream: PodStream, type: string, object: unknown): 'ok' | 'expired' | Error {
    const rv = (object as { metadata?: { resourceVersion?: unknown } } | null)?.metadata?.resourceVersion;
    switch (type) {
      case 'BOOKMARK':
        if (typeof rv === 'string' && rv) stream.resourceVersion = rv;
        return 'ok';
      case 'ERROR': {
        const status = object as { code?: number; message?: string; reason?: string } | null;
        if (status?.code === 410 || status?.reason === 'Expired' || status?.reason === 'Gone') return 'expired';
        return new Error(`watch error ${status?.code ?? '?'}: ${status?.message ?? 'unknown'}`);
      }
      case 'ADDED':
      case 'MODIFIED':
      case 'DELETED': {
        if (typeof rv === 'string' && rv) stream.resourceVersion = rv;
        const pod = podFromObject(object);
        if (!pod) return 'ok';
        const known = stream.cache.get(pod.uid);
        if (type === 'DELETED') {
          stream.cache.delete(pod.uid);
          if (known || classifyPod(pod, this.scope).kind !== 'other') {
            this.enqueue(() => this.onGone(pod.uid, pod, { kind: 'gone', event: 'POD_DELETED' }));
          }
          return 'ok';
        }
        const verdict = classifyPod(pod, this.scope);
        if (verdict.kind === 'live') {
          stream.cache.set(pod.uid, pod);
          this.enqueue(() => this.onLive(pod));
        } else if (verdict.kind === 'gone') {
          stream.cache.delete(pod.uid);
          this.enqueue(() => this.onGone(pod.uid, pod, verdict));
        } else if (known) {
          // Still there, but no longer asks for reverse forwards.
          stream.cache.delete(pod.uid);
          this.enqueue(() =>
            this.onGone(pod.uid, pod, { kind: 'gone', event: 'TEARDOWN', reason: 'reverse-annotations-removed' }),
          );
        }
        return 'ok';
      }
      default:
        return 'ok';
    }
  }

  // ---- what a pod means for its machine ----

  private enqueue(work: () => Promise<void>): Promise<void> {
    const next = this.chain.then(work).catch((err) => {
      this.log.error({ err }, 'pod watcher could not update a machine (the next resync repairs it)');
    });
    this.chain = next;
    return next;
  }

  /** A live pod: make sure its machine exists and knows its current annotations and cluster verdict. */
  private async onLive(watched: WatchedPod): Promise<void> {
    const { pod, verdict } = await this.withVerdict(watched);
    const fingerprint = podFingerprint(pod);
    if (this.sent.get(pod.uid) === fingerprint) return;
    const stored = await this.deps.store.load(pod.uid);
    if (!(await this.upToDate(pod, stored))) await this.sendUpsert(pod);
    if (verdict && !verdict.ok) await this.refuse(pod, verdict.why, stored);
    this.sent.set(pod.uid, fingerprint);
  }

  /**
   * The pod as its machine is told of it: with the cluster gate's verdict among its annotations (a key
   * no pod can set: only RELEVANT_ANNOTATIONS are kept from the pod). The validate step requires it.
   */
  private async withVerdict(pod: WatchedPod): Promise<{ pod: WatchedPod; verdict?: ClusterVerdict }> {
    if (!this.gate) return { pod };
    const verdict = await this.gate.verdict(pod);
    return { pod: { ...pod, annotations: { ...pod.annotations, [CLUSTER_VERDICT]: formatVerdict(verdict) } }, verdict };
  }

  /**
   * A pod the cluster refuses: a Warning Event on it (once per refusal), and a machine that already
   * serves it (the namespace lost its label, a NetworkPolicy appeared) is torn down. A new machine fails
   * in its validate step with the same words.
   */
  private async refuse(pod: WatchedPod, why: string, stored: StoredPod | null): Promise<void> {
    if (this.refusals.get(pod.uid) !== why) {
      this.refusals.set(pod.uid, why);
      this.log.warn({ uid: pod.uid, pod: `${pod.namespace}/${pod.name}`, why }, 'pod refused by the cluster');
      this.opts.recorder?.record(pod, 'Warning', 'ReverseRefused', why);
    }
    if (!stored || stored.state === 'validating' || stored.state === 'failed' || stored.state === 'done') return;
    const restored = restorePod(stored.snapshot);
    if (!restored.ok || restored.snapshot.context.podDeleted || restored.snapshot.context.teardownReason !== null) {
      return;
    }
    await this.sendGone(pod.uid, pod, { kind: 'gone', event: 'TEARDOWN', reason: 'refused-by-cluster' });
  }

  /**
   * True when nothing needs to be sent: the stored machine already has these annotations, or the
   * pod's machine was torn down and forgotten while the pod lives on (an operator's teardown, a job that
   * ended): its history is kept, and a new machine would start a tunnel nobody waits for.
   */
  private async upToDate(pod: WatchedPod, known?: StoredPod | null): Promise<boolean> {
    const stored = known === undefined ? await this.deps.store.load(pod.uid) : known;
    if (!stored) return (await this.deps.redis.exists(this.deps.keys.history(pod.uid))) === 1;
    const restored = restorePod(stored.snapshot);
    if (!restored.ok) return true; // `status` shows it; an event cannot help
    const ctx = restored.snapshot.context;
    return (
      ctx.namespace === pod.namespace && ctx.name === pod.name && sameAnnotations(ctx.annotations, pod.annotations)
    );
  }

  private async sendUpsert(pod: WatchedPod): Promise<void> {
    const event: PodEvent = {
      type: 'POD_UPSERT',
      namespace: pod.namespace,
      name: pod.name,
      annotations: pod.annotations,
      at: this.deps.now(),
    };
    await this.send(pod.uid, event, watchEventIds.upsert(pod.uid, pod.resourceVersion));
    this.log.info({ uid: pod.uid, pod: `${pod.namespace}/${pod.name}`, node: pod.nodeName }, 'pod upserted');
    if (pod.annotations[ANNOTATION.forwards] !== undefined && !pod.hasPrelude && !this.warned.has(pod.uid)) {
      this.warned.add(pod.uid);
      this.opts.recorder?.record(
        pod,
        'Warning',
        'PreludeMissing',
        `${ANNOTATION.preExec} holds no backhaul prelude: the job will not start the relay, so the reverse forwards cannot be used (was the pod admitted through backhaul's mutating webhook?)`,
      );
    }
  }

  /** A pod that is gone (or going): end its machine, unless it is already ending or unknown. */
  private async onGone(uid: string, pod: Pick<WatchedPod, 'namespace' | 'name'>, gone: GoneEvent): Promise<void> {
    if (this.sent.get(uid) === 'gone') return;
    const stored = await this.deps.store.load(uid);
    if (stored) {
      const restored = restorePod(stored.snapshot);
      const ending =
        restored.ok &&
        (stored.state === 'done' ||
          restored.snapshot.context.podDeleted ||
          (gone.event === 'TEARDOWN' && restored.snapshot.context.teardownReason !== null));
      if (!ending) await this.sendGone(uid, pod, gone);
    }
    this.sent.set(uid, 'gone');
    this.warned.delete(uid);
    this.refusals.delete(uid);
  }

  private async sendGone(uid: string, pod: Pick<WatchedPod, 'namespace' | 'name'>, gone: GoneEvent): Promise<void> {
    const at = this.deps.now();
    const event: PodEvent =
      gone.event === 'POD_DELETED' ? { type: 'POD_DELETED', at } : { type: 'TEARDOWN', reason: gone.reason, at };
    await this.send(uid, event, watchEventIds.gone(uid, gone));
    this.log.info({ uid, pod: `${pod.namespace}/${pod.name}`, event: event.type }, 'pod gone');
  }

  private async send(uid: string, event: PodEvent, dedupId: string): Promise<void> {
    await this.deps.queues.events.add(
      event.type,
      { uid, event },
      {
        deduplication: { id: dedupId },
        removeOnComplete: true,
        removeOnFail: { age: 86_400 },
        attempts: 10,
        backoff: { type: 'exponential', delay: 200 },
      },
    );
  }

  // ---- level-triggered reconcile ----

  /**
   * Every live pod has a machine with its annotations; every machine whose pod is gone is ended. A
   * machine whose pod the watch does not show is confirmed gone with a GET first (it may be outside the
   * watched scope, or the cache behind): only a 404, or a pod of another uid under that name, ends it.
   */
  private async reconcile(): Promise<void> {
    if (this.stopped) return;
    const live = new Map<string, WatchedPod>();
    for (const stream of this.streams) for (const [uid, pod] of stream.cache) live.set(uid, pod);
    let upserts = 0;
    let ended = 0;
    const livePods = [...live.values()];
    const stored = await this.deps.store.loadMany(livePods.map((p) => p.uid));
    for (const [i, watched] of livePods.entries()) {
      if (this.stopped) return;
      const { pod, verdict } = await this.withVerdict(watched);
      const record = stored[i] ?? null;
      if (!(await this.upToDate(pod, record))) {
        await this.sendUpsert(pod);
        upserts += 1;
      }
      if (verdict && !verdict.ok) await this.refuse(pod, verdict.why, record);
      this.sent.set(pod.uid, podFingerprint(pod));
    }
    const uids = await this.deps.store.list();
    const records = await this.deps.store.loadMany(uids.filter((uid) => !live.has(uid)));
    for (const record of records) {
      if (!record || this.stopped) continue;
      const restored = restorePod(record.snapshot);
      if (!restored.ok) continue;
      const ctx = restored.snapshot.context;
      if (record.state === 'done' || ctx.podDeleted || ctx.teardownReason !== null) continue;
      if (this.cfg.Namespace && ctx.namespace !== this.cfg.Namespace) continue;
      const gone = await this.confirmGone(record.uid, ctx.namespace, ctx.name);
      if (!gone) continue;
      await this.sendGone(record.uid, ctx, gone);
      this.sent.set(record.uid, 'gone');
      ended += 1;
    }
    // The memo only needs pods that still exist somewhere.
    const known = new Set(uids);
    for (const uid of this.sent.keys()) if (!live.has(uid) && !known.has(uid)) this.sent.delete(uid);
    this.reconciles += 1;
    this.log.info({ live: live.size, machines: uids.length, upserts, ended }, 'pods reconciled');
  }

  private async confirmGone(uid: string, namespace: string, name: string): Promise<GoneEvent | undefined> {
    kubeCall('pods.get');
    try {
      const current = podFromObject(await this.core.readNamespacedPod({ namespace, name }));
      if (!current || current.uid !== uid) return { kind: 'gone', event: 'POD_DELETED' };
      const verdict = classifyPod(current, this.scope);
      return verdict.kind === 'gone' ? verdict : undefined;
    } catch (err) {
      if (statusCodeOf(err) === 404) return { kind: 'gone', event: 'POD_DELETED' };
      this.log.warn({ uid, pod: `${namespace}/${name}`, err: describeKubeError(err) }, 'could not read a pod');
      return undefined;
    }
  }
}

function isAbort(err: unknown): boolean {
  return (err as { name?: string } | null)?.name === 'AbortError';
}
