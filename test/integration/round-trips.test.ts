import { type ChildProcess, spawn } from 'node:child_process';
import { chown, mkdtemp, rm, stat } from 'node:fs/promises';
import { connect, type Server } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { sshCryptoPath } from '../../src/ssh/crypto-path.js';
import { type LoopbackSite, startLoopbackSite } from '../../tools/sandbox/loopback-site.js';
import { echoServer } from '../../tools/sandbox/shadow-harness.js';

/**
 * A round trip through the tunnel must not wait for a delayed ACK. Before ssh2's native binding was
 * built, its JavaScript fallback wrote each SSH packet in three pieces and Nagle held the later ones
 * until the peer's delayed ACK: 46 ms a round trip (docs/history/performance-notebook.md "Round trips"). The carrier
 * runs in its own process (test/fixtures/carrier-process.ts), once as installed and once with the
 * binding hidden, and a client here makes sequential 64-byte request/responses through the node's
 * socket. Not a benchmark: the bound is 15 ms a round trip, a third of one delayed ACK.
 */

const CARRIER = new URL('../fixtures/carrier-process.ts', import.meta.url).pathname;
const HIDE_BINDING = new URL('../fixtures/hide-ssh2-binding.cjs', import.meta.url).pathname;
const ROUND_TRIPS = 200;
const BOUND_MS = ROUND_TRIPS * 15;

let site: LoopbackSite;
let echo: { server: Server; port: number };
let dir: string;

beforeAll(async () => {
  site = await startLoopbackSite();
  echo = await echoServer();
  dir = await mkdtemp(join(tmpdir(), 'bh-rtt-'));
  await chown(dir, site.user.uid, site.user.gid);
});

afterAll(async () => {
  echo?.server.close();
  await site?.stop();
  if (dir) await rm(dir, { recursive: true, force: true });
});

interface Carrier {
  child: ChildProcess;
  crypto: { native: boolean; patched: boolean };
  stderr(): string;
  stop(): Promise<void>;
}

async function startCarrier(socket: string, hideBinding: boolean): Promise<Carrier> {
  const child = spawn(
    process.execPath,
    [
      ...(hideBinding ? ['--require', HIDE_BINDING] : []),
      '--import',
      'tsx',
      CARRIER,
      site.siteConfigPath,
      site.nodeHost,
      socket,
      String(echo.port),
    ],
    { stdio: ['pipe', 'pipe', 'pipe'] },
  );
  let out = '';
  let err = '';
  child.stderr?.on('data', (d: Buffer) => {
    err += d.toString();
  });
  const exited = new Promise<number | null>((resolve) => child.once('exit', resolve));
  const line = await new Promise<string>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`carrier not ready in 30 s: ${err}`)), 30_000);
    child.stdout?.on('data', (d: Buffer) => {
      out += d.toString();
      const nl = out.indexOf('\n');
      if (nl >= 0) {
        clearTimeout(timer);
        resolve(out.slice(0, nl));
      }
    });
    void exited.then((code) => {
      clearTimeout(timer);
      reject(new Error(`carrier exited ${code}: ${err}`));
    });
  });
  const { crypto } = JSON.parse(line) as { crypto: Carrier['crypto'] };
  return {
    child,
    crypto,
    stderr: () => err,
    stop: async () => {
      child.stdin?.end();
      const killer = setTimeout(() => child.kill('SIGKILL'), 10_000);
      await exited;
      clearTimeout(killer);
    },
  };
}

/** Sequential request/responses of `size` bytes on one connection; the time of each in ms. */
async function roundTrips(socket: string, count: number, size: number): Promise<number[]> {
  const conn = connect(socket);
  await new Promise<void>((resolve, reject) => {
    conn.once('connect', resolve);
    conn.once('error', reject);
  });
  const times: number[] = [];
  try {
    for (let i = 0; i < count; i++) {
      const request = Buffer.alloc(size, i & 0xff);
      const started = performance.now();
      const answer = await new Promise<Buffer>((resolve, reject) => {
        let got = Buffer.alloc(0);
        const onData = (chunk: Buffer) => {
          got = Buffer.concat([got, chunk]);
          if (got.length >= size) {
            conn.off('data', onData);
            conn.off('error', reject);
            resolve(got);
          }
        };
        conn.on('data', onData);
        conn.once('error', reject);
        conn.write(request);
      });
      times.push(performance.now() - started);
      if (!answer.equals(request)) throw new Error(`round trip ${i}: the answer differs from the request`);
    }
  } finally {
    conn.destroy();
  }
  return times;
}

function summary(times: number[]): string {
  const sorted = [...times].sort((a, b) => a - b);
  const at = (q: number) => sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))]?.toFixed(2);
  const total = times.reduce((a, b) => a + b, 0);
  const slow = times.filter((t) => t > 30).length;
  return `${times.length} round trips in ${total.toFixed(0)} ms: p50 ${at(0.5)} ms, p90 ${at(0.9)} ms, max ${at(1)} ms, ${slow} over 30 ms`;
}

describe('round trips through the node carrier', () => {
  it("run on ssh2's native binding with our patch (the JavaScript fallback is not what runs)", () => {
    expect(sshCryptoPath(), 'npm ci builds the binding and applies patches/').toMatchObject({
      native: true,
      patched: true,
      ok: true,
    });
  });

  for (const hideBinding of [false, true]) {
    const name = hideBinding ? 'the JavaScript fallback (binding hidden)' : 'the native binding';
    it(`${ROUND_TRIPS} sequential 64-byte request/responses never wait for a delayed ACK, on ${name}`, async () => {
      const socket = join(dir, hideBinding ? 'js.sock' : 'native.sock');
      const carrier = await startCarrier(socket, hideBinding);
      try {
        expect(carrier.crypto, 'the crypto path the carrier process reported').toMatchObject({
          native: !hideBinding,
          patched: true,
        });
        await roundTrips(socket, 20, 64); // warm-up: JIT, first channel
        const times = await roundTrips(socket, ROUND_TRIPS, 64);
        const total = times.reduce((a, b) => a + b, 0);
        expect(total, `${summary(times)}; carrier stderr: ${carrier.stderr()}`).toBeLessThan(BOUND_MS);
      } finally {
        await carrier.stop();
      }
      // The carrier removed its socket on the node through the carrier before it ended.
      await expect(stat(socket)).rejects.toThrow();
    }, 90_000);
  }
});
