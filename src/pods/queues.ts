import { Queue, type QueueOptions } from 'bullmq';
import type { Redis } from 'ioredis';
import type { PodEvent, StepName } from '../machines/pod-machine.js';
import type { SessionPlan } from '../render/session-plan.js';
import type { RedisKeys } from '../store/keys.js';
import { EventStream } from './event-stream.js';

/**
 * The fleet's BullMQ queues (ARCHITECTURE.md, "Redis keys and queues"): steps and shadows. The pods' events are not
 * jobs: they go through one Redis stream (EventStream), at a fraction of a job's Redis commands.
 */
export const QUEUE_NAMES = { steps: 'bh-steps', sessions: 'bh-sessions' } as const;

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
 * Job ids carry the pod UID and generation, never ':' (ARCHITECTURE.md, "Redis keys and queues"): the same step of the same
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
  events: EventStream;
  steps: Queue<StepJobData>;
  sessions: Queue<SessionJobData>;
  close(): Promise<void>;
}

/**
 * The fleet's queues. `readOnly`: for commands that only look (status, list): BullMQ then writes none of
 * its metadata keys, so looking at a fleet leaves nothing in its Redis.
 */
export function openQueues(connection: Redis, keys: RedisKeys, prefix?: string, readOnly = false): FleetQueues {
  const opts: QueueOptions = {
    connection,
    ...(prefix ? { prefix } : {}),
    ...(readOnly ? { skipMetasUpdate: true } : {}),
  };
  const events = new EventStream(connection, keys);
  const steps = new Queue<StepJobData>(QUEUE_NAMES.steps, opts);
  const sessions = new Queue<SessionJobData>(QUEUE_NAMES.sessions, opts);
  // Connection errors are retried by ioredis and surface in the calls that fail; don't print each one.
  for (const queue of [steps, sessions]) queue.on('error', () => undefined);
  return {
    events,
    steps,
    sessions,
    close: async () => {
      await Promise.all([steps.close(), sessions.close()]);
    },
  };
}

/**
 * A job's state, or 'unknown' when it does not exist: an EXISTS first, since most jobs asked about are
 * gone (they are removed on completion) and BullMQ's state script runs about six commands.
 */
export async function jobState(redis: Redis, queue: Queue, id: string): Promise<string> {
  if ((await redis.exists(queue.toKey(id))) === 0) return 'unknown';
  return queue.getJobState(id);
}

/** Sends one event to a pod's machine. */
export function sendEvent(queues: Pick<FleetQueues, 'events'>, uid: string, event: PodEvent): Promise<unknown> {
  return queues.events.send(uid, event);
}
