import { setTimeout as sleep } from 'node:timers/promises';
import { CoreV1Api, type KubeConfig } from '@kubernetes/client-node';
import { ANNOTATION } from '../contract/annotations.js';
import { CLUSTER_VERDICT, type ClusterVerdict, clusterChecksOn, formatVerdict } from '../contract/cluster-verdict.js';
import type { KubernetesConfig } from '../contract/site-config.js';
import type { Logger } from '../log.js';
import type { PodEvent } from '../machines/pod-machine.js';
import type { FleetDeps } from '../pods/fleet-deps.js';
import { isEnding, loadPodRecord, loadPodRecords, type PodRecord } from '../pods/pod-reader.js';
import { forwardsCondition } from '../render/pod-condition.js';
import { RedisEpoch, recoveryWindowMs } from '../store/redis-epoch.js';
import { ClusterGate } from './cluster-gate.js';
import type { EventRecorder } from './event-recorder.js';
import { describeKubeError, kubeCall, statusCodeOf } from './kube-api.js';
import type { PodConditionWriter } from './pod-conditions.js';
import {
  classifyPod,
  type PodScope,
  podFingerprint,
  podFromObject,
  sameAnnotations,
  type WatchedPod,
} from './pod-info.js';
import { type GoneEvent, PodInformer, type PodInformerOptions } from './pod-informer.js';

export interface PodWatcherOptions extends PodInformerOptions {
  /** Level-triggered reconcile period (default Backhaul.Kubernetes.ResyncInterval). */
  resyncMs?: number;
  /** How long the cluster gate keeps namespaces and NetworkPolicies it read (default CLUSTER_CACHE_MS). */
  clusterCacheMs?: number;
  /** Warning Events (a pod whose pre-exec lacks the prelude); none when undefined. */
  recorder?: EventRecorder;
  /** Puts the forwards condition back on a pod that lost it or shows another; none when undefined. */
  conditions?: PodConditionWriter;
}

/** The teardown reason of a served pod the cluster refuses (in its history, and what lifts it). */
const REFUSED_BY_CLUSTER = 'refused-by-cluster';

/** How often the watch role looks whether Redis lost its data (one small Lua call). */
const EPOCH_CHECK_MS = 2_000;

/** Deduplication ids of the events the watcher sends (no ':' — ARCHITECTURE.md, "Redis keys and queues"). */
export const watchEventIds = {
  upsert: (uid: string, resourceVersion: string) => `${uid}-upsert-${resourceVersion || 'x'}`,
  gone: (uid: string, event: GoneEvent) => `${uid}-${event.event === 'POD_DELETED' ? 'deleted' : 'teardown'}`,
};

/**
 * The watch role (ARCHITECTURE.md, "The Kubernetes side"): keeps one machine per live pod that asks for reverse forwards on a
 * virtual node, and ends the machines of pods that are gone. The pods come from a PodInformer (list +
 * watch, src/cluster/pod-informer.ts); this is the reconcile.
 *
 * Edge- and level-triggered: the informer's changes are turned into POD_UPSERT / POD_DELETED as they
 * come, and on start (once every stream has listed) and then every ResyncInterval, the pods seen are
 * compared with the machines stored in Redis. Nothing is sent twice: a pod whose relevant fields did not
 * change sends nothing (a memo, then the stored machine), and events are sent once per id while they wait (EventStream.sendOnce).
 */
