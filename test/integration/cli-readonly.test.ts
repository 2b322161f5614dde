import { type ChildProcess, execFile, spawn } from 'node:child_process';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { basename, join, relative } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { PodFollower } from '../../src/cli/pod-follow.js';
import { silentLogger } from '../../src/log.js';
import { type FleetDeps, fleetDeps, podReadDeps } from '../../src/pods/fleet-deps.js';
import { controlOnlyConfig, drive, eventsUpTo } from '../../tools/sandbox/control-only.js';
import { waitFor } from '../../tools/sandbox/shadow-harness.js';
import { privateRedis } from '../fixtures/fleet-harness.js';
import { containerOf, renderOverlay, SITE_ADDRESSES } from '../fixtures/kustomize.js';

/**
 * The commands that only look at the fleet (`status`, `list`, `status --watch`), run as the built
 * command with Redis alone: no site configuration, and nothing written into Redis.
 */

const DB = 14;
const BIN = new URL('../../bin/backhaul.js', import.meta.url).pathname;

let redis: Awaited<ReturnType<typeof privateRedis>>;
let deps: FleetDeps | undefined;
/** The fleet's side, which writes pods (opened only once the empty database has been looked at). */
const fleet = (): FleetDeps => {
  deps ??= fleetDeps(controlOnlyConfig(DB), redis.redis, silentLogger());
  return deps;
};
const children: ChildProcess[] = [];

/** No BACKHAUL_CONFIG or REDIS_URL from the caller's shell. */
function cliEnv(): NodeJS.ProcessEnv {
  const clean = { ...process.env };
  delete clean.BACKHAUL_CONFIG;
  delete clean.REDIS_URL;
  return clean;
}

function backhaul(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    execFile('node', [BIN, ...args], { env: cliEnv(), timeout: 60_000 }, (err, stdout, stderr) => {
      resolve({ code: err ? (typeof err.code === 'number' ? err.code : 1) : 0, stdout, stderr });
    });
  });
}

async function allKeys(): Promise<string[]> {
  return (await redis.redis.keys('*')).sort();
}

beforeAll(async () => {
  redis = await privateRedis(DB);
});

afterAll(async () => {
  for (const child of children) child.kill('SIGKILL');
  await deps?.queues.close();
  await redis?.close();
});

