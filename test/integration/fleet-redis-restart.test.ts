import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { FleetDeps } from '../../src/pods/fleet-deps.js';
import { sendEvent } from '../../src/pods/queues.js';
import { createRedis } from '../../src/store/redis.js';
import { uid, waitFor } from '../../tools/sandbox/shadow-harness.js';
import { cancelSubmittedJobs } from '../../tools/sandbox/slurm.js';
import { freePort } from '../../tools/sandbox/sshd.js';
import { killWorkers, startWorker, type WorkerProcess, workerStarted } from '../../tools/sandbox/worker-process.js';
import { allActive, failedProbes, failsAfter, oksAfter, prober, timelines } from '../fixtures/fault-probes.js';
import { type ProcessFleetSite, processFleetSite, submitPod } from '../fixtures/fleet-harness.js';
import { RedisServer } from '../fixtures/redis-server.js';

describe('Redis restarts or hangs while pods are active', () => {
  let site: ProcessFleetSite;
  let redis: RedisServer;
  let deps: FleetDeps;
  const workers: WorkerProcess[] = [];

  beforeAll(async () => {
    redis = new RedisServer(await freePort(), await mkdtemp(join(tmpdir(), 'bh-redis-')));
    await redis.start();
    site = await processFleetSite(redis.url);
    deps = site.deps;
  }, 120_000);

  // Each test starts on an empty Redis with no worker and no job of the one before.
  afterEach(async () => {
    redis.signal('SIGCONT');
    await killWorkers(workers);
    await cancelSubmittedJobs();
    const admin = createRedis(redis.url, { kind: 'command' });
    await admin.flushall().finally(() => admin.disconnect());
  });

  afterAll(async () => {
    await site?.close();
    await redis?.crash();
    if (redis) await rm(redis.dir, { recursive: true, force: true });
  });

  const submit = (podUid: string, port: number, name: string) =>
    submitPod(site, podUid, name, `${port}:127.0.0.1:${site.echo.port}`, 'sleep 600\n');

  const state = async (podUid: string) => (await deps.store.load(podUid).catch(() => null))?.state;

  it('the fleet reconnects and carries on; no pod is lost', async () => {
    const worker = startWorker(site.configPath, redis.url, 'control,session', 'host-r');
    workers.push(worker);
    await workerStarted(worker);
    const pods = [uid(), uid(), uid()];
    await Promise.all(pods.map((p, i) => submit(p, 15400 + i, `redis-${i}`)));
    await waitFor(
      'pods active',
      async () => ((await Promise.all(pods.map(state))).every((s) => s === 'active') ? true : undefined),
      90_000,
    );

    // Which session holds each shadow: its generation and its lease's fencing token.
    const holders = () =>
      Promise.all(
        pods.map(async (p) => {
          const stored = await deps.store.load(p);
          const generation = (stored?.snapshot as { context?: { generation?: number } } | undefined)?.context
            ?.generation;
          return { state: stored?.state, generation, token: (await deps.leases.get(p))?.token };
        }),
      );
    const before = await holders();
    for (const h of before) expect(h.token).toBeTypeOf('number');

    // Down for longer than LeaseTTL (3 s) and than the session jobs' lock (4 s): every lease expires and
    // every session job stalls, but nobody else took either.
    await redis.crash();
    await new Promise((r) => setTimeout(r, 5_000));
    await redis.start();

    // No pod is lost: every one is still known after the restart (the AOF kept it).
    for (const p of pods)
      expect(await waitFor('pod readable', async () => (await state(p)) ?? undefined, 20_000)).toBeTruthy();
    // No shadow was replaced: its session renewed its expired lease by its token, and its stalled job,
    // back on the same host, stood for it. Same generation, same token, still active a while later.
    await new Promise((r) => setTimeout(r, 6_000));
    expect(await holders()).toEqual(before);
    // The fleet carries on: a delete is torn down, a new pod comes up.
    await sendEvent(deps.queues, pods[0] ?? '', { type: 'POD_DELETED', at: Date.now() });
    const fresh = uid();
    await submit(fresh, 15410, 'after-restart');
    await waitFor(
      'deleted pod forgotten',
      async () => ((await deps.store.load(pods[0] ?? '')) === null ? true : undefined),
      60_000,
    );
    await waitFor('new pod active', async () => ((await state(fresh)) === 'active' ? true : undefined), 90_000);
    for (const p of pods.slice(1)) expect(await state(p)).toBe('active');
    expect(worker.child.exitCode).toBeNull();
  }, 300_000);
  it('Redis SIGSTOPped 12 s (four times LeaseTTL), then continued: the forwards keep working through it, every pod active after, none replaced, nothing left', async () => {
    const control = startWorker(site.configPath, redis.url, 'control', 'control-s');
    const host = startWorker(site.configPath, redis.url, 'session', 'host-s');
    workers.push(control, host);
    await Promise.all([workerStarted(control), workerStarted(host)]);
    const pods = Array.from({ length: 3 }, (_, i) => ({ uid: uid(), port: 15500 + i }));
    const outs = pods.map((p) => join(site.h.workdir, `${p.uid}.out`));
    for (const [i, p] of pods.entries()) {
      await submitPod(site, p.uid, `redis-stop-${i}`, `${p.port}:127.0.0.1:${site.echo.port}`, prober(p.port), outs[i]);
    }
    const uids = pods.map((p) => p.uid);
    const isActive = () => allActive(deps, uids);
    await waitFor('the pods active', isActive, 90_000);
    const generations = async () =>
      Promise.all(
        pods.map(
          async (p) =>
            ((await deps.store.load(p.uid))?.snapshot as { context?: { generation?: number } } | undefined)?.context
              ?.generation,
        ),
      );
    const before = await generations();

    redis.signal('SIGSTOP');
    const stoppedAt = Date.now();
    try {
      await new Promise((r) => setTimeout(r, 12_000));
    } finally {
      redis.signal('SIGCONT');
    }
    const continuedAt = Date.now();
    const recovered = await waitFor(
      'every pod active and through again',
      async () => {
        const texts = await Promise.all(outs.map((o) => readFile(o, 'utf8').catch(() => '')));
        return texts.every((t) => oksAfter(t, continuedAt) > 0) && (await isActive()) ? Date.now() : undefined;
      },
      90_000,
    ).catch(async (err: Error) => {
      throw new Error(`${err.message}\n${await timelines(deps, uids)}\nhost log: ${host.log().slice(-3000)}`);
    });
    // Let a renewal round or two run, then look again: nothing flaps.
    await new Promise((r) => setTimeout(r, 4_000));
    const texts = await Promise.all(outs.map((o) => readFile(o, 'utf8')));
    const failsDuring = texts.map((t) => failsAfter(t, stoppedAt));
    const all = await timelines(deps, uids);
    console.log(
      `Redis stopped 12 s (${continuedAt - stoppedAt} ms): every pod active and through ${recovered - continuedAt} ms after it continued; failed probes from the stop on, per pod: ${failsDuring.join(', ')}\n${all}`,
    );
    expect(await isActive()).toBe(true);
    // The data plane does not need Redis: no probe failed, no shadow was replaced.
    expect(failsDuring, `${failedProbes(uids, texts, stoppedAt)}\nhost log: ${host.log().slice(-4000)}`).toEqual(
      pods.map(() => 0),
    );
    expect(await generations()).toEqual(before);
    expect((await deps.leases.list()).leases).toHaveLength(pods.length);
    expect(control.child.exitCode).toBeNull();
    expect(host.child.exitCode).toBeNull();
  }, 300_000);
});
