import { describe, expect, it } from 'vitest';
import { classifyPod, podFingerprint, podFromObject, relevantAnnotations } from '../../src/cluster/pod-info.js';
import { ANNOTATION } from '../../src/contract/annotations.js';
import { parseSiteConfig } from '../../src/contract/site-config.js';
import type { PodContext, PodEvent } from '../../src/machines/pod-machine.js';
import {
  EVENT_REASONS,
  eventName,
  eventObject,
  MAX_MESSAGE,
  repeatPatch,
  transitionEvents,
} from '../../src/render/kube-events.js';
import { PRELUDE_BEGIN } from '../../src/render/prelude.js';

function ctx(over: Partial<PodContext> = {}): PodContext {
  return {
    uid: 'u-1',
    namespace: 'user',
    name: 'train',
    annotations: { [ANNOTATION.forwards]: 'a.b:9000 c.d:6379' },
    retryLimit: 5,
    backoffBaseMs: 1000,
    backoffMaxMs: 60000,
    nodeWaitTimeoutMs: 1,
    phaseTimeoutMs: 1,
    createdAt: 0,
    generation: 1,
    attempts: 1,
    backoffMs: 0,
    deadline: null,
    host: 'fleet-0',
    jobId: '77',
    batchHost: 'cn01',
    lastError: null,
    forwardsReadyAt: null,
    podDeleted: false,
    teardownReason: null,
    ...over,
  };
}

const at = 1;

