import { podActionsSchema } from '../machines/pod-machine.js';
import type { FleetDeps } from '../pods/fleet-deps.js';
import { runEffects } from './effects.js';

/**
 * Runs the effects a control worker stored with a state but did not live to run. Every transition
 * writes its effects into the pod's record in the same compare-and-set as the state (an outbox), and the
 * worker clears them once they ran; a worker killed in between leaves them, and the event that caused
 * them, retried, is no transition any more. This sweep claims such records (redis/outbox-claim.lua: one
 * control worker each) and runs their effects again, which every effect tolerates.
 */
export class OutboxSweeper {
  /** `ageMs`: effects not cleared this long after they were written were left by a worker that died. */
  constructor(
    private readonly deps: FleetDeps,
    private readonly ageMs = 5_000,
  ) {}

  /** One sweep: runs the left effects of every claimed pod; returns how many pods had some. */
  async sweep(): Promise<number> {
    const uids = await this.deps.store.claimLeftEffects(this.ageMs);
    if (uids.length === 0) return 0;
    let ran = 0;
    for (const record of await this.deps.store.loadMany(uids)) {
      if (!record || record.outbox === null) continue;
      const parsed = podActionsSchema.safeParse(record.outbox);
      if (!parsed.success) {
        // Written by another version of backhaul: the reaper repairs from the state instead.
        this.deps.log.warn({ uid: record.uid }, 'outbox: effects in an unknown form, dropped');
      } else {
        this.deps.log.info({ uid: record.uid, effects: parsed.data.length }, 'outbox: running effects left behind');
        await runEffects(this.deps, record.uid, parsed.data);
        this.deps.metrics.outboxRepairs.inc();
        ran += 1;
      }
      await this.deps.store.clearOutbox(record.uid, record.gen);
    }
    return ran;
  }
}
