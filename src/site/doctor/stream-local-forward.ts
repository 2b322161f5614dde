import type { Client } from 'ssh2';
import { bounded, errorMessage } from './check-result.js';
import type { OpenConnection } from './doctor-context.js';

export type ForwardOutcome = { granted: true } | { granted: false; reason: string; clientError: string };

/**
 * Asks the sshd behind `conn` for a remote unix-socket forward (`streamlocal-forward@openssh.com`,
 * what a carrier does for every pod forward). ssh2's callback error only says "Unable to bind to
 * <path>": the server's reason arrives as an SSH debug message just before the refusal, and
 * connectSsh collects those.
 */
export async function tryStreamLocalForward(
  conn: OpenConnection,
  path: string,
  timeoutMs: number,
): Promise<ForwardOutcome> {
  const seen = conn.serverMessages.length;
  const request = new Promise<void>((resolve, reject) => {
    try {
      conn.client.openssh_forwardInStreamLocal(path, (err) => (err ? reject(err) : resolve()));
    } catch (err) {
      reject(err);
    }
  });
  try {
    await bounded(`the stream-local forward request for ${path}`, timeoutMs, request, () =>
      cancelForward(conn.client, path),
    );
    return { granted: true };
  } catch (err) {
    const said = conn.serverMessages.slice(seen).join(' ');
    return { granted: false, reason: said, clientError: errorMessage(err) };
  }
}

/** Cancels a granted forward (best effort: the scratch dir holding its socket is removed anyway). */
export function cancelForward(client: Client, path: string, timeoutMs = 3000): Promise<void> {
  return bounded(
    `cancelling the forward of ${path}`,
    timeoutMs,
    new Promise<void>((resolve) => {
      try {
        client.openssh_unforwardInStreamLocal(path, () => resolve());
      } catch {
        resolve();
      }
    }),
  ).catch(() => undefined);
}
