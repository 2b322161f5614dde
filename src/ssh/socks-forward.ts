import { pipeline } from 'node:stream';
import { createServer, type Socks5Server } from '@pondwader/socks5-server';
import type { AcceptConnection, Client, RejectConnection, TcpConnectionDetails } from 'ssh2';
import { type EndpointDialer, EndpointRefusedError } from './endpoint-dial.js';
import type { ForwardLog } from './reverse-forwards.js';
import { SessionError } from './session-error.js';

/**
 * SOCKS5 CONNECT for a pod that asked for it on a site that allows it (ARCHITECTURE.md §3.1): the node sshd
 * listens on 127.0.0.1:<port> of the node (open to every user there, hence the warning) and each
 * connection is a SOCKS conversation answered here, in the cluster.
 */
export class SocksForward {
  private readonly server: Socks5Server;
  private bound = false;
  private readonly onTcp = (info: TcpConnectionDetails, accept: AcceptConnection, reject: RejectConnection) => {
    if (info.destPort !== this.port) return reject();
    this.server._handleConnection(accept());
  };

  constructor(
    private readonly client: Client,
    private readonly port: number,
    private readonly serverMessages: readonly string[],
    log: ForwardLog,
    dialer: EndpointDialer,
  ) {
    this.server = createServer();
    this.server.setConnectionHandler((conn, sendStatus) => {
      const target = dialer.dialSocks(conn.destAddress, conn.destPort);
      target.once('error', (err) => {
        const refused = err instanceof EndpointRefusedError;
        log.warn(refused ? 'socks target refused by the endpoint policy' : 'socks target unreachable', {
          target: `${conn.destAddress}:${conn.destPort}`,
          error: err.message,
        });
        sendStatus(refused ? 'CONNECTION_NOT_ALLOWED' : 'HOST_UNREACHABLE');
        conn.socket.destroy();
      });
      target.once('connect', () => {
        sendStatus('REQUEST_GRANTED');
        const abort = (err: Error | null) => {
          if (!err) return;
          target.destroy();
          conn.socket.destroy();
        };
        pipeline(conn.socket, target, abort);
        pipeline(target, conn.socket, abort);
      });
    });
    client.on('tcp connection', this.onTcp);
  }

  async establish(): Promise<void> {
    if (this.bound) return;
    const before = this.serverMessages.length;
    await new Promise<void>((resolve, reject) => {
      this.client.forwardIn('127.0.0.1', this.port, (err) => {
        if (!err) return resolve();
        const said = this.serverMessages.slice(before).join('; ');
        reject(
          new SessionError(
            'forwarding-refused',
            `the node sshd refused the SOCKS listener 127.0.0.1:${this.port}: ${said || err.message}`,
            {
              cause: err,
            },
          ),
        );
      });
    });
    this.bound = true;
  }

  async cancel(): Promise<void> {
    this.client.removeListener('tcp connection', this.onTcp);
    if (!this.bound) return;
    this.bound = false;
    await new Promise<void>((resolve) => {
      try {
        this.client.unforwardIn('127.0.0.1', this.port, () => resolve());
      } catch {
        resolve();
      }
    });
  }
}
