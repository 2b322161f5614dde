import { readFile, stat } from 'node:fs/promises';
import type { Server } from 'node:net';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { FleetMetrics } from '../../src/metrics/fleet-metrics.js';
import { dialRulesOf } from '../../src/ssh/endpoint-dial.js';
import type { ShadowEnd, ShadowPhase } from '../../src/ssh/shadow-session.js';
import { TunnelThreads } from '../../src/ssh/tunnel-threads.js';
import {
  carrierGone,
  echoServer,
  exists,
  type Harness,
  harness,
  jobScript,
  MiB,
  planFor,
  stopHarness,
  uid,
  waitFor,
  workload,
} from '../../tools/sandbox/shadow-harness.js';
import { jobState, sbatch, scancel, waitForState } from '../../tools/sandbox/slurm.js';

/**
 * Shadows in tunnel threads (src/ssh/tunnel-threads.ts): a worker thread runs the carrier and the
 * forwards, with login connections of its own ('per-thread') or the session host's reached through
 * byte pipes ('shared'). The same outcomes as a shadow on the session host's own thread
 * (shadow-session.test.ts), and a thread that dies costs its shadows, never the session host.
 */
describe.each([
  ['node', 'per-thread', {}],
  ['node', 'shared', {}],
  ['srun', 'per-thread', { Sshd: 'userspace', NodeExec: 'srun' }],
  ['srun', 'shared', { Sshd: 'userspace', NodeExec: 'srun' }],
] as const)('shadows in tunnel threads, %s carrier, login %s', (mode, login, reverse) => {
  let h: Harness;
  let echo: { server: Server; port: number };
  let threads: TunnelThreads;
  /** The session host's metrics, fed by the threads' reports as a fleet member's are. */
  const metrics = new FleetMetrics();
  const logs: string[] = [];

  beforeAll(async () => {
    h = await harness('allowed', reverse);
    echo = await echoServer();
    threads = await TunnelThreads.start(
      h.access,
      { threads: 2, login, onReport: (report) => metrics.dataPlane.apply(report) },
      {
        info: (d, m) => logs.push(`info ${m} ${JSON.stringify(d)}`),
        warn: (d, m) => logs.push(`warn ${m} ${JSON.stringify(d)}`),
      },
    );
  });

  afterAll(async () => {
    await threads?.close();
    echo?.server.close();
    await stopHarness(h);
  });

  function start(plan: ReturnType<typeof planFor>) {
    const phases: ShadowPhase[] = [];
    const warnings: string[] = [];
    const shadow = threads.startShadow({
      plan,
      pool: h.access.pool,
      site: h.access.carrier,
      onPhase: (p) => phases.push(p),
      log: { warn: (m) => warnings.push(m), info: () => undefined },
      nodeWaitTimeoutMs: 60_000,
      jobPollMs: 200,
      socketCheckMs: 1_000,
      dialRules: dialRulesOf(h.config),
    });
    const ended: Promise<ShadowEnd> = shadow.run();
    return { shadow, phases, warnings, ended };
  }

  /** A metric's value for the echo endpoint (namespace "", service 127.0.0.1), summed over other labels. */
  async function endpointMetric(name: string, extra: Record<string, string> = {}, sample = name): Promise<number> {
    const metric = metrics.registry.getSingleMetric(name);
    const values = metric ? (await metric.get()).values : [];
    return values
      .filter(
        (v) =>
          ((v as { metricName?: string }).metricName ?? name) === sample &&
          v.labels.service === '127.0.0.1' &&
          Object.entries(extra).every(([k, want]) => String(v.labels[k as keyof typeof v.labels]) === want),
      )
      .reduce((n, v) => n + v.value, 0);
  }

  it('carries 100 MiB both ways byte-identical for a client in the job, and ends with the job; /metrics counts every byte', async () => {
    const bytesBefore = await Promise.all(
      ['to_service', 'from_service'].map((direction) => endpointMetric('backhaul_forward_bytes_total', { direction })),
    );
    const connectionsBefore = await endpointMetric('backhaul_forward_connections_total');
    const podUid = uid();
    const plan = planFor(h, podUid, `15000:127.0.0.1:${echo.port}`);
    expect(plan.carrier.mode).toBe(mode);
    const out = join(h.workdir, `${podUid}.out`);
    const jobId = await sbatch(h.site.user, jobScript(h, plan, workload(15000, (mode === 'srun' ? 4 : 100) * MiB)), {
      jobName: podUid,
      output: out,
    });
    const { phases, ended } = start(plan);
    const seen = async () =>
      `phases: ${JSON.stringify(phases)}; job output: ${await readFile(out, 'utf8').catch(() => '')}; logs: ${logs.join('\n')}`;
    await waitForState(jobId, ['COMPLETED', 'FAILED', 'CANCELLED'], 120_000).catch(async (err: Error) => {
      throw new Error(`${err.message}; ${await seen()}`);
    });
    const text = await readFile(out, 'utf8');
    expect(text, `phases: ${JSON.stringify(phases)}; logs: ${logs.join('\n')}`).toContain(
      `workload ${(mode === 'srun' ? 4 : 100) * MiB} ${(mode === 'srun' ? 4 : 100) * MiB} True`,
    );
    expect(phases.map((p) => p.type).slice(0, 4)).toEqual([
      'SHADOW_UP',
      'BATCH_HOST',
      'CARRIER_OPEN',
      'FORWARDS_READY',
    ]);
    expect((await ended).type).toBe('JOB_ENDED');
    expect(await exists(plan.socketDir)).toBe(false);
    await waitFor('login lease given back', () => (threads.loginLeases === 0 ? true : undefined), 5_000);
    // The thread's meter reports every couple of seconds: the bytes the workload moved, each way, once.
    const moved = (mode === 'srun' ? 4 : 100) * MiB;
    const counted = async () =>
      Promise.all(
        ['to_service', 'from_service'].map(
          async (direction, i) =>
            (await endpointMetric('backhaul_forward_bytes_total', { direction })) - (bytesBefore[i] ?? 0),
        ),
      );
    // The bytes and the connection's close may come in two reports (a report samples an open socket).
    const open = () => endpointMetric('backhaul_forward_connections_open');
    await waitFor(
      'the bytes and the closed connection counted in /metrics',
      async () => ((await counted()).every((n) => n === moved) && (await open()) === 0 ? true : undefined),
      10_000,
    ).catch(async (err: Error) => {
      throw new Error(
        `${err.message}: counted ${JSON.stringify(await counted())} of ${moved} each way, ${await open()} open`,
      );
    });
    expect((await endpointMetric('backhaul_forward_connections_total')) - connectionsBefore).toBe(1);
    expect(await endpointMetric('backhaul_forward_connections_open')).toBe(0);
    expect(
      await endpointMetric('backhaul_forward_connect_seconds', {}, 'backhaul_forward_connect_seconds_count'),
    ).toBeGreaterThan(0);
  }, 180_000);

  it('close() ends the shadow in its thread: no socket, no carrier step or process; the job goes on', async () => {
    const podUid = uid();
    const plan = planFor(h, podUid, `15002:127.0.0.1:${echo.port} 15003:127.0.0.1:${echo.port}`);
    const jobId = await sbatch(h.site.user, jobScript(h, plan, 'sleep 600\n'), { jobName: podUid });
    const { shadow, phases, warnings, ended } = start(plan);
    await waitFor('forwards', () => phases.some((p) => p.type === 'FORWARDS_READY'), 60_000).catch((err: Error) => {
      throw new Error(
        `${err.message}: phases ${JSON.stringify(phases)}; warnings ${warnings.join(' | ')}; logs ${logs.join(' | ')}`,
      );
    });
    for (const f of plan.forwards) expect((await stat(f.socketPath)).isSocket()).toBe(true);
    await Promise.all([shadow.close('operator'), shadow.close('again')]);
    expect(await ended).toEqual({ type: 'CLOSED', reason: 'operator' });
    for (const f of plan.forwards) expect(await exists(f.socketPath)).toBe(false);
    expect((await jobState(jobId)).state).toBe('RUNNING');
    await carrierGone(h, plan, jobId);
    expect(threads.loads.reduce((a, b) => a + b, 0)).toBe(0);
    await waitFor('login lease given back', () => (threads.loginLeases === 0 ? true : undefined), 5_000);
    await scancel(jobId);
  }, 120_000);

  it('a tunnel thread that dies ends its shadows as lost carriers, leaves no lease, and is replaced', async () => {
    const podUid = uid();
    const plan = planFor(h, podUid, `15004:127.0.0.1:${echo.port}`);
    const jobId = await sbatch(h.site.user, jobScript(h, plan, 'sleep 600\n'), { jobName: podUid });
    const { phases, warnings, ended } = start(plan);
    await waitFor('forwards', () => phases.some((p) => p.type === 'FORWARDS_READY'), 60_000).catch((err: Error) => {
      throw new Error(`${err.message}: phases ${JSON.stringify(phases)}; warnings ${warnings.join(' | ')}`);
    });
    const index = threads.loads.findIndex((n) => n > 0);
    expect(index, `loads ${JSON.stringify(threads.loads)}`).toBeGreaterThanOrEqual(0);
    await threads.killThread(index);
    const end = await ended;
    expect(end, JSON.stringify(phases)).toMatchObject({ type: 'CARRIER_LOST' });
    expect(phases.at(-1)).toMatchObject({
      type: 'CARRIER_LOST',
      reason: expect.stringContaining(`tunnel thread ${index}`),
    });
    expect(threads.loads.reduce((a, b) => a + b, 0)).toBe(0);
    expect(threads.loginLeases).toBe(0);
    // The replacement takes new shadows: the same pod's next generation comes up in it.
    const again = start(plan);
    await waitFor('forwards again', () => again.phases.some((p) => p.type === 'FORWARDS_READY'), 60_000).catch(
      (err: Error) => {
        throw new Error(
          `${err.message}: phases ${JSON.stringify(again.phases)}; warnings ${again.warnings.join(' | ')}`,
        );
      },
    );
    await again.shadow.close('test');
    expect((await again.ended).type).toBe('CLOSED');
    for (const f of plan.forwards) expect(await exists(f.socketPath)).toBe(false);
    await scancel(jobId);
  }, 150_000);
});
