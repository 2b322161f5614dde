import { spawn } from 'node:child_process';
import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { stringify } from 'yaml';
import { KUBE_API_ACCESS } from '../../src/cluster/kube-api.js';
import { PodWatcher } from '../../src/cluster/pod-watcher.js';
import { ANNOTATION } from '../../src/contract/annotations.js';
import type { SiteConfig } from '../../src/contract/site-config.js';
import { type RunningFleet, startFleet } from '../../src/fleet/fleet.js';
import { silentLogger } from '../../src/log.js';
import { sendEvent } from '../../src/pods/queues.js';
import { createRedis } from '../../src/store/redis.js';
import { freePort } from '../../tools/sandbox/sshd.js';
import { privateRedis } from '../fixtures/fleet-harness.js';
import {
  type KubeHarness,
  kubeHarness,
  kubeSite,
  reversePod,
  type SentEvent,
  spyOnEvents,
  VIRTUAL_NODE,
  waitFor,
} from '../fixtures/kube-harness.js';

const DB = 11;
const NS = 'user';

/**
 * The pod watcher against the fake API server, with a real control role consuming its events: a
 * machine per live pod on the virtual node, torn down when the pod goes, through dropped watches,
 * 410 Gone, an API server restart and a watcher restart.
 */
describe('pod watcher (watch role) against the fake API server', () => {
  let kube: KubeHarness;
  let redis: Awaited<ReturnType<typeof privateRedis>>;
  let config: SiteConfig;
  let fleet: RunningFleet;
  let sent: SentEvent[];
  let watcher: PodWatcher | undefined;

  const startWatcher = async () => {
    const w = new PodWatcher(fleet.deps, kube.kubeConfig(), config.Backhaul.Kubernetes, {
      resyncMs: 60_000,
      backoffBaseMs: 100,
      backoffMaxMs: 1_000,
      watchTimeoutSeconds: 60,
    });
    w.start();
    await w.whenSynced();
    return w;
  };
  const sentFor = (uid: string, type?: SentEvent['type']) =>
    sent.filter((e) => e.uid === uid && (type === undefined || e.type === type));
  const machine = (uid: string) => fleet.deps.store.load(uid);
  const waitMachine = (uid: string) => waitFor(`a machine for ${uid}`, async () => (await machine(uid)) ?? undefined);
  const waitNoMachine = (uid: string) =>
    waitFor(`the machine of ${uid} to be gone`, async () => (await machine(uid)) === null);
  const scheduled = (name: string, annotations?: Record<string, string>, node = VIRTUAL_NODE) => {
    kube.api.createPod(reversePod(name, annotations));
    return kube.api.schedule(NS, name, node).metadata.uid;
  };
  /** Lets the watcher and the control worker catch up. */
  const settle = async () => {
    await new Promise((r) => setTimeout(r, 400));
    await watcher?.idle();
  };

  beforeAll(async () => {
    kube = await kubeHarness({ bookmarkEveryMs: 300 });
    redis = await privateRedis(DB);
    config = kubeSite(redis.url, kube.kubeconfigFile);
    const connection = createRedis(redis.url);
    fleet = await startFleet(config, connection, silentLogger(), {
      roles: ['control'],
      bullPrefix: 'bhkw',
      reaperEveryMs: 60_000,
    });
    const stop = fleet.stop;
    fleet.stop = async () => {
      await stop();
      connection.disconnect();
    };
    sent = spyOnEvents(fleet.deps.queues.events);
    watcher = await startWatcher();
  });

  afterAll(async () => {
    await watcher?.stop();
    await fleet?.stop();
    await redis?.close();
    await kube?.close();
  });

  beforeEach(() => {
    kube.api.clearFailures();
  });

  it('gives a machine to a pod scheduled to the virtual node, and to nothing else', async () => {
    kube.api.createPod(reversePod('unscheduled'));
    const other = scheduled('other-node', undefined, 'worker-1');
    const plain = scheduled('no-annotations', {});
    const uid = scheduled('train-1');
    await waitMachine(uid);
    await settle();
    expect(sentFor(uid, 'POD_UPSERT')).toHaveLength(1);
    const stored = await machine(uid);
    expect(stored).toMatchObject({ namespace: NS, name: 'train-1' });
    for (const u of [other, plain]) {
      expect(await machine(u)).toBeNull();
      expect(sentFor(u)).toEqual([]);
    }
  });

  it('sends nothing for an update that changes nothing relevant, and one POD_UPSERT for one that does', async () => {
    const uid = scheduled('train-2');
    await waitMachine(uid);
    kube.api.setPhase(NS, 'train-2', 'Running');
    kube.api.updatePod(NS, 'train-2', (pod) => {
      pod.metadata.labels = { app: 'train', extra: 'x' };
    });
    await settle();
    expect(sentFor(uid, 'POD_UPSERT')).toHaveLength(1);
    kube.api.updatePod(NS, 'train-2', (pod) => {
      (pod.metadata.annotations as Record<string, string>)[ANNOTATION.forwards] =
        'minio.storage.svc.cluster.local:9000 redis.cache:6379';
    });
    await waitFor('a second upsert', () => sentFor(uid, 'POD_UPSERT').length === 2);
    await settle();
    expect(sentFor(uid, 'POD_UPSERT')).toHaveLength(2);
  });

  it('sends POD_DELETED once when the pod is deleted (gracefully: deletionTimestamp, then gone)', async () => {
    const uid = scheduled('train-3');
    await waitMachine(uid);
    kube.api.deletePod(NS, 'train-3', { graceful: true });
    await waitFor('POD_DELETED', () => sentFor(uid, 'POD_DELETED').length === 1);
    kube.api.deletePod(NS, 'train-3');
    await waitNoMachine(uid);
    await settle();
    expect(sentFor(uid, 'POD_DELETED')).toHaveLength(1);
    const history = await fleet.deps.store.history(uid);
    expect(history.map((h) => h.event)).toContain('POD_DELETED');
  });

  it('ends the machine of a pod that finished (phase Succeeded) with a TEARDOWN', async () => {
    const uid = scheduled('train-4');
    await waitMachine(uid);
    kube.api.setPhase(NS, 'train-4', 'Succeeded');
    await waitNoMachine(uid);
    expect(sentFor(uid, 'TEARDOWN')).toHaveLength(1);
    expect((await fleet.deps.store.history(uid)).some((h) => h.detail === 'pod-succeeded')).toBe(true);
  });

  it('misses nothing and doubles nothing when the watch is dropped mid-stream', async () => {
    const a = scheduled('drop-a');
    await waitMachine(a);
    const watchesBefore = kube.api.calls.filter((c) => c.verb === 'watch').length;
    const listsBefore = kube.api.calls.filter((c) => c.verb === 'list').length;
    kube.api.dropWatches();
    const b = scheduled('drop-b');
    kube.api.deletePod(NS, 'drop-a');
    kube.api.dropWatches();
    const c = scheduled('drop-c');
    await waitMachine(b);
    await waitMachine(c);
    await waitNoMachine(a);
    await settle();
    const resumed = kube.api.calls.filter((x) => x.verb === 'watch').slice(watchesBefore);
    expect(resumed.length).toBeGreaterThan(0);
    for (const call of resumed) expect(call.query.resourceVersion).toMatch(/^\d+$/);
    // Resumed from the last resourceVersion: no relist was needed.
    expect(kube.api.calls.filter((x) => x.verb === 'list').length).toBe(listsBefore);
    expect(sentFor(a, 'POD_UPSERT')).toHaveLength(1);
    expect(sentFor(a, 'POD_DELETED')).toHaveLength(1);
    expect(sentFor(b, 'POD_UPSERT')).toHaveLength(1);
    expect(sentFor(c, 'POD_UPSERT')).toHaveLength(1);
  });

  it('relists on 410 Gone (an ERROR event with a 410 Status, or HTTP 410) and diffs: nothing missed, nothing doubled', async () => {
    for (const goneAs of ['event', 'http'] as const) {
      const keep = scheduled(`gone-keep-${goneAs}`);
      const doomed = scheduled(`gone-doomed-${goneAs}`);
      await waitMachine(keep);
      await waitMachine(doomed);
      await settle();
      // Keep the watcher away while the cluster changes and the history is compacted.
      kube.api.failNext(503, 1_000, (call) => call.verb === 'watch');
      kube.api.dropWatches();
      await new Promise((r) => setTimeout(r, 300));
      const fresh = scheduled(`gone-fresh-${goneAs}`);
      kube.api.deletePod(NS, `gone-doomed-${goneAs}`);
      kube.api.updatePod(NS, `gone-keep-${goneAs}`, (pod) => {
        pod.metadata.labels = { app: 'train', touched: 'yes' };
      });
      kube.api.compact();
      kube.api.goneAs = goneAs;
      const listsBefore = kube.api.calls.filter((x) => x.verb === 'list').length;
      kube.api.clearFailures();
      await waitMachine(fresh);
      await waitNoMachine(doomed);
      await settle();
      expect(kube.api.calls.filter((x) => x.verb === 'list').length).toBeGreaterThan(listsBefore);
      expect(sentFor(fresh, 'POD_UPSERT')).toHaveLength(1);
      expect(sentFor(doomed, 'POD_DELETED')).toHaveLength(1);
      expect(sentFor(keep)).toHaveLength(1); // its first POD_UPSERT only
    }
    kube.api.goneAs = 'event';
  });

  it('comes back after the API server restarts on the same port', async () => {
    const before = scheduled('restart-before');
    await waitMachine(before);
    const restarting = kube.api.restart({ downMs: 1_500, compact: true });
    await new Promise((r) => setTimeout(r, 100));
    // Changes made while it is down (they are in its store when it comes back).
    const during = scheduled('restart-during');
    kube.api.deletePod(NS, 'restart-before');
    await restarting;
    await waitMachine(during);
    await waitNoMachine(before);
    await settle();
    expect(sentFor(during, 'POD_UPSERT')).toHaveLength(1);
    expect(sentFor(before, 'POD_DELETED')).toHaveLength(1);
  });

  it('reconciles on start: pods created while it was down get machines, machines of vanished pods get POD_DELETED', async () => {
    const stays = scheduled('down-stays');
    const vanishes = scheduled('down-vanishes');
    const operatorTornDown = scheduled('down-torn-down');
    for (const u of [stays, vanishes, operatorTornDown]) await waitMachine(u);
    await watcher?.stop();
    watcher = undefined;
    // While the watcher is down: one pod created, one deleted; an operator tears one down (its pod lives).
    const created = scheduled('down-created');
    kube.api.deletePod(NS, 'down-vanishes');
    await sendEvent(fleet.deps.queues, operatorTornDown, { type: 'TEARDOWN', reason: 'operator', at: Date.now() });
    await waitNoMachine(operatorTornDown);
    const before = sent.length;
    watcher = await startWatcher();
    await waitMachine(created);
    await waitNoMachine(vanishes);
    await settle();
    const after = sent.slice(before);
    expect(after.filter((e) => e.uid === created && e.type === 'POD_UPSERT')).toHaveLength(1);
    expect(after.filter((e) => e.uid === vanishes && e.type === 'POD_DELETED')).toHaveLength(1);
    // Unchanged pods with machines: nothing; a pod torn down by an operator is not started again.
    expect(after.filter((e) => e.uid === stays)).toEqual([]);
    expect(after.filter((e) => e.uid === operatorTornDown)).toEqual([]);
    expect(await machine(operatorTornDown)).toBeNull();
    // The vanished pod was confirmed gone with a GET before its machine was ended.
    expect(kube.api.calls.some((c) => c.verb === 'get' && c.name === 'down-vanishes')).toBe(true);
    // A periodic resync with nothing changed sends nothing.
    const quiet = sent.length;
    await watcher.resync();
    await settle();
    expect(sent.slice(quiet)).toEqual([]);
  });

  it('used only the API calls its RBAC grants', () => {
    const granted = new Set(
      Object.entries(KUBE_API_ACCESS).flatMap(([resource, verbs]) => verbs.map((v) => `${resource}.${v}`)),
    );
    const used = kube.api.usedAccess();
    for (const call of used) expect(granted).toContain(call);
    for (const call of ['pods.list', 'pods.watch', 'pods.get']) expect(used).toContain(call);
  });
});

