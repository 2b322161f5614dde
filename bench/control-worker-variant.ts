/**
 * A control worker process for the benchmark's experiments (bench/control.ts): the same pieces as
 * `backhaul worker --roles control` (src/workers), with knobs the CLI does not have. src/ is not changed.
 *
 *   node --import tsx bench/control-worker-variant.ts --config SITE.yaml --redis URL
 *        [--events 32] [--steps 16] [--variant baseline | --variant custom FLAGS…]
 *
 * - baseline: src's ControlWorker as it is, with the given concurrency (the CLI always uses 32 / 16).
 * - custom: the same event and step processing (applyPodEvent → runEffects → forget, runStep), plus:
 *   --inline-steps      validate and render are pure functions of the pod and the site: the event worker runs
 *                       them right after the transition that asks for them and applies STEP_DONE itself
 *                       (same store, same CAS, same history) instead of a step job and another event job.
 *   --fast-transition   the machine's transitions through one shared actor scope (bench/control-fast-apply.ts)
 *                       instead of XState's transition(), which builds an inert actor per call.
 *   --auto-pipeline     ioredis enableAutoPipelining: commands issued in the same tick share one write.
 *   --no-launch-report  the launch step does not send STEP_DONE(launch), which the machine always ignores
 *                       (launchingShadow has no STEP_DONE transition): one event job less per launch.
 *   --no-deadline-jobs  what the 4 delayed DEADLINE jobs (added and removed again) per pod cost: they are
 *                       not scheduled. Not a fix by itself (deadlines must still be delivered, e.g. from a
 *                       sorted set written by the CAS script and scanned by the reaper): an upper bound.
 *
 * Prints "fleet started" when it takes jobs; SIGTERM stops it.
 */
import { readFileSync } from 'node:fs';
import { parseArgs } from 'node:util';
import { type Job, UnrecoverableError, Worker } from 'bullmq';
import { createLogger } from '../src/log.js';
import { applyEvent, type PodAction, type PodEvent, parsePodEvent } from '../src/machines/pod-machine.js';
import { parseSiteConfigYaml } from '../src/spec/site-config.js';
import { isSpecError } from '../src/spec/spec-error.js';
import { createRedis } from '../src/store/redis.js';
import { preloadScripts } from '../src/store/scripts.js';
import { CONTROL_LOCKS, ControlWorker } from '../src/workers/control-worker.js';
import { forgetPod, runEffects } from '../src/workers/effects.js';
import { type FleetDeps, fleetDeps } from '../src/workers/fleet-deps.js';
import { planOf, requestOf } from '../src/workers/pod-plan.js';
import { readPod } from '../src/workers/pod-reader.js';
import { type EventJobData, jobIds, QUEUE_NAMES, type StepJobData } from '../src/workers/queues.js';
import { REAPER_JOB, reap } from '../src/workers/reaper.js';
import { runStep } from '../src/workers/step-runner.js';
import { type ApplyFn, applyPodEventWith, fastApplyEvent } from './control-fast-apply.js';

export interface CustomFlags {
  inlineSteps: boolean;
  fastTransition: boolean;
  noLaunchReport: boolean;
  noDeadlineJobs: boolean;
}

const DEADLINE_ACTIONS = new Set(['scheduleDeadline', 'cancelDeadline']);

/** ControlWorker's event and step processing (src/workers/control-worker.ts), with the experiment flags. */
class CustomControlWorker {
  readonly events: Worker<EventJobData>;
  readonly steps: Worker<StepJobData>;
  private readonly apply: ApplyFn;

  constructor(
    private readonly deps: FleetDeps,
    conc: { events: number; steps: number },
    private readonly flags: CustomFlags,
  ) {
    this.apply = flags.fastTransition ? fastApplyEvent : applyEvent;
    this.events = new Worker<EventJobData>(QUEUE_NAMES.events, (job) => this.onEvent(job), {
      connection: deps.redis,
      concurrency: conc.events,
      ...CONTROL_LOCKS,
    });
    this.steps = new Worker<StepJobData>(QUEUE_NAMES.steps, (job) => this.onStep(job), {
      connection: deps.redis,
      concurrency: conc.steps,
      ...CONTROL_LOCKS,
    });
    for (const w of [this.events, this.steps]) w.on('error', (err) => deps.log.error({ err }, 'worker error'));
  }

  async schedule(everyMs = 5_000): Promise<void> {
    await this.deps.queues.events.upsertJobScheduler(
      REAPER_JOB,
      { every: everyMs },
      { name: REAPER_JOB, data: { uid: '', event: { type: 'RETRY', at: 0 } } },
    );
  }

  async close(): Promise<void> {
    await Promise.all([this.events.close(), this.steps.close()]);
  }

