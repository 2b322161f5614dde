import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { readFile, stat } from 'node:fs/promises';
import { createServer, type Server } from 'node:net';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { formatAddresses } from '../../src/cli/status-format.js';
import { bindAddress } from '../../src/contract/derivations.js';
import {
  carrierGone,
  echoServer,
  exists,
  type Harness,
  harness,
  jobScript,
  MiB,
  planFor,
  preludeV1JobScript,
  startSession,
  stopHarness,
  trapLessJobScript,
  uid,
  userProcesses,
  waitFor,
  waitForForwards,
  workload,
} from '../../tools/sandbox/shadow-harness.js';
import { jobState, killJobProcesses, sbatch, scancel, stepsOf, waitForState } from '../../tools/sandbox/slurm.js';

describe.each([
  ['node', {}],
  ['userspace', { Sshd: 'userspace' }],
  ['srun', { Sshd: 'userspace', NodeExec: 'srun' }],
] as const)('shadow session, %s carrier, on the loopback site', (mode, reverse) => {
  let h: Harness;
  let echo: { server: Server; port: number };

  beforeAll(async () => {
    h = await harness('allowed', reverse);
    echo = await echoServer();
  });

  afterAll(async () => {
    echo?.server.close();
    await stopHarness(h);
  });

  it('establishes the forwards and carries 100 MiB both ways byte-identical for a client in the job', async () => {
    const podUid = uid();
    const plan = planFor(h, podUid, `15000:127.0.0.1:${echo.port}`);
    expect(plan.carrier.mode).toBe(mode);
    const out = join(h.workdir, `${podUid}.out`);
    const jobId = await sbatch(h.site.user, jobScript(h, plan, workload(15000, 100 * MiB)), {
      jobName: podUid,
      output: out,
    });
    const { session, phases, ended } = startSession(h, plan);
    await waitForState(jobId, ['COMPLETED', 'FAILED', 'CANCELLED'], 120_000);
    const text = await readFile(out, 'utf8');
    expect(text, `phases: ${JSON.stringify(phases)}`).toContain(`workload ${100 * MiB} ${100 * MiB} True`);
    expect(phases.map((p) => p.type).slice(0, 4)).toEqual([
      'SHADOW_UP',
      'BATCH_HOST',
      'CARRIER_OPEN',
      'FORWARDS_READY',
    ]);
    expect(phases[1]).toMatchObject({ type: 'BATCH_HOST', batchHost: 'bhnode1', jobId });
    // The relay's address, read from its ready file on the node: the derived one (nothing held it); and
    // what separates the tunnel: the relay admits the job only, the sockets are the user's (no job_container).
    expect(phases[3]).toEqual({
      type: 'FORWARDS_READY',
      addresses: [bindAddress(podUid, 0)],
      isolation: { relay: 'job', sockets: 'user' },
    });
    // The job ended: its trap removed the socket dir, and the session noticed.
    const end = await ended;
    expect(end.type).toBe('JOB_ENDED');
    expect(end, 'its trap ran').not.toHaveProperty('trapMissed');
    expect(session.stats?.bytesToCluster).toBe(100 * MiB);
    expect(await exists(plan.socketDir)).toBe(false);
  }, 180_000);

  it('a job whose prelude carries its own relay (admitted before the boot) gets its forwards from this fleet', async () => {
    const podUid = uid();
    const plan = planFor(h, podUid, `15020:127.0.0.1:${echo.port} 15021:echo.user.svc.cluster.local:${echo.port}`);
    const out = join(h.workdir, `${podUid}.out`);
    const jobId = await sbatch(h.site.user, preludeV1JobScript(h, workload(15020, MiB)), {
      jobName: podUid,
      output: out,
    });
    const { phases, infos, ended } = startSession(h, plan);
    await waitForState(jobId, ['COMPLETED', 'FAILED', 'CANCELLED'], 120_000);
    const seen = `phases ${JSON.stringify(phases)}; log ${infos.join(' | ')}; job output:\n${await readFile(out, 'utf8').catch(() => '')}`;
    expect(await readFile(out, 'utf8'), seen).toContain(`workload ${MiB} ${MiB} True`);
    // Its own relay, as it started it, and its own hosts file: the fleet delivered nothing.
    expect(infos.join('\n'), seen).toContain('nothing to deliver');
    expect(phases[3], seen).toEqual({
      type: 'FORWARDS_READY',
      addresses: [bindAddress(podUid, 0), bindAddress(podUid, 1)],
      isolation: { relay: 'job', sockets: 'user' },
    });
    const end = await ended;
    expect(end, seen).toMatchObject({ type: 'JOB_ENDED' });
    expect(end, 'its trap ran').not.toHaveProperty('trapMissed');
    expect(await exists(plan.socketDir)).toBe(false);
  }, 120_000);

  it('reports the job ended within 10 s of scancel and leaves no socket, process or step', async () => {
    const podUid = uid();
    const plan = planFor(h, podUid, `15001:127.0.0.1:${echo.port}`);
    const jobId = await sbatch(h.site.user, jobScript(h, plan, 'sleep 600\n'), { jobName: podUid });
    const started = startSession(h, plan);
    const { session, ended } = started;
    await waitForForwards(started, jobId);
    for (const f of plan.forwards) expect((await stat(f.socketPath)).isSocket()).toBe(true);
    const cancelledAt = Date.now();
    await scancel(jobId);
    const end = await ended;
    expect(['JOB_ENDED', 'SOCKETS_VANISHED']).toContain(end.type);
    expect(Date.now() - cancelledAt).toBeLessThan(10_000);
    await session.close('test');
    // Its trap ran and removed the dir: nothing left to report.
    expect(started.warnings.join('\n')).not.toContain('ended without running its trap');
    expect(end).not.toHaveProperty('trapMissed');
    for (const f of plan.forwards) expect(await exists(f.socketPath)).toBe(false);
    await waitFor('the trap to remove the socket dir', async () => !(await exists(plan.socketDir)), 10_000).catch(
      (err: Error) => {
        throw new Error(
          `${err.message}: it holds ${JSON.stringify(readdirSync(plan.socketDir))}; phases ${JSON.stringify(started.phases)}`,
        );
      },
    );
    await waitFor('no steps', async () => ((await stepsOf(jobId)).length === 0 ? true : undefined), 10_000);
    await waitFor(
      'no job processes',
      async () => ((await userProcesses(h.site.user.name, plan.socketDir)).length === 0 ? true : undefined),
      10_000,
    );
    expect((await jobState(jobId)).state).not.toBe('RUNNING');
  }, 120_000);

  // An srun carrier is a step of the job: Slurm's TERM ends it with the relay, so no clearing is tried.
  if (mode !== 'srun') {
    it("a workload that ignores scancel's TERM for a while: JOB_ENDED with no trap claim, and the job's own trap removes the dir later", async () => {
      // Slurm's TERM kills the relay at once; the batch shell runs its trap only once the workload has
      // exited (4 s here, within the site's KillWait of 5 s), while squeue already says CG.
      const podUid = uid();
      const plan = planFor(h, podUid, `15012:127.0.0.1:${echo.port}`);
      const body = "echo workload started\n(trap 'sleep 4; exit 0' TERM; sleep 600 & wait $!)\n";
      const out = join(h.workdir, `${podUid}.out`);
      const jobId = await sbatch(h.site.user, jobScript(h, plan, body), { jobName: podUid, output: out });
      const started = startSession(h, plan, { jobCheckMs: 1_000 });
      await waitForForwards(started, jobId);
      // Past the prelude (whose wait for the sockets would take the TERM itself).
      await waitFor('the workload to start', async () => (await readFile(out, 'utf8')).includes('workload started'));
      const cancelledAt = Date.now();
      await scancel(jobId);
      const end = await Promise.race([started.ended, sleep(20_000).then(() => undefined)]);
      const seen = () =>
        `${Date.now() - cancelledAt} ms after the cancel; phases ${JSON.stringify(started.phases)}; warnings ${JSON.stringify(started.warnings)}; job output ${JSON.stringify(readFileSync(out, 'utf8'))}; socket dir holds ${JSON.stringify(existsSync(plan.socketDir) ? readdirSync(plan.socketDir) : null)}`;
      expect(end, seen()).toMatchObject({ type: 'JOB_ENDED' });
      expect(end, seen()).not.toHaveProperty('trapMissed');
      await started.session.close('test');
      expect(started.warnings.join('\n'), seen()).not.toContain('ended without running its trap');
      await waitFor('the trap to remove the socket dir', async () => !(await exists(plan.socketDir)), 15_000).catch(
        (err: Error) => {
          throw new Error(`${err.message}: ${seen()}`);
        },
      );
      await waitFor(
        'no job processes',
        async () => ((await userProcesses(h.site.user.name, plan.socketDir)).length === 0 ? true : undefined),
        10_000,
      );
    }, 120_000);
  }

  it('sockets gone while squeue still says the job runs: asked again, JOB_ENDED as squeue then has it, not only SOCKETS_VANISHED', async () => {
    // The trap's removal a moment before slurmctld hears the job end, drawn out: the workload removes the
    // dir itself and ends 3 s later (with an srun carrier, the carrier, a step of the job, ends with it).
    const podUid = uid();
    const plan = planFor(h, podUid, `15004:127.0.0.1:${echo.port}`);
    const body = `rm -rf '${plan.socketDir}'\necho removed\nsleep 3\n`;
    const out = join(h.workdir, `${podUid}.out`);
    const jobId = await sbatch(h.site.user, jobScript(h, plan, body), { jobName: podUid, output: out });
    const started = startSession(h, plan);
    const end = await Promise.race([started.ended, sleep(60_000).then(() => undefined)]);
    const seen = `phases ${JSON.stringify(started.phases)}; job output ${JSON.stringify(readFileSync(out, 'utf8'))}; job ${JSON.stringify(await jobState(jobId))}`;
    expect(end, seen).toMatchObject({ type: 'JOB_ENDED' });
    // As squeue had it: ending (CG) or ended, never still running.
    expect(['COMPLETING', 'COMPLETED'], seen).toContain((end as { jobState?: string }).jobState);
    await started.session.close('test');
  }, 120_000);

  it("reports the relay's own address when the derived one was taken on the node (status shows which)", async () => {
    const podUid = uid();
    const plan = planFor(h, podUid, `15008:127.0.0.1:${echo.port}`);
    const derived = bindAddress(podUid, 0);
    // Another process holds the derived address and port before the job starts: the relay moves.
    const squatter = createServer();
    await new Promise<void>((resolve, reject) => {
      squatter.once('error', reject);
      squatter.listen(15008, derived, resolve);
    });
    try {
      const jobId = await sbatch(h.site.user, jobScript(h, plan, 'sleep 600\n'), { jobName: podUid });
      const started = startSession(h, plan);
      await waitForForwards(started, jobId);
      const ready = started.phases.find((p) => p.type === 'FORWARDS_READY');
      const addresses = ready?.type === 'FORWARDS_READY' ? ready.addresses : undefined;
      expect(addresses, JSON.stringify(started.phases)).toHaveLength(1);
      expect(addresses?.[0]).toMatch(/^127\.\d+\.\d+\.\d+$/);
      expect(addresses?.[0]).not.toBe(derived);
      expect(formatAddresses(podUid, addresses ?? null)).toContain(`in place of ${derived}`);
      await started.session.close('test');
      await scancel(jobId);
    } finally {
      squatter.close();
    }
  }, 120_000);

  it('a job cancelled while the session waits for its prelude ends the session as JOB_ENDED at once, not as a failed launch', async () => {
    // A job that runs but whose prelude has not (yet) made the socket dir: the session waits for it
    // (PreludeWait), and the job is cancelled meanwhile, as when a pod is deleted early.
    const podUid = uid();
    const plan = planFor(h, podUid, `15009:127.0.0.1:${echo.port}`);
    const jobId = await sbatch(h.site.user, '#!/bin/sh\nsleep 600\n', { jobName: podUid });
    const started = startSession(h, plan, { preludeWaitMs: 60_000 });
    await waitFor(
      'the session past BATCH_HOST, waiting for the prelude',
      async () => (started.phases.some((p) => p.type === 'BATCH_HOST') ? true : undefined),
      30_000,
    );
    await new Promise((resolve) => setTimeout(resolve, 1_500));
    const cancelledAt = Date.now();
    await scancel(jobId);
    const end = await started.ended;
    const after = Date.now() - cancelledAt;
    expect(end, `ended ${after} ms after the cancel; phases ${JSON.stringify(started.phases)}`).toMatchObject({
      type: 'JOB_ENDED',
    });
    expect(after, JSON.stringify(started.phases)).toBeLessThan(15_000);
    expect(await exists(plan.socketDir)).toBe(false);
    await waitFor('no steps', async () => ((await stepsOf(jobId)).length === 0 ? true : undefined), 10_000);
  }, 120_000);

  // Only a node carrier outlives its job (the node's sshd is the site's); in the other modes the carrier
  // is a process of the job and ends with it.
  if (mode === 'node') {
    it("a job killed before its trap could run (socket dir and sockets left) ends the session as JOB_ENDED on squeue's word", async () => {
      const podUid = uid();
      const plan = planFor(h, podUid, `15010:127.0.0.1:${echo.port}`);
      const jobId = await sbatch(h.site.user, trapLessJobScript(plan), { jobName: podUid });
      const started = startSession(h, plan, { jobCheckMs: 1_000 });
      await waitForForwards(started, jobId);
      await scancel(jobId);
      await waitForState(jobId, ['CANCELLED'], 30_000);
      const cancelledAt = Date.now();
      // The job is gone, its socket dir and the bound sockets are not: the node's watch cannot tell.
      for (const f of plan.forwards) expect((await stat(f.socketPath)).isSocket()).toBe(true);
      const end = await Promise.race([started.ended, sleep(20_000).then(() => undefined)]);
      const seen = `${Date.now() - cancelledAt} ms after the job ended; phases ${JSON.stringify(started.phases)}`;
      expect(end, seen).toMatchObject({ type: 'JOB_ENDED', jobState: 'CANCELLED', trapMissed: true });
      // Reported once the dir was removed: the report says so, for the pod's Event.
      expect(started.phases.at(-1), seen).toEqual({ type: 'JOB_ENDED', jobState: 'CANCELLED', trapMissed: true });
      expect(Date.now() - cancelledAt, seen).toBeLessThan(10_000);
      await started.session.close('test');
      for (const f of plan.forwards) expect(await exists(f.socketPath), seen).toBe(false);
      // The dead job's dir went with the sockets, and the site hears of it.
      expect(await exists(plan.socketDir), seen).toBe(false);
      expect(started.warnings.join('\n'), seen).toContain(`job ${jobId} on bhnode1 of pod`);
      expect(started.warnings.join('\n'), seen).toContain('ended without running its trap');
    }, 120_000);

    it('a job killed whole (SIGKILL to every process: no trap) ends as JOB_ENDED, and its socket dir goes with the sockets', async () => {
      // What the OOM killer or KillWait's SIGKILL leaves: the prelude's dir with the hosts file, the
      // relay's files and the bound sockets, and no process of the job.
      const podUid = uid();
      const plan = planFor(h, podUid, `15011:127.0.0.1:${echo.port}`);
      const jobId = await sbatch(h.site.user, jobScript(h, plan, 'sleep 600\n'), { jobName: podUid });
      const started = startSession(h, plan, { jobCheckMs: 60_000 });
      await waitForForwards(started, jobId);
      const killedAt = Date.now();
      const killed = await killJobProcesses(jobId);
      const end = await Promise.race([started.ended, sleep(30_000).then(() => undefined)]);
      const seen = `${Date.now() - killedAt} ms after the kill of ${killed.length} processes; phases ${JSON.stringify(started.phases)}`;
      // The relay's holder, its relaying process, the batch shell and the workload at least.
      expect(killed.length, seen).toBeGreaterThanOrEqual(4);
      expect(end, seen).toMatchObject({ type: 'JOB_ENDED', trapMissed: true });
      expect(started.phases.at(-1), seen).toMatchObject({ type: 'JOB_ENDED', trapMissed: true });
      await started.session.close('test');
      for (const f of plan.forwards) expect(await exists(f.socketPath), seen).toBe(false);
      expect(await exists(plan.socketDir), seen).toBe(false);
      expect(started.warnings.join('\n'), seen).toContain('ended without running its trap');
      await waitFor(
        'no job processes',
        async () => ((await userProcesses(h.site.user.name, plan.socketDir)).length === 0 ? true : undefined),
        10_000,
      );
    }, 120_000);
  }

  it('close() twice is harmless and leaves no socket files, no steps and no carrier processes', async () => {
    const podUid = uid();
    const plan = planFor(h, podUid, `15002:127.0.0.1:${echo.port} 15003:127.0.0.1:${echo.port}`);
    const jobId = await sbatch(h.site.user, jobScript(h, plan, 'sleep 600\n'), { jobName: podUid });
    const started = startSession(h, plan);
    const { session, ended } = started;
    await waitForForwards(started, jobId);
    await Promise.all([session.close('operator'), session.close('again')]);
    await session.close('third');
    expect(await ended).toEqual({ type: 'CLOSED', reason: 'operator' });
    for (const f of plan.forwards) expect(await exists(f.socketPath)).toBe(false);
    // The job goes on; only the carrier is gone.
    expect((await jobState(jobId)).state).toBe('RUNNING');
    await carrierGone(h, plan, jobId);
    await scancel(jobId);
  }, 120_000);
});

