import { Counter, collectDefaultMetrics, Gauge, Registry } from 'prom-client';
import { DataPlaneMetrics } from './data-plane-metrics.js';

type PodCounter = () => Promise<Record<string, number>>;

/**
 * A fleet member's Prometheus metrics (`GET /metrics` on `--health-port`), in a registry of its own:
 * built once with the fleet (FleetDeps.metrics) and handed to what counts, so two fleets in one process
 * (the tests') count apart and nothing below the workers reaches for a module's counters.
 */
export class FleetMetrics {
  readonly registry = new Registry();
  readonly transitions: Counter<'to' | 'event'>;
  readonly casConflicts: Counter;
  readonly ignoredEvents: Counter<'event'>;
  readonly steps: Counter<'step' | 'outcome'>;
  readonly exhaustedSteps: Counter<'step'>;
  readonly deadlinesSent: Counter<'name'>;
  readonly outboxRepairs: Counter;
  readonly sshCrypto: Gauge<'path' | 'patched'>;
  readonly shadowsHeld: Gauge;
  readonly shadowsReasserted: Counter;
  readonly sessionEnds: Counter<'end'>;
  readonly jobsEndedWithoutTrap: Counter;
  /** Per endpoint, of the carriers, and squeue: fed by the threads' reports. */
  readonly dataPlane: DataPlaneMetrics;
  private tunnelLoads: () => readonly number[] = () => [];
  private countPods: PodCounter | undefined;

  constructor() {
    const registers = [this.registry];
    collectDefaultMetrics({ register: this.registry, prefix: 'backhaul_' });
    this.transitions = new Counter({
      name: 'backhaul_transitions_total',
      help: 'Transitions stored by this control worker, by the state entered and the event that caused them.',
      labelNames: ['to', 'event'] as const,
      registers,
    });
    this.casConflicts = new Counter({
      name: 'backhaul_cas_conflicts_total',
      help: "Compare-and-set writes of a pod's record that lost to another writer and were applied again.",
      registers,
    });
    this.ignoredEvents = new Counter({
      name: 'backhaul_events_ignored_total',
      help: 'Events that caused no transition (stale generation, state already passed, pod unknown).',
      labelNames: ['event'] as const,
      registers,
    });
    this.steps = new Counter({
      name: 'backhaul_steps_total',
      help: 'Step jobs run by this control worker, by step and outcome (done, failed, stale).',
      labelNames: ['step', 'outcome'] as const,
      registers,
    });
    this.exhaustedSteps = new Counter({
      name: 'backhaul_steps_exhausted_total',
      help: 'Step jobs that failed on every retry and were reported to the machine as STEP_FAILED.',
      labelNames: ['step'] as const,
      registers,
    });
    this.deadlinesSent = new Counter({
      name: 'backhaul_deadlines_sent_total',
      help: 'DEADLINE events sent by this control worker for deadlines that fell due.',
      labelNames: ['name'] as const,
      registers,
    });
    this.outboxRepairs = new Counter({
      name: 'backhaul_outbox_repairs_total',
      help: 'Pods whose effects a dead control worker left and this one ran again.',
      registers,
    });
    this.sshCrypto = new Gauge({
      name: 'backhaul_ssh_crypto_info',
      help: "1, labelled with the code that encrypts this process's SSH packets: native (ssh2's OpenSSL binding) or javascript (the slow fallback), and whether patches/ssh2 is applied.",
      labelNames: ['path', 'patched'] as const,
      registers,
    });
    const loads = () => this.tunnelLoads();
    new Gauge({
      name: 'backhaul_tunnel_thread_shadows',
      help: "Shadows each of this session host's tunnel threads carries (read when scraped; none with TunnelThreads 0).",
      labelNames: ['thread'] as const,
      registers,
      collect() {
        this.reset();
        for (const [thread, load] of loads().entries()) this.set({ thread: String(thread) }, load);
      },
    });
    this.shadowsHeld = new Gauge({
      name: 'backhaul_shadows_held',
      help: 'Shadow sessions this session host holds now.',
      registers,
    });
    this.shadowsReasserted = new Counter({
      name: 'backhaul_shadows_reasserted_total',
      help: 'Shadows whose lease this session host took again after Redis lost its data (their tunnels stayed up).',
      registers,
    });
    this.sessionEnds = new Counter({
      name: 'backhaul_session_ends_total',
      help: 'Shadow sessions that ended on this session host, by how they ended.',
      labelNames: ['end'] as const,
      registers,
    });
    this.jobsEndedWithoutTrap = new Counter({
      name: 'backhaul_jobs_ended_without_trap_total',
      help: "Slurm jobs that ended without running the prelude's trap (SIGKILL, the OOM killer): their socket dir was left on the node, and this session host removed it.",
      registers,
    });
    const pods = () => this.countPods;
    new Gauge({
      name: 'backhaul_pods',
      help: 'Pods known to the fleet, by the state of their machine (read from Redis when scraped; control role).',
      labelNames: ['state'] as const,
      registers,
      async collect() {
        const count = pods();
        if (!count) return;
        this.reset();
        for (const [state, n] of Object.entries(await count())) this.set({ state }, n);
      },
    });
    this.dataPlane = new DataPlaneMetrics(this.registry);
  }

  /** The session host with tunnel threads reports how many shadows each carries (read when scraped). */
  reportTunnelLoads(source: () => readonly number[]): void {
    this.tunnelLoads = source;
  }

  /** The control role reports the fleet's pods by state (one Redis pipeline per scrape); undefined stops it. */
  countPodsWith(fn: PodCounter | undefined): void {
    this.countPods = fn;
  }

  /** The exposition text and its content type, for the HTTP endpoint. */
  async text(): Promise<{ contentType: string; body: string }> {
    return { contentType: this.registry.contentType, body: await this.registry.metrics() };
  }
}