describe('read-only commands', () => {
  it('list and status need only --redis, and write nothing into Redis (BullMQ metadata included)', async () => {
    await redis.redis.flushdb();
    const list = await backhaul(['list', '--redis', redis.url]);
    expect(list, list.stderr).toMatchObject({ code: 0, stdout: '' });
    const status = await backhaul(['status', '--redis', redis.url, '--json']);
    expect(status.code, status.stderr).toBe(0);
    expect(JSON.parse(status.stdout)).toEqual([]);
    expect(await allKeys()).toEqual([]);
  });

  it('without --redis, REDIS_URL or a configuration: exit 2, saying what to give', async () => {
    const run = await backhaul(['list']);
    expect(run.code).toBe(2);
    expect(run.stderr).toContain('pass --redis URL, set REDIS_URL, or name the site configuration');
  });

  it('shows a pod in detail without a configuration, and leaves only what the fleet wrote', async () => {
    const podUid = `ro${process.pid.toString(16)}-0000-4000-8000-000000000001`;
    await drive(fleet(), podUid, eventsUpTo('waitingBatchHost', Date.now(), 'watched'));
    const before = await allKeys();
    const run = await backhaul(['status', 'user/watched', '--redis', redis.url]);
    expect(run.code, run.stderr).toBe(0);
    expect(run.stdout).toContain('waitingBatchHost');
    expect(run.stdout).toContain(podUid);
    expect(await allKeys()).toEqual(before);
  });

  it('`kubectl -n backhaul exec deploy/backhaul-fleet -- backhaul status` works with the fleet container’s own environment', async () => {
    // The Deployment as an overlay renders it: its env (the Secret's URL resolved to this Redis) and its
    // site configuration where the container mounts it (here in a temporary directory). No API server
    // runs here to exec into; everything the command gets from the pod is given as the pod gives it.
    const objects = renderOverlay('bundled-redis', SITE_ADDRESSES);
    const container = containerOf(objects, 'backhaul-fleet');
    const site = objects.find((o) => o.kind === 'ConfigMap' && o.metadata.name === 'backhaul-site');
    const dir = await mkdtemp(join(tmpdir(), 'bh-exec-'));
    try {
      const env: NodeJS.ProcessEnv = { PATH: process.env.PATH };
      for (const e of container.env ?? []) {
        if (e.valueFrom?.secretKeyRef) {
          expect(e.valueFrom.secretKeyRef).toEqual({ name: 'backhaul-redis', key: 'url' });
          env[e.name] = redis.url;
        } else if (e.name === 'BACKHAUL_CONFIG') {
          const mount = container.volumeMounts?.find((m) => e.value?.startsWith(`${m.mountPath}/`));
          const file = join(dir, relative(mount?.mountPath ?? '/', e.value ?? ''));
          await writeFile(file, (site?.data as Record<string, string>)[basename(file)] ?? '');
          env[e.name] = file;
        } else env[e.name] = e.value;
      }
      expect(Object.keys(env).sort()).toEqual([
        'BACKHAUL_CONFIG',
        'BACKHAUL_LOG_LEVEL',
        'NODE_OPTIONS',
        'PATH',
        'REDIS_URL',
      ]);
      const run = await new Promise<{ code: number; stdout: string; stderr: string }>((resolve) => {
        execFile('node', [BIN, 'status'], { env, timeout: 60_000 }, (err, stdout, stderr) => {
          resolve({ code: err ? (typeof err.code === 'number' ? err.code : 1) : 0, stdout, stderr });
        });
      });
      expect(run.code, run.stderr).toBe(0);
      expect(run.stdout).toContain('user/watched');
      expect(run.stdout).toContain('waitingBatchHost');
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  it('status --watch writes a frame when the pod changes, and ends with exit 0 on Ctrl-C', async () => {
    const podUid = `ro${process.pid.toString(16)}-0000-4000-8000-000000000002`;
    await drive(fleet(), podUid, eventsUpTo('openingCarrier', Date.now(), 'followed'));
    const child = spawn('node', [BIN, 'status', podUid, '--redis', redis.url, '--watch', '--interval', '0.2'], {
      env: cliEnv(),
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    children.push(child);
    let out = '';
    let err = '';
    child.stdout?.on('data', (chunk: Buffer) => {
      out += chunk.toString();
    });
    child.stderr?.on('data', (chunk: Buffer) => {
      err += chunk.toString();
    });
    const frames = () => out.split(/^--- /m).filter(Boolean);
    await waitFor('the first frame', () => (frames().length >= 1 ? true : undefined), 15_000).catch((e: Error) => {
      throw new Error(`${e.message}: stdout ${out} stderr ${err}`);
    });
    expect(frames()[0]).toContain('openingCarrier');
    // Nothing changes: no frame is written again (to a pipe, only changes are).
    await new Promise((r) => setTimeout(r, 1_000));
    expect(frames()).toHaveLength(1);
    await drive(fleet(), podUid, [{ type: 'CARRIER_OPEN', generation: 1, at: Date.now() }]);
    await waitFor('a second frame', () => (frames().length >= 2 ? true : undefined), 10_000).catch((e: Error) => {
      throw new Error(`${e.message}: stdout ${out} stderr ${err}`);
    });
    expect(frames()[1]).toContain('establishingForwards');
    const exited = new Promise<number | null>((resolve) => child.on('exit', (code) => resolve(code)));
    child.kill('SIGINT');
    expect(await exited, err).toBe(0);
  }, 60_000);

  it('waiting that times out says what the pod waits for (--wait of submit and delete)', async () => {
    const podUid = `ro${process.pid.toString(16)}-0000-4000-8000-000000000003`;
    await drive(fleet(), podUid, eventsUpTo('waitingBatchHost', Date.now(), 'unscheduled'));
    const reader = podReadDeps(redis.redis);
    try {
      const waited = new PodFollower(reader, podUid, { write: () => undefined }).until((s) => s === 'active', 300);
      await expect(waited).rejects.toThrow(
        `timed out after 0.3 s; the pod is waitingBatchHost: its Slurm job is not running: the job must be named after the pod UID (squeue --name=${podUid})`,
      );
    } finally {
      await reader.queues.close();
    }
  });

  it('refuses a bad --interval, naming it', async () => {
    const run = await backhaul(['status', '--redis', redis.url, '--watch', '--interval', 'soon']);
    expect(run.code).toBe(2);
    expect(run.stderr).toContain('--interval: expected seconds ("90", "0.5") or a duration such as');
  });
});
