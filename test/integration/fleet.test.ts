import { readFile, rm, stat } from 'node:fs/promises';
import type { Server } from 'node:net';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseSiteConfig } from '../../src/contract/site-config.js';
import type { RunningFleet } from '../../src/fleet/fleet.js';
import { LOOPBACK_ENDPOINT_POLICY, NO_CLUSTER_CHECKS } from '../../tools/sandbox/loopback-site.js';
import {
  echoServer,
  exists,
  type Harness,
  harness,
  jobScript,
  MiB,
  planFor,
  uid,
  workload,
} from '../../tools/sandbox/shadow-harness.js';
import { cancelSubmittedJobs, sbatch, scancel, waitForState } from '../../tools/sandbox/slurm.js';
import { inProcessFleet, privateRedis, upsert, waitForPodState } from '../fixtures/fleet-harness.js';

const DB = 3;

describe('the fleet (control + session roles) on the loopback site', () => {
  let h: Harness;
  let echo: { server: Server; port: number };
  let redis: Awaited<ReturnType<typeof privateRedis>>;
  let fleet: RunningFleet;

  beforeAll(async () => {
    redis = await privateRedis(DB);
    h = await harness('allowed', {});
    const config = parseSiteConfig({
      ...JSON.parse(JSON.stringify(h.site.siteConfig)),
      Network: {
        SSH: {
          ...h.site.siteConfig.Network.SSH,
          Reverse: { ...h.site.siteConfig.Network.SSH.Reverse, PythonPath: '/usr/bin/python3', WaitForForwards: '60s' },
        },
      },
      Backhaul: {
        EndpointPolicy: LOOPBACK_ENDPOINT_POLICY,
        Kubernetes: NO_CLUSTER_CHECKS,
        Redis: { URL: redis.url },
        KeepaliveInterval: '2s',
        SocketCheckInterval: '1s',
        LeaseTTL: '3s',
        RetryBackoff: '200ms',
      },
    });
    h = { ...h, config };
    fleet = await inProcessFleet(config, redis.url, ['control', 'session'], 'host-a');
    echo = await echoServer();
  }, 120_000);

  afterAll(async () => {
    await cancelSubmittedJobs();
    await fleet?.stop();
    echo?.server.close();
    h?.access.pool.close();
    await h?.site.stop();
    if (h) await rm(h.workdir, { recursive: true, force: true });
    await redis?.close();
  });

  it('takes a pod from POD_UPSERT to active, serves its job, and is done and forgotten when the job ends', async () => {
    const podUid = uid();
    const forwards = `15200:127.0.0.1:${echo.port}`;
    const plan = planFor(h, podUid, forwards);
    const out = join(h.workdir, `${podUid}.out`);
    // The job lingers 3 s after its workload, so the test sees the pod active (the metrics below).
    const jobId = await sbatch(h.site.user, jobScript(h, plan, `${workload(15200, 10 * MiB)}sleep 3\n`), {
      jobName: podUid,
      output: out,
    });
    await upsert(fleet, podUid, 'p1', { 'interlink.eu/reverse-forwards': forwards });
    // While it runs, its tunnel is carried by one of the session host's tunnel threads, on ssh2's native crypto.
    await waitForPodState(fleet, podUid, 'active', 60_000);
    const metrics = await fleet.deps.metrics.registry.metrics();
    expect(metrics).toMatch(/^backhaul_ssh_crypto_info\{path="native",patched="yes"\} 1$/m);
    const loads = [...metrics.matchAll(/^backhaul_tunnel_thread_shadows\{thread="\d+"\} (\d+)$/gm)].map((m) =>
      Number(m[1]),
    );
    expect(loads.length, metrics).toBeGreaterThan(0);
    expect(
      loads.reduce((a, b) => a + b, 0),
      metrics,
    ).toBe(1);
    await waitForState(jobId, ['COMPLETED', 'FAILED'], 90_000);
    expect(await readFile(out, 'utf8')).toContain(`workload ${10 * MiB} ${10 * MiB} True`);
    await waitForPodState(fleet, podUid, null, 30_000);
    const history = await fleet.deps.store.history(podUid);
    const states = history.map((e) => e.to);
    expect(states).toEqual(
      expect.arrayContaining([
        'validating',
        'rendering',
        'launchingShadow',
        'waitingBatchHost',
        'active',
        'tearingDown',
        'done',
      ]),
    );
    expect(history.find((e) => e.event === 'SHADOW_UP')?.detail).toBe('host host-a');
    // Nothing left but the history, which expires.
    const keys = await redis.redis.keys(`bh:*${podUid}*`);
    expect(keys).toEqual([`bh:hist:${podUid}`]);
    expect(await redis.redis.ttl(`bh:hist:${podUid}`)).toBeGreaterThan(0);
  }, 150_000);

  it('tears down on POD_DELETED: no socket, no lease, no record', async () => {
    const podUid = uid();
    const forwards = `15201:127.0.0.1:${echo.port}`;
    const plan = planFor(h, podUid, forwards);
    const jobId = await sbatch(h.site.user, jobScript(h, plan, 'sleep 600\n'), { jobName: podUid });
    await upsert(fleet, podUid, 'p2', { 'interlink.eu/reverse-forwards': forwards });
    await waitForPodState(fleet, podUid, 'active', 60_000);
    expect((await stat(plan.forwards[0]?.socketPath ?? '')).isSocket()).toBe(true);
    await fleet.deps.queues.events.send(podUid, { type: 'POD_DELETED', at: Date.now() });
    await waitForPodState(fleet, podUid, null, 30_000);
    expect(await exists(plan.forwards[0]?.socketPath ?? '')).toBe(false);
    expect(await fleet.deps.leases.get(podUid)).toBeNull();
    await scancel(jobId);
  }, 120_000);

  it('refuses a pod with bad annotations: failed, with the reason, and nothing launched', async () => {
    const podUid = uid();
    await upsert(fleet, podUid, 'bad', { 'interlink.eu/reverse-forwards': 'kubernetes.default.svc.cluster.local:443' });
    await waitForPodState(fleet, podUid, 'failed', 20_000);
    const stored = await fleet.deps.store.load(podUid);
    const context = (
      stored?.snapshot as { context: { lastError: { kind: string; message: string }; generation: number } }
    ).context;
    expect(context.lastError.kind).toBe('invalid-pod');
    expect(context.lastError.message).toContain('listen port 443 is below 1024');
    expect(context.generation).toBe(0);
  }, 60_000);
});
