import { describe, expect, it } from 'vitest';
import { admit } from '../../src/cluster/admission.js';
import { ANNOTATION } from '../../src/contract/annotations.js';
import type { SiteConfig } from '../../src/contract/site-config.js';
import { applyEvent, POD_STATES, startPod } from '../../src/machines/pod-machine.js';
import {
  conditionHolds,
  conditionPatch,
  FORWARDS_READY_CONDITION,
  forwardsCondition,
} from '../../src/render/pod-condition.js';
import { readinessGatePatch } from '../../src/render/webhook-patch.js';
import { podReview } from '../fixtures/admission-reviews.js';
import { jsonPatch } from '../fixtures/fake-apiserver.js';
import { POD_INPUT } from '../fixtures/pod-input.js';
import { siteWith } from './contract-fixtures.js';

const INPUT = POD_INPUT;
const AT = Date.UTC(2026, 11, 3, 18, 0, 0, 750);

describe('the forwards condition', () => {
  it('is True in active only; False with a reason in every other state but done, which leaves it', () => {
    const ctx = { ...startPod(INPUT, AT).snapshot.context, batchHost: 'cn01', jobId: '42' };
    for (const state of POD_STATES) {
      const condition = forwardsCondition(state, ctx, AT);
      if (state === 'done') {
        expect(condition, state).toBeNull();
        continue;
      }
      expect(condition?.type, state).toBe(FORWARDS_READY_CONDITION);
      expect(condition?.status, state).toBe(state === 'active' ? 'True' : 'False');
      expect(condition?.reason, state).toMatch(/^[A-Z][A-Za-z]+$/);
      // RFC 3339 in whole seconds, as the API server keeps it.
      expect(condition?.lastTransitionTime).toBe('2026-12-03T18:00:00Z');
    }
    expect(forwardsCondition('active', ctx, AT)?.message).toBe('reverse forwards up on cn01 (job 42)');
  });

  it('says why a failed pod failed', () => {
    const { snapshot } = startPod(INPUT, AT);
    const failed = applyEvent(snapshot, {
      type: 'STEP_FAILED',
      step: 'validate',
      generation: 0,
      error: { kind: 'invalid-pod', message: 'bad', permanent: true },
      at: AT,
    });
    expect(failed.to).toBe('failed');
    expect(forwardsCondition('failed', failed.snapshot.context, AT)).toMatchObject({
      status: 'False',
      reason: 'Failed',
      message: 'setting up the forwards failed: invalid-pod',
    });
  });

  it('holds when the pod shows the same status and reason; the patch merges by type', () => {
    const ready = forwardsCondition('active', startPod(INPUT, AT).snapshot.context, AT);
    if (!ready) throw new Error('no condition');
    expect(conditionHolds(undefined, ready)).toBe(false);
    expect(conditionHolds([{ type: 'Ready', status: 'True' }], ready)).toBe(false);
    expect(conditionHolds([{ type: FORWARDS_READY_CONDITION, status: 'False', reason: 'Launching' }], ready)).toBe(
      false,
    );
    expect(conditionHolds([{ type: FORWARDS_READY_CONDITION, status: 'True', reason: 'ForwardsReady' }], ready)).toBe(
      true,
    );
    expect(conditionPatch(ready)).toEqual({ status: { conditions: [ready] } });
  });
});

describe('the readiness gate the webhook adds (Backhaul.Kubernetes.ReadinessGate)', () => {
  const site = (gate: boolean): SiteConfig => {
    const base = siteWith();
    return {
      ...base,
      Backhaul: { ...base.Backhaul, Kubernetes: { ...base.Backhaul.Kubernetes, ReadinessGate: gate } },
    };
  };
  const gatesAfter = (gate: boolean, spec: Record<string, unknown> = {}) => {
    const review = podReview({ [ANNOTATION.forwards]: 'minio:9000' });
    Object.assign(review.request.object.spec, spec);
    const response = admit(review, 'mutate', site(gate)).response;
    expect(response.allowed).toBe(true);
    const ops = JSON.parse(Buffer.from(response.patch ?? 'W10=', 'base64').toString('utf8'));
    return (jsonPatch(review.request.object, ops) as { spec: { readinessGates?: unknown } }).spec.readinessGates;
  };

  it('is added where the site enables it, kept once, and appended to the pod’s own gates', () => {
    expect(gatesAfter(false)).toBeUndefined();
    expect(gatesAfter(true)).toEqual([{ conditionType: FORWARDS_READY_CONDITION }]);
    expect(gatesAfter(true, { readinessGates: [{ conditionType: 'example.com/Warm' }] })).toEqual([
      { conditionType: 'example.com/Warm' },
      { conditionType: FORWARDS_READY_CONDITION },
    ]);
    expect(gatesAfter(true, { readinessGates: [{ conditionType: FORWARDS_READY_CONDITION }] })).toEqual([
      { conditionType: FORWARDS_READY_CONDITION },
    ]);
  });

  it('the patch alone: none when present, a new list when absent', () => {
    expect(readinessGatePatch(undefined, 'x/Y')).toEqual([
      { op: 'add', path: '/spec/readinessGates', value: [{ conditionType: 'x/Y' }] },
    ]);
    expect(readinessGatePatch([{ conditionType: 'x/Y' }], 'x/Y')).toEqual([]);
  });
});
