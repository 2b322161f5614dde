import { z } from 'zod';
import type { SessionPlan } from './session-plan.js';

/**
 * A SessionPlan as it comes back from Redis (the pod hash's `plan` field, written by the render step):
 * checked before a launch uses it, so that a record written by another version, or changed by hand,
 * makes the launch render the plan again instead of dialling what the record says.
 */
const port = z.number().int().min(1).max(65535);
const text = z.string().min(1);
const loginHop = { loginHost: text, loginPort: port, user: text };

const plannedForward = z.object({
  listenPort: port,
  host: text,
  port,
  dialHost: text,
  bindAddress: text,
  socketPath: text,
  names: z.array(text),
});

const carrierPlan = z.discriminatedUnion('mode', [
  z.object({ ...loginHop, mode: z.literal('node'), nodeSshPort: port }),
  z.object({
    ...loginHop,
    mode: z.literal('userspace'),
    nodeSshPort: port,
    carrierDir: text,
    bootstrapCommand: text,
    sshdCommand: text,
  }),
  z.object({ ...loginHop, mode: z.literal('srun'), carrierDir: text, bootstrapCommand: text, sshdCommand: text }),
]);

export const sessionPlanSchema = z.object({
  uid: text,
  namespace: text,
  name: text,
  bindAddress: text,
  socketDir: text,
  forwards: z.array(plannedForward),
  socks: port.nullable(),
  carrier: carrierPlan,
  hostsLine: z.string().nullable(),
  waitForForwardsMs: z.number().min(0),
}) satisfies z.ZodType<SessionPlan>;
