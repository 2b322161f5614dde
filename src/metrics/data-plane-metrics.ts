import { Counter, Gauge, Histogram, type Registry } from 'prom-client';

/**
 * The data plane's metrics: per endpoint (namespace and Service; a host or address outside the
 * cluster has namespace ""), never per pod. Fed with the deltas each thread's meter collects
 * (src/ssh/data-plane-meter.ts): "is the tunnel slow, or the service?".
 */

export type DialFailure = 'policy' | 'refused' | 'timeout' | 'unreachable';

export interface EndpointLabels {
  namespace: string;
  service: string;
}

export interface EndpointDelta extends EndpointLabels {
  toService: number;
  fromService: number;
  opened: number;
  closed: number;
  failures: Partial<Record<DialFailure, number>>;
  /** Seconds from the dial to the endpoint's connect, one per connection opened. */
  connectSeconds: number[];
}

/** What one thread's meter collected since its last report: per endpoint, of its carriers, and squeue. */
export interface DataPlaneReport {
  endpoints: EndpointDelta[];
  /** Keepalive round trips of its carriers to their batch hosts' sshd, in seconds. */
  carrierRttSeconds: number[];
  /** Times one of its channels had data to send and no window left (ssh2's Channel, patched). */
  windowStalls: number;
  /** squeue commands its login connections ran, and how many of them failed. */
  squeue: { queries: number; failures: number };
}

/** The data plane's series in one registry (a fleet member's), fed by reports. */
export class DataPlaneMetrics {
  /** The session host's own thread's meter, read when scraped (tunnel threads send theirs). */
  private ownReport: () => DataPlaneReport | undefined = () => undefined;
  private readonly forwardBytes: Counter<'namespace' | 'service' | 'direction'>;
  private readonly forwardConnections: Counter<'namespace' | 'service'>;
  private readonly forwardOpen: Gauge<'namespace' | 'service'>;
  private readonly dialFailures: Counter<'namespace' | 'service' | 'reason'>;
  private readonly connectSeconds: Histogram<'namespace' | 'service'>;
  private readonly carrierRtt: Histogram;
  private readonly windowStalls: Counter;
  readonly squeueQueries: Counter;
  readonly squeueFailures: Counter;

  constructor(registry: Registry) {
    const registers = [registry];
    const apply = (report: DataPlaneReport | undefined) => {
      if (report) this.apply(report);
    };
    const own = () => this.ownReport();
    this.forwardBytes = new Counter({
      name: 'backhaul_forward_bytes_total',
      help: 'Bytes carried by forwarded connections, by endpoint and direction (to_service: from the job to the endpoint).',
      labelNames: ['namespace', 'service', 'direction'] as const,
      registers,
      // Registered first of these, so a scrape applies this thread's deltas before it reads the others.
      collect() {
        apply(own());
      },
    });
    this.forwardConnections = new Counter({
      name: 'backhaul_forward_connections_total',
      help: 'Forwarded connections that reached their endpoint.',
      labelNames: ['namespace', 'service'] as const,
      registers,
    });
    this.forwardOpen = new Gauge({
      name: 'backhaul_forward_connections_open',
      help: 'Forwarded connections open now, by endpoint.',
      labelNames: ['namespace', 'service'] as const,
      registers,
    });
    this.dialFailures = new Counter({
      name: 'backhaul_forward_dial_failures_total',
      help: 'Connections from a job that did not reach their endpoint: refused by the endpoint policy, refused by the endpoint, timed out, or unreachable.',
      labelNames: ['namespace', 'service', 'reason'] as const,
      registers,
    });
    this.connectSeconds = new Histogram({
      name: 'backhaul_forward_connect_seconds',
      help: "Time from a job's connection to the endpoint's answer (the fleet's dial), by endpoint.",
      labelNames: ['namespace', 'service'] as const,
      buckets: [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5],
      registers,
    });
    this.carrierRtt = new Histogram({
      name: 'backhaul_carrier_rtt_seconds',
      help: "Keepalive round trips of the carriers to their batch hosts' sshd (through the login node): the tunnel's own latency.",
      buckets: [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5],
      registers,
    });
    this.windowStalls = new Counter({
      name: 'backhaul_channel_window_stalls_total',
      help: "Times one of the fleet's SSH channels (a forwarded connection, or a carrier's hop through the login node) had data to send and no window from the other side: it waited a round trip (a slow reader in the job, or a window too small for the path).",
      registers,
    });
    this.squeueQueries = new Counter({
      name: 'backhaul_squeue_queries_total',
      help: 'squeue commands run on the login node (one per login connection for all lookups asked at once).',
      registers,
      collect() {
        apply(own());
      },
    });
    this.squeueFailures = new Counter({
      name: 'backhaul_squeue_failures_total',
      help: 'squeue commands that failed (each is asked again twice before the lookups fail).',
      registers,
    });
  }

  /** Where the session host's own thread's report is read from when scraped. */
  reportFrom(source: () => DataPlaneReport | undefined): void {
    this.ownReport = source;
  }

  /** Adds one thread's report to the metrics. */
  apply(report: DataPlaneReport): void {
    for (const s of report.carrierRttSeconds) this.carrierRtt.observe(s);
    if (report.windowStalls > 0) this.windowStalls.inc(report.windowStalls);
    if (report.squeue.queries > 0) this.squeueQueries.inc(report.squeue.queries);
    if (report.squeue.failures > 0) this.squeueFailures.inc(report.squeue.failures);
    for (const d of report.endpoints) {
      const labels = { namespace: d.namespace, service: d.service };
      if (d.toService > 0) this.forwardBytes.inc({ ...labels, direction: 'to_service' }, d.toService);
      if (d.fromService > 0) this.forwardBytes.inc({ ...labels, direction: 'from_service' }, d.fromService);
      if (d.opened > 0) this.forwardConnections.inc(labels, d.opened);
      if (d.opened !== d.closed) this.forwardOpen.inc(labels, d.opened - d.closed);
      for (const [reason, n] of Object.entries(d.failures)) if (n) this.dialFailures.inc({ ...labels, reason }, n);
      for (const s of d.connectSeconds) this.connectSeconds.observe(labels, s);
    }
  }
}