export class PodWatcher {
  private readonly core: CoreV1Api;
  private readonly informer: PodInformer;
  private readonly scope: PodScope;
  private readonly log: Logger;
  /** uid → fingerprint sent (live) or 'gone'. */
  private readonly sent = new Map<string, string>();
  private readonly warned = new Set<string>();
  private chain: Promise<void> = Promise.resolve();
  private stopped = false;
  private resyncTimer: NodeJS.Timeout | undefined;
  private epochTimer: NodeJS.Timeout | undefined;
  /** Whether Redis lost its data (the pods' records with it): then the pods are told again at once. */
  private readonly epoch: RedisEpoch;
  private reconciles = 0;
  private readonly resyncMs: number;
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
    this.scope = { virtualNodes: cfg.VirtualNodes };
    this.log = deps.log.child({ role: 'watch' });
    this.resyncMs = opts.resyncMs ?? cfg.ResyncInterval;
    this.epoch = new RedisEpoch(deps.redis, deps.keys, recoveryWindowMs(deps.config.Backhaul.LeaseTTL));
    this.informer = new PodInformer(
      kubeConfig,
      cfg,
      {
        live: (pod) => void this.enqueue(() => this.onLive(pod)),
        gone: (uid, pod, gone) => void this.enqueue(() => this.onGone(uid, pod, gone)),
        synced: () => void this.enqueue(() => this.reconcile()),
      },
      this.log,
      opts,
    );
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
    this.informer.start();
    this.resyncTimer = setInterval(() => {
      if (this.synced) this.enqueue(() => this.reconcile());
    }, this.resyncMs);
    this.resyncTimer.unref();
    void this.epoch.check().catch(() => undefined);
    this.epochTimer = setInterval(() => void this.lookForLoss(), EPOCH_CHECK_MS);
    this.epochTimer.unref();
  }

  /**
   * Redis lost its data (restarted empty): every pod's record is gone while their tunnels live on. The
   * records are rebuilt from the API server now, not at the next resync; the session hosts tell each
   * rebuilt record of the shadow they kept (SHADOW_HELD).
   */
  private async lookForLoss(): Promise<void> {
    const check = await this.epoch.check().catch(() => undefined);
    if (!check?.lost || this.stopped) return;
    this.log.warn("Redis lost its data: rebuilding every pod's record from the API server now");
    this.sent.clear();
    if (this.synced) await this.resync();
  }

  /** Every stream has listed at least once (readiness). */
  get synced(): boolean {
    return this.informer.synced;
  }

  /** How many level-triggered reconciles have completed. */
  get reconcileCount(): number {
    return this.reconciles;
  }

  /** Resolves once every stream has listed and the first reconcile is done. */
  async whenSynced(timeoutMs = 60_000): Promise<void> {
    const deadline = performance.now() + timeoutMs;
    while (this.reconciles === 0) {
      if (performance.now() > deadline) throw new Error('the pod watcher did not sync in time');
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
    if (this.epochTimer) clearInterval(this.epochTimer);
    await this.informer.stop();
    await this.idle();
    this.log.info('pod watcher stopped');
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
    if (this.sent.get(pod.uid) === fingerprint) {
      // The virtual kubelet writes the pod's whole status: a condition it dropped is put back.
      if (this.opts.conditions && !watched.forwardsCondition) {
        this.keepCondition(watched, await loadPodRecord(this.deps.store, pod.uid));
      }
      return;
    }
    const record = await loadPodRecord(this.deps.store, pod.uid);
    this.keepCondition(watched, record);
    if (!(await this.upToDate(pod, record))) await this.sendUpsert(pod);
    if (verdict && !verdict.ok) await this.refuse(pod, verdict.why, record);
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

  /** The pod's forwards condition as its machine's state says it should be (level-triggered). */
  private keepCondition(pod: WatchedPod, record: PodRecord | null): void {
    const conditions = this.opts.conditions;
    if (!conditions || !record?.ok) return;
    // Dated when the pod entered its state (the writer keeps an earlier time while the status stays).
    const wanted = forwardsCondition(record.state, record.context, record.stored.updatedAt);
    if (!wanted) return;
    const shown = pod.forwardsCondition;
    if (shown && shown.status === wanted.status && shown.reason === wanted.reason) return;
    conditions.set(pod, wanted, true);
  }

  /**
   * A pod the cluster refuses: a Warning Event on it (once per refusal), and a machine that already
   * serves it (the namespace lost its label, a NetworkPolicy appeared) is torn down. A new machine fails
   * in its validate step with the same words.
   */
  private async refuse(pod: WatchedPod, why: string, record: PodRecord | null): Promise<void> {
    if (this.refusals.get(pod.uid) !== why) {
      this.refusals.set(pod.uid, why);
      this.log.warn({ uid: pod.uid, pod: `${pod.namespace}/${pod.name}`, why }, 'pod refused by the cluster');
      this.opts.recorder?.record(pod, 'Warning', 'ReverseRefused', why);
    }
    // Not yet serving (validate refuses it by itself), failed, or already ending: nothing to tear down.
    if (!record?.ok || record.state === 'validating' || record.state === 'failed' || isEnding(record)) return;
    await this.sendGone(pod.uid, pod, { kind: 'gone', event: 'TEARDOWN', reason: REFUSED_BY_CLUSTER });
  }

  /**
   * True when nothing needs to be sent: the stored machine already has these annotations, or the
   * pod's machine was torn down and forgotten while the pod lives on (an operator's teardown, a job that
   * ended): its history is kept, and a new machine would start a tunnel nobody waits for.
   */
  private async upToDate(pod: WatchedPod, known?: PodRecord | null): Promise<boolean> {
    const record = known === undefined ? await loadPodRecord(this.deps.store, pod.uid) : known;
    if (!record) {
      if (!(await this.deps.store.hasHistory(pod.uid))) return false;
      // Torn down because the cluster refused it (a label removed, a policy added): once it no longer
      // does, the pod gets its tunnel back.
      return !(pod.annotations[CLUSTER_VERDICT] === 'ok' && (await this.endedByRefusal(pod.uid)));
    }
    if (!record.ok) return true; // `status` shows it; an event cannot help
    const ctx = record.context;
    return (
      ctx.namespace === pod.namespace && ctx.name === pod.name && sameAnnotations(ctx.annotations, pod.annotations)
    );
  }

  /** Whether the pod's last machine ended in a teardown for a cluster refusal (its last few history entries). */
  private async endedByRefusal(uid: string): Promise<boolean> {
    const last = await this.deps.store.history(uid, 4);
    return last.some((entry) => entry.event === 'TEARDOWN' && entry.detail === REFUSED_BY_CLUSTER);
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
    const record = await loadPodRecord(this.deps.store, uid);
    if (record) {
      // A deletion is still noted on a pod torn down for another reason (`status` shows it).
      const ending =
        record.ok &&
        (record.state === 'done' ||
          record.context.podDeleted ||
          (gone.event === 'TEARDOWN' && record.context.teardownReason !== null));
      if (!ending) await this.sendGone(uid, pod, gone);
    }
    this.sent.set(uid, 'gone');
    this.warned.delete(uid);
    this.refusals.delete(uid);
    this.opts.conditions?.forget(uid);
  }

  private async sendGone(uid: string, pod: Pick<WatchedPod, 'namespace' | 'name'>, gone: GoneEvent): Promise<void> {
    const at = this.deps.now();
    const event: PodEvent =
      gone.event === 'POD_DELETED' ? { type: 'POD_DELETED', at } : { type: 'TEARDOWN', reason: gone.reason, at };
    await this.send(uid, event, watchEventIds.gone(uid, gone));
    this.log.info({ uid, pod: `${pod.namespace}/${pod.name}`, event: event.type }, 'pod gone');
  }

  private async send(uid: string, event: PodEvent, dedupId: string): Promise<void> {
    await this.deps.queues.events.sendOnce(uid, event, dedupId);
  }

  // ---- level-triggered reconcile ----

  /**
   * Every live pod has a machine with its annotations; every machine whose pod is gone is ended. A
   * machine whose pod the watch does not show is confirmed gone with a GET first (it may be outside the
   * watched scope, or the cache behind): only a 404, or a pod of another uid under that name, ends it.
   */
  private async reconcile(): Promise<void> {
    if (this.stopped) return;
    const live = this.informer.livePods();
    let upserts = 0;
    let ended = 0;
    const livePods = [...live.values()];
    const stored = await loadPodRecords(
      this.deps.store,
      livePods.map((p) => p.uid),
    );
    for (const [i, watched] of livePods.entries()) {
      if (this.stopped) return;
      const { pod, verdict } = await this.withVerdict(watched);
      const record = stored[i] ?? null;
      if (!(await this.upToDate(pod, record))) {
        await this.sendUpsert(pod);
        upserts += 1;
      }
      if (verdict && !verdict.ok) await this.refuse(pod, verdict.why, record);
      this.keepCondition(watched, record);
      this.sent.set(pod.uid, podFingerprint(pod));
    }
    const uids = await this.deps.store.list();
    const records = await loadPodRecords(
      this.deps.store,
      uids.filter((uid) => !live.has(uid)),
    );
    for (const record of records) {
      if (!record?.ok || this.stopped || isEnding(record)) continue;
      const { uid } = record.stored;
      const ctx = record.context;
      if (this.cfg.Namespace && ctx.namespace !== this.cfg.Namespace) continue;
      const gone = await this.confirmGone(uid, ctx.namespace, ctx.name);
      if (!gone) continue;
      await this.sendGone(uid, ctx, gone);
      this.sent.set(uid, 'gone');
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
