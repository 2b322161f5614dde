import { type Job, Worker } from 'bullmq';
import type { Redis } from 'ioredis';
import { podError } from '../machines/error-kinds.js';
import { type PodAction, type PodEvent, PURE_STEPS, parsePodEvent, type StepName } from '../machines/pod-machine.js';
import type { StreamedEvent } from '../pods/event-stream.js';
import type { FleetDeps, TransitionHook } from '../pods/fleet-deps.js';
import { QUEUE_NAMES, type StepJobData, sendEvent } from '../pods/queues.js';
import { Converger, type ConvergerOptions } from './converger.js';
import { forgetPod, runEffects } from './effects.js';
import { EventConsumer, type EventConsumerOptions, PermanentEventError } from './event-consumer.js';
import { applyPodEvent } from './pod-events.js';
import { pureStepResult, runStep } from './step-runner.js';

/**
 * Events and step jobs a control worker runs at once. Events are short Redis round trips: many in
 * flight keep one process busy while each waits (bench:control measured 128/64 ahead of 32/16 with one
 * process).
 */
export const CONTROL_CONCURRENCY = { events: 128, steps: 64 } as const;

/** A killed control worker's step at hand is retried by another within about 15 s (BullMQ's default is 60 s). */
export const CONTROL_LOCKS = { lockDuration: 10_000, stalledInterval: 5_000, maxStalledCount: 10 } as const;

export interface ControlWorkerOptions {
  /** Jobs run at once: events (each a load → transition → compare-and-set) and steps. */
  concurrency?: { events: number; steps: number };
  /** The convergence loop: deadlines, effects left behind, repairs (converger.ts). */
  convergence?: ConvergerOptions;
  /** How events are read, taken over from dead consumers and buried (event-consumer.ts). */
  events?: Partial<Omit<EventConsumerOptions, 'concurrency'>>;
  /** After each applied (stored) transition: the cluster roles record Kubernetes Events with it. */
  onTransition?: TransitionHook;
}

type PureStepRequest = Extract<PodAction, { type: 'runStep' }> & { params: { step: StepName } };

/**
 * The control role: applies events to pods' machines (load → transition → compare-and-set → effects),
 * runs the steps those machines ask for, delivers their deadlines and runs effects a dead worker left.
 * Stopping finishes the events and the step at hand.
 */
export class ControlWorker {
  readonly events: EventConsumer;
  readonly steps: Worker<StepJobData>;
  readonly convergence: Converger;
  /** The last event job of each pod being applied here: the next one of that pod waits for it. */
  private readonly podTurns = new Map<string, Promise<unknown>>();
  private readonly onTransition: TransitionHook | undefined;

  constructor(
    private readonly deps: FleetDeps,
    connections: { events: Redis; steps: Redis },
    opts: ControlWorkerOptions = {},
  ) {
    const concurrency = opts.concurrency ?? CONTROL_CONCURRENCY;
    this.onTransition = opts.onTransition;
    const prefix = deps.bullPrefix ? { prefix: deps.bullPrefix } : {};
    this.events = new EventConsumer(deps.queues.events, connections.events, (e) => this.onEvent(e), deps.log, {
      ...opts.events,
      concurrency: concurrency.events,
    });
    this.events.start();
    this.steps = new Worker<StepJobData>(QUEUE_NAMES.steps, (job) => this.onStep(job), {
      connection: connections.steps,
      concurrency: concurrency.steps,
      ...CONTROL_LOCKS,
      ...prefix,
    });
    this.steps.on('error', (err) => deps.log.error({ err }, 'control worker error'));
    this.steps.on('failed', (job, err) => {
      if (job) void this.reportExhaustedStep(job, err);
    });
    this.convergence = new Converger(deps, opts.convergence);
    this.convergence.start();
    deps.metrics.countPodsWith(() => deps.store.countByState());
  }

  async close(): Promise<void> {
    this.deps.metrics.countPodsWith(undefined);
    await this.convergence.stop();
    await Promise.all([this.events.close(), this.steps.close()]);
  }

  /**
   * Events of one pod taken by this worker are applied one at a time, in the order they were taken (the
   * stream's): concurrent ones would only conflict in the compare-and-set and land in any order. (Across
   * workers the compare-and-set still decides.)
   */
  private onEvent(entry: StreamedEvent): Promise<string> {
    const { uid } = entry;
    const before = this.podTurns.get(uid) ?? Promise.resolve();
    const turn = before.then(
      () => this.applyStreamedEvent(entry),
      () => this.applyStreamedEvent(entry),
    );
    const done = turn.catch(() => undefined);
    this.podTurns.set(uid, done);
    void done.then(() => {
      if (this.podTurns.get(uid) === done) this.podTurns.delete(uid);
    });
    return turn;
  }