describe('Kubernetes Events of machine transitions', () => {
  it('forwards established: Normal, with node, job and host', () => {
    const specs = transitionEvents(ctx(), 'establishingForwards', 'active', {
      type: 'FORWARDS_READY',
      generation: 1,
      at,
    });
    expect(specs).toEqual([
      {
        type: 'Normal',
        reason: EVENT_REASONS.forwardsEstablished,
        message: '2 reverse forward(s) established on node cn01 (shadow session 1, Slurm job 77, held by fleet-0)',
      },
    ]);
  });

  it('teardown and closed: Normal, with the reason', () => {
    const torn = ctx({ teardownReason: 'pod-deleted', podDeleted: true });
    expect(transitionEvents(torn, 'active', 'tearingDown', { type: 'POD_DELETED', at })).toEqual([
      {
        type: 'Normal',
        reason: EVENT_REASONS.teardownStarted,
        message: 'tearing down the reverse forwards: pod-deleted',
      },
    ]);
    expect(transitionEvents(torn, 'tearingDown', 'done', { type: 'STEP_DONE', step: 'teardown', at })).toEqual([
      { type: 'Normal', reason: EVENT_REASONS.tornDown, message: 'reverse forwards closed (pod-deleted)' },
    ]);
  });

  it('a job ended without its trap: a Warning naming the job and node, beside the teardown; none when the trap ran', () => {
    const ended = ctx({ teardownReason: 'job-ended' });
    const killed = transitionEvents(ended, 'active', 'tearingDown', {
      type: 'JOB_ENDED',
      trapMissed: true,
      generation: 1,
      at,
    });
    expect(killed).toEqual([
      {
        type: 'Warning',
        reason: EVENT_REASONS.trapMissed,
        message:
          "Slurm job 77 on node cn01 ended without running the prelude's trap (killed outright: SIGKILL, the OOM killer, or a signal before the trap was set); its socket dir was left on the node and backhaul removed it",
      },
      {
        type: 'Normal',
        reason: EVENT_REASONS.teardownStarted,
        message: 'tearing down the reverse forwards: job-ended',
      },
    ]);
    expect(EVENT_REASONS.trapMissed).toBe('PreludeTrapNotRun');
    // With the job's state, the Warning says it (OUT_OF_MEMORY tells the user what to change).
    const oom = transitionEvents(ended, 'active', 'tearingDown', {
      type: 'JOB_ENDED',
      jobState: 'OUT_OF_MEMORY',
      trapMissed: true,
      generation: 1,
      at,
    });
    expect(oom[0]?.message).toMatch(
      /^Slurm job 77 on node cn01 \(OUT_OF_MEMORY\) ended without running the prelude's trap/,
    );
    const clean = transitionEvents(ended, 'active', 'tearingDown', { type: 'JOB_ENDED', generation: 1, at });
    expect(clean.map((s) => s.reason)).toEqual([EVENT_REASONS.teardownStarted]);
    // A stale report (no transition to tearingDown) says nothing.
    expect(
      transitionEvents(ended, 'tearingDown', 'tearingDown', { type: 'JOB_ENDED', trapMissed: true, generation: 1, at }),
    ).toEqual([]);
  });

  it("a job whose prelude could not set up the tunnel: a Warning in the job's own words, escaped for display", () => {
    const ended = ctx({ teardownReason: 'job-ended' });
    const specs = transitionEvents(ended, 'waitingBatchHost', 'tearingDown', {
      type: 'JOB_ENDED',
      jobState: 'FAILED',
      note: 'relay could not start: 0.0.0.0:15400 is held by uid 1001 (bhother)\u202E',
      generation: 1,
      at,
    });
    expect(specs[0]).toEqual({
      type: 'Warning',
      reason: 'ReversePreludeFailed',
      message: 'Slurm job 77 on node cn01: relay could not start: 0.0.0.0:15400 is held by uid 1001 (bhother)\\u202E',
    });
    expect(specs.map((s) => s.reason)).toEqual(['ReversePreludeFailed', EVENT_REASONS.teardownStarted]);
  });

  it('SOCKS: a Warning once the pod is validated', () => {
    const socks = ctx({ annotations: { [ANNOTATION.socksPort]: '11080' } });
    const specs = transitionEvents(socks, 'validating', 'rendering', { type: 'STEP_DONE', step: 'validate', at });
    expect(specs).toHaveLength(1);
    expect(specs[0]).toMatchObject({ type: 'Warning', reason: EVENT_REASONS.socks });
    expect(specs[0]?.message).toContain('11080');
    expect(transitionEvents(ctx(), 'validating', 'rendering', { type: 'STEP_DONE', step: 'validate', at })).toEqual([]);
  });

  it('refused forwarding: a Warning with the validation message', () => {
    const refused = ctx({ lastError: { kind: 'invalid-pod', message: 'interlink.eu/reverse-forwards: …', at } });
    const event: PodEvent = {
      type: 'STEP_FAILED',
      step: 'validate',
      generation: 0,
      error: { kind: 'invalid-pod', message: 'x', permanent: true },
      at,
    };
    expect(transitionEvents(refused, 'validating', 'failed', event)).toEqual([
      {
        type: 'Warning',
        reason: EVENT_REASONS.refused,
        message: 'reverse forwarding refused: invalid-pod: interlink.eu/reverse-forwards: …',
      },
    ]);
  });

  it('failed sessions: a Warning whose message repeats identically (so it aggregates), then giving up', () => {
    const failure: PodEvent = { type: 'CARRIER_LOST', reason: 'keepalive timeout', generation: 1, at };
    const err = { kind: 'carrier-lost' as const, message: 'keepalive timeout', at };
    const first = transitionEvents(
      ctx({ generation: 2, attempts: 2, lastError: err }),
      'active',
      'launchingShadow',
      failure,
    );
    const second = transitionEvents(
      ctx({ generation: 3, attempts: 3, lastError: err }),
      'launchingShadow',
      'launchingShadow',
      { ...failure, generation: 2 },
    );
    expect(first).toHaveLength(1);
    expect(first[0]).toMatchObject({ type: 'Warning', reason: EVENT_REASONS.sessionFailed });
    expect(second).toEqual(first);
    const gaveUp = transitionEvents(ctx({ attempts: 5, lastError: err }), 'active', 'failed', failure);
    expect(gaveUp[0]).toMatchObject({ type: 'Warning', reason: EVENT_REASONS.sessionFailed });
    expect(gaveUp[0]?.message).toContain('giving up after 5 attempt(s)');
  });

  it('the site out of reach: its own Warning, saying the pod waits without spending its attempts', () => {
    const failure: PodEvent = {
      type: 'SESSION_FAILED',
      error: {
        kind: 'login-unreachable',
        message: 'login 10.0.0.1:22: Timed out while waiting for handshake',
        permanent: false,
      },
      generation: 2,
      at,
    };
    const err = {
      kind: 'login-unreachable' as const,
      message: 'login 10.0.0.1:22: Timed out while waiting for handshake',
      at,
    };
    const specs = transitionEvents(
      ctx({ generation: 3, lastError: err }),
      'launchingShadow',
      'launchingShadow',
      failure,
    );
    expect(specs).toEqual([
      {
        type: 'Warning',
        reason: EVENT_REASONS.siteUnreachable,
        message:
          "the site is out of reach (login-unreachable: login 10.0.0.1:22: Timed out while waiting for handshake); waiting for it: relaunching every 30 s at most, without spending this pod's attempts",
      },
    ]);
  });

  it('nothing for the ordinary steps in between', () => {
    expect(
      transitionEvents(ctx(), null, 'validating', {
        type: 'POD_UPSERT',
        namespace: 'user',
        name: 't',
        annotations: {},
        at,
      }),
    ).toEqual([]);
    expect(
      transitionEvents(ctx(), 'launchingShadow', 'waitingBatchHost', {
        type: 'SHADOW_UP',
        host: 'h',
        generation: 1,
        at,
      }),
    ).toEqual([]);
  });

  it('builds core/v1 Event objects and repeat patches, clamping long messages', () => {
    const body = eventObject(
      { uid: 'u-1', namespace: 'user', name: 'train' },
      { type: 'Warning', reason: 'R', message: 'x'.repeat(5_000) },
      { name: 'train.1', at: new Date(0), component: 'backhaul', instance: 'h' },
    );
    expect(body.involvedObject).toEqual({
      apiVersion: 'v1',
      kind: 'Pod',
      namespace: 'user',
      name: 'train',
      uid: 'u-1',
    });
    expect(body.message.length).toBe(MAX_MESSAGE);
    expect(repeatPatch(3, new Date(0), 'm')).toEqual({
      count: 3,
      lastTimestamp: '1970-01-01T00:00:00.000Z',
      message: 'm',
    });
    expect(eventName('train', 1_700_000_000_000, 1)).toMatch(/^train\.[0-9a-f]+$/);
    expect(eventName('train', 1, 1)).not.toBe(eventName('train', 1, 2));
  });
});

