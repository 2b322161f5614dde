import { execFile, spawn } from 'node:child_process';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import type { Server } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { stringify as toYaml } from 'yaml';
import { bindAddress } from '../../src/contract/derivations.js';
import { parseSiteConfig, type SiteConfig } from '../../src/contract/site-config.js';
import type { RunningFleet } from '../../src/fleet/fleet.js';
import { jobIds } from '../../src/pods/queues.js';
import type { SessionPlan } from '../../src/render/session-plan.js';
import { keysNaming, queueEntriesNaming } from '../../tools/demo/leftovers.js';
import {
  LOOPBACK_ENDPOINT_POLICY,
  type LoopbackSite,
  NO_CLUSTER_CHECKS,
  startLoopbackSite,
} from '../../tools/sandbox/loopback-site.js';
import {
  echoServer,
  exists,
  type Harness,
  jobScript,
  PYTHON,
  planFor,
  uid,
  userProcesses,
  waitFor,
} from '../../tools/sandbox/shadow-harness.js';
import { cancelSubmittedJobs, jobState, sbatch, scancel, stepsOf, waitForState } from '../../tools/sandbox/slurm.js';
import { inProcessFleet, privateRedis, waitForPodState } from '../fixtures/fleet-harness.js';

/**
 * The built `backhaul` command (`npm run build` first) against an in-process fleet on the loopback
 * site: submit, status, list, teardown, delete and retry as an operator runs them.
 *
 * The site's node sshd refuses forwarding. The fleet runs the user-space sshd through `srun` (which
 * works there, and whose carrier is a Slurm step, so "no extra step" means something); the retry test
 * briefly runs a fleet configured for the node's own sshd, whose sessions fail permanently.
 */

const DB = 7;
const BIN = new URL('../../bin/backhaul.js', import.meta.url).pathname;

interface Run {
  code: number;
  stdout: string;
  stderr: string;
  ms: number;
}

/** A clean environment: no BACKHAUL_CONFIG or REDIS_URL from the caller's shell. */
function cliEnv(env: NodeJS.ProcessEnv): NodeJS.ProcessEnv {
  const clean = { ...process.env };
  delete clean.BACKHAUL_CONFIG;
  delete clean.REDIS_URL;
  delete clean.BACKHAUL_LOG_LEVEL;
  return { ...clean, ...env };
}

function backhaul(args: string[], env: NodeJS.ProcessEnv = {}): Promise<Run> {
  const started = Date.now();
  return new Promise((resolve) => {
    execFile('node', [BIN, ...args], { env: cliEnv(env), timeout: 120_000 }, (err, stdout, stderr) => {
      const code = err ? (typeof err.code === 'number' ? err.code : 1) : 0;
      resolve({ code, stdout, stderr, ms: Date.now() - started });
    });
  });
}

function rawConfig(site: LoopbackSite, redisUrl: string, reverse: Record<string, unknown>) {
  return {
    Network: {
      SSH: {
        ...site.siteConfig.Network.SSH,
        Reverse: { ...site.siteConfig.Network.SSH.Reverse, PythonPath: PYTHON, WaitForForwards: '60s', ...reverse },
      },
    },
    Backhaul: {
      EndpointPolicy: LOOPBACK_ENDPOINT_POLICY,
      Kubernetes: NO_CLUSTER_CHECKS,
      Redis: { URL: redisUrl },
      KeepaliveInterval: '1s',
      SocketCheckInterval: '1s',
      LeaseTTL: '3s',
      RetryBackoff: '200ms',
      RetryLimit: 3,
    },
  };
}

/** A line of `status`'s table, split at runs of two or more spaces. */
function row(table: string, pod: string): string[] | undefined {
  return table
    .split('\n')
    .map((line) => line.split(/ {2,}/))
    .find((cells) => cells[0] === pod);
}

