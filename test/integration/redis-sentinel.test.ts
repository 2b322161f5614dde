import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { FleetDeps } from '../../src/pods/fleet-deps.js';
import { uid, waitFor } from '../../tools/sandbox/shadow-harness.js';
import { cancelSubmittedJobs } from '../../tools/sandbox/slurm.js';
import { killWorkers, startWorker, type WorkerProcess, workerStarted } from '../../tools/sandbox/worker-process.js';
import {
  allActive,
  failedProbes,
  failsAfter,
  oksAfter,
  prober,
  slowestProbe,
  timelines,
} from '../fixtures/fault-probes.js';
import { type ProcessFleetSite, processFleetSite, submitPod } from '../fixtures/fleet-harness.js';
import { SentinelSet } from '../fixtures/redis-sentinel.js';

/**
 * The fleet on Redis with Sentinel (a master, two replicas, three sentinels), through
 * `redis+sentinel://…/bh`: the master is killed (kill -9) under active pods and pods in setup; the
 * sentinels promote a replica, the fleet follows it, no tunnel drops and the pods in setup come up.
 * Then the old master comes back and is made a replica of the new one; the fleet carries on.
 */
describe('Redis with Sentinel: the master killed under active pods', () => {
  let sentinels: SentinelSet;
  let site: ProcessFleetSite;
  let deps: FleetDeps;
  const workers: WorkerProcess[] = [];

  beforeAll(async () => {
    sentinels = await SentinelSet.start();
    site = await processFleetSite(sentinels.url);
    deps = site.deps;
  }, 120_000);

  afterAll(async () => {
    await killWorkers(workers);
    await cancelSubmittedJobs();
    await site?.close();
    await sentinels?.stop();
  });

  /** As the issue asks: 20 pods active (each probing its forward) and 10 in setup when the master dies. */
  const ACTIVE = 20;
  const IN_SETUP = 10;

  it(`follows the promoted replica under ${ACTIVE} active pods and ${IN_SETUP} in setup: no probe fails, no shadow is replaced, the pods in setup come up; the old master returns as a replica`, async () => {
    const control = startWorker(site.configPath, sentinels.url, 'control', 'control-sentinel');
    const host = startWorker(site.configPath, sentinels.url, 'session', 'host-sentinel');
    workers.push(control, host);
    await Promise.all([workerStarted(control), workerStarted(host)]);

    const active = Array.from({ length: ACTIVE }, (_, i) => ({ uid: uid(), port: 15600 + i }));
    const outs = active.map((p) => join(site.h.workdir, `${p.uid}.out`));
    for (const [i, p] of active.entries()) {
      await submitPod(site, p.uid, `sentinel-${i}`, `${p.port}:127.0.0.1:${site.echo.port}`, prober(p.port), outs[i]);
    }
    const uids = active.map((p) => p.uid);
    await waitFor('the pods active', () => allActive(deps, uids), 90_000);
    const generations = () =>
      Promise.all(
        uids.map(
          async (u) =>
            ((await deps.store.load(u))?.snapshot as { context?: { generation?: number } } | undefined)?.context
              ?.generation,
        ),
      );
    const before = await generations();

    const oldMaster = (await sentinels.masterPort()) ?? 0;
    expect(oldMaster).toBe(sentinels.dataPorts[0]);
    // Pods submitted just before the kill: their setup runs through the failover.
    const setup = Array.from({ length: IN_SETUP }, () => uid());
    await Promise.all(
      setup.map((u, i) =>
        submitPod(site, u, `sentinel-setup-${i}`, `${15640 + i}:127.0.0.1:${site.echo.port}`, 'sleep 600\n'),
      ),
    );
    const killedAt = Date.now();
    await sentinels.kill(oldMaster);
    const promoted = await waitFor(
      'a replica promoted',
      async () => {
        const port = await sentinels.masterPort();
        return port !== undefined && port !== oldMaster ? port : undefined;
      },
      30_000,
    );
    const promotedAt = Date.now();
    const everyone = [...uids, ...setup];
    const recovered = await waitFor(
      'every pod active, the active ones through again',
      async () => {
        const texts = await Promise.all(outs.map((o) => readFile(o, 'utf8').catch(() => '')));
        return texts.every((t) => oksAfter(t, promotedAt) > 0) && (await allActive(deps, everyone))
          ? Date.now()
          : undefined;
      },
      120_000,
    ).catch(async (err: Error) => {
      throw new Error(
        `${err.message}\n${await timelines(deps, everyone)}\ncontrol log: ${control.log().slice(-2000)}\nhost log: ${host.log().slice(-2000)}`,
      );
    });
    const texts = await Promise.all(outs.map((o) => readFile(o, 'utf8')));
    const failsDuring = texts.map((t) => failsAfter(t, killedAt));
    console.log(
      `master ${oldMaster} killed: replica ${promoted} promoted ${promotedAt - killedAt} ms after; every pod active (${IN_SETUP} in setup) ${recovered - killedAt} ms after the kill; failed probes per active pod: ${failsDuring.join(', ')}; the slowest took ${slowestProbe(texts, killedAt)} ms\n${await timelines(deps, everyone)}`,
    );
    // The tunnels never needed Redis: nothing failed, no shadow was replaced, one lease per pod.
    expect(failsDuring, `${failedProbes(uids, texts, killedAt)}\nhost log: ${host.log().slice(-4000)}`).toEqual(
      active.map(() => 0),
    );
    expect(await generations()).toEqual(before);
    expect((await deps.leases.list()).leases).toHaveLength(everyone.length);

    // The old master comes back (empty): the sentinels make it a replica of the new master.
    await sentinels.restart(oldMaster);
    await waitFor(
      'the old master a replica',
      async () => ((await sentinels.role(oldMaster)) === 'slave' ? true : undefined),
      30_000,
    );
    // The fleet must follow whichever master the sentinels name: with down-after 1 s, a CI machine under
    // this load once made them fail the promoted master over to the other replica too (a second, false
    // failover), which the fleet rode through as well. Only the old master may not be it.
    const master = await sentinels.masterPort();
    expect(master, `promoted ${promoted}, now ${master}`).not.toBe(oldMaster);
    expect(sentinels.dataPorts).toContain(master);
    const after = uid();
    await submitPod(site, after, 'sentinel-after', `15660:127.0.0.1:${site.echo.port}`, 'sleep 600\n');
    await waitFor('a pod submitted after it active', () => allActive(deps, [after]), 90_000);
    expect(await allActive(deps, everyone)).toBe(true);
    expect(control.child.exitCode).toBeNull();
    expect(host.child.exitCode).toBeNull();
    // No connection of either worker, BullMQ's included, closed for good on the way (src/store/lost-connections.ts).
    expect(control.log(), 'control worker log').not.toContain('closed for good');
    expect(host.log(), 'session host log').not.toContain('closed for good');
  }, 360_000);
});
