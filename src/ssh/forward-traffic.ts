import type { Socket } from 'node:net';

/**
 * What one pod's forwards carry, per forward, for `backhaul status POD` (the metrics aggregate by
 * Service, never by pod). The session host writes it to Redis while the session lives (session-host.ts).
 */
export interface ForwardTraffic {
  /** The endpoint as the pod's annotation names it (host:port), or `socks`. */
  forward: string;
  /** Connections open now. */
  open: number;
  /** Connections that reached the endpoint since the session began. */
  opened: number;
  /** Connections that did not (refused by the policy or the endpoint, unreachable, timed out). */
  failed: number;
  /** Bytes from the job to the endpoint, and back: closed connections and open ones so far. */
  toService: number;
  fromService: number;
}

export interface SessionTraffic {
  /** The carrier's last keepalive round trip to the batch host's sshd, ms (absent before one). */
  rttMs?: number;
  forwards: ForwardTraffic[];
}

interface Tally {
  opened: number;
  failed: number;
  toService: number;
  fromService: number;
  live: Set<Socket>;
}

/** Counts one session's forwarded connections by forward. */
export class ForwardTally {
  private readonly byForward = new Map<string, Tally>();

  private tally(forward: string): Tally {
    let t = this.byForward.get(forward);
    if (!t) {
      t = { opened: 0, failed: 0, toService: 0, fromService: 0, live: new Set() };
      this.byForward.set(forward, t);
    }
    return t;
  }

  failed(forward: string): void {
    this.tally(forward).failed += 1;
  }

  /** A connection that reached its endpoint; SOCKET (the endpoint's side) is counted until closed() (no listener of its own). */
  opened(forward: string, socket?: Socket): void {
    const t = this.tally(forward);
    t.opened += 1;
    if (socket) t.live.add(socket);
  }

  /** SOCKET closed: its bytes are counted for good. */
  closed(forward: string, socket: Socket): void {
    const t = this.byForward.get(forward);
    if (!t?.live.delete(socket)) return;
    t.toService += socket.bytesWritten;
    t.fromService += socket.bytesRead;
  }

  snapshot(): ForwardTraffic[] {
    return [...this.byForward].map(([forward, t]) => {
      let toService = t.toService;
      let fromService = t.fromService;
      for (const socket of t.live) {
        toService += socket.bytesWritten;
        fromService += socket.bytesRead;
      }
      return { forward, open: t.live.size, opened: t.opened, failed: t.failed, toService, fromService };
    });
  }
}
