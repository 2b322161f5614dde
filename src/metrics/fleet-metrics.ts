import { Counter, collectDefaultMetrics, Gauge } from 'prom-client';
import { registry } from './registry.js';
// The data plane's metrics (per endpoint) are the fleet's too: registered wherever these are.
import './data-plane-metrics.js';

export { registry };

/**
 * The fleet member's Prometheus metrics (`GET /metrics` on `--health-port`). One set per process: a
 * process runs one fleet member, and the pieces that count (the Slurm job lookup, the session host, the
 * control worker) are reached from places that do not share other state.
 */
collectDefaultMetrics({ register: registry, prefix: 'backhaul_' });

export const transitions = new Counter({
  name: 'backhaul_transitions_total',
  help: 'Transitions stored by this control worker, by the state entered and the event that caused them.',
  labelNames: ['to', 'event'] as const,
  registers: [registry],
});

export const casConflicts = new Counter({
  name: 'backhaul_cas_conflicts_total',
  help: "Compare-and-set writes of a pod's record that lost to another writer and were applied again.",
  registers: [registry],
});

export const ignoredEvents = new Counter({
  name: 'backhaul_events_ignored_total',
  help: 'Events that caused no transition (stale generation, state already passed, pod unknown).',
  labelNames: ['event'] as const,
  registers: [registry],
});

export const steps = new Counter({
  name: 'backhaul_steps_total',
  help: 'Step jobs run by this control worker, by step and outcome (done, failed, stale).',
  labelNames: ['step', 'outcome'] as const,
  registers: [registry],
});

export const exhaustedSteps = new Counter({
  name: 'backhaul_steps_exhausted_total',
  help: 'Step jobs that failed on every retry and were reported to the machine as STEP_FAILED.',
  labelNames: ['step'] as const,
  registers: [registry],
});

export const deadlinesSent = new Counter({
  name: 'backhaul_deadlines_sent_total',
  help: 'DEADLINE events sent by this control worker for deadlines that fell due.',
  labelNames: ['name'] as const,
  registers: [registry],
});

export const outboxRepairs = new Counter({
  name: 'backhaul_outbox_repairs_total',
  help: 'Pods whose effects a dead control worker left and this one ran again.',
  registers: [registry],
});

export const squeueQueries = new Counter({
  name: 'backhaul_squeue_queries_total',
  help: 'squeue commands run on the login node (one per login connection for all lookups asked at once).',
  registers: [registry],
});

export const squeueFailures = new Counter({
  name: 'backhaul_squeue_failures_total',
  help: 'squeue commands that failed (each is asked again twice before the lookups fail).',
  registers: [registry],
});

export const sshCrypto = new Gauge({
  name: 'backhaul_ssh_crypto_info',
  help: "1, labelled with the code that encrypts this process's SSH packets: native (ssh2's OpenSSL binding) or javascript (the slow fallback), and whether patches/ssh2 is applied.",
  labelNames: ['path', 'patched'] as const,
  registers: [registry],
});

/** What the tunnel-thread gauge reads when scraped (set by the session host that has threads). */
let tunnelLoads: () => readonly number[] = () => [];
export function reportTunnelLoads(source: () => readonly number[]): void {
  tunnelLoads = source;
}

export const tunnelThreadShadows = new Gauge({
  name: 'backhaul_tunnel_thread_shadows',
  help: "Shadows each of this session host's tunnel threads carries (read when scraped; none with TunnelThreads 0).",
  labelNames: ['thread'] as const,
  registers: [registry],
  collect() {
    this.reset();
    for (const [thread, load] of tunnelLoads().entries()) this.set({ thread: String(thread) }, load);
  },
});

export const shadowsHeld = new Gauge({
  name: 'backhaul_shadows_held',
  help: 'Shadow sessions this session host holds now.',
  registers: [registry],
});

export const shadowsReasserted = new Counter({
  name: 'backhaul_shadows_reasserted_total',
  help: 'Shadows whose lease this session host took again after Redis lost its data (their tunnels stayed up).',
  registers: [registry],
});

export const sessionEnds = new Counter({
  name: 'backhaul_session_ends_total',
  help: 'Shadow sessions that ended on this session host, by how they ended.',
  labelNames: ['end'] as const,
  registers: [registry],
});

export const jobsEndedWithoutTrap = new Counter({
  name: 'backhaul_jobs_ended_without_trap_total',
  help: "Slurm jobs that ended without running the prelude's trap (SIGKILL, the OOM killer): their socket dir was left on the node, and this session host removed it.",
  registers: [registry],
});

type PodCounter = () => Promise<Record<string, number>>;
let countPods: PodCounter | undefined;

new Gauge({
  name: 'backhaul_pods',
  help: 'Pods known to the fleet, by the state of their machine (read from Redis when scraped; control role).',
  labelNames: ['state'] as const,
  registers: [registry],
  async collect() {
    if (!countPods) return;
    this.reset();
    for (const [state, n] of Object.entries(await countPods())) this.set({ state }, n);
  },
});

/** The control role reports the fleet's pods by state (one Redis pipeline per scrape). */
export function countPodsWith(fn: PodCounter | undefined): void {
  countPods = fn;
}

/** The exposition text and its content type, for the HTTP endpoint. */
export async function metricsText(): Promise<{ contentType: string; body: string }> {
  return { contentType: registry.contentType, body: await registry.metrics() };
}