describe('shadow session when the job relay dies', () => {
  let h: Harness;
  let echo: { server: Server; port: number };

  beforeAll(async () => {
    h = await harness('allowed', {});
    echo = await echoServer();
  });

  afterAll(async () => {
    echo?.server.close();
    await stopHarness(h);
  });

  it('fails the session as relay-dead (permanent) when every relay process is killed, and removes its sockets', async () => {
    const podUid = uid();
    const plan = planFor(h, podUid, `15010:127.0.0.1:${echo.port}`);
    const jobId = await sbatch(h.site.user, jobScript(h, plan, 'sleep 600\n'), { jobName: podUid });
    const started = startSession(h, plan);
    const { phases, ended } = started;
    await waitForForwards(started, jobId);
    // The relay writes its pids just after it reports ready; the forwards can be up before that.
    const pids = await waitFor(
      'relay.pids naming the holder and the relaying process',
      async () => {
        const text = await readFile(join(plan.socketDir, 'relay.pids'), 'utf8').catch(() => '');
        const found = text.trim().split(' ').filter(Boolean).map(Number);
        return found.length === 2 ? found : undefined;
      },
      10_000,
    );
    const killedAt = Date.now();
    for (const pid of pids) process.kill(pid, 'SIGKILL');
    const end = await ended;
    expect(end, `phases: ${JSON.stringify(phases)}`).toMatchObject({
      type: 'SESSION_FAILED',
      error: { kind: 'relay-dead', permanent: true },
    });
    expect(end.type === 'SESSION_FAILED' ? end.error.message : '').toMatch(
      new RegExp(`the relay of pod user/${plan.name} in job ${jobId} on bhnode1 has died`),
    );
    // One check round, the 2 s second look, and the teardown.
    expect(Date.now() - killedAt).toBeLessThan(8_000);
    for (const f of plan.forwards) expect(await exists(f.socketPath)).toBe(false);
    // The job is the workload's: it goes on (Kubernetes shows the pod failed; deleting it ends the job).
    expect((await jobState(jobId)).state).toBe('RUNNING');
    await scancel(jobId);
  }, 120_000);
});
