import { setTimeout as sleep } from 'node:timers/promises';
import { isInputError } from '../contract/input-error.js';
import { podError } from '../machines/error-kinds.js';
import { type PodContext, type PodEvent, PURE_STEPS, STATE_OF_STEP, type StepName } from '../machines/pod-machine.js';
import type { FleetDeps } from '../pods/fleet-deps.js';
import { type PodView, readPod } from '../pods/pod-reader.js';
import { jobIds, jobState, sendEvent } from '../pods/queues.js';
import { type LaunchPlan, launchPlan, parseStoredPlan, renderPlan, requestOf } from './pod-plan.js';
import { stopShadow } from './shadow-stop.js';

export type StepOutcome = 'done' | 'failed' | 'stale';

const WHY: Record<NonNullable<LaunchPlan['rendered']>, string> = {
  'site-changed': 'the site configuration changed since the pod was rendered',
  'not-stored': 'the pod has no stored plan (its record was rebuilt)',
  unreadable: 'the stored plan is unreadable',
};

/**
 * Runs one step of one pod and reports STEP_DONE / STEP_FAILED to its machine (launch reports nothing
 * on success: the shadow's own reports move the machine on). Level-triggered: the step first checks
 * that the pod is still in the step's state and generation, so a step run twice, or late, is harmless.
 * Bad input is reported as a permanent failure instead of being retried.
 */
export async function runStep(deps: FleetDeps, uid: string, step: StepName, generation: number): Promise<StepOutcome> {
  const pod = await readPod(deps, uid);
  if (!pod || pod.state !== STATE_OF_STEP[step] || pod.context.generation !== generation) return 'stale';
  if (PURE_STEPS.has(step)) {
    // The same function the control worker runs inline: one way to validate and render.
    const result = pureStepResult(deps, pod.context, step, generation);
    await sendEvent(deps.queues, uid, result);
    return result.type === 'STEP_DONE' ? 'done' : 'failed';
  }
  try {
    await perform(deps, pod, step, generation);
  } catch (err) {
    if (!isInputError(err)) throw err; // transient: BullMQ retries with backoff
    const error = podError('invalid-pod', err.message);
    await sendEvent(deps.queues, uid, { type: 'STEP_FAILED', step, generation, error, at: deps.now() });
    return 'failed';
  }
  if (step !== 'launch') await sendEvent(deps.queues, uid, { type: 'STEP_DONE', step, generation, at: deps.now() });
  return 'done';
}

/**
 * Validate or render, as the event that reports it: a pure function of the pod and the site, run by the
 * control worker right after the transition that asks for it (no job, no second event to queue).
 */
export function pureStepResult(
  deps: FleetDeps,
  context: PodContext,
  step: StepName,
  generation: number,
): Extract<PodEvent, { type: 'STEP_DONE' | 'STEP_FAILED' }> {
  try {
    if (step === 'validate') requestOf(context, deps.config);
    else if (step === 'render') {
      return { type: 'STEP_DONE', step, generation, plan: renderPlan(context, deps.config), at: deps.now() };
    } else throw new Error(`step ${step} is not pure`);
    return { type: 'STEP_DONE', step, generation, at: deps.now() };
  } catch (err) {
    if (!isInputError(err)) throw err;
    const error = podError('invalid-pod', err.message);
    return { type: 'STEP_FAILED', step, generation, error, at: deps.now() };
  }
}

async function perform(deps: FleetDeps, pod: PodView, step: StepName, generation: number): Promise<void> {
  const { context } = pod;
  switch (step) {
    case 'validate':
    case 'render':
      throw new Error(`step ${step} is pure: pureStepResult runs it`);
    case 'launch': {
      const stored = parseStoredPlan(await deps.store.plan(context.uid));
      const { plan, rendered } = launchPlan(context, deps.config, stored);
      if (rendered)
        deps.log.info({ uid: context.uid, generation }, `launch renders the session plan again: ${WHY[rendered]}`);
      // The shadow runs for as long as the tunnel lives; a crashed host's job is picked up by another.
      await deps.queues.sessions.add(
        'shadow',
        { uid: context.uid, generation, plan },
        {
          jobId: jobIds.session(context.uid, generation),
          attempts: 1,
          removeOnComplete: true,
          removeOnFail: { age: 3_600 },
        },
      );
      return;
    }
    case 'teardown':
      await stopShadow(deps, context.uid, generation);
      await waitForShadowGone(deps, context.uid, generation);
      return;
  }
}

/** The session closes its carrier and removes its sockets once its lease is gone; give it time to. */
async function waitForShadowGone(deps: FleetDeps, uid: string, generation: number, timeoutMs = 20_000): Promise<void> {
  const deadline = deps.now() + timeoutMs;
  for (;;) {
    if ((await jobState(deps.redis, deps.queues.sessions, jobIds.session(uid, generation))) !== 'active') return;
    if (deps.now() > deadline) {
      deps.log.warn({ uid, generation }, 'teardown: the shadow did not stop in time; its lease is gone, so it will');
      return;
    }
    await sleep(250);
  }
}
