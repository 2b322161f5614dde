import { ERROR_KINDS, type ErrorKind } from '../machines/error-kinds.js';

/**
 * Why a shadow session could not be set up or ended: the kinds of error-kinds.ts a session meets, so
 * the machine can decide between retrying (carrier lost, login unreachable) and failing at once (host
 * key mismatch, forwarding refused by the site), and an operator reads the cause rather than a stack
 * trace.
 */
export const SESSION_ERROR_KINDS = [
  'login-unreachable',
  'slurm-unreachable',
  'node-unreachable',
  'auth-refused',
  'host-key-mismatch',
  'forwarding-refused',
  'bootstrap-failed',
  'job-not-running',
  'job-ended',
  'carrier-lost',
  'sockets-vanished',
  'relay-dead',
  'closed',
] as const satisfies readonly ErrorKind[];

export type SessionErrorKind = (typeof SESSION_ERROR_KINDS)[number];

export class SessionError extends Error {
  override readonly name = 'SessionError';
  constructor(
    readonly kind: SessionErrorKind,
    message: string,
    options?: { cause?: unknown },
  ) {
    super(message, options);
  }

  /** Retrying cannot help: the site's configuration or keys must change first (its kind's class). */
  get permanent(): boolean {
    return ERROR_KINDS[this.kind] === 'permanent';
  }
}

export function isSessionError(err: unknown, kind?: SessionErrorKind): err is SessionError {
  return err instanceof SessionError && (kind === undefined || err.kind === kind);
}
