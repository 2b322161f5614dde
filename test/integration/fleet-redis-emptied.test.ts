import { mkdtemp, readdir, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ANNOTATION } from '../../src/contract/annotations.js';
import type { FleetDeps } from '../../src/pods/fleet-deps.js';
import { NO_CLUSTER_CHECKS } from '../../tools/sandbox/loopback-site.js';
import { jobScript, planFor, waitFor } from '../../tools/sandbox/shadow-harness.js';
import { cancelSubmittedJobs, sbatch, scontrol } from '../../tools/sandbox/slurm.js';
import { freePort } from '../../tools/sandbox/sshd.js';
import { killWorkers, startWorker, type WorkerProcess, workerStarted } from '../../tools/sandbox/worker-process.js';
import { failedProbes, failsAfter, oksAfter, prober, timelines } from '../fixtures/fault-probes.js';
import { type ProcessFleetSite, processFleetSite } from '../fixtures/fleet-harness.js';
import { type KubeHarness, kubeHarness, reversePod, VIRTUAL_NODE } from '../fixtures/kube-harness.js';
import { RedisServer } from '../fixtures/redis-server.js';

/**
 * Redis restarted with none of its data (a Redis pod rescheduled without its volume; a replica promoted
 * with no copy) while pods are active and one waits for its node. The tunnels are the jobs' and live on
 * the session host: it must keep them, re-assert its leases and registration, and the watch role must
 * rebuild each pod's record from the API server at once, the record taking back the shadow it had.
 */
/** Pods active (each probing its forward) when Redis empties; one more waits for its node. */
const ACTIVE = 12;

