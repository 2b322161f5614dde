import type { Socket } from 'node:net';
import { type Duplex, pipeline } from 'node:stream';
import type { AcceptConnection, Channel, Client, RejectConnection, UNIXConnectionDetails } from 'ssh2';
import { setChannelWindow, type WindowGrant } from './channel-window.js';
import { type DialFailure, dataPlane } from './data-plane-meter.js';
import { type EndpointDialer, EndpointRefusedError } from './endpoint-dial.js';
import { ForwardTally } from './forward-traffic.js';
import { SessionError } from './session-error.js';

/** One socket on the node and the one endpoint it may reach (ARCHITECTURE.md, "Carriers and shadow sessions"), or the SOCKS socket. */
export type ForwardTarget =
  | { socketPath: string; dialHost: string; port: number }
  | { socketPath: string; socks: { serve(stream: Duplex): void } };

export interface ForwardStats {
  connections: number;
  refused: number;
  bytesToCluster: number;
  bytesToJob: number;
}

export interface ForwardOptions {
  /** Dials the endpoints, checking each connection against the endpoint policy. */
  dialer: EndpointDialer;
  connectTimeoutMs?: number;
  /**
   * The receive window of each accepted connection, granted from the thread's budget and given back
   * when the channel closes (channel-window.ts). Absent: ssh2's own (2 MiB).
   */
  window?: () => WindowGrant;
}

export interface ForwardLog {
  warn(message: string, detail?: Record<string, unknown>): void;
}

/**
 * The `streamlocal-forward@openssh.com` requests of one carrier and the connections they bring.
 * Each socket reaches only its declared endpoint; the endpoint is connected before the channel is
 * accepted, so a job whose endpoint is down sees its connection closed instead of a silent hang.
 */
export class ReverseForwards {
  readonly stats: ForwardStats = { connections: 0, refused: 0, bytesToCluster: 0, bytesToJob: 0 };
  /** By forward, for `backhaul status POD`. */
  readonly traffic = new ForwardTally();
  private readonly byPath: Map<string, ForwardTarget>;
  private readonly open = new Set<Socket>();
  private readonly bound: string[] = [];
  private readonly onConnection = (info: UNIXConnectionDetails, accept: AcceptConnection, reject: RejectConnection) =>
    this.handle(info, accept, reject);

  constructor(
    private readonly client: Client,
    targets: readonly ForwardTarget[],
    private readonly serverMessages: readonly string[],
    private readonly log: ForwardLog,
    private readonly options: ForwardOptions,
  ) {
    this.byPath = new Map(targets.map((t) => [t.socketPath, t]));
    client.on('unix connection', this.onConnection);
  }

  /** The socket paths bound so far (until cancel). */
  get boundPaths(): readonly string[] {
    return [...this.bound];
  }

  /**
   * Binds every socket; the first refusal is a SessionError carrying the server's own reason. The
   * requests go out together (one round trip for all, not one each: over a WAN that is 20-50 ms per
   * forward); the sockets that were bound stay bound (cancel() unbinds them). With `signal` aborted it
   * binds nothing (a pod being torn down gets no new socket).
   */
  async establish(signal?: AbortSignal): Promise<void> {
    const paths = [...this.byPath.keys()].filter((path) => !this.bound.includes(path));
    if (paths.length === 0) return;
    if (signal?.aborted) throw new SessionError('closed', 'closed while binding the forwards');
    const before = this.serverMessages.length;
    const results = await Promise.allSettled(
      paths.map(
        (path) =>
          new Promise<string>((resolve, reject) => {
            this.client.openssh_forwardInStreamLocal(path, (err) => (err ? reject(err) : resolve(path)));
          }),
      ),
    );
    for (const r of results) if (r.status === 'fulfilled') this.bound.push(r.value);
    const failed = results.findIndex((r) => r.status === 'rejected');
    if (failed < 0) return;
    const err = (results[failed] as PromiseRejectedResult).reason as Error;
    // ssh2 only says "Unable to bind"; the server's debug message (when it sends one) says why.
    const said = this.serverMessages.slice(before).join('; ');
    throw new SessionError(
      'forwarding-refused',
      `the node sshd refused to forward ${paths[failed]}: ${said || err.message}`,
      { cause: err },
    );
  }

