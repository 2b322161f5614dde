import { CoreV1Api } from '@kubernetes/client-node';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { KUBE_API_ACCESS } from '../../src/cluster/kube-api.js';
import { type RunningFleet, startFleet } from '../../src/fleet/fleet.js';
import { silentLogger } from '../../src/log.js';
import type { PodEvent } from '../../src/machines/pod-machine.js';
import { sendEvent } from '../../src/pods/queues.js';
import { FORWARDS_READY_CONDITION } from '../../src/render/pod-condition.js';
import { createRedis } from '../../src/store/redis.js';
import { privateRedis } from '../fixtures/fleet-harness.js';
import {
  type KubeHarness,
  kubeHarness,
  kubeSite,
  reversePod,
  VIRTUAL_NODE,
  waitFor,
} from '../fixtures/kube-harness.js';

const DB = 15;
const NS = 'user';

interface Condition {
  type: string;
  status: string;
  reason?: string;
  message?: string;
  lastTransitionTime?: string | Date;
}

/**
 * The pod condition interlink.eu/ReverseForwardsReady, set by the control role's transitions and kept
 * by the watch role, against the fake API server through the real client library.
 */
describe('the forwards condition on the pod (readiness gate)', () => {
  let kube: KubeHarness;
  let redis: Awaited<ReturnType<typeof privateRedis>>;
  let fleet: RunningFleet;
  let disconnect: () => void;
  let core: CoreV1Api;

  const conditions = async (name: string): Promise<Condition[]> => {
    const pod = await core.readNamespacedPod({ name, namespace: NS });
    return (pod.status?.conditions ?? []) as Condition[];
  };
  const ours = async (name: string) => (await conditions(name)).find((c) => c.type === FORWARDS_READY_CONDITION);

  /**
   * What `kubectl wait --for=condition=interlink.eu/ReverseForwardsReady[=STATUS] pod/NAME` does: read the
   * pod until the condition of that type has that status (True by default), or time out.
   */
  const kubectlWait = (name: string, status = 'True', timeoutMs = 15_000) =>
    waitFor(
      `condition ${FORWARDS_READY_CONDITION}=${status} on ${name}`,
      async () => {
        const found = await ours(name);
        return found?.status === status ? found : undefined;
      },
      timeoutMs,
    );
  /** The condition once it has STATUS and REASON (the patch for a new state follows its transition). */
  const conditionWith = (name: string, status: string, reason: string) =>
    waitFor(
      `condition ${FORWARDS_READY_CONDITION}=${status} (${reason}) on ${name}`,
      async () => {
        const found = await ours(name);
        return found?.status === status && found.reason === reason ? found : undefined;
      },
      15_000,
    ).catch(async (err: Error) => {
      throw new Error(`${err.message}; the pod shows ${JSON.stringify(await conditions(name))}`);
    });
  const state = async (uid: string) => (await fleet.deps.store.load(uid))?.state;
  const send = (uid: string, event: PodEvent) => sendEvent(fleet.deps.queues, uid, event);

  beforeAll(async () => {
    kube = await kubeHarness({ bookmarkEveryMs: 300 });
    redis = await privateRedis(DB);
    const connection = createRedis(redis.url);
    disconnect = () => connection.disconnect();
    fleet = await startFleet(kubeSite(redis.url, kube.kubeconfigFile), connection, silentLogger(), {
      roles: ['control', 'watch'],
      bullPrefix: 'bhkc',
      reaperEveryMs: 60_000,
      // No resync within a test: a condition put back comes from the pod's watch event.
      cluster: { watcher: { resyncMs: 600_000, backoffBaseMs: 100, backoffMaxMs: 1_000 } },
    });
    core = kube.kubeConfig().makeApiClient(CoreV1Api);
  });

  afterAll(async () => {
    await fleet?.stop();
    disconnect?.();
    await redis?.close();
    await kube?.close();
  });

  it('is False while the forwards come up, True once they are, False again when the carrier is lost', async () => {
    kube.api.createPod(reversePod('analysis'));
    const uid = kube.api.schedule(NS, 'analysis', VIRTUAL_NODE).metadata.uid;
    // The virtual kubelet's own condition, which the patch must keep.
    kube.api.updatePod(NS, 'analysis', (pod) => {
      (pod.status as { conditions?: Condition[] }).conditions = [{ type: 'PodScheduled', status: 'True' }];
    });
    await waitFor('the pod waiting for its shadow', async () =>
      (await state(uid)) === 'launchingShadow' ? true : undefined,
    );
    expect(await kubectlWait('analysis', 'False')).toMatchObject({ status: 'False' });
    await conditionWith('analysis', 'False', 'Launching');

    await send(uid, { type: 'BATCH_HOST', batchHost: 'cn01', jobId: '4242', generation: 1, at: Date.now() });
    await waitFor('openingCarrier', async () => ((await state(uid)) === 'openingCarrier' ? true : undefined));
    await conditionWith('analysis', 'False', 'OpeningCarrier');
    const falseSince = (await ours('analysis'))?.lastTransitionTime;

    await send(uid, { type: 'FORWARDS_READY', generation: 1, at: Date.now() + 2_000 });
    const ready = await kubectlWait('analysis');
    expect(ready).toMatchObject({ status: 'True', reason: 'ForwardsReady' });
    expect(ready.message).toContain('cn01');
    expect(ready.message).toContain('4242');
    expect(new Date(String(ready.lastTransitionTime)).getTime()).toBeGreaterThan(
      new Date(String(falseSince)).getTime(),
    );
    expect((await conditions('analysis')).map((c) => c.type).sort()).toEqual(
      [FORWARDS_READY_CONDITION, 'PodScheduled'].sort(),
    );

    await send(uid, { type: 'CARRIER_LOST', reason: 'test', generation: 1, at: Date.now() });
    expect(await kubectlWait('analysis', 'False')).toMatchObject({ status: 'False' });
    await conditionWith('analysis', 'False', 'Launching');
  });

  it('is put back by the watch role when the virtual kubelet writes the pod status without it', async () => {
    kube.api.createPod(reversePod('dropped'));
    const uid = kube.api.schedule(NS, 'dropped', VIRTUAL_NODE).metadata.uid;
    await waitFor('launchingShadow', async () => ((await state(uid)) === 'launchingShadow' ? true : undefined));
    await send(uid, { type: 'FORWARDS_READY', generation: 1, at: Date.now() });
    await kubectlWait('dropped');
    // An UpdateStatus of the virtual kubelet: its own status, ours gone.
    kube.api.updatePod(NS, 'dropped', (pod) => {
      pod.status = { phase: 'Running', conditions: [{ type: 'Ready', status: 'True' }] };
    });
    expect((await ours('dropped'))?.status).toBeUndefined();
    expect(await kubectlWait('dropped')).toMatchObject({ status: 'True', reason: 'ForwardsReady' });
    expect((await conditions('dropped')).find((c) => c.type === 'Ready')?.status).toBe('True');
  });

  it('used only the API calls its RBAC grants, pods/status patch among them', () => {
    const granted = new Set(Object.entries(KUBE_API_ACCESS).flatMap(([r, verbs]) => verbs.map((v) => `${r}.${v}`)));
    const used = kube.api.usedAccess();
    expect(used.has('pods/status.patch')).toBe(true);
    expect([...used].filter((call) => !granted.has(call))).toEqual([]);
  });
});
