import { connect, type Socket } from 'node:net';
import { pipeline } from 'node:stream';
import type { AcceptConnection, Channel, Client, RejectConnection, UNIXConnectionDetails } from 'ssh2';
import type { ForwardLog, ForwardStats, ForwardTarget } from '../src/ssh/reverse-forwards.js';
import { SessionError } from '../src/ssh/session-error.js';

/**
 * EXPERIMENT for bench/tunnel.ts (BENCH_EXPERIMENT=1): a copy of src/ssh/reverse-forwards.ts
 * (ReverseForwards) with knobs on its data path, to measure changes side by side with the real
 * one before proposing them. Only handle() differs; everything else is the original.
 */
export interface ForwardTuning {
  /**
   * Channel -> TCP (job -> cluster): cork the TCP socket at the first chunk and uncork on the next
   * tick ('tick') or after the event loop's poll phase ('immediate'), so the SSH packets (<= 32 KiB
   * each) that one read of the carrier delivers go out in one writev instead of one write each.
   */
  batch: 'off' | 'tick' | 'immediate';
  /** highWaterMark of the TCP socket (both sides); Node's default is 16 KiB. */
  highWaterMark?: number;
}

/**
 * The `streamlocal-forward@openssh.com` requests of one carrier and the connections they bring.
 * Each socket reaches only its declared endpoint; the endpoint is connected before the channel is
 * accepted, so a job whose endpoint is down sees its connection closed instead of a silent hang.
 */
export class ExperimentalReverseForwards {
  readonly stats: ForwardStats = { connections: 0, refused: 0, bytesToCluster: 0, bytesToJob: 0 };
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
    private readonly tuning: ForwardTuning,
    private readonly connectTimeoutMs = 10_000,
  ) {
    this.byPath = new Map(targets.map((t) => [t.socketPath, t]));
    client.on('unix connection', this.onConnection);
  }

  /** Binds every socket; the first refusal is a SessionError carrying the server's own reason. */
  async establish(): Promise<void> {
    for (const path of this.byPath.keys()) {
      if (this.bound.includes(path)) continue;
      const before = this.serverMessages.length;
      await new Promise<void>((resolve, reject) => {
        this.client.openssh_forwardInStreamLocal(path, (err) => {
          if (!err) return resolve();
          // ssh2 only says "Unable to bind"; the server's debug message (when it sends one) says why.
          const said = this.serverMessages.slice(before).join('; ');
          reject(
            new SessionError('forwarding-refused', `the node sshd refused to forward ${path}: ${said || err.message}`, {
              cause: err,
            }),
          );
        });
      });
      this.bound.push(path);
    }
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

  private handle(info: UNIXConnectionDetails, accept: AcceptConnection<Channel>, reject: RejectConnection): void {
    const target = this.byPath.get(info.socketPath);
    if (!target) {
      this.stats.refused += 1;
      reject();
      return;
    }
    const socket = connect({
      host: target.dialHost,
      port: target.port,
      allowHalfOpen: true,
      noDelay: true,
      ...(this.tuning.highWaterMark ? { highWaterMark: this.tuning.highWaterMark } : {}),
    });
    socket.setTimeout(this.connectTimeoutMs);
    const fail = (err: Error) => {
      this.stats.refused += 1;
      this.log.warn('endpoint unreachable', { endpoint: `${target.dialHost}:${target.port}`, error: err.message });
      socket.destroy();
      reject();
    };
    socket.once('error', fail);
    socket.once('timeout', () => fail(new Error('connect timed out')));
    socket.once('connect', () => {
      socket.removeListener('error', fail);
      socket.setTimeout(0);
      this.stats.connections += 1;
      this.open.add(socket);
      const channel = accept();
      const done = () => {
        // Count once, when the TCP side is gone.
        this.open.delete(socket);
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
      const batch = this.tuning.batch;
      if (batch !== 'off') {
        let corked = false;
        const uncork = () => {
          corked = false;
          socket.uncork();
        };
        // Registered before the pipeline's own listener: the socket is corked before the first write.
        channel.on('data', () => {
          if (corked) return;
          corked = true;
          socket.cork();
          if (batch === 'tick') process.nextTick(uncork);
          else setImmediate(uncork);
        });
      }
      pipeline(channel, socket, abort);
      pipeline(socket, channel, abort);
    });
  }
}

/**
 * EXPERIMENT: the login connection's TCP socket made here instead of by ssh2, with TCP_NODELAY and,
 * unless 'nodelay', corked from its first write until the next tick / the end of the poll phase, so
 * that the SSH packets ssh2 writes one by one (<= 32 KiB each, and the small tail of every inner
 * packet that did not fit the outer one) leave in one writev.
 */
export async function loginSocket(host: string, port: number, mode: 'nodelay' | 'tick' | 'immediate'): Promise<Socket> {
  const socket = connect({ host, port, noDelay: true });
  await new Promise<void>((resolve, reject) => {
    socket.once('connect', resolve);
    socket.once('error', reject);
  });
  if (mode === 'nodelay') return socket;
  const write = socket.write.bind(socket) as (...args: unknown[]) => boolean;
  let corked = false;
  const uncork = () => {
    corked = false;
    socket.uncork();
  };
  socket.write = ((...args: unknown[]) => {
    if (!corked) {
      corked = true;
      socket.cork();
      if (mode === 'tick') process.nextTick(uncork);
      else setImmediate(uncork);
    }
    return write(...args);
  }) as typeof socket.write;
  return socket;
}
