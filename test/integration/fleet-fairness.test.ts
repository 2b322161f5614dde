import { join } from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { uid, waitFor } from '../../tools/sandbox/shadow-harness.js';
import { cancelSubmittedJobs, queueReport, scancel } from '../../tools/sandbox/slurm.js';
import { killWorkers, type WorkerProcess } from '../../tools/sandbox/worker-process.js';
import { stillStored, timelines } from '../fixtures/fault-probes.js';
import {
  controlAndSession,
  type ProcessFleetSite,
  privateRedis,
  processFleetSite,
  submitPod,
} from '../fixtures/fleet-harness.js';

const DB = 10;

/**
 * Issue 25, item 6: one tenant cannot starve the rest. A session host with room for 4 carriers, 2 per
 * namespace: pods whose jobs are pending hold no carrier slot, and one namespace holds at most its share.
 */
describe('fairness between namespaces on one session host', () => {
  let site: ProcessFleetSite;
  let redis: Awaited<ReturnType<typeof privateRedis>>;
  const workers: WorkerProcess[] = [];

  beforeAll(async () => {
    redis = await privateRedis(DB);
    site = await processFleetSite(redis.url, {}, { SessionCapacity: 4, NamespaceCapacity: 2 });
    workers.push(...(await controlAndSession(site, redis.url, 'fair')));
  }, 120_000);

  afterEach(async () => {
    await cancelSubmittedJobs();
  });

  afterAll(async () => {
    await killWorkers(workers);
    await cancelSubmittedJobs();
    await site?.close();
    await redis?.close();
  });

  async function submit(namespace: string, port: number, held: boolean): Promise<{ uid: string; jobId: string }> {
    const podUid = uid();
    const forwards = `${port}:127.0.0.1:${site.echo.port}`;
    const output = join(site.h.workdir, `${podUid}.out`);
    const args = held ? ['--hold'] : [];
    const jobId = await submitPod(site, podUid, `pod-${port}`, forwards, 'sleep 300\n', output, args, namespace);
    return { uid: podUid, jobId };
  }

  const state = async (podUid: string) => (await site.deps.store.load(podUid))?.state;

  /** What a failed wait prints: each pod's job as squeue has it, and its state, timeline and host log. */
  async function seen(pods: ReadonlyArray<{ uid: string; jobId: string }>): Promise<string> {
    const host = workers.find((w) => w.hostId.startsWith('host-'))?.log() ?? '';
    const stored = await stillStored(
      site.deps,
      pods.map((p) => p.uid),
      host,
    );
    return `squeue:\n${await queueReport(pods.map((p) => p.jobId))}\n${stored}`;
  }

  it("50 pending pods of one namespace do not delay another's pod, and a namespace holds at most its share of carriers", async () => {
    // 50 pods of one tenant whose jobs wait in Slurm (held): more than the host's 4 carrier slots.
    const pending: Array<{ uid: string; jobId: string }> = [];
    for (let i = 0; i < 50; i += 1) pending.push(await submit('busy', 16000 + i, true));
    await waitFor(
      '50 shadows waiting for their jobs',
      async () => {
        const states = await Promise.all(pending.map((p) => state(p.uid)));
        return states.every((s) => s === 'waitingBatchHost') ? true : undefined;
      },
      60_000,
    );
    // Another tenant's pod with a running job gets its tunnel at once.
    const quietAt = Date.now();
    const quiet = await submit('quiet', 16100, false);
    await waitFor(
      'the quiet pod active',
      async () => ((await state(quiet.uid)) === 'active' ? true : undefined),
      60_000,
    ).catch(async (err: Error) => {
      throw new Error(`${err.message}\n${await timelines(site.deps, [quiet.uid])}`);
    });
    console.log(
      `a pod of another namespace active ${Date.now() - quietAt} ms after it was submitted, beside 50 pending`,
    );

    // Three running pods of one namespace: two carriers (NamespaceCapacity), the third waits for a slot.
    const greedy: Array<{ uid: string; jobId: string }> = [];
    for (let i = 0; i < 3; i += 1) greedy.push(await submit('greedy', 16200 + i, false));
    await waitFor(
      'two greedy pods active',
      async () => {
        const states = await Promise.all(greedy.map((p) => state(p.uid)));
        return states.filter((s) => s === 'active').length === 2 ? states : undefined;
      },
      60_000,
    ).catch(async (err: Error) => {
      throw new Error(`${err.message}\n${await seen(greedy)}`);
    });
    await new Promise((r) => setTimeout(r, 3_000));
    const states = await Promise.all(greedy.map((p) => state(p.uid)));
    expect(
      states.filter((s) => s === 'active'),
      await timelines(
        site.deps,
        greedy.map((p) => p.uid),
      ),
    ).toHaveLength(2);
    const waiting = greedy[states.indexOf('waitingBatchHost')];
    expect(waiting, JSON.stringify(states)).toBeDefined();
    // One of the two ends: the third takes its slot.
    const done = greedy[states.indexOf('active')];
    await scancel(done?.jobId ?? '');
    await waitFor(
      'the third greedy pod active',
      async () => ((await state(waiting?.uid ?? '')) === 'active' ? true : undefined),
      60_000,
    ).catch(async (err: Error) => {
      throw new Error(`${err.message}\n${await seen(greedy)}`);
    });
    // Nothing of the pending ones moved meanwhile.
    expect(new Set(await Promise.all(pending.map((p) => state(p.uid))))).toEqual(new Set(['waitingBatchHost']));
  }, 300_000);
});