describe('Redis restarted empty under active pods', () => {
  let kube: KubeHarness;
  let redis: RedisServer;
  let site: ProcessFleetSite;
  let deps: FleetDeps;
  const workers: WorkerProcess[] = [];

  beforeAll(async () => {
    kube = await kubeHarness();
    redis = new RedisServer(await freePort(), await mkdtemp(join(tmpdir(), 'bh-redis-')));
    await redis.start();
    site = await processFleetSite(
      redis.url,
      {},
      {
        Kubernetes: {
          Kubeconfig: kube.kubeconfigFile,
          VirtualNodes: [VIRTUAL_NODE],
          ...NO_CLUSTER_CHECKS,
          PodCondition: false,
          // Only the loss may bring the records back in time: the periodic resync is far off.
          ResyncInterval: '10m',
        },
      },
    );
    deps = site.deps;
  }, 120_000);

  afterAll(async () => {
    await killWorkers(workers);
    await cancelSubmittedJobs();
    await site?.close();
    await redis?.crash();
    if (redis) await rm(redis.dir, { recursive: true, force: true });
    await kube?.close();
  });

  /** A pod in the fake cluster, scheduled to the virtual node, and its Slurm job (the prelude, then a prober). */
  async function pod(name: string, port: number, sbatchArgs: string[] = []) {
    const forwards = `${port}:127.0.0.1:${site.echo.port}`;
    kube.api.createPod(reversePod(name, { [ANNOTATION.forwards]: forwards }));
    const podUid = kube.api.schedule('user', name, VIRTUAL_NODE).metadata.uid as string;
    const plan = planFor(site.h, podUid, forwards);
    const out = join(site.h.workdir, `${name}.out`);
    const jobId = await sbatch(site.h.site.user, jobScript(site.h, plan, prober(port)), {
      jobName: podUid,
      output: out,
      args: sbatchArgs,
    });
    return { name, uid: podUid, out, jobId, plan };
  }

  const view = async (podUid: string) => {
    const stored = await deps.store.load(podUid).catch(() => null);
    const context = (stored?.snapshot as { context?: { generation?: number; host?: string } } | undefined)?.context;
    return { state: stored?.state, generation: context?.generation, host: context?.host };
  };

  it('keeps every tunnel (no probe fails), re-asserts its leases and registration, and each rebuilt record takes its shadow back; the pod that waited for its node comes up; nothing left after', async () => {
    const control = startWorker(site.configPath, redis.url, 'control,watch', 'control-e');
    const host = startWorker(site.configPath, redis.url, 'session', 'host-e');
    workers.push(control, host);
    await Promise.all([workerStarted(control), workerStarted(host)]);

    const active = await Promise.all(Array.from({ length: ACTIVE }, (_, i) => pod(`emptied-${i}`, 15600 + i)));
    const uids = active.map((p) => p.uid);
    const seen = async () =>
      `${await timelines(deps, uids)}\nhost log: ${host.log().slice(-4000)}\ncontrol log: ${control.log().slice(-3000)}`;
    await waitFor(
      'the pods active',
      async () => ((await Promise.all(uids.map(view))).every((v) => v.state === 'active') ? true : undefined),
      90_000,
    ).catch(async (err: Error) => {
      throw new Error(`${err.message}\n${await seen()}`);
    });
    const before = await Promise.all(uids.map(view));
    // A pod whose job waits for its node (held until after the loss): it is in setup when Redis empties.
    const waiting = await pod('emptied-waiting', 15640, ['--hold']);
    await waitFor('the waiting pod launched', async () =>
      (await view(waiting.uid)).state === 'waitingBatchHost' ? true : undefined,
    );

    // The fleet's epoch (redis/epoch-check.lua), which nothing deletes: a new one after the restart proves
    // Redis came back empty. The records themselves cannot: the watch role may rebuild them before this
    // process has reconnected to look (seen in CI under load: all 13 back by then).
    const epochBefore = await deps.redis.hget(deps.keys.epoch(), 'id');
    expect(epochBefore, 'the fleet keeps an epoch').toBeTruthy();
    const emptiedAt = Date.now();
    await redis.restartEmpty();
    const restartedAt = Date.now();
    const epochAfter = await waitFor(
      'the fleet to find its epoch gone and write another',
      async () => (await deps.redis.hget(deps.keys.epoch(), 'id')) ?? undefined,
      30_000,
    );
    expect(epochAfter, 'the epoch after the restart').not.toBe(epochBefore);

    const back = await waitFor(
      'every record rebuilt and active on its kept shadow',
      async () => {
        const now = await Promise.all(uids.map(view));
        return now.every(
          (v, i) => v.state === 'active' && v.generation === before[i]?.generation && v.host === 'host-e',
        )
          ? Date.now()
          : undefined;
      },
      60_000,
    ).catch(async (err: Error) => {
      throw new Error(`${err.message}\n${await seen()}`);
    });
    // Let renewals and heartbeats run a few rounds, then look: nothing flaps, every probe went through.
    await new Promise((r) => setTimeout(r, 4_000));
    const texts = await Promise.all(active.map((p) => readFile(p.out, 'utf8')));
    const fails = texts.map((t) => failsAfter(t, emptiedAt));
    const detail = `${await seen()}\n${failedProbes(
      active.map((p) => p.uid),
      texts,
      emptiedAt,
    )}`;
    console.log(
      `Redis restarted empty (${restartedAt - emptiedAt} ms down): every record active again on its kept shadow ${back - restartedAt} ms after; failed probes per pod: ${fails.join(', ')}; oks since: ${texts.map((t) => oksAfter(t, restartedAt)).join(', ')}\n${await timelines(deps, uids)}`,
    );
    expect(fails, detail).toEqual(active.map(() => 0));
    for (const text of texts) expect(oksAfter(text, back), detail).toBeGreaterThan(5);
    // The same shadows: same generation, same host; each record says how it got it back.
    expect(await Promise.all(uids.map(view)), detail).toEqual(before);
    expect(await timelines(deps, uids), detail).toMatch(/SHADOW_HELD/);
    // Leases and registration are back: one lease per pod, held by the host that kept it.
    const leases = (await deps.leases.list()).leases;
    expect(
      leases
        .filter((l) => uids.includes(l.uid))
        .map((l) => l.holder)
        .sort(),
      detail,
    ).toEqual(uids.map(() => 'host-e'));
    expect(
      (await deps.hosts.list()).hosts.map((h) => h.id),
      detail,
    ).toContain('host-e');
    expect(host.log(), detail).toContain("Redis lost its data: re-asserting the leases of this host's shadows");
    expect(control.log(), detail).toContain("Redis lost its data: rebuilding every pod's record");

    // The pod that waited for its node through the loss comes up once its job starts.
    await scontrol(['release', waiting.jobId]);
    await waitFor(
      'the waiting pod active',
      async () => ((await view(waiting.uid)).state === 'active' ? true : undefined),
      90_000,
    ).catch(async (err: Error) => {
      throw new Error(`${err.message}\n${await timelines(deps, [waiting.uid])}\nhost log: ${host.log().slice(-3000)}`);
    });

    // And the fleet ends pods as before: a deleted pod is torn down, forgotten, its lease gone.
    const [gone] = active;
    if (!gone) throw new Error('no pod');
    kube.api.deletePod('user', gone.name);
    await waitFor(
      'the deleted pod forgotten',
      async () => ((await deps.store.load(gone.uid)) === null ? true : undefined),
      60_000,
    ).catch(async (err: Error) => {
      throw new Error(`${err.message}\n${await seen()}`);
    });
    expect((await deps.leases.get(gone.uid))?.holder, detail).toBeUndefined();
    // Its tunnel is closed: no forward socket left in its job's dir (the job itself runs on: no interLink here).
    const sockets = async () =>
      (await readdir(gone.plan.socketDir).catch(() => [] as string[])).filter((n) => n.endsWith('.sock'));
    await waitFor(
      'its forward sockets removed',
      async () => ((await sockets()).length === 0 ? true : undefined),
      20_000,
    ).catch(async (err: Error) => {
      throw new Error(`${err.message}: ${(await sockets()).join(', ')}
${await seen()}`);
    });
    expect(control.child.exitCode).toBeNull();
    expect(host.child.exitCode).toBeNull();
  }, 300_000);
});
