import { CoreV1Api, type KubeConfig, PatchStrategy, setHeaderOptions } from '@kubernetes/client-node';
import type { Logger } from '../log.js';
import type { InvolvedPod } from '../render/kube-events.js';
import { conditionPatch, type PodCondition } from '../render/pod-condition.js';
import { describeKubeError, kubeCall, statusCodeOf } from './kube-api.js';

/**
 * Writes the `interlink.eu/ReverseForwardsReady` condition into pods' status (a strategic-merge patch of
 * `pods/status`: conditions merge by type, so the virtual kubelet's own conditions stay). Writes never
 * block or fail their caller; per pod they go out one at a time, the latest wish winning, and a
 * status already written is not written again. A pod that is gone is forgotten.
 */
export class PodConditionWriter {
  /** What was last written per pod (status and reason), to skip repeats. */
  private readonly written = new Map<string, string>();
  /** When each pod's status last changed (lastTransitionTime is that, not the time of any write). */
  private readonly changed = new Map<string, { status: string; time: string }>();
  /** The condition each pod should get next, while a write for it runs. */
  private readonly pending = new Map<string, { pod: InvolvedPod; condition: PodCondition }>();
  private readonly running = new Map<string, Promise<void>>();
  private warned = false;

  constructor(
    private readonly api: CoreV1Api,
    private readonly log: Logger,
  ) {}

  static fromKubeConfig(kubeConfig: KubeConfig, log: Logger): PodConditionWriter {
    return new PodConditionWriter(kubeConfig.makeApiClient(CoreV1Api), log);
  }

  /** The pod should carry CONDITION; `force` writes it even if it was written before (the pod lost it). */
  set(pod: InvolvedPod, condition: PodCondition, force = false): void {
    if (!force && this.written.get(pod.uid) === keyOf(condition)) return;
    if (force) this.written.delete(pod.uid);
    const last = this.changed.get(pod.uid);
    const dated = last?.status === condition.status ? { ...condition, lastTransitionTime: last.time } : condition;
    this.changed.set(pod.uid, { status: dated.status, time: dated.lastTransitionTime });
    this.pending.set(pod.uid, { pod, condition: dated });
    if (!this.running.has(pod.uid)) this.drain(pod.uid);
  }

  /** The pod's machine is gone: nothing more is written for it. */
  forget(uid: string): void {
    this.written.delete(uid);
    this.changed.delete(uid);
    this.pending.delete(uid);
  }

  /** Waits for the writes in flight (for shutdown and tests). */
  async flush(): Promise<void> {
    while (this.running.size > 0) await Promise.all([...this.running.values()]);
  }

  private drain(uid: string): void {
    const run = (async () => {
      for (let next = this.pending.get(uid); next; next = this.pending.get(uid)) {
        this.pending.delete(uid);
        if (this.written.get(uid) === keyOf(next.condition)) continue;
        await this.write(next.pod, next.condition);
      }
    })().finally(() => this.running.delete(uid));
    this.running.set(uid, run);
  }

  private async write(pod: InvolvedPod, condition: PodCondition): Promise<void> {
    try {
      kubeCall('pods/status.patch');
      await this.api.patchNamespacedPodStatus(
        { name: pod.name, namespace: pod.namespace, body: conditionPatch(condition) },
        setHeaderOptions('Content-Type', PatchStrategy.StrategicMergePatch),
      );
      this.written.set(pod.uid, keyOf(condition));
    } catch (err) {
      if (statusCodeOf(err) === 404) {
        this.forget(pod.uid);
        return;
      }
      // Once per process at warn (e.g. RBAC without pods/status patch); then at debug.
      const line = { uid: pod.uid, pod: `${pod.namespace}/${pod.name}`, err: describeKubeError(err) };
      if (this.warned) this.log.debug(line, 'could not set the pod condition');
      else this.log.warn(line, `could not set the pod condition ${condition.type}`);
      this.warned = true;
    }
  }
}

function keyOf(condition: PodCondition): string {
  return `${condition.status}/${condition.reason}`;
}
