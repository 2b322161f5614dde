import { Queue, type QueueOptions } from 'bullmq';
import type { Redis } from 'ioredis';
import type { PodEvent, StepName } from '../machines/pod-machine.js';
import type { SessionPlan } from '../render/session-plan.js';

/** ARCHITECTURE.md §3.8: the three queues of the fleet. */
export const QUEUE_NAMES = { events: 'bh-events', steps: 'bh-steps', sessions: 'bh-sessions' } as const;

/** An event for one pod's machine. */
export interface EventJobData {
  uid: string;
  event: PodEvent;
}

export interface StepJobData {
  uid: string;
  step: StepName;
  generation: number;
}

/** One shadow: held by a session host for as long as the tunnel lives. */
export interface SessionJobData {
  uid: string;
  generation: number;
  plan: SessionPlan;
}

/**
 * Job ids carry the pod UID and generation, never ':' (ARCHITECTURE.md §3.8): the same step of the same
 * generation asked twice is one job.
 */
export const jobIds = {
  step: (uid: string, step: StepName, generation: number) => `${uid}-${step}-${generation}`,
  session: (uid: string, generation: number) => `${uid}-shadow-${generation}`,
};

/**
 * Completed and failed jobs are kept a while for `status POD` (a step asked for again replaces its
 * finished job: effects.ts queueStep); a forgotten pod's jobs are removed with it (forgetPod).
 */
export const KEEP_JOBS = { removeOnComplete: { age: 3_600, count: 10_000 }, removeOnFail: { age: 86_400 } } as const;

export interface FleetQueues {
  events: Queue<EventJobData>;
  steps: Queue<StepJobData>;
  sessions: Queue<SessionJobData>;
  close(): Promise<void>;
}

/**
 * The fleet's queues. `readOnly`: for commands that only look (status, list): BullMQ then writes none of
 * its metadata keys, so looking at a fleet leaves nothing in its Redis.
 */
export function openQueues(connection: Redis, prefix?: string, readOnly = false): FleetQueues {
  const opts: QueueOptions = {
    connection,
    ...(prefix ? { prefix } : {}),
    ...(readOnly ? { skipMetasUpdate: true } : {}),
  };
  const events = new Queue<EventJobData>(QUEUE_NAMES.events, opts);
  const steps = new Queue<StepJobData>(QUEUE_NAMES.steps, opts);
  const sessions = new Queue<SessionJobData>(QUEUE_NAMES.sessions, opts);
  // Connection errors are retried by ioredis and surface in the calls that fail; don't print each one.
  for (const queue of [events, steps, sessions]) queue.on('error', () => undefined);
  return {
    events,
    steps,
    sessions,
    close: async () => {
      await Promise.all([events.close(), steps.close(), sessions.close()]);
    },
  };
}

/** Sends one event to a pod's machine. */
export function sendEvent(queues: Pick<FleetQueues, 'events'>, uid: string, event: PodEvent): Promise<unknown> {
  return queues.events.add(
    event.type,
    { uid, event },
    { ...KEEP_JOBS, removeOnComplete: true, attempts: 10, backoff: { type: 'exponential', delay: 200 } },
  );
}