  /**
   * A session's report whose lease token is not the pod's lease now: a stale session host (stopped,
   * then woken after another took its shadow over with the same generation) must not drive the
   * machine. A report after its own lease was released (the session's last one) still counts.
   */
  private async fencedOff(uid: string, event: PodEvent): Promise<boolean> {
    if (!('lease' in event) || event.lease === undefined) return false;
    const current = await this.deps.leases.get(uid);
    return current !== null && current.token !== event.lease;
  }

  private async applyStreamedEvent(entry: StreamedEvent): Promise<string> {
    const { uid } = entry;
    let data: unknown;
    try {
      data = JSON.parse(entry.event);
    } catch {
      throw new PermanentEventError(`pod ${uid}: bad event: not JSON`);
    }
    const parsed = parsePodEvent(data);
    if (!parsed.ok) throw new PermanentEventError(`pod ${uid}: bad event: ${parsed.message}`);
    if (await this.fencedOff(uid, parsed.event)) {
      this.deps.metrics.ignoredEvents.inc({ event: parsed.event.type });
      return `ignored ${parsed.event.type}: its session lost the lease to another`;
    }
    const path: string[] = [];
    /** The gen of the last write whose outbox holds a pure step run here (cleared if its result is ignored). */
    let pendingPure: number | undefined;
    // Validate and render are pure: their result is applied here, as the next event, instead of
    // queueing a step job that would queue that event (two jobs and a second load saved per step).
    for (let event: PodEvent = parsed.event; ; ) {
      const result = await applyPodEvent(this.deps, uid, event);
      switch (result.kind) {
        case 'ignored':
          if (path.length === 0) this.deps.metrics.ignoredEvents.inc({ event: event.type });
          if (pendingPure !== undefined) await this.deps.store.clearOutbox(uid, pendingPure);
          return path.length > 0 ? path.join(', ') : `ignored ${event.type} in ${result.state ?? 'no machine'}`;
        case 'unrestorable':
          // A snapshot of another machine version: `status` shows it; retrying cannot help.
          throw new PermanentEventError(`pod ${uid}: ${result.message}`);
        case 'applied': {
          path.push(`${result.from ?? 'new'} → ${result.to}`);
          this.deps.metrics.transitions.inc({ to: result.to, event: event.type });
          this.onTransition?.(uid, result.context, result.from, result.to, event);
          const pure = result.actions.find(
            (a): a is PureStepRequest => a.type === 'runStep' && PURE_STEPS.has(a.params.step) && !a.params.delayMs,
          );
          await runEffects(
            this.deps,
            uid,
            result.actions.filter((a) => a !== pure),
          );
          // A finished pod leaves only its history, which expires.
          if (result.to === 'done') await forgetPod(this.deps, uid, result.context.generation);
          else if (!pure && result.actions.length > 0) await this.deps.store.clearOutbox(uid, result.gen);
          if (!pure) return path.join(', ');
          // The next write replaces this one's outbox (the pure step's result is that write).
          pendingPure = result.gen;
          event = pureStepResult(this.deps, result.context, pure.params.step, pure.params.generation);
        }
      }
    }
  }

  private async onStep(job: Job<StepJobData>): Promise<string> {
    const { uid, step, generation } = job.data;
    try {
      const outcome = await runStep(this.deps, uid, step, generation);
      this.deps.metrics.steps.inc({ step, outcome });
      return outcome;
    } catch (err) {
      this.deps.metrics.steps.inc({ step, outcome: 'error' });
      throw err;
    }
  }

  /**
   * A step that failed for good (its retries used up) is reported to the machine, which shows the
   * error and fails or relaunches the pod, instead of leaving it in the step's state until the reaper.
   */
  private async reportExhaustedStep(job: Job<StepJobData>, err: Error): Promise<void> {
    const attempts = job.opts.attempts ?? 1;
    if (job.attemptsMade < attempts) return;
    const { uid, step, generation } = job.data;
    this.deps.metrics.exhaustedSteps.inc({ step });
    const message = `${step} failed ${job.attemptsMade} time(s): ${err.message}`;
    await sendEvent(this.deps.queues, uid, {
      type: 'STEP_FAILED',
      step,
      generation,
      error: podError('step-failed', message),
      at: this.deps.now(),
    }).catch((sendErr: unknown) => this.deps.log.error({ err: sendErr, uid, step }, 'could not report a failed step'));
  }
}
