import type { FleetDeps } from '../pods/fleet-deps.js';
import { DeadlineClock } from './deadline-clock.js';
import { OutboxSweeper } from './outbox-sweeper.js';
import { PeriodicTask } from './periodic-task.js';
import { reap } from './reaper.js';

export interface ConvergerOptions {
  /** How often the loop runs: a deadline is delivered at most this late (default 500 ms). */
  everyMs?: number;
  /** How often effects left by a dead worker are looked for (default 1 s). */
  outboxEveryMs?: number;
  /** How often the pods due for a look are repaired (default 5 s). */
  reapEveryMs?: number;
}

/** Every pod is looked at this often whatever the indexes say (a controller's resync), and at start. */
const RESYNC_MS = 10 * 60_000;

/**
 * The control plane's one convergence loop, level-triggered like a controller's reconcile: it compares
 * what each pod's stored state says should be with what is, and redoes what is missing. It reads only
 * what an index says is due — deadlines fallen due (bh:deadlines), effects a dead worker left
 * (bh:outbox), pods whose step or lease should have moved them on (bh:review, bh:leases) — so pods that
 * wait for nothing cost it nothing. Every control worker runs one; each pass claims what it takes or
 * does only what is safe to do twice, so several loops never double an effect that matters.
 */
export class Converger {
  readonly deadlines: DeadlineClock;
  readonly outbox: OutboxSweeper;
  private readonly task: PeriodicTask;
  private readonly outboxEveryMs: number;
  private readonly reapEveryMs: number;
  private lastOutboxAt = Number.NEGATIVE_INFINITY;
  private lastReapAt = Number.NEGATIVE_INFINITY;
  private lastFullAt = Number.NEGATIVE_INFINITY;

  constructor(
    private readonly deps: FleetDeps,
    opts: ConvergerOptions = {},
  ) {
    this.deadlines = new DeadlineClock(deps);
    this.outbox = new OutboxSweeper(deps);
    this.outboxEveryMs = opts.outboxEveryMs ?? 1_000;
    this.reapEveryMs = opts.reapEveryMs ?? 5_000;
    this.task = new PeriodicTask('convergence', opts.everyMs ?? 500, () => this.pass(), deps.log);
  }

  start(): void {
    this.task.start();
  }

  stop(): Promise<void> {
    return this.task.stop();
  }

  /** One turn of the loop: deadlines always; the outbox and the repairs when theirs is due. */
  async pass(): Promise<void> {
    await this.deadlines.tick();
    const now = performance.now();
    if (now - this.lastOutboxAt >= this.outboxEveryMs) {
      this.lastOutboxAt = now;
      await this.outbox.sweep();
    }
    if (now - this.lastReapAt >= this.reapEveryMs) {
      this.lastReapAt = now;
      const full = now - this.lastFullAt >= RESYNC_MS;
      if (full) this.lastFullAt = now;
      await reap(this.deps, { full });
    }
  }
}