describe('what the watcher reads of a pod', () => {
  const pod = (over: Record<string, unknown> = {}, meta: Record<string, unknown> = {}) => ({
    metadata: {
      uid: 'u-1',
      namespace: 'user',
      name: 'train',
      resourceVersion: '7',
      annotations: {
        [ANNOTATION.forwards]: 'a.b:9000',
        [ANNOTATION.preExec]: `${PRELUDE_BEGIN}\n…`,
        'other/x': 'y',
      },
      ...meta,
    },
    spec: { nodeName: 'vk' },
    status: { phase: 'Running' },
    ...over,
  });

  it('keeps only the annotations the machine reads', () => {
    const watched = podFromObject(pod());
    expect(watched?.annotations).toEqual({ [ANNOTATION.forwards]: 'a.b:9000' });
    expect(watched?.hasPrelude).toBe(true);
    expect(relevantAnnotations({ [ANNOTATION.podVpn]: 'x', n: 1 })).toEqual({ [ANNOTATION.podVpn]: 'x' });
    expect(podFromObject({ metadata: { name: 'x' } })).toBeUndefined();
  });

  it('classifies: live on a virtual node; other elsewhere, unscheduled or unannotated; gone when deleted or finished', () => {
    const scope = { virtualNodes: ['vk'] };
    const classify = (o: unknown, s = scope) => {
      const p = podFromObject(o);
      if (!p) throw new Error('no pod');
      return classifyPod(p, s);
    };
    expect(classify(pod())).toEqual({ kind: 'live' });
    expect(classify(pod({ spec: { nodeName: 'worker-1' } }))).toEqual({ kind: 'other' });
    expect(classify(pod({ spec: { nodeName: 'worker-1' } }), { virtualNodes: [] })).toEqual({ kind: 'live' });
    expect(classify(pod({ spec: {} }))).toEqual({ kind: 'other' });
    expect(classify(pod({}, { annotations: {} }))).toEqual({ kind: 'other' });
    expect(classify(pod({}, { deletionTimestamp: '2030-01-01T00:00:00Z' }))).toEqual({
      kind: 'gone',
      event: 'POD_DELETED',
    });
    expect(classify(pod({ status: { phase: 'Succeeded' } }))).toEqual({
      kind: 'gone',
      event: 'TEARDOWN',
      reason: 'pod-succeeded',
    });
  });

  it('fingerprints what the machine is told, independent of annotation order', () => {
    const a = { namespace: 'n', name: 'p', annotations: { x: '1', y: '2' } };
    const b = { namespace: 'n', name: 'p', annotations: { y: '2', x: '1' } };
    expect(podFingerprint(a)).toBe(podFingerprint(b));
    expect(podFingerprint(a)).not.toBe(podFingerprint({ ...a, annotations: { x: '1' } }));
  });
});

describe('Backhaul.Kubernetes configuration keys', () => {
  const base = {
    Network: { SSH: { LoginHost: 'login', User: 'u', KeyFile: '/k', KnownHostsFile: '/kh' } },
  };

  it('has sensible defaults', () => {
    const k = parseSiteConfig(base).Backhaul.Kubernetes;
    expect(k).toEqual({
      VirtualNodes: [],
      ResyncInterval: 300_000,
      NamespaceLabel: 'interlink.eu/backhaul=enabled',
      NetworkPolicies: true,
      RecordEvents: true,
      PodCondition: true,
      ReadinessGate: false,
      Webhook: {
        Address: '0.0.0.0',
        Port: 8443,
        CertFile: '/etc/backhaul/tls/tls.crt',
        KeyFile: '/etc/backhaul/tls/tls.key',
        ReloadInterval: 30_000,
      },
    });
  });

  it.each([
    [{ VirtualNodes: ['Bad_Node'] }, 'Backhaul.Kubernetes.VirtualNodes.0'],
    [{ Namespace: 'Not A Namespace' }, 'Backhaul.Kubernetes.Namespace'],
    [{ Webhook: { Port: 0 } }, 'Backhaul.Kubernetes.Webhook.Port'],
    [{ ResyncInterval: 'soon' }, 'Backhaul.Kubernetes.ResyncInterval'],
    [{ NamespaceLabel: 'interlink.eu/backhaul' }, 'Backhaul.Kubernetes.NamespaceLabel'],
    [{ NamespaceLabel: 'a=b=c' }, 'Backhaul.Kubernetes.NamespaceLabel'],
    [{ NamespaceLabel: 'x=$(id)' }, 'Backhaul.Kubernetes.NamespaceLabel'],
    [{ NodeSelector: 'x=y' }, 'Backhaul.Kubernetes.NodeSelector'],
  ])('refuses %j naming %s', (kubernetes, path) => {
    expect(() => parseSiteConfig({ ...base, Backhaul: { Kubernetes: kubernetes } })).toThrow(path);
  });
});
