import { isSessionError } from '../../ssh/session-error.js';
import { CheckTimeout, errorMessage } from './check-result.js';

/** How a connection attempt ended, as the checks that report on it need to tell apart. */
export type ConnectFailure =
  | { kind: 'host-key' }
  | { kind: 'auth-refused' }
  | { kind: 'unreachable'; why: string }
  | { kind: 'timeout'; why: string };

export function classifyConnectFailure(err: unknown, hostKeyRefused: boolean): ConnectFailure {
  if (hostKeyRefused) return { kind: 'host-key' };
  if (err instanceof CheckTimeout) return { kind: 'timeout', why: err.message };
  if (isSessionError(err, 'auth-refused')) return { kind: 'auth-refused' };
  // connectSsh prefixes its label; the cause is what the network said.
  const cause = err instanceof Error && err.cause instanceof Error ? err.cause.message : errorMessage(err);
  return { kind: 'unreachable', why: cause };
}
