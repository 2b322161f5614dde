import { describe, expect, it } from 'vitest';
import { CarrierSlots } from '../../src/ssh/carrier-slots.js';

/** Whether PROMISE has settled once pending callbacks ran: 'granted', 'rejected' or 'waiting'. */
async function settled(promise: Promise<unknown>): Promise<'granted' | 'rejected' | 'waiting'> {
  let outcome: 'granted' | 'rejected' | 'waiting' = 'waiting';
  promise.then(
    () => {
      outcome = 'granted';
    },
    () => {
      outcome = 'rejected';
    },
  );
  await new Promise((r) => setImmediate(r));
  return outcome;
}

describe('carrier slots of a session host', () => {
  it('grants up to the capacity, then the next waiter once one is released', async () => {
    const slots = new CarrierSlots(2);
    const first = await slots.acquire('a');
    await slots.acquire('b');
    const third = slots.acquire('c');
    expect(await settled(third)).toBe('waiting');
    expect([slots.inUse, slots.waiters]).toEqual([2, 1]);
    first();
    expect(await settled(third)).toBe('granted');
    expect([slots.inUse, slots.waiters]).toEqual([2, 0]);
  });

  it('holds a namespace to its share, and a release counts once however often it is called', async () => {
    const slots = new CarrierSlots(4, 2);
    const one = await slots.acquire('greedy');
    await slots.acquire('greedy');
    const third = slots.acquire('greedy');
    expect(await settled(third)).toBe('waiting');
    one();
    one();
    expect(await settled(third)).toBe('granted');
    expect(slots.inUse).toBe(2);
  });

  it('does not queue a namespace with room behind a waiter whose namespace is at its share', async () => {
    const slots = new CarrierSlots(4, 2);
    await slots.acquire('greedy');
    await slots.acquire('greedy');
    const capped = slots.acquire('greedy');
    expect(await settled(capped)).toBe('waiting');
    // Two slots are free and 'quiet' holds none: nothing it waits for would ever be released.
    const quiet = slots.acquire('quiet');
    expect(await settled(quiet), `in use ${slots.inUse}, waiting ${slots.waiters}`).toBe('granted');
    expect(await settled(capped)).toBe('waiting');
  });

  it('serves waiters in order, skipping those whose namespace is at its share', async () => {
    const slots = new CarrierSlots(2, 1);
    const a = await slots.acquire('a');
    const b = await slots.acquire('b');
    const order: string[] = [];
    const a2 = slots.acquire('a').then((release) => {
      order.push('a2');
      return release;
    });
    const c = slots.acquire('c').then((release) => {
      order.push('c');
      return release;
    });
    b();
    await settled(c);
    expect(order).toEqual(['c']);
    a();
    await settled(a2);
    expect(order).toEqual(['c', 'a2']);
  });

  it('a waiter aborted leaves the queue, and the one behind it is served', async () => {
    const slots = new CarrierSlots(1);
    const held = await slots.acquire('a');
    const controller = new AbortController();
    const aborted = slots.acquire('b', controller.signal);
    const behind = slots.acquire('c');
    controller.abort();
    expect(await settled(aborted)).toBe('rejected');
    expect(slots.waiters).toBe(1);
    held();
    expect(await settled(behind)).toBe('granted');
    await expect(slots.acquire('d', controller.signal)).rejects.toThrow('closed while waiting for a carrier slot');
  });
});