describe('backhaul submit / status / list / teardown / delete / retry against a running fleet', () => {
  let redis: Awaited<ReturnType<typeof privateRedis>>;
  let site: LoopbackSite;
  let dir: string;
  let configPath: string;
  let srunConfig: SiteConfig;
  let nodeConfig: SiteConfig;
  let fleet: RunningFleet & { redis: Redis };
  let echo: { server: Server; port: number };
  let h: Harness;

  /** The pod of the submit test, used by the status and teardown tests after it. */
  const web = { uid: uid(), name: 'web', jobId: '', plan: undefined as SessionPlan | undefined };
  /** How long commands against the reachable Redis took (the yardstick for the unreachable one). */
  const reachableMs: number[] = [];

  async function podFile(name: string, podUid: string | undefined, annotations: Record<string, string>) {
    const path = join(dir, `${name}.yaml`);
    const metadata = { name, namespace: 'user', ...(podUid ? { uid: podUid } : {}), annotations };
    await writeFile(path, toYaml({ apiVersion: 'v1', kind: 'Pod', metadata, spec: { containers: [] } }));
    return path;
  }

  const cli = (...args: string[]) => backhaul([...args, '--config', configPath]);

  async function podState(podUid: string): Promise<string | null> {
    return (await fleet.deps.store.load(podUid))?.state ?? null;
  }

  /** Everything a forgotten pod must not leave behind (ARCHITECTURE.md, "Aims (what good looks like)"). */
  async function expectNothingLeft(podUid: string, name: string, plan: SessionPlan, jobId: string): Promise<void> {
    expect(await podState(podUid)).toBeNull();
    expect(await keysNaming(redis.redis, podUid)).toEqual([`bh:hist:${podUid}`]);
    expect(await redis.redis.ttl(`bh:hist:${podUid}`)).toBeGreaterThan(0);
    expect(await queueEntriesNaming(redis.redis, podUid)).toEqual([]);
    expect(await redis.redis.zscore('bh:leases', podUid)).toBeNull();
    expect(await redis.redis.hget('bh:pods:by-name', `user/${name}`)).toBeNull();
    for (const f of plan.forwards) expect(await exists(f.socketPath)).toBe(false);
    await waitFor(
      'no carrier process of the job user',
      async () => ((await userProcesses(site.user.name, `${plan.socketDir}/carrier`)).length === 0 ? true : undefined),
      10_000,
    );
    await waitFor(
      'no carrier step',
      async () => ((await stepsOf(jobId)).filter((s) => !/\.(batch|extern)$/.test(s)).length === 0 ? true : undefined),
      10_000,
    );
    // The pod itself (its Slurm job) is not ours to end.
    expect((await jobState(jobId)).state).toBe('RUNNING');
  }

  beforeAll(async () => {
    redis = await privateRedis(DB);
    site = await startLoopbackSite({ nodeForwarding: 'refused' });
    dir = await mkdtemp(join(tmpdir(), 'bh-cli-fleet-'));
    const srun = rawConfig(site, redis.url, { Sshd: 'userspace', NodeExec: 'srun' });
    srunConfig = parseSiteConfig(srun);
    nodeConfig = parseSiteConfig(rawConfig(site, redis.url, { Sshd: 'node', NodeExec: 'ssh' }));
    configPath = join(dir, 'site.yaml');
    await writeFile(configPath, toYaml(srun));
    h = { site, config: srunConfig } as unknown as Harness;
    fleet = await inProcessFleet(srunConfig, redis.url, ['control', 'session'], 'cli-host');
    echo = await echoServer();
  }, 120_000);

  afterAll(async () => {
    await cancelSubmittedJobs().catch(() => undefined);
    await fleet?.stop();
    echo?.server.close();
    await site?.stop();
    if (dir) await rm(dir, { recursive: true, force: true });
    await redis?.close();
  });

  it('submit refuses a pod with a bad annotation: exit 2, the annotation named, nothing stored', async () => {
    const cases: [string, Record<string, string>, string[]][] = [
      [
        'low-port',
        { 'interlink.eu/reverse-forwards': 'kubernetes.default.svc.cluster.local:443' },
        ['interlink.eu/reverse-forwards', '"kubernetes.default.svc.cluster.local:443"', ':kubernetes.default.svc'],
      ],
      [
        'socks',
        { 'interlink.eu/reverse-forwards': 'minio:9000', 'interlink.eu/reverse-socks-port': '11080' },
        ['interlink.eu/reverse-socks-port'],
      ],
    ];
    const uids = cases.map(() => uid());
    const runs = await Promise.all(
      cases.map(async ([name, annotations], i) => cli('submit', await podFile(name, uids[i], annotations))),
    );
    cases.forEach(([name, , messages], i) => {
      const run = runs[i] as Run;
      expect(run.code, `${name}: ${run.stderr}`).toBe(2);
      expect(run.stdout).toBe('');
      for (const message of messages) expect(run.stderr, name).toContain(message);
      expect(run.stderr.trim().split('\n')).toHaveLength(1);
    });
    for (const podUid of uids) {
      expect(await keysNaming(redis.redis, podUid as string)).toEqual([]);
      expect(await queueEntriesNaming(redis.redis, podUid as string)).toEqual([]);
    }
    expect(await redis.redis.zcard('bh:pods')).toBe(0);
    expect(await redis.redis.hlen('bh:pods:by-name')).toBe(0);
  }, 60_000);

  it('submit --wait prints the states as they happen and exits 0 once the pod is active', async () => {
    const forwards = `15500:127.0.0.1:${echo.port}`;
    web.plan = planFor(h, web.uid, forwards);
    const path = await podFile(web.name, web.uid, { 'interlink.eu/reverse-forwards': forwards });
    const child = spawn('node', [BIN, 'submit', path, '--wait', '--timeout', '2m', '--config', configPath], {
      env: cliEnv({}),
    });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (chunk: Buffer) => {
      stdout += chunk.toString();
    });
    child.stderr.on('data', (chunk: Buffer) => {
      stderr += chunk.toString();
    });
    const exited = new Promise<number | null>((resolve) => child.on('exit', (code) => resolve(code)));
    try {
      // No Slurm job yet: the pod waits for a batch host, and the command says so while it waits.
      await waitFor('waitingBatchHost on stdout', () => stdout.includes('→ waitingBatchHost'), 45_000);
      expect(child.exitCode).toBeNull();
      expect(stdout).not.toContain('→ active');
      web.jobId = await sbatch(site.user, jobScript(h, web.plan, 'sleep 600\n'), { jobName: web.uid });
      const code = await exited;
      expect(code, stderr).toBe(0);
    } finally {
      child.kill();
    }
    const lines = stdout.trim().split('\n');
    expect(lines[0]).toBe(`submitted user/web ${web.uid}`);
    const order = ['validating', 'rendering', 'launchingShadow', 'waitingBatchHost', 'active'].map((state) =>
      lines.findIndex((line) => line.includes(`→ ${state}`)),
    );
    expect(order.every((i) => i > 0)).toBe(true);
    expect([...order].sort((a, b) => a - b)).toEqual(order);
    expect(lines.at(-1)).toMatch(/FORWARDS_READY +\w+ → active$/);
    expect(await podState(web.uid)).toBe('active');
  }, 120_000);

  it('status, status POD, --json and list show the pod, its timeline, lease and jobs', async () => {
    expect(await podState(web.uid)).toBe('active');
    const [table, detail, all, one, list, listJson] = await Promise.all([
      cli('status'),
      cli('status', 'user/web'),
      cli('status', '--json'),
      cli('status', web.uid, '--json'),
      cli('list'),
      cli('list', '--json'),
    ]);
    for (const run of [table, detail, all, one, list, listJson]) expect(run.code, run.stderr).toBe(0);
    reachableMs.push(table.ms, list.ms);

    expect(table.stdout.split('\n')[0]?.split(/ {2,}/)).toEqual([
      'POD',
      'STATE',
      'AGE',
      'ATTEMPTS',
      'HOST',
      'LAST ERROR',
    ]);
    expect(row(table.stdout, 'user/web')).toEqual([
      'user/web',
      'active',
      expect.stringMatching(/^\d+[smhd]$/),
      '0',
      'cli-host',
      '-',
    ]);

    expect(detail.stdout).toContain('pod         user/web\n');
    expect(detail.stdout).toContain(`uid         ${web.uid}\n`);
    expect(detail.stdout).toMatch(/state {7}active for \d+[smhd]\n/);
    expect(detail.stdout).toMatch(/generation {2}1 \(attempts 0\)\n/);
    expect(detail.stdout).toMatch(new RegExp(`job {9}${web.jobId} on bhnode1\\n`));
    // The relay's address as the shadow read it on the node: the derived one (nothing else held it).
    expect(detail.stdout).toContain(`addresses   ${bindAddress(web.uid, 0)}\n`);
    expect(detail.stdout).toMatch(/lease {7}cli-host, generation 1, expires in \d+s\n/);
    expect(detail.stdout).toContain(`  ${jobIds.session(web.uid, 1)}  active`);
    // Launch ran with the transition's effects: no step job of it to show.
    expect(detail.stdout).not.toContain(jobIds.step(web.uid, 'launch', 1));
    expect(detail.stdout).toContain('\ntimeline\n');
    expect(detail.stdout).toMatch(/ FORWARDS_READY +\w+ → active\n/);

    const array = JSON.parse(all.stdout) as Record<string, unknown>[];
    expect(Array.isArray(array)).toBe(true);
    expect(array.find((p) => p.uid === web.uid)).toMatchObject({
      namespace: 'user',
      name: 'web',
      state: 'active',
      generation: 1,
      attempts: 0,
      host: 'cli-host',
      lastError: null,
      snapshotError: null,
      history: expect.any(Array),
    });

    const pod = JSON.parse(one.stdout);
    expect(pod).toMatchObject({
      uid: web.uid,
      namespace: 'user',
      name: 'web',
      state: 'active',
      generation: 1,
      attempts: 0,
      host: 'cli-host',
      lastError: null,
      jobId: web.jobId,
      batchHost: 'bhnode1',
      relayAddresses: [bindAddress(web.uid, 0)],
      lease: { holder: 'cli-host', generation: 1 },
    });
    expect(pod.history.map((e: { to: string }) => e.to)).toEqual(
      expect.arrayContaining(['validating', 'rendering', 'launchingShadow', 'waitingBatchHost', 'active']),
    );
    expect(pod.steps.map((s: { id: string }) => s.id)).toContain(jobIds.session(web.uid, 1));

    expect(list.stdout).toContain(`user/web\t${web.uid}\tactive\n`);
    expect(JSON.parse(listJson.stdout)).toContainEqual({
      uid: web.uid,
      namespace: 'user',
      name: 'web',
      state: 'active',
    });
  }, 90_000);

  it('exit codes: an unknown pod is 1 with a message, bad usage is 2', async () => {
    const unknownUid = uid();
    const [byName, byUid, ...usage] = await Promise.all([
      cli('status', 'user/nobody'),
      cli('teardown', unknownUid),
      cli('status', 'user/web', 'extra'),
      backhaul(['status']),
    ]);
    expect(byName.code).toBe(1);
    expect(byName.stderr).toBe('backhaul: no pod user/nobody is known to backhaul\n');
    expect(byUid.code).toBe(1);
    expect(byUid.stderr).toBe(`backhaul: no pod with UID ${unknownUid} is known to backhaul\n`);
    expect(byUid.stdout).toBe('');
    for (const run of usage) {
      expect(run.code, run.stderr).toBe(2);
      expect(run.stderr).not.toBe('');
    }
    expect(usage[0]?.stderr).toContain('too many arguments');
    // status only reads: it needs Redis, not the site configuration, and says how to name it.
    expect(usage[1]?.stderr).toContain('pass --redis URL, set REDIS_URL, or name the site configuration');
  }, 90_000);

  it('two pods of one name: namespace/name is refused with both UIDs, status marks them, each goes by its UID', async () => {
    const uids = [uid(), uid()];
    const forwards = { 'interlink.eu/reverse-forwards': `15601:127.0.0.1:${echo.port}` };
    for (const [i, podUid] of uids.entries()) {
      // The same name in two manifests: a pod deleted and created again, or submitted twice.
      const path = join(dir, `twin-${i}.yaml`);
      const metadata = { name: 'twin', namespace: 'user', uid: podUid, annotations: forwards };
      await writeFile(path, toYaml({ apiVersion: 'v1', kind: 'Pod', metadata, spec: { containers: [] } }));
      const run = await cli('submit', path);
      expect(run.code, run.stderr).toBe(0);
    }
    const ambiguous = await cli('teardown', 'user/twin');
    expect(ambiguous.code, ambiguous.stderr).toBe(2);
    expect(ambiguous.stderr).toContain('2 pods are named user/twin');
    for (const podUid of uids) expect(ambiguous.stderr).toContain(podUid);
    const table = await cli('status');
    for (const podUid of uids) expect(table.stdout).toContain(`user/twin (uid ${podUid})`);
    expect(table.stdout).toContain('1 name(s) belong to more than one pod');
    for (const podUid of uids) {
      const run = await cli('delete', podUid);
      expect(run.code, run.stderr).toBe(0);
    }
    for (const podUid of uids) {
      await waitFor(
        'the twin to be forgotten',
        async () => ((await podState(podUid)) === null ? true : undefined),
        30_000,
      );
    }
    expect((await cli('status', 'user/twin')).stderr).toBe('backhaul: no pod user/twin is known to backhaul\n');
  }, 90_000);

  it('exit 1, one clear line and no stack trace when Redis cannot be reached, quickly', async () => {
    const [run, viaEnv] = await Promise.all([
      cli('status', '--redis', 'redis://:hunter2@127.0.0.1:1'),
      backhaul(['list', '--config', configPath], { REDIS_URL: 'redis://127.0.0.1:1' }),
    ]);
    expect(run.code).toBe(1);
    expect(run.stdout).toBe('');
    // A password on the command line is warned about (ps shows it), then the one line saying what failed.
    const [warning, failure, ...more] = run.stderr.trim().split('\n');
    expect(warning).toMatch(
      /^backhaul: warning: the --redis URL carries a password, which every user of this machine can read in ps/,
    );
    expect(failure).toMatch(/^backhaul: cannot reach Redis at redis:\/\/\S*127\.0\.0\.1:1\b.*ECONNREFUSED/);
    expect(more).toEqual([]);
    expect(run.stderr).not.toContain('hunter2');
    expect(viaEnv.code).toBe(1);
    expect(viaEnv.stderr).toBe(
      'backhaul: cannot reach Redis at redis://127.0.0.1:1: connect ECONNREFUSED 127.0.0.1:1\n',
    );
    // No longer than a command against a reachable Redis, plus a little: no long retries.
    const slowest = Math.max(...reachableMs);
    expect(Math.max(run.ms, viaEnv.ms)).toBeLessThan(slowest + 3_000);
  }, 60_000);

  it('shows a snapshot of an unknown machine version as unreadable, and does not send it events', async () => {
    const future = uid();
    await fleet.deps.store.create(future, {
      snapshot: { version: 999, state: 'hovering', context: { uid: future } },
      version: 999,
      state: 'hovering',
      namespace: 'user',
      name: 'future',
      history: { at: Date.now() - 5_000, event: 'POD_UPSERT', from: '', to: 'hovering' },
    });
    try {
      const [table, detail, json, teardown] = await Promise.all([
        cli('status'),
        cli('status', 'user/future'),
        cli('status', 'user/future', '--json'),
        cli('teardown', 'user/future'),
      ]);
      for (const run of [table, detail, json]) expect(run.code, run.stderr).toBe(0);
      const cells = row(table.stdout, 'user/future');
      expect(cells?.[1]).toBe('hovering (unreadable)');
      expect(cells?.[5]).toContain('stored with machine version 999; this build runs version 1');
      // The other pods are shown as ever.
      expect(row(table.stdout, 'user/web')?.[1]).toBe('active');

      expect(detail.stdout).toContain('snapshot    unreadable by this build: stored with machine version 999');
      expect(detail.stdout).toContain('POD_UPSERT');

      expect(JSON.parse(json.stdout)).toMatchObject({
        uid: future,
        namespace: 'user',
        name: 'future',
        state: 'hovering',
        generation: null,
        attempts: null,
        host: null,
        lastError: null,
        snapshotError: expect.stringContaining('machine version 999'),
        history: [expect.objectContaining({ event: 'POD_UPSERT', to: 'hovering' })],
      });

      // An event for it could only fail in the control worker: the command says why instead.
      expect(teardown.code).toBe(1);
      expect(teardown.stderr).toContain(
        'user/future: this build cannot act on the pod: stored with machine version 999',
      );
      expect(await queueEntriesNaming(redis.redis, future)).toEqual([]);
    } finally {
      await fleet.deps.store.remove(future, 1);
    }
  }, 90_000);

  it('teardown POD: the tunnel goes, the pod is forgotten, nothing but its history is left', async () => {
    const plan = web.plan;
    if (!plan) throw new Error('the submit test did not run');
    expect(await podState(web.uid)).toBe('active');
    expect((await stepsOf(web.jobId)).filter((s) => !/\.(batch|extern)$/.test(s))).toHaveLength(1);
    expect(await userProcesses(site.user.name, `${plan.socketDir}/carrier`)).not.toEqual([]);
    const run = await cli('teardown', 'user/web', '--reason', 'maintenance');
    expect(run.code, run.stderr).toBe(0);
    expect(run.stdout).toBe(`tearing down user/web (${web.uid})\n`);
    await waitFor(
      'the pod to be forgotten',
      async () => ((await podState(web.uid)) === null ? true : undefined),
      30_000,
    );
    await expectNothingLeft(web.uid, web.name, plan, web.jobId);
    const history = await fleet.deps.store.history(web.uid);
    expect(history.find((e) => e.event === 'TEARDOWN')).toMatchObject({
      from: 'active',
      to: 'tearingDown',
      detail: 'maintenance',
    });
    expect(history.at(-1)).toMatchObject({ from: 'tearingDown', to: 'done' });
    await scancel(web.jobId);
  }, 90_000);

  it('delete POD --wait: follows the teardown until the pod is forgotten, and leaves nothing', async () => {
    const podUid = uid();
    const forwards = `15501:127.0.0.1:${echo.port}`;
    const plan = planFor(h, podUid, forwards);
    const jobId = await sbatch(site.user, jobScript(h, plan, 'sleep 600\n'), { jobName: podUid });
    await waitForState(jobId, ['RUNNING'], 30_000);
    const submitted = await cli(
      'submit',
      await podFile(plan.name, podUid, { 'interlink.eu/reverse-forwards': forwards }),
    );
    expect(submitted.code, submitted.stderr).toBe(0);
    await waitForPodState(fleet, podUid, 'active', 60_000);
    const run = await cli('delete', `user/${plan.name}`, '--wait', '--timeout', '60');
    expect(run.code, run.stderr).toBe(0);
    expect(run.stdout).toContain(`deleting user/${plan.name} (${podUid})\n`);
    expect(run.stdout).toMatch(/POD_DELETED +active → tearingDown/);
    expect(run.stdout).toMatch(/STEP_DONE +tearingDown → done/);
    await expectNothingLeft(podUid, plan.name, plan, jobId);
    expect((await cli('status', `user/${plan.name}`)).code).toBe(1);
    await scancel(jobId);
  }, 120_000);

  it('retry brings a failed pod back once its cause is fixed', async () => {
    const podUid = uid();
    const forwards = `15502:127.0.0.1:${echo.port}`;
    const plan = planFor(h, podUid, forwards);
    const path = await podFile(plan.name, podUid, { 'interlink.eu/reverse-forwards': forwards });
    const jobId = await sbatch(site.user, jobScript(h, plan, 'sleep 600\n'), { jobName: podUid });
    await waitForState(jobId, ['RUNNING'], 30_000);

    // A fleet set up for the node's own sshd: it refuses forwarding, a permanent failure.
    await fleet.stop();
    const nodeFleet = await inProcessFleet(nodeConfig, redis.url, ['control', 'session'], 'node-host');
    try {
      expect((await cli('submit', path)).code).toBe(0);
      await waitForPodState(nodeFleet, podUid, 'failed', 60_000);
      const failed = JSON.parse((await cli('status', podUid, '--json')).stdout);
      expect(failed).toMatchObject({ state: 'failed', generation: 1, lastError: { kind: 'forwarding-refused' } });
      expect(failed.lastError.message).toContain('Server has disabled streamlocal forwarding');
    } finally {
      await nodeFleet.stop();
    }

    // The fix: the fleet runs the user-space sshd again. Retry starts the pod over.
    fleet = await inProcessFleet(srunConfig, redis.url, ['control', 'session'], 'cli-host');
    const run = await cli('retry', `user/${plan.name}`);
    expect(run.code, run.stderr).toBe(0);
    expect(run.stdout).toBe(`retrying user/${plan.name} (${podUid})\n`);
    await waitForPodState(fleet, podUid, 'active', 60_000);
    const back = (await fleet.deps.store.load(podUid))?.snapshot as {
      context: { generation: number; attempts: number; host: string };
    };
    // A new shadow (generation 2, or later if a busy machine made the carrier look dead and the machine
    // relaunched it: that is the retry budget at work, not a failure), active on the new fleet's host.
    const timeline = JSON.stringify(await fleet.deps.store.history(podUid));
    expect(back.context, timeline).toMatchObject({ attempts: 0, host: 'cli-host' });
    expect(back.context.generation, timeline).toBeGreaterThanOrEqual(2);
    expect((await fleet.deps.store.history(podUid)).find((e) => e.event === 'RETRY')).toMatchObject({
      from: 'failed',
      to: 'validating',
    });

    // Retry is for failed pods: an active one is left alone, and the command says so.
    const again = await cli('retry', podUid);
    expect(again.code).toBe(1);
    expect(again.stderr).toContain('active');
    expect(await podState(podUid)).toBe('active');

    const deleted = await cli('delete', podUid, '--wait');
    expect(deleted.code, deleted.stderr).toBe(0);
    await expectNothingLeft(podUid, plan.name, plan, jobId);
    await scancel(jobId);
  }, 150_000);
});
