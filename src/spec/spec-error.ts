import { quote } from './display-text.js';

/**
 * The one error type for bad input (annotations, pod manifests, site configuration).
 * `field` is what the user wrote wrong: an annotation name or a configuration key path;
 * `entry` the offending value when there is one; `accepted` what would have been accepted.
 * Callers turn it into exit code 2, an admission refusal, or an UnrecoverableError.
 */
export class SpecError extends Error {
  override readonly name = 'SpecError';
  readonly field: string;
  readonly entry: string | undefined;
  readonly accepted: string | undefined;

  constructor(field: string, problem: string, opts: { entry?: string; accepted?: string } = {}) {
    const entry = opts.entry === undefined ? '' : ` entry ${quote(opts.entry)}`;
    const accepted = opts.accepted === undefined ? '' : `; accepted: ${opts.accepted}`;
    super(`${field}${entry}: ${problem}${accepted}`);
    this.field = field;
    this.entry = opts.entry;
    this.accepted = opts.accepted;
  }
}

export function isSpecError(err: unknown): err is SpecError {
  return err instanceof SpecError;
}

export { quote } from './display-text.js';
