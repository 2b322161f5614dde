import { z } from 'zod';
import { quote } from './input-error.js';

const UNIT_MS = { ms: 1, s: 1_000, m: 60_000, h: 3_600_000, d: 86_400_000 } as const;
const DURATION = /^(?:\d+(?:ms|s|m|h|d))+$/;
const PART = /(\d+)(ms|s|m|h|d)/g;

export const DURATION_ACCEPTED = 'a duration such as "500ms", "30s", "10m", "2h" or "1h30m"';

/**
 * The longest wait a Node timer can take (2^31 - 1 ms, about 24.8 days); a longer one fires after
 * 1 ms, so every duration is refused above it.
 */
export const MAX_DURATION_MS = 2_147_483_647;

/** Parses "10m", "2h", "1h30m", "500ms" into milliseconds; undefined when malformed. */
export function parseDuration(text: string): number | undefined {
  if (!DURATION.test(text)) return undefined;
  let total = 0;
  for (const [, amount, unit] of text.matchAll(PART)) {
    total += Number(amount) * UNIT_MS[unit as keyof typeof UNIT_MS];
  }
  return Number.isSafeInteger(total) ? total : undefined;
}

/** A zod field taking a duration string and yielding milliseconds. */
export function duration(min = 1) {
  // The metadata is for docs/CONFIG.md (tools/config-doc.ts): a duration, and its floor.
  return z
    .string()
    .meta({ 'x-duration-min-ms': min })
    .transform((text, ctx) => {
      const ms = parseDuration(text);
      if (ms === undefined) {
        ctx.addIssue({ code: 'custom', message: `expected ${DURATION_ACCEPTED}, got ${quote(text)}` });
        return z.NEVER;
      }
      if (ms < min) {
        ctx.addIssue({ code: 'custom', message: `must be at least ${min} ms, got ${quote(text)}` });
        return z.NEVER;
      }
      if (ms > MAX_DURATION_MS) {
        ctx.addIssue({
          code: 'custom',
          message: `must be at most 24d (24.8 days, the longest a timer waits), got ${quote(text)}`,
        });
        return z.NEVER;
      }
      return ms;
    });
}