describe('the watch role in the fleet', () => {
  it('starts with startFleet, syncs, and stops', async () => {
    const kube = await kubeHarness();
    const redis = await privateRedis(DB);
    const connection = createRedis(redis.url);
    try {
      const config = kubeSite(redis.url, kube.kubeconfigFile);
      kube.api.createPod(reversePod('role-pod'));
      const uid = kube.api.schedule(NS, 'role-pod', VIRTUAL_NODE).metadata.uid;
      const fleet = await startFleet(config, connection, silentLogger(), {
        roles: ['control', 'watch'],
        bullPrefix: 'bhkr',
        reaperEveryMs: 60_000,
      });
      try {
        expect(fleet.cluster.watcher).toBeDefined();
        await fleet.cluster.watcher?.whenSynced();
        expect(fleet.cluster.watcher?.synced).toBe(true);
        await waitFor('the machine', async () => (await fleet.deps.store.load(uid)) ?? undefined);
        // Its pre-exec has no prelude (no webhook in this cluster): the pod gets a Warning Event.
        const warning = await waitFor('the PreludeMissing Event', () =>
          kube.api.listEvents(NS).find((e) => e.reason === 'PreludeMissing'),
        );
        expect(warning).toMatchObject({ type: 'Warning', involvedObject: { kind: 'Pod', name: 'role-pod', uid } });
      } finally {
        await fleet.stop();
      }
      expect(await kube.api.openWatchesAfter(), 'watches still open 3 s after the fleet stopped').toBe(0);
    } finally {
      connection.disconnect();
      await redis.close();
      await kube.close();
    }
  });

  it('runs as `backhaul worker --roles control,watch --health-port`: probes answer, SIGTERM stops it cleanly', async () => {
    const kube = await kubeHarness();
    const redis = await privateRedis(DB);
    try {
      const port = await freePort();
      const configFile = join(kube.dir, 'site.yaml');
      await writeFile(
        configFile,
        stringify({
          Network: {
            SSH: {
              LoginHost: 'login.example.org',
              User: 'hpc',
              KeyFile: '/k',
              KnownHostsFile: '/kh',
              Reverse: { Enabled: true },
            },
          },
          Backhaul: {
            // The pod reaches minio.storage from its own namespace: allowed by name here.
            EndpointPolicy: { Allow: { Namespaces: ['storage'] } },
            Kubernetes: { Kubeconfig: kube.kubeconfigFile, VirtualNodes: [VIRTUAL_NODE] },
          },
        }),
      );
      // The default site checks the namespace's opt-in label and the NetworkPolicies (none here).
      kube.api.putNamespace(NS, { 'interlink.eu/backhaul': 'enabled' });
      kube.api.createPod(reversePod('cli-pod'));
      const uid = kube.api.schedule(NS, 'cli-pod', VIRTUAL_NODE).metadata.uid;
      const argv = ['worker', '--roles', 'control,watch', '--config', configFile, '--redis', redis.url];
      argv.push('--health-port', String(port), '--health-address', '127.0.0.1');
      const child = spawn(
        process.execPath,
        [
          '--import',
          'tsx',
          '-e',
          `import('./src/cli/main.ts').then(async (m) => { process.exitCode = await m.main(${JSON.stringify(argv)}); })`,
        ],
        {
          cwd: join(import.meta.dirname, '../..'),
          stdio: ['ignore', 'ignore', 'pipe'],
          env: { ...process.env, BACKHAUL_LOG_LEVEL: 'warn' },
        },
      );
      let stderr = '';
      child.stderr?.on('data', (d: Buffer) => {
        stderr += d.toString();
      });
      const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
      try {
        const probe = async (path: string) => {
          try {
            const res = await fetch(`http://127.0.0.1:${port}${path}`);
            return { status: res.status, body: (await res.json()) as { failing?: string[] } };
          } catch {
            return undefined;
          }
        };
        await waitFor('/livez', async () => (await probe('/livez'))?.status === 200, 60_000);
        await waitFor('/readyz', async () => (await probe('/readyz'))?.status === 200, 60_000);
        await waitFor('the machine', async () => (await redis.redis.exists(`bh:pod:${uid}`)) === 1, 30_000);
        // Prometheus metrics on the same port: the pod's transitions, the fleet's pods by state, the process.
        await waitFor(
          'the pod in launchingShadow',
          async () => (await redis.redis.hget(`bh:pod:${uid}`, 'state')) === 'launchingShadow',
          30_000,
        );
        const res = await fetch(`http://127.0.0.1:${port}/metrics`);
        expect(res.status).toBe(200);
        expect(res.headers.get('content-type')).toMatch(/^text\/plain; version=0\.0\.4/);
        const text = await res.text();
        expect(text).toContain('# HELP backhaul_transitions_total ');
        expect(text).toMatch(/^backhaul_transitions_total\{to="validating",event="POD_UPSERT"\} 1$/m);
        expect(text).toMatch(/^backhaul_transitions_total\{to="launchingShadow",event="STEP_DONE"\} 1$/m);
        expect(text).toMatch(/^backhaul_pods\{state="launchingShadow"\} 1$/m);
        expect(text).toMatch(/^backhaul_process_resident_memory_bytes \d+/m);
      } finally {
        child.kill('SIGTERM');
      }
      expect(await exited, stderr).toBe(0);
      // Its Redis connections, BullMQ's included, were closed by the fleet: none reported as lost.
      expect(stderr).not.toContain('closed for good');
      expect(await kube.api.openWatchesAfter(), `watches still open 3 s after the worker exited; ${stderr}`).toBe(0);
    } finally {
      await redis.close();
      await kube.close();
    }
  }, 90_000);

  it('refuses to start the watch role without a cluster', async () => {
    const redis = await privateRedis(DB);
    const connection = createRedis(redis.url);
    try {
      const config = kubeSite(redis.url, '/nonexistent/kubeconfig');
      await expect(
        startFleet(config, connection, silentLogger(), { roles: ['watch'], bullPrefix: 'bhkn' }),
      ).rejects.toThrow(/Kubeconfig/);
    } finally {
      connection.disconnect();
      await redis.close();
    }
  });
});
