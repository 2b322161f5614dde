/**
 * Why a shadow session could not be set up or ended, classified so the machine can decide between
 * retrying (carrier lost, login unreachable) and failing at once (host key mismatch, forwarding
 * refused by the site), and so an operator reads the cause rather than a stack trace.
 */
export const SESSION_ERROR_KINDS = [
  'login-unreachable',
  /** squeue on the login node failed: slurmctld does not answer (site-wide, like the login node). */
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
  /** Every process of the job's relay is gone: the workload cannot reach the forwards. */
  'relay-dead',
  'closed',
] as const;

export type SessionErrorKind = (typeof SESSION_ERROR_KINDS)[number];

const PERMANENT: ReadonlySet<SessionErrorKind> = new Set([
  'auth-refused',
  'host-key-mismatch',
  'forwarding-refused',
  // Another shadow cannot bring the relay back: only the job (a new pod) can.
  'relay-dead',
]);

export class SessionError extends Error {
  override readonly name = 'SessionError';
  constructor(
    readonly kind: SessionErrorKind,
    message: string,
    options?: { cause?: unknown },
  ) {
    super(message, options);
  }

  /** Retrying cannot help: the site's configuration or keys must change first. */
  get permanent(): boolean {
    return PERMANENT.has(this.kind);
  }
}

export function isSessionError(err: unknown, kind?: SessionErrorKind): err is SessionError {
  return err instanceof SessionError && (kind === undefined || err.kind === kind);
}
