import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { FleetMetrics } from '../../src/metrics/fleet-metrics.js';
import { dataPlane } from '../../src/ssh/data-plane-meter.js';
import type { LoginLease } from '../../src/ssh/login-pool.js';
import { findPodJob, jobLookup } from '../../src/ssh/slurm-queries.js';
import { type Harness, harness, stopHarness, uid } from '../../tools/sandbox/shadow-harness.js';
import { sbatch, waitForState } from '../../tools/sandbox/slurm.js';

/**
 * Pods' jobs are found with one squeue per login connection and user for all the lookups asked at once
 * (each shadow polls its job every 2 s while it is pending: one squeue per pod would be an RPC to
 * slurmctld per pod per poll). Real login sshd, real Slurm.
 */
/** A session host's metrics, fed by this thread's meter as the session host feeds them when scraped. */
const metrics = new FleetMetrics();
metrics.dataPlane.reportFrom(() => dataPlane.flush());

/** backhaul_squeue_queries_total, as /metrics reports it. */
async function counted(): Promise<number> {
  return (await metrics.dataPlane.squeueQueries.get()).values[0]?.value ?? 0;
}

describe('Slurm job lookup through the login node', () => {
  let h: Harness;
  let login: LoginLease;

  beforeAll(async () => {
    h = await harness('allowed', {});
    login = await h.access.pool.acquire(1);
  }, 60_000);

  afterAll(async () => {
    login?.release();
    await stopHarness(h);
  });

  it('answers 20 lookups asked at once (3 jobs, 17 unknown names, repeats) with 2 squeue commands', async () => {
    const pods = [uid(), uid(), uid()];
    const ids = await Promise.all(pods.map((p) => sbatch(h.site.user, '#!/bin/sh\nsleep 300\n', { jobName: p })));
    await Promise.all(ids.map((id) => waitForState(id, ['RUNNING'], 60_000)));
    const user = h.config.Network.SSH.User;
    const lookup = jobLookup(login.client, user);
    const before = lookup.queries;
    const metricBefore = await counted();
    const unknown = Array.from({ length: 14 }, () => uid());
    const names = [...pods, ...unknown, pods[0] as string, pods[1] as string, unknown[0] as string];
    const found = await Promise.all(names.map((name) => findPodJob(login.client, user, name)));
    // The first lookup starts a query at once; the 19 asked while it runs share the next one.
    expect(lookup.queries - before).toBe(2);
    expect(await counted()).toBe(metricBefore + 2);
    expect(found.slice(0, 3).map((j) => j?.jobId)).toEqual(ids);
    for (const job of found.slice(0, 3)) expect(job).toMatchObject({ phase: 'running', batchHost: 'bhnode1' });
    expect(found.slice(0, 3).map((j) => j?.name)).toEqual(pods);
    expect(found.slice(3, 17)).toEqual(Array(14).fill(undefined));
    expect(found.slice(17).map((j) => j?.jobId)).toEqual([ids[0], ids[1], undefined]);

    // A lookup alone, when nothing runs, is one query and no wait.
    const again = lookup.queries;
    expect((await findPodJob(login.client, user, pods[2] as string))?.jobId).toBe(ids[2]);
    expect(lookup.queries - again).toBe(1);
  }, 90_000);

  it('a lost login connection: squeue is asked 3 times, then every lookup of the batch fails; none hangs', async () => {
    const user = h.config.Network.SSH.User;
    const closed = new Promise<void>((resolve) => login.client.once('close', () => resolve()));
    login.client.end();
    await closed;
    const lookup = jobLookup(login.client, user);
    const before = lookup.queries;
    const results = await Promise.allSettled([uid(), uid(), uid()].map((name) => findPodJob(login.client, user, name)));
    for (const r of results) expect(r.status).toBe('rejected');
    // The first lookup's query and the batch of the other two, each tried 3 times (squeue only reads).
    expect(lookup.queries - before).toBe(6);
    const again = await Promise.race([
      findPodJob(login.client, user, uid()).then(
        () => 'answered',
        () => 'rejected',
      ),
      new Promise((resolve) => setTimeout(() => resolve('hung'), 5_000)),
    ]);
    expect(again).toBe('rejected');
  }, 30_000);
});
