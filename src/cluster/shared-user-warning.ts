import type { Redis } from 'ioredis';
import type { Logger } from '../log.js';
import type { PodContext, PodEvent, PodStateName } from '../machines/pod-machine.js';
import { EVENT_REASONS } from '../render/kube-events.js';
import type { RedisKeys } from '../store/keys.js';
import type { EventRecorder } from './event-recorder.js';

/** How long a namespace counts as one whose pods run as the site user after its last pod came up. */
export const NAMESPACES_WINDOW_MS = 24 * 3_600_000;

/**
 * Pods of different namespaces that run as one site user, where the site separates their tunnels by
 * Unix user only (the relay or the sockets are the user's, not the job's): each such pod gets one
 * Warning Event saying so, when its forwards come up. The namespaces seen are kept in one sorted set
 * (`<prefix>user-namespaces`, namespace → when last seen, a day's worth, with a TTL), so that every
 * control worker knows them.
 */
export class SharedUserWarning {
  private readonly warned = new Set<string>();

  constructor(
    private readonly redis: Redis,
    private readonly keys: RedisKeys,
    private readonly recorder: EventRecorder,
    private readonly siteUser: string,
    private readonly log: Logger,
  ) {}

  /** Called for every transition; does its work in the background. */
  observe(ctx: PodContext, to: PodStateName, event: PodEvent): void {
    if (to !== 'active' || event.type !== 'FORWARDS_READY' || !ctx.isolation) return;
    if (ctx.isolation.relay === 'job' && ctx.isolation.sockets === 'job') return;
    void this.check(ctx, event.at).catch((err: unknown) =>
      this.log.warn({ uid: ctx.uid, err }, 'could not check which namespaces share the site user'),
    );
  }

  private async check(ctx: PodContext, at: number): Promise<void> {
    const key = this.keys.userNamespaces();
    const namespaces = (await this.redis
      .multi()
      .zadd(key, String(at), ctx.namespace)
      .zremrangebyscore(key, '-inf', String(at - NAMESPACES_WINDOW_MS))
      .pexpire(key, NAMESPACES_WINDOW_MS)
      .zrange(key, '0', '49')
      .exec()
      .then((replies) => replies?.[3]?.[1])) as string[] | undefined;
    const others = (namespaces ?? []).filter((ns) => ns !== ctx.namespace);
    if (others.length === 0 || this.warned.has(ctx.uid)) return;
    if (this.warned.size > 10_000) this.warned.clear();
    this.warned.add(ctx.uid);
    const what =
      ctx.isolation?.relay === 'user'
        ? 'its relay admits every process of that user and its forward sockets can be opened by them'
        : "its relay admits only this pod's job, but its forward sockets can be opened by every process of that user";
    this.recorder.record(
      { uid: ctx.uid, namespace: ctx.namespace, name: ctx.name },
      'Warning',
      EVENT_REASONS.sharedUser,
      `this pod's tunnel is separated from other jobs only by the site user ${this.siteUser}: ${what}${ctx.batchHost ? ` on node ${ctx.batchHost}` : ''}, and pods of other namespaces (${others.slice(0, 5).join(', ')}${others.length > 5 ? ', …' : ''}) run as that user on this site. A site with Slurm's job_container/tmpfs and the srun carrier keeps the sockets per job (README, Security model)`,
    );
  }
}
