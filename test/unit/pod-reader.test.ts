import { describe, expect, it } from 'vitest';
import { applyEvent, persistPod, startPod } from '../../src/machines/pod-machine.js';
import { isEnding, podRecordOf } from '../../src/pods/pod-reader.js';
import type { StoredPod } from '../../src/store/snapshot-store.js';
import { POD_INPUT } from '../fixtures/pod-input.js';

const INPUT = POD_INPUT;

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
