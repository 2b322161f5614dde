import { type Duplex, pipeline } from 'node:stream';
import { createServer, type Socks5Server } from '@pondwader/socks5-server';
import { type EndpointDialer, EndpointRefusedError } from './endpoint-dial.js';
import type { ForwardLog } from './reverse-forwards.js';

/**
 * SOCKS5 CONNECT for a pod that asked for it on a site that allows it (ARCHITECTURE.md, "Annotations"). The SOCKS
 * port is one of the relay's ports like a forward's, joined to the socket `<socket dir>/socks.sock`
 * (so the relay's owner check applies to it too); each connection on that socket is a SOCKS
 * conversation answered here, in the cluster, and every destination passes the endpoint policy.
 */
export class SocksForward {
  private readonly server: Socks5Server;

  constructor(log: ForwardLog, dialer: EndpointDialer) {
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
  }

  /** One connection on the SOCKS socket: its SOCKS5 conversation, then the bytes both ways. */
  serve(stream: Duplex): void {
    // The library types its connections as net.Sockets; it uses only the stream side of them.
    this.server._handleConnection(stream as Parameters<Socks5Server['_handleConnection']>[0]);
  }
}