  /** Cancels the forwards and closes their connections; safe to call twice. */
  async cancel(): Promise<void> {
    this.client.removeListener('unix connection', this.onConnection);
    for (const socket of this.open) socket.destroy();
    const paths = this.bound.splice(0);
    await Promise.all(
      paths.map(
        (path) =>
          new Promise<void>((resolve) => {
            try {
              this.client.openssh_unforwardInStreamLocal(path, () => resolve());
            } catch {
              resolve(); // The connection is already gone: nothing left to cancel.
            }
          }),
      ),
    );
  }

  /** accept(), advertising the granted window (ssh2 reads the connection's channelWindow as it accepts). */
  private acceptWithWindow(accept: AcceptConnection<Channel>): Channel {
    if (!this.options.window) return accept();
    const grant = this.options.window();
    setChannelWindow(this.client, grant.window);
    const channel = accept();
    channel.once('close', grant.release);
    return channel;
  }

  private handle(info: UNIXConnectionDetails, accept: AcceptConnection<Channel>, reject: RejectConnection): void {
    const target = this.byPath.get(info.socketPath);
    if (!target) {
      this.stats.refused += 1;
      reject();
      return;
    }
    if ('socks' in target) {
      // The destination is known only once the SOCKS conversation names it: accept, then converse.
      this.stats.connections += 1;
      this.traffic.opened('socks');
      target.socks.serve(this.acceptWithWindow(accept));
      return;
    }
    const dialedAt = performance.now();
    const forward = `${target.dialHost}:${target.port}`;
    const socket = this.options.dialer.dial(target.dialHost, target.port);
    socket.setTimeout(this.options.connectTimeoutMs ?? 10_000);
    const fail = (err: Error, timedOut = false) => {
      this.stats.refused += 1;
      const refused = err instanceof EndpointRefusedError;
      const code = (err as NodeJS.ErrnoException).code;
      const reason: DialFailure = refused
        ? 'policy'
        : timedOut
          ? 'timeout'
          : code === 'ECONNREFUSED'
            ? 'refused'
            : 'unreachable';
      dataPlane.failed(target.dialHost, reason);
      this.traffic.failed(forward);
      this.log.warn(refused ? 'endpoint refused by the endpoint policy' : 'endpoint unreachable', {
        endpoint: `${target.dialHost}:${target.port}`,
        error: err.message,
      });
      socket.destroy();
      reject();
    };
    socket.once('error', fail);
    socket.once('timeout', () => fail(new Error('connect timed out'), true));
    socket.once('connect', () => {
      socket.removeListener('error', fail);
      socket.setTimeout(0);
      this.stats.connections += 1;
      dataPlane.opened(target.dialHost, socket, (performance.now() - dialedAt) / 1000);
      this.traffic.opened(forward, socket);
      this.open.add(socket);
      const channel = this.acceptWithWindow(accept);
      const done = () => {
        // Count once, when the TCP side is gone.
        this.open.delete(socket);
        dataPlane.closed(socket);
        this.traffic.closed(forward, socket);
        this.stats.bytesToCluster += socket.bytesWritten;
        this.stats.bytesToJob += socket.bytesRead;
      };
      socket.once('close', done);
      // One pipeline per direction: an end on one side half-closes the other and leaves the reverse flowing.
      const abort = (err: Error | null) => {
        if (!err) return;
        socket.destroy();
        channel.destroy();
      };
      pipeline(channel, socket, abort);
      pipeline(socket, channel, abort);
    });
  }
}
