/**
 * What retrying does for an error:
 * - `permanent`: nothing; the pod fails at once (the site's keys or configuration, or the pod, must change);
 * - `site-wide`: the site is out of reach (the login node, or slurmctld behind it), not this pod's job or
 *   node: the pod relaunches without spending a launch, backing off, until the site answers (a login node
 *   rebooting fails every pod at once);
 * - `transient`: another launch (or try) may help, and spends one.
 */
export type ErrorClass = 'permanent' | 'site-wide' | 'transient';

/**
 * Every kind of error a pod can meet, with its class: the one table the session's errors, the machine's
 * guards, the step runner and the control worker read. Adding a kind is one line here.
 */
export const ERROR_KINDS = {
  // A shadow session (src/ssh/session-error.ts).
  'login-unreachable': 'site-wide',
  /** squeue on the login node failed: slurmctld does not answer. */
  'slurm-unreachable': 'site-wide',
  'node-unreachable': 'transient',
  'auth-refused': 'permanent',
  'host-key-mismatch': 'permanent',
  'forwarding-refused': 'permanent',
  'bootstrap-failed': 'transient',
  'job-not-running': 'transient',
  'job-ended': 'transient',
  'carrier-lost': 'transient',
  'sockets-vanished': 'transient',
  /** Every process of the job's relay is gone: another shadow cannot bring it back, only the job can. */
  'relay-dead': 'permanent',
  closed: 'transient',
  // The machine and its steps.
  /** The pod's annotations (or the site) do not make a valid request (an InputError). */
  'invalid-pod': 'permanent',
  /** A step failed on every retry (the control worker says which, and why). */
  'step-failed': 'transient',
  // A step reported a failure without its error (STEP_FAILED without one).
  'validate-failed': 'transient',
  'render-failed': 'transient',
  'launch-failed': 'transient',
  'teardown-failed': 'transient',
  /** The job got no batch host in time: waiting again would only wait as long again. */
  'node-wait-timeout': 'permanent',
  deadline: 'transient',
  /** An event that is not a failure taken as one (a bug, shown rather than hidden). */
  unexpected: 'transient',
} as const satisfies Record<string, ErrorClass>;

export type ErrorKind = keyof typeof ERROR_KINDS;

export const ERROR_KIND_NAMES = Object.keys(ERROR_KINDS) as [ErrorKind, ...ErrorKind[]];

/** An error as a step or a session reports it; `permanent` is the kind's class, carried with it. */
export interface PodError {
  kind: ErrorKind;
  message: string;
  permanent: boolean;
}

export function podError(kind: ErrorKind, message: string): PodError {
  return { kind, message, permanent: ERROR_KINDS[kind] === 'permanent' };
}

/** The site out of reach (its class), unless reported as permanent. */
export function isSiteWide(error: { kind: ErrorKind; permanent?: boolean }): boolean {
  return error.permanent !== true && ERROR_KINDS[error.kind] === 'site-wide';
}
