import { createRequire } from 'node:module';
import { Client } from 'ssh2';
import { describe, expect, it } from 'vitest';
import {
  BASE_WINDOW,
  channelWindowOf,
  DEFAULT_MAX_WINDOW,
  RttEstimate,
  sampleRtt,
  setChannelWindow,
  WindowBudget,
  windowForRtt,
} from '../../src/ssh/channel-window.js';

const MiB = 1024 * 1024;
const require = createRequire(import.meta.url);
/** ssh2's channel module as patched (patches/ssh2+1.17.0.patch). */
const ssh2Channel = require('ssh2/lib/Channel.js') as {
  needsWindowAdjust?: (channel: { incoming: { window: number; windowMax?: number } }) => boolean;
  PACKET_SIZE: number;
};

describe('windowForRtt', () => {
  it("is ssh2's own 2 MiB on loopback and up to where 2 MiB covers the path", () => {
    expect(windowForRtt(0)).toBe(BASE_WINDOW);
    expect(windowForRtt(0.06)).toBe(BASE_WINDOW);
    expect(windowForRtt(5)).toBe(BASE_WINDOW); // 400 MB/s × 5 ms = 2 MB < 2 MiB
    expect(windowForRtt(-3)).toBe(BASE_WINDOW);
    expect(windowForRtt(Number.NaN)).toBe(BASE_WINDOW);
  });

  it('covers the bandwidth-delay product at WAN round trips, within the site maximum', () => {
    expect(windowForRtt(20)).toBe(8_000_000);
    expect(windowForRtt(50)).toBe(DEFAULT_MAX_WINDOW); // 20 MB wanted, 16 MiB allowed
    expect(windowForRtt(50, 64 * MiB)).toBe(20_000_000);
    expect(windowForRtt(20, 4 * MiB)).toBe(4 * MiB);
  });
});

describe('WindowBudget', () => {
  it('grants windows above the base from the budget and takes them back once released', () => {
    const budget = new WindowBudget(10 * MiB);
    const a = budget.grant(8 * MiB);
    expect(a.window).toBe(8 * MiB);
    expect(budget.inUse).toBe(6 * MiB);
    const b = budget.grant(8 * MiB);
    expect(b.window).toBe(BASE_WINDOW + 4 * MiB); // what is left
    expect(budget.inUse).toBe(10 * MiB);
    const c = budget.grant(8 * MiB);
    expect(c.window).toBe(BASE_WINDOW); // spent: the base, as before tuning
    a.release();
    a.release(); // twice is once
    expect(budget.inUse).toBe(4 * MiB);
    expect(budget.grant(8 * MiB).window).toBe(8 * MiB);
    b.release();
    c.release();
    expect(budget.inUse).toBe(6 * MiB);
  });

  it('never grants below the base, and a budget of 0 is the untuned fleet', () => {
    const none = new WindowBudget(0);
    expect(none.grant(16 * MiB).window).toBe(BASE_WINDOW);
    expect(none.grant(MiB).window).toBe(BASE_WINDOW);
    expect(none.inUse).toBe(0);
  });

  it('1,000 stalled channels hold no more than the budget beyond their base windows', () => {
    const budget = new WindowBudget(256 * MiB);
    const grants = Array.from({ length: 1000 }, () => budget.grant(windowForRtt(50)));
    const total = grants.reduce((n, g) => n + g.window, 0);
    expect(total).toBe(1000 * BASE_WINDOW + 256 * MiB);
    for (const g of grants) g.release();
    expect(budget.inUse).toBe(0);
  });
});

describe("ssh2's window patch", () => {
  it('a connection carries the window its channels will advertise', () => {
    const client = new Client();
    expect(channelWindowOf(client)).toBe(BASE_WINDOW);
    setChannelWindow(client, 8 * MiB);
    expect(channelWindowOf(client)).toBe(8 * MiB);
  });

  it('returns window once an eighth of it (at least 3 packets) is consumed, not half of it', () => {
    const needs = ssh2Channel.needsWindowAdjust;
    expect(needs, 'ssh2 without the patch: run npx patch-package').toBeTypeOf('function');
    if (!needs) return;
    const packet = ssh2Channel.PACKET_SIZE;
    // ssh2's own 2 MiB window: every 256 KiB (ssh2 waited for 1 MiB; OpenSSH returns every 3 packets).
    expect(needs({ incoming: { window: BASE_WINDOW - 2 * packet } })).toBe(false);
    expect(needs({ incoming: { window: BASE_WINDOW - BASE_WINDOW / 8 } })).toBe(true);
    expect(needs({ incoming: { window: BASE_WINDOW - 3 * packet + 1 } })).toBe(false);
    // A tuned 16 MiB window: every 2 MiB consumed, not after 8 MiB.
    const big = 16 * MiB;
    expect(needs({ incoming: { window: big - 2 * MiB + 1, windowMax: big } })).toBe(false);
    expect(needs({ incoming: { window: big - 2 * MiB, windowMax: big } })).toBe(true);
  });
});

describe('RttEstimate and sampleRtt', () => {
  it('keep the smallest sample: a ping queued behind set-up says more than the path', () => {
    const rtt = new RttEstimate();
    expect(rtt.ms).toBeUndefined();
    expect(rtt.sample(64)).toBe(true);
    expect(rtt.sample(80)).toBe(false);
    expect(rtt.sample(0.2)).toBe(true);
    expect(rtt.sample(Number.NaN)).toBe(false);
    expect(rtt.sample(-1)).toBe(false);
    expect(rtt.ms).toBe(0.2);
    expect(windowForRtt(rtt.ms ?? 0)).toBe(BASE_WINDOW);
  });

  /** A connection whose Nth keepalive is answered after DELAYS[N] ms (or fails with 'gone'). */
  function answering(delays: (number | 'gone')[]) {
    let n = 0;
    const client = {
      ping(cb: (err?: Error) => void) {
        const d = delays[n++];
        if (d === 'gone') setTimeout(() => cb(new Error('Not connected')), 0);
        else setTimeout(() => cb(), d);
      },
      get pings() {
        return n;
      },
    };
    return client;
  }

  it('pings at each time given, lowers the estimate as samples come in, and tells each time it fell', async () => {
    const client = answering([60, 80, 2]);
    const rtt = new RttEstimate();
    const lowered: number[] = [];
    sampleRtt(client as unknown as Client, rtt, (ms) => lowered.push(ms), [0, 100, 200]);
    await new Promise((r) => setTimeout(r, 300));
    expect(client.pings).toBe(3);
    expect(lowered.length, `lowered at ${lowered.join(', ')}`).toBe(2);
    expect(rtt.ms, `lowered at ${lowered.join(', ')}`).toBeLessThan(40);
  });

  it('stops at the first failed ping and when told to', async () => {
    const failing = answering(['gone', 1, 1]);
    sampleRtt(failing as unknown as Client, new RttEstimate(), undefined, [0, 50, 100]);
    await new Promise((r) => setTimeout(r, 150));
    expect(failing.pings).toBe(1);
    const stopped = answering([1, 1, 1]);
    const stop = sampleRtt(stopped as unknown as Client, new RttEstimate(), undefined, [0, 50, 100]);
    await new Promise((r) => setTimeout(r, 25));
    stop();
    await new Promise((r) => setTimeout(r, 125));
    expect(stopped.pings).toBe(1);
  });
});