  private async onStep(job: Job<StepJobData>): Promise<string> {
    const { uid, step, generation } = job.data;
    if (step !== 'launch' || !this.flags.noLaunchReport) return runStep(this.deps, uid, step, generation);
    // step-runner's launch, without the STEP_DONE report nobody listens to.
    const pod = await readPod(this.deps, uid);
    if (!pod || pod.state !== 'launchingShadow' || pod.context.generation !== generation) return 'stale';
    const plan = planOf(pod.context, this.deps.config);
    await this.deps.queues.sessions.add(
      'shadow',
      { uid, generation, plan },
      { jobId: jobIds.session(uid, generation), attempts: 1, removeOnComplete: true, removeOnFail: { age: 3_600 } },
    );
    return 'done';
  }

  private async onEvent(job: Job<EventJobData>): Promise<string> {
    if (job.name === REAPER_JOB) return `reaped ${await reap(this.deps)}`;
    const { uid } = job.data;
    const parsed = parsePodEvent(job.data.event);
    if (!parsed.ok) throw new UnrecoverableError(`pod ${uid}: bad event: ${parsed.message}`);
    let event: PodEvent = parsed.event;
    const path: string[] = [];
    for (;;) {
      const result = await applyPodEventWith(this.deps, uid, event, this.apply);
      if (result.kind === 'ignored') {
        return path.length > 0 ? path.join(' ') : `ignored ${event.type} in ${result.state ?? 'no machine'}`;
      }
      if (result.kind === 'unrestorable') throw new UnrecoverableError(`pod ${uid}: ${result.message}`);
      path.push(`${result.from ?? 'new'} → ${result.to}`);
      this.deps.onTransition?.(uid, result.context, result.from, result.to, event);
      const pure = this.flags.inlineSteps
        ? result.actions.find(
            (a): a is Extract<PodAction, { type: 'runStep' }> =>
              a.type === 'runStep' && (a.params.step === 'validate' || a.params.step === 'render'),
          )
        : undefined;
      const effects = result.actions.filter(
        (a) => a !== pure && !(this.flags.noDeadlineJobs && DEADLINE_ACTIONS.has(a.type)),
      );
      await runEffects(this.deps, uid, effects);
      if (result.to === 'done') await forgetPod(this.deps, uid, result.context.generation);
      if (!pure) return path.join(' ');
      const { step, generation } = pure.params;
      try {
        if (step === 'validate') requestOf(result.context, this.deps.config);
        else planOf(result.context, this.deps.config);
        event = { type: 'STEP_DONE', step, generation, at: this.deps.now() };
      } catch (err) {
        if (!isSpecError(err)) throw err;
        event = {
          type: 'STEP_FAILED',
          step,
          generation,
          error: { kind: 'invalid-pod', message: err.message, permanent: true },
          at: this.deps.now(),
        };
      }
    }
  }
}

// ------------------------------------------------------------------------------------------ main

const { values } = parseArgs({
  options: {
    config: { type: 'string' },
    redis: { type: 'string' },
    variant: { type: 'string', default: 'baseline' },
    events: { type: 'string', default: '32' },
    steps: { type: 'string', default: '16' },
    'inline-steps': { type: 'boolean', default: false },
    'fast-transition': { type: 'boolean', default: false },
    'auto-pipeline': { type: 'boolean', default: false },
    'no-launch-report': { type: 'boolean', default: false },
    'no-deadline-jobs': { type: 'boolean', default: false },
  },
});
if (!values.config || !values.redis) throw new Error('--config and --redis are required');
const concurrency = { events: Number(values.events), steps: Number(values.steps) };

const config = parseSiteConfigYaml(readFileSync(values.config, 'utf8'), values.config);
const log = createLogger('bench-control');
const redis = createRedis(values.redis, {
  connectionName: `bench-variant-${process.pid}`,
  ...(values['auto-pipeline'] ? { options: { enableAutoPipelining: true } } : {}),
});
const deps = fleetDeps(config, redis, log);
await preloadScripts(redis);

let close: () => Promise<void>;
if (values.variant === 'baseline') {
  const control = new ControlWorker(deps, { events: redis, steps: redis }, { concurrency });
  await control.schedule();
  close = () => control.close();
} else if (values.variant === 'custom') {
  const custom = new CustomControlWorker(deps, concurrency, {
    inlineSteps: values['inline-steps'] ?? false,
    fastTransition: values['fast-transition'] ?? false,
    noLaunchReport: values['no-launch-report'] ?? false,
    noDeadlineJobs: values['no-deadline-jobs'] ?? false,
  });
  await custom.schedule();
  close = () => custom.close();
} else {
  throw new Error(`unknown variant ${values.variant}`);
}
log.info({ variant: values.variant, concurrency, argv: process.argv.slice(2) }, 'fleet started');

await new Promise<void>((resolve) => {
  process.once('SIGTERM', resolve);
  process.once('SIGINT', resolve);
});
await close();
await deps.queues.close();
redis.disconnect();
log.info('fleet stopped');
