import { ANNOTATION } from '../contract/annotations.js';
import { InputError } from '../contract/input-error.js';

/**
 * The prelude is pasted into `slurm-job.vk.io/pre-exec`. The admission webhook sees the pod again on
 * every re-submission, so it strips an existing block before adding the current one instead of
 * stacking a second prelude (two relays would fight over the same listen ports).
 */
export const PRELUDE_BEGIN = '# >>> backhaul prelude v1 (do not edit) >>>';
export const PRELUDE_END = '# <<< backhaul prelude v1 <<<';

// Any version: a newer webhook must also remove blocks written by an older one.
const BEGIN_LINE = /^# >>> backhaul prelude v\d+\b/;
const END_LINE = /^# <<< backhaul prelude v\d+\b/;

export function hasPrelude(text: string): boolean {
  return text.split('\n').some((line) => BEGIN_LINE.test(line));
}

/**
 * Removes every backhaul prelude block (marker lines included) and leaves the rest untouched.
 * A start marker without an end marker means the block was edited by hand: guessing where it ends
 * could delete the user's own commands or leave half a prelude, so it is refused.
 */
export function stripPrelude(text: string): string {
  const kept: string[] = [];
  let inside = false;
  for (const line of text.split('\n')) {
    if (!inside && BEGIN_LINE.test(line)) {
      inside = true;
    } else if (inside) {
      if (END_LINE.test(line)) inside = false;
    } else {
      kept.push(line);
    }
  }
  if (inside) {
    throw new InputError(ANNOTATION.preExec, 'holds the start of a backhaul prelude without its end marker', {
      accepted: `a pre-exec without a backhaul prelude, or with a complete block from "${PRELUDE_BEGIN}" to "${PRELUDE_END}"`,
    });
  }
  return kept.join('\n');
}
