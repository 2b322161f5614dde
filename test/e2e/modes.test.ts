import { chmod, mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { PodFollower } from '../../src/cli/pod-follow.js';
import { Cleanup } from '../../tools/demo/cleanup.js';
import { failed, jobLeftovers, type LeftoverScope, settle, tunnelLeftovers } from '../../tools/demo/leftovers.js';
import { type DemoService, startService } from '../../tools/demo/service.js';
import {
  bringUpFleet,
  bringUpSite,
  DEMO_MODES,
  type DemoFleet,
  type DemoPod,
  deletePod,
  demoPod,
  type PodJob,
  submitJob,
  submitPod,
  waitForJobEnd,
  waitForOutput,
} from '../../tools/demo/stack.js';
import { WORKLOAD_DONE, workloadScript } from '../../tools/demo/workload.js';
import type { LoopbackSite } from '../../tools/sandbox/loopback-site.js';
import { ensureSlurm, scancel } from '../../tools/sandbox/slurm.js';
import { ensureUser, JOB_USER, type TestUser } from '../../tools/sandbox/users.js';
import { privateRedis } from '../fixtures/fleet-harness.js';

/**
 * The whole stack, end to end, in each carrier mode: real Redis, the loopback site with real Slurm, an
 * in-cluster service known only by its Service name (Backhaul.HostAliases), the fleet as two
 * `backhaul worker` processes (control, session), pods fed through the events queue and jobs submitted
 * as the job user with the prelude, a workload that reaches the service by name through bwrap's
 * /etc/hosts bind. Afterwards nothing of the pod may be left but its history.
 */

const DB = 12;
const MiB = 1024 * 1024;
const quiet = { write: () => undefined };

describe.each(DEMO_MODES)('end to end, %s carrier, fleet in separate processes', (mode) => {
  const cleanup = new Cleanup();
  let redis: Awaited<ReturnType<typeof privateRedis>>;
  let user: TestUser;
  let site: LoopbackSite;
  let service: DemoService;
  let fleet: DemoFleet;
  let dir: string;

  beforeAll(async () => {
    redis = await privateRedis(DB);
    await ensureSlurm();
    user = await ensureUser(JOB_USER);
    dir = await mkdtemp(join(tmpdir(), `bh-e2e-${mode}-`));
    await chmod(dir, 0o755);
    cleanup.add('temp dir', () => rm(dir, { recursive: true, force: true }));
    site = await bringUpSite(mode, user.name, cleanup);
    service = await startService();
    cleanup.add('service', () => service.close());
    fleet = await bringUpFleet({ mode, site, service, redisUrl: redis.url, dir }, cleanup);
  }, 180_000);

  afterAll(async () => {
    const failures = await cleanup.run();
    await redis?.close();
    expect(failures).toEqual([]);
  }, 120_000);

  function scope(pod: DemoPod, job: PodJob): LeftoverScope {
    return { deps: fleet.deps, site, user, pod, jobId: job.jobId };
  }

  async function untilActive(pod: DemoPod): Promise<PodFollower> {
    const follower = new PodFollower(fleet.deps, pod.uid, quiet);
    const state = await follower.until((s) => s === 'active' || s === 'failed', 90_000);
    const history = await fleet.deps.store.history(pod.uid);
    expect(state, JSON.stringify(history, null, 1)).toBe('active');
    return follower;
  }

  async function nothingLeft(pod: DemoPod, job: PodJob): Promise<void> {
    expect(failed(await settle(() => tunnelLeftovers(scope(pod, job)), 15_000))).toEqual([]);
    await scancel(job.jobId);
    await waitForJobEnd(job.jobId, 30_000);
    const left = failed(await settle(() => jobLeftovers(scope(pod, job)), 15_000));
    const output = left.length > 0 ? await readFile(job.output, 'utf8').catch((e: Error) => e.message) : '';
    expect(left, `the job's output:\n${output}`).toEqual([]);
    const keys = await redis.redis.keys(`*${pod.uid}*`);
    expect(keys.filter((k) => k.startsWith('bh:'))).toEqual([`bh:hist:${pod.uid}`]);
    expect(await redis.redis.ttl(`bh:hist:${pod.uid}`)).toBeGreaterThan(0);
  }

  it('submit → forwards → a workload reaches the service by name (bwrap) → scancel → teardown, nothing left', async () => {
    const endpoint = `${service.fqdn}:${service.port}`;
    const pod = demoPod(fleet.config, 'demo', `e2e-a-${mode}`, endpoint);
    expect(pod.plan.carrier.mode).toBe(mode);
    await submitPod(fleet.deps, pod);
    const body = workloadScript({ host: service.fqdn, port: service.port, bytes: 4 * MiB });
    const job = await submitJob(fleet.config, user, dir, pod, body, cleanup);
    const follower = await untilActive(pod);

    // While the tunnel is up the checks see it: they would notice anything left behind.
    const during = failed(await tunnelLeftovers(scope(pod, job)));
    for (const what of ['no lease', 'no socket file', 'no carrier process', 'Redis: no key of the pod']) {
      expect(
        during.some((p) => p.startsWith(what)),
        `${what} in ${JSON.stringify(during)}`,
      ).toBe(true);
    }

    const text = await waitForOutput(job, WORKLOAD_DONE, 90_000);
    const address = pod.plan.bindAddress;
    expect(text).toContain(`workload: ${service.fqdn} resolves to ${address} (the hosts file bound over /etc/hosts)`);
    expect(text).toContain(`-> 200 ${service.greeting}`);
    expect(text).toContain(`GET /demo/results.bin -> 200, ${4 * MiB} bytes, identical to what it sent`);
    expect(text).toContain('workload: exit 0');
    const traffic = service.traffic();
    expect(traffic.bytesIn).toBeGreaterThan(4 * MiB);
    expect(traffic.bytesOut).toBeGreaterThan(4 * MiB);

    // interLink cancels the job: the shadow sees the job end (or its sockets vanish) and tears down.
    await scancel(job.jobId);
    expect(await follower.until((s) => s === null, 60_000)).toBeNull();
    const history = await fleet.deps.store.history(pod.uid);
    const ending = history.find((h) => h.from === 'active');
    expect(['JOB_ENDED', 'SOCKETS_VANISHED']).toContain(ending?.event);
    expect(history.map((h) => h.to).slice(-2)).toEqual(['tearingDown', 'done']);
    expect(history.find((h) => h.event === 'SHADOW_UP')?.detail).toBe('host demo-session');
    await nothingLeft(pod, job);
  }, 240_000);

  it('submit → pod deleted → teardown while the job still runs, nothing left', async () => {
    const pod = demoPod(fleet.config, 'demo', `e2e-b-${mode}`, `${service.fqdn}:${service.port}`);
    await submitPod(fleet.deps, pod);
    const job = await submitJob(fleet.config, user, dir, pod, 'sleep 3600\n', cleanup);
    const follower = await untilActive(pod);
    await deletePod(fleet.deps, pod);
    expect(await follower.until((s) => s === null, 60_000)).toBeNull();
    const history = await fleet.deps.store.history(pod.uid);
    expect(history.slice(-2).map((h) => `${h.event} ${h.from} → ${h.to}`)).toEqual([
      'POD_DELETED active → tearingDown',
      'STEP_DONE tearingDown → done',
    ]);
    // The job is still running: only the tunnel is gone.
    expect(failed(await settle(() => tunnelLeftovers(scope(pod, job)), 15_000))).toEqual([]);
    await nothingLeft(pod, job);
  }, 240_000);
});
