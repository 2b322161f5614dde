import { createRequire } from 'node:module';
import type { Socket } from 'node:net';
import type { DataPlaneReport, DialFailure, EndpointDelta, EndpointLabels } from '../metrics/data-plane-metrics.js';

export type { DialFailure } from '../metrics/data-plane-metrics.js';

/**
 * What the forwarded connections of one thread did, counted per endpoint (namespace and Service, never
 * per pod: the number of series stays that of the cluster's Services). Each thread meters its own
 * connections and the squeue commands of its login connections; the deltas go to the session host's
 * metrics (FleetMetrics.dataPlane): at scrape time from its own thread, every couple of seconds from each
 * tunnel thread.
 */

/** A Service's namespace and name from its cluster name (name.namespace.svc.<domain>); else the host as it is. */
export function endpointLabels(host: string): EndpointLabels {
  const m = /^([a-z0-9-]+)\.([a-z0-9-]+)\.svc(?:\.|$)/i.exec(host);
  return m?.[1] && m[2] ? { namespace: m[2], service: m[1] } : { namespace: '', service: host };
}

interface Tracked {
  labels: EndpointLabels;
  socket: Socket;
  written: number;
  read: number;
}

/** ssh2's count of window stalls on this thread (our patch to its Channel.js); undefined unpatched. */
const stallCounter = (createRequire(import.meta.url)('ssh2/lib/Channel.js') as { windowStalls?: { count: number } })
  .windowStalls;

export class DataPlaneMeter {
  private deltas = new Map<string, EndpointDelta>();
  private readonly open = new Map<Socket, Tracked>();
  private rtts: number[] = [];
  private stallsSeen = stallCounter?.count ?? 0;
  private squeue = { queries: 0, failures: 0 };

  /** One squeue command run on a login connection of this thread, and whether it failed. */
  squeueRan(failed: boolean): void {
    this.squeue.queries += 1;
    if (failed) this.squeue.failures += 1;
  }

  /** One keepalive round trip of a carrier, in seconds. */
  carrierRtt(seconds: number): void {
    if (Number.isFinite(seconds) && seconds >= 0) this.rtts.push(seconds);
  }

  private entry(labels: EndpointLabels): EndpointDelta {
    const key = `${labels.namespace}\u0000${labels.service}`;
    let d = this.deltas.get(key);
    if (!d) {
      d = { ...labels, toService: 0, fromService: 0, opened: 0, closed: 0, failures: {}, connectSeconds: [] };
      this.deltas.set(key, d);
    }
    return d;
  }

  /**
   * A connection to the endpoint at HOST is up after CONNECTSECONDS; its bytes are counted until closed()
   * (called by the connection's own close handler: an endpoint socket has listeners enough).
   */
  opened(host: string, socket: Socket, connectSeconds: number): void {
    const labels = endpointLabels(host);
    const d = this.entry(labels);
    d.opened += 1;
    d.connectSeconds.push(connectSeconds);
    this.open.set(socket, { labels, socket, written: 0, read: 0 });
  }

  closed(socket: Socket): void {
    const tracked = this.open.get(socket);
    if (!tracked) return;
    this.sample(tracked);
    this.open.delete(socket);
    this.entry(tracked.labels).closed += 1;
  }

  failed(host: string, reason: DialFailure): void {
    const d = this.entry(endpointLabels(host));
    d.failures[reason] = (d.failures[reason] ?? 0) + 1;
  }

  private sample(t: Tracked): void {
    const written = t.socket.bytesWritten;
    const read = t.socket.bytesRead;
    if (written === t.written && read === t.read) return;
    const d = this.entry(t.labels);
    d.toService += written - t.written;
    d.fromService += read - t.read;
    t.written = written;
    t.read = read;
  }

  /** What happened since the last call (open connections' bytes included); undefined when nothing did. */
  flush(): DataPlaneReport | undefined {
    for (const t of this.open.values()) this.sample(t);
    const endpoints = [...this.deltas.values()];
    this.deltas = new Map();
    const carrierRttSeconds = this.rtts;
    this.rtts = [];
    const stalls = stallCounter?.count ?? 0;
    const windowStalls = stalls - this.stallsSeen;
    this.stallsSeen = stalls;
    const squeue = this.squeue;
    this.squeue = { queries: 0, failures: 0 };
    if (endpoints.length === 0 && carrierRttSeconds.length === 0 && windowStalls === 0 && squeue.queries === 0) {
      return undefined;
    }
    return { endpoints, carrierRttSeconds, windowStalls, squeue };
  }
}

/** How often a tunnel thread sends its meter's deltas to the session host. */
export const DATA_PLANE_REPORT_MS = 2_000;

/** This thread's meter (a module instance per thread). */
export const dataPlane = new DataPlaneMeter();
