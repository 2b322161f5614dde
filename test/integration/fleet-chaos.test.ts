import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { FleetDeps } from '../../src/pods/fleet-deps.js';
import { jobIds, sendEvent } from '../../src/pods/queues.js';
import { type Harness, jobScript, planFor, uid, waitFor } from '../../tools/sandbox/shadow-harness.js';
import { cancelSubmittedJobs, sbatch } from '../../tools/sandbox/slurm.js';
import { killWorkers, startWorker, type WorkerProcess, workerStarted } from '../../tools/sandbox/worker-process.js';
import { firstOkAfter, prober } from '../fixtures/fault-probes.js';
import { type ProcessFleetSite, privateRedis, processFleetSite, submitPod } from '../fixtures/fleet-harness.js';

const DB = 4;

describe('the fleet survives its members dying', () => {
  let site: ProcessFleetSite;
  let h: Harness;
  let echo: ProcessFleetSite['echo'];
  let redis: Awaited<ReturnType<typeof privateRedis>>;
  let configPath: string;
  let deps: FleetDeps;
  const workers: WorkerProcess[] = [];

  beforeAll(async () => {
    redis = await privateRedis(DB);
    site = await processFleetSite(redis.url);
    ({ h, configPath, deps, echo } = site);
  }, 120_000);

  afterEach(async () => {
    await killWorkers(workers);
    await cancelSubmittedJobs();
  });

  afterAll(async () => {
    await site?.close();
    await redis?.close();
  });

  async function podState(podUid: string): Promise<string | undefined> {
    return (await deps.store.load(podUid))?.state;
  }

  it('re-establishes all 20 shadows of a kill -9ed session host on another host within 15 s', async () => {
    const control = startWorker(configPath, redis.url, 'control', 'control-1');
    const first = startWorker(configPath, redis.url, 'session', 'host-first');
    workers.push(control, first);
    await Promise.all([workerStarted(control), workerStarted(first)]);

    const pods = Array.from({ length: 20 }, (_, i) => ({ uid: uid(), port: 15300 + i }));
    const outputs = new Map<string, string>();
    for (const pod of pods) {
      const out = join(h.workdir, `${pod.uid}.out`);
      outputs.set(pod.uid, out);
      await submitPod(site, pod.uid, `chaos-${pod.port}`, `${pod.port}:127.0.0.1:${echo.port}`, prober(pod.port), out);
    }
    // Every pod active, every lease held by the first host, every job getting through.
    await waitFor(
      '20 pods active',
      async () => {
        const states = await Promise.all(pods.map((p) => podState(p.uid)));
        return states.every((s) => s === 'active') ? true : undefined;
      },
      120_000,
    );
    for (const pod of pods) expect((await deps.leases.get(pod.uid))?.holder).toBe('host-first');
    await waitFor(
      'jobs getting through',
      async () => {
        const texts = await Promise.all(pods.map((p) => readFile(outputs.get(p.uid) ?? '', 'utf8').catch(() => '')));
        return texts.every((t) => firstOkAfter(t, 0) !== undefined) ? true : undefined;
      },
      60_000,
    );

    const second = startWorker(configPath, redis.url, 'session', 'host-second');
    workers.push(second);
    await workerStarted(second);
    const killedAt = Date.now();
    first.kill('SIGKILL');
    await first.exited;

    // Each job's own client gets through again, through the second host.
    const recovered = await waitFor(
      'every job through again',
      async () => {
        const texts = await Promise.all(pods.map((p) => readFile(outputs.get(p.uid) ?? '', 'utf8').catch(() => '')));
        const times = texts.map((t) => firstOkAfter(t, killedAt + 500));
        return times.every((t) => t !== undefined) ? (times as number[]) : undefined;
      },
      60_000,
    );
    const worst = Math.max(...recovered) - killedAt;
    console.log(
      `session host killed: 20 shadows back on another host after ${worst} ms (median ${recovered.sort((a, b) => a - b)[10]! - killedAt} ms)`,
    );
    expect(worst).toBeLessThan(15_000);
    for (const pod of pods) expect((await deps.leases.get(pod.uid))?.holder).toBe('host-second');
    for (const pod of pods) expect(await podState(pod.uid)).toBe('active');
  }, 300_000);

  it('a session host stopped with SIGTERM hands its shadows over at once and exits 0', async () => {
    const control = startWorker(configPath, redis.url, 'control', 'control-t');
    const leaving = startWorker(configPath, redis.url, 'session', 'host-leaving');
    workers.push(control, leaving);
    await Promise.all([workerStarted(control), workerStarted(leaving)]);
    const pods = Array.from({ length: 3 }, (_, i) => ({ uid: uid(), port: 15360 + i }));
    const outputs = new Map<string, string>();
    for (const pod of pods) {
      const forwards = `${pod.port}:127.0.0.1:${echo.port}`;
      const out = join(h.workdir, `${pod.uid}.out`);
      outputs.set(pod.uid, out);
      await sbatch(h.site.user, jobScript(h, planFor(h, pod.uid, forwards), prober(pod.port)), {
        jobName: pod.uid,
        output: out,
      });
      await sendEvent(deps.queues, pod.uid, {
        type: 'POD_UPSERT',
        namespace: 'user',
        name: `term-${pod.port}`,
        annotations: { 'interlink.eu/reverse-forwards': forwards },
        at: Date.now(),
      });
    }
    await waitFor(
      'pods active',
      async () => {
        const states = await Promise.all(pods.map((p) => podState(p.uid)));
        return states.every((s) => s === 'active') ? true : undefined;
      },
      90_000,
    );
    const staying = startWorker(configPath, redis.url, 'session', 'host-staying');
    workers.push(staying);
    await workerStarted(staying);
    const stoppedAt = Date.now();
    leaving.kill('SIGTERM');
    expect(await leaving.exited).toBe(0);
    const recovered = await waitFor(
      'every job through again',
      async () => {
        const texts = await Promise.all(pods.map((p) => readFile(outputs.get(p.uid) ?? '', 'utf8').catch(() => '')));
        const times = texts.map((t) => firstOkAfter(t, stoppedAt + 200));
        return times.every((t) => t !== undefined) ? (times as number[]) : undefined;
      },
      30_000,
    );
    // No lease to wait out and no stall to detect: the other host starts at once.
    expect(Math.max(...recovered) - stoppedAt).toBeLessThan(6_000);
    for (const pod of pods) expect((await deps.leases.get(pod.uid))?.holder).toBe('host-staying');
  }, 180_000);

  it('retries the step of a kill -9ed control worker and keeps the machine consistent', async () => {
    const control = startWorker(configPath, redis.url, 'control', 'control-a');
    const session = startWorker(configPath, redis.url, 'session', 'host-s');
    workers.push(control, session);
    await Promise.all([workerStarted(control), workerStarted(session)]);
    const podUid = uid();
    await submitPod(site, podUid, 'control-kill', `15350:127.0.0.1:${echo.port}`, 'sleep 600\n');
    await waitFor('active', async () => ((await podState(podUid)) === 'active' ? true : undefined), 60_000);

    // Freeze the session host so the teardown step has to wait for the shadow: kill the control worker then.
    session.kill('SIGSTOP');
    await sendEvent(deps.queues, podUid, { type: 'TEARDOWN', reason: 'chaos', at: Date.now() });
    const stored = await deps.store.load(podUid);
    const generation = (stored?.snapshot as { context: { generation: number } }).context.generation;
    const teardownJob = jobIds.step(podUid, 'teardown', generation);
    await waitFor(
      'teardown step running',
      async () => {
        const job = await deps.queues.steps.getJob(teardownJob);
        return job && (await job.getState()) === 'active' ? true : undefined;
      },
      30_000,
    );
    control.kill('SIGKILL');
    await control.exited;
    session.kill('SIGCONT');

    const again = startWorker(configPath, redis.url, 'control', 'control-b');
    workers.push(again);
    await workerStarted(again);
    await waitFor(
      'pod done and forgotten',
      async () => ((await deps.store.load(podUid)) === null ? true : undefined),
      60_000,
    );
    const history = await deps.store.history(podUid);
    const transitions = history.map((e) => `${e.from}→${e.to}`);
    // One teardown, entered once and finished once: nothing applied twice.
    expect(transitions.filter((t) => t === 'active→tearingDown')).toHaveLength(1);
    expect(transitions.filter((t) => t === 'tearingDown→done')).toHaveLength(1);
    expect(await deps.leases.get(podUid)).toBeNull();
  }, 180_000);
});
