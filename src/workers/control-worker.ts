import { type Job, UnrecoverableError, Worker } from 'bullmq';
import type { Redis } from 'ioredis';
import { parsePodEvent } from '../machines/pod-machine.js';
import { forgetPod, runEffects } from './effects.js';
import type { FleetDeps } from './fleet-deps.js';
import { applyPodEvent } from './pod-events.js';
import { type EventJobData, QUEUE_NAMES, type StepJobData } from './queues.js';
import { REAPER_JOB, reap } from './reaper.js';
import { runStep } from './step-runner.js';

/** A killed control worker's job at hand is retried by another within about 15 s (BullMQ's default is 60 s). */
export const CONTROL_LOCKS = { lockDuration: 10_000, stalledInterval: 5_000, maxStalledCount: 10 } as const;

/**
 * The control role: applies events to pods' machines (load → transition → compare-and-set → effects)
 * and runs the steps those machines ask for. Stopping finishes the job at hand (BullMQ's close waits).
 */
export class ControlWorker {
  readonly events: Worker<EventJobData>;
  readonly steps: Worker<StepJobData>;

  constructor(
    private readonly deps: FleetDeps,
    connections: { events: Redis; steps: Redis },
    concurrency = { events: 32, steps: 16 },
  ) {
    const prefix = deps.bullPrefix ? { prefix: deps.bullPrefix } : {};
    this.events = new Worker<EventJobData>(QUEUE_NAMES.events, (job) => this.onEvent(job), {
      connection: connections.events,
      concurrency: concurrency.events,
      ...CONTROL_LOCKS,
      ...prefix,
    });
    this.steps = new Worker<StepJobData>(QUEUE_NAMES.steps, (job) => this.onStep(job), {
      connection: connections.steps,
      concurrency: concurrency.steps,
      ...CONTROL_LOCKS,
      ...prefix,
    });
    for (const worker of [this.events, this.steps]) {
      worker.on('error', (err) => deps.log.error({ err }, 'control worker error'));
    }
  }

  /** Registers the periodic reaper (one schedule for the whole fleet, whichever worker runs it). */
  async schedule(everyMs = 5_000): Promise<void> {
    await this.deps.queues.events.upsertJobScheduler(
      REAPER_JOB,
      { every: everyMs },
      // Each run is a job: keep none of them, or every 5 s leaves a record behind.
      {
        name: REAPER_JOB,
        data: { uid: '', event: { type: 'RETRY', at: 0 } },
        opts: { removeOnComplete: true, removeOnFail: { count: 100 } },
      },
    );
  }

  async close(): Promise<void> {
    await Promise.all([this.events.close(), this.steps.close()]);
  }

  private async onEvent(job: Job<EventJobData>): Promise<string> {
    if (job.name === REAPER_JOB) return `reaped ${await reap(this.deps)}`;
    const { uid } = job.data;
    const parsed = parsePodEvent(job.data.event);
    if (!parsed.ok) throw new UnrecoverableError(`pod ${uid}: bad event: ${parsed.message}`);
    const result = await applyPodEvent(this.deps, uid, parsed.event);
    switch (result.kind) {
      case 'ignored':
        return `ignored ${parsed.event.type} in ${result.state ?? 'no machine'}`;
      case 'unrestorable':
        // A snapshot of another machine version: `status` shows it; retrying cannot help.
        throw new UnrecoverableError(`pod ${uid}: ${result.message}`);
      case 'applied':
        this.deps.onTransition?.(uid, result.context, result.from, result.to, parsed.event);
        await runEffects(this.deps, uid, result.actions);
        // A finished pod leaves only its history, which expires.
        if (result.to === 'done') await forgetPod(this.deps, uid, result.context.generation);
        return `${result.from ?? 'new'} → ${result.to}`;
    }
  }

  private async onStep(job: Job<StepJobData>): Promise<string> {
    const { uid, step, generation } = job.data;
    return runStep(this.deps, uid, step, generation);
  }
}
