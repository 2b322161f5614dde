import { describe, expect, it } from 'vitest';
import { applyEvent, persistPod, startPod } from '../../src/machines/pod-machine.js';
import { isEnding, podRecordOf } from '../../src/pods/pod-reader.js';
import type { StoredPod } from '../../src/store/snapshot-store.js';

const INPUT = {
  uid: '7c1b0f1e-3c4f-4a5e-9d2b-0123456789ab',
  namespace: 'user',
  name: 'analysis',
  annotations: {},
  retryLimit: 3,
  backoffBaseMs: 1_000,
  backoffMaxMs: 30_000,
  nodeWaitTimeoutMs: 60_000,
  phaseTimeoutMs: 60_000,
};

const stored = (snapshot: unknown, state = 'validating'): StoredPod => ({
  uid: INPUT.uid,
  snapshot,
  version: '1',
  gen: 1,
  state,
  updatedAt: 0,
  namespace: 'user',
  name: 'analysis',
  outbox: null,
});

describe('reading a stored pod', () => {
  it('gives its state and context, or the reason this build cannot read it', () => {
    const { snapshot } = startPod(INPUT, 1);
    const record = podRecordOf(stored(JSON.parse(JSON.stringify(persistPod(snapshot)))));
    expect(record).toMatchObject({ ok: true, state: 'validating', context: { uid: INPUT.uid } });
    const alien = podRecordOf(stored({ version: 99, state: 'holding', context: {} }));
    expect(alien.ok).toBe(false);
    if (!alien.ok) expect(alien.error.message).toMatch(/machine version 99/);
  });

  it('is ending once done, deleted or torn down for a reason; not before', () => {
    const { snapshot } = startPod(INPUT, 1);
    const view = { state: 'validating' as const, context: snapshot.context };
    expect(isEnding(view)).toBe(false);
    const deleted = applyEvent(snapshot, { type: 'POD_DELETED', at: 2 });
    expect(isEnding({ state: deleted.to, context: deleted.snapshot.context })).toBe(true);
    const torn = applyEvent(snapshot, { type: 'TEARDOWN', reason: 'operator', at: 2 });
    expect(isEnding({ state: torn.to, context: torn.snapshot.context })).toBe(true);
    expect(isEnding({ state: 'done', context: snapshot.context })).toBe(true);
  });
});
