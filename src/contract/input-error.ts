import { quote } from './display-text.js';

/**
 * The one error type for bad input (annotations, pod manifests, site configuration).
 * `field` is what the user wrote wrong: an annotation name or a configuration key path;
 * `entry` the offending value when there is one; `accepted` what would have been accepted.
 * Callers turn it into exit code 2, an admission refusal, or an UnrecoverableError.
 */
export class InputError extends Error {
  override readonly name = 'InputError';
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

export function isInputError(err: unknown): err is InputError {
  return err instanceof InputError;
}

export { quote } from './display-text.js';
