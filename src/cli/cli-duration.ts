import { DURATION_ACCEPTED, MAX_DURATION_MS, parseDuration } from '../contract/duration.js';

/** What a duration flag accepts, for help texts and errors. */
export const CLI_DURATION_ACCEPTED = `seconds ("90", "0.5") or ${DURATION_ACCEPTED}`;

/**
 * A duration flag's value in ms: a plain number is seconds (as the flags always took), anything else a
 * duration as in the site configuration and `kubectl wait --timeout` ("30s", "10m", "1h30m"). Throws a
 * RangeError naming the flag and what it accepts; undefined text is the fallback.
 */
export function cliDuration(
  text: string | undefined,
  fallbackMs: number,
  flag: string,
  limits: { minMs?: number; maxMs?: number } = {},
): number {
  if (text === undefined) return fallbackMs;
  const trimmed = text.trim();
  const ms = /^\d+(\.\d+)?$/.test(trimmed) ? Math.round(Number(trimmed) * 1000) : parseDuration(trimmed);
  const minMs = limits.minMs ?? 1;
  const maxMs = Math.min(limits.maxMs ?? MAX_DURATION_MS, MAX_DURATION_MS);
  if (ms === undefined || !Number.isFinite(ms)) {
    throw new RangeError(`${flag}: expected ${CLI_DURATION_ACCEPTED}, got ${JSON.stringify(text)}`);
  }
  if (ms < minMs || ms > maxMs) {
    throw new RangeError(
      `${flag}: expected ${CLI_DURATION_ACCEPTED} from ${human(minMs)} to ${human(maxMs)}, got ${JSON.stringify(text)}`,
    );
  }
  return ms;
}

function human(ms: number): string {
  if (ms % 1000 !== 0) return `${ms} ms`;
  const s = ms / 1000;
  return s % 60 === 0 && s >= 60 ? `${s / 60} min` : `${s} s`;
}
