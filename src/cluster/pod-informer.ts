import { setTimeout as sleep } from 'node:timers/promises';
import { CoreV1Api, type KubeConfig, type V1PodList, Watch } from '@kubernetes/client-node';
import type { KubernetesConfig } from '../contract/site-config.js';
import type { Logger } from '../log.js';
import { describeKubeError, kubeCall, statusCodeOf } from './kube-api.js';
import { classifyPod, type PodScope, type PodVerdict, podFromObject, type WatchedPod } from './pod-info.js';

export type GoneEvent = Extract<PodVerdict, { kind: 'gone' }>;

/** What the informer reports; called synchronously, in the order the API server's events came. */
export interface PodInformerHandlers {
  /** A pod that needs a machine (new, or changed). */
  live(pod: WatchedPod): void;
  /** A pod whose tunnel must go (deleted, finished, no longer asking, or vanished across a relist). */
  gone(uid: string, pod: Pick<WatchedPod, 'namespace' | 'name'>, gone: GoneEvent): void;
  /** Every stream has listed once: the cache is complete. */
  synced(): void;
}

export interface PodInformerOptions {
  /** Reconnect backoff: doubles from base to max, with jitter. */
  backoffBaseMs?: number;
  backoffMaxMs?: number;
  /** Asked of the server for each watch (default a random 5–10 min, as client-go does). */
  watchTimeoutSeconds?: number;
  /** Page size of lists. */
  listLimit?: number;
}

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

/**
 * The pods backhaul may serve, as the API server shows them: one list+watch per virtual node (or one
 * for every node), a cache of the live ones, and what changes mean (PodInformerHandlers). Watches resume
 * from the last resourceVersion (bookmarks keep it fresh); a 410 Gone relists and diffs the list against
 * what was known, so nothing is missed; errors reconnect with backoff. client-node's informer is not used:
 * it neither diffs a relist nor reports a pod leaving the selection, and it cannot take one field
 * selector per node.
 */
export class PodInformer {
  private readonly core: CoreV1Api;
  private readonly watch: Watch;
  private readonly streams: PodStream[];
  private readonly scope: PodScope;
  private stopped = false;
  private readonly loops: Promise<void>[] = [];
  private readonly backoffBaseMs: number;
  private readonly backoffMaxMs: number;

  constructor(
    kubeConfig: KubeConfig,
    private readonly cfg: KubernetesConfig,
    private readonly handlers: PodInformerHandlers,
    private readonly log: Logger,
    private readonly opts: PodInformerOptions = {},
  ) {
    this.core = kubeConfig.makeApiClient(CoreV1Api);
    this.watch = new Watch(kubeConfig);
    this.scope = { virtualNodes: cfg.VirtualNodes };
    this.streams =
      cfg.VirtualNodes.length > 0 ? cfg.VirtualNodes.map((n) => new PodStream(n)) : [new PodStream(undefined)];
    this.backoffBaseMs = opts.backoffBaseMs ?? 500;
    this.backoffMaxMs = opts.backoffMaxMs ?? 30_000;
  }

  start(): void {
    for (const stream of this.streams) this.loops.push(this.run(stream));
  }

  /** Every stream has listed at least once. */
  get synced(): boolean {
    return this.streams.every((s) => s.synced);
  }

  /** The live pods of every stream, as of the last event received. */
  livePods(): Map<string, WatchedPod> {
    const live = new Map<string, WatchedPod>();
    for (const stream of this.streams) for (const [uid, pod] of stream.cache) live.set(uid, pod);
    return live;
  }

  async stop(): Promise<void> {
    this.stopped = true;
    for (const stream of this.streams) stream.controller?.abort();
    // A list under way cannot be aborted; do not let an unreachable API server hold up the shutdown.
    await Promise.race([Promise.all(this.loops), sleep(5_000)]);
  }

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
            if (this.synced) this.handlers.synced();
          }
        }
        if (this.stopped) break;
        const watchStarted = performance.now();
        const outcome = await this.watchOnce(stream);
        if (outcome.kind === 'expired') {
          this.log.info({ stream: stream.label, rv: stream.resourceVersion }, 'watch expired (410 Gone): relisting');
          stream.resourceVersion = '';
          // Expired at once after a fresh list: something is wrong with the server; do not spin.
          failures = listed && performance.now() - watchStarted < 1_000 ? failures + 1 : 0;
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
    const until = performance.now() + delay;
    while (!this.stopped && performance.now() < until) await sleep(Math.min(100, until - performance.now()));
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
      this.handlers.gone(uid, old, gone);
    }
    for (const { pod, verdict } of seen.values()) {
      if (verdict.kind === 'live') this.handlers.live(pod);
      else if (verdict.kind === 'gone' && !before.has(pod.uid)) this.handlers.gone(pod.uid, pod, verdict);
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
    const started = performance.now();
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
        else resolve({ kind: 'closed', received, durationMs: performance.now() - started });
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
            this.handlers.gone(pod.uid, pod, { kind: 'gone', event: 'POD_DELETED' });
          }
          return 'ok';
        }
        const verdict = classifyPod(pod, this.scope);
        if (verdict.kind === 'live') {
          stream.cache.set(pod.uid, pod);
          this.handlers.live(pod);
        } else if (verdict.kind === 'gone') {
          stream.cache.delete(pod.uid);
          this.handlers.gone(pod.uid, pod, verdict);
        } else if (known) {
          // Still there, but no longer asks for reverse forwards.
          stream.cache.delete(pod.uid);
          this.handlers.gone(pod.uid, pod, { kind: 'gone', event: 'TEARDOWN', reason: 'reverse-annotations-removed' });
        }
        return 'ok';
      }
      default:
        return 'ok';
    }
  }
}

function isAbort(err: unknown): boolean {
  return (err as { name?: string } | null)?.name === 'AbortError';
}
