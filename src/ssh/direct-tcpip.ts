import type { Duplex } from 'node:stream';
import type { Client } from 'ssh2';

/** Why an sshd would not open a `direct-tcpip` channel (RFC 4254 §5.1 reason codes). */
export type DirectTcpipRefusal = 'prohibited' | 'connect-failed' | 'unknown';

export class DirectTcpipError extends Error {
  override readonly name = 'DirectTcpipError';
  /** `cause`: ssh2's error for the refused channel open. */
  constructor(
    readonly refusal: DirectTcpipRefusal,
    message: string,
    cause: unknown,
  ) {
    super(message, { cause });
  }
}

const REASON: Readonly<Record<number, DirectTcpipRefusal>> = {
  1: 'prohibited', // SSH_OPEN_ADMINISTRATIVELY_PROHIBITED: AllowTcpForwarding no|remote, PermitOpen
  2: 'connect-failed', // SSH_OPEN_CONNECT_FAILED: nothing listens there, or the name does not resolve
};

/**
 * A `direct-tcpip` channel from the far side of `client` to host:port (the jump of `ssh -J`), with
 * the server's refusal classified: an operator must tell "the login sshd forbids this" from "nothing
 * listens on the node".
 */
export function openDirectTcpip(client: Client, host: string, port: number): Promise<Duplex> {
  return new Promise((resolve, reject) => {
    client.forwardOut('127.0.0.1', 0, host, port, (err, stream) => {
      if (err) {
        const code = (err as Error & { reason?: unknown }).reason;
        const refusal = (typeof code === 'number' ? REASON[code] : undefined) ?? 'unknown';
        reject(new DirectTcpipError(refusal, `${host}:${port}: ${err.message}`, err));
      } else resolve(stream as unknown as Duplex);
    });
  });
}
