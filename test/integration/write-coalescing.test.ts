import type { Socket } from 'node:net';
import type { Duplex } from 'node:stream';
import type { Client, ClientChannel } from 'ssh2';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseSiteConfig } from '../../src/contract/site-config.js';
import { openSiteAccess, type SiteAccess } from '../../src/ssh/site-access.js';
import { tcpSocketOf } from '../../src/ssh/ssh-connect.js';
import { isCoalesced } from '../../src/ssh/write-coalescing.js';
import { type LoopbackSite, startLoopbackSite } from '../../tools/sandbox/loopback-site.js';
import { connectNodeThroughLogin } from '../../tools/sandbox/node-hop.js';

/**
 * What a node carrier writes in one turn of the event loop reaches the login socket as one write
 * (src/ssh/write-coalescing.ts): the real login and node sshds, the node connection jumped through the
 * login one as a carrier does, and CHANNELS `cat` sessions on the node written in one turn, as a turn
 * in which that many endpoint sockets answered. The login socket's writes are counted at the stream.
 */

const CHANNELS = 16;

let site: LoopbackSite;
let access: SiteAccess;

beforeAll(async () => {
  site = await startLoopbackSite({ slurm: false });
  access = await openSiteAccess(parseSiteConfig(site.siteConfig));
}, 60_000);

afterAll(async () => {
  access?.pool.close();
  await site?.stop();
});

interface Jumped {
  login: Client;
  loginSocket: Socket;
  jump: Duplex;
  node: Client;
  close(): void;
}

async function jumpToNode(): Promise<Jumped> {
  const { login, jump, node } = await connectNodeThroughLogin(site, access, {
    intervalMs: access.carrier.keepaliveIntervalMs,
  });
  return {
    login,
    loginSocket: tcpSocketOf(login),
    jump,
    node,
    close() {
      node.end();
      login.end();
    },
  };
}

function cat(node: Client): Promise<ClientChannel> {
  return new Promise((resolve, reject) =>
    node.exec('cat', (err, channel) => (err ? reject(err) : resolve(channel as ClientChannel))),
  );
}

/** Counts the writes the stream hands to the kernel (one per _write or _writev call). */
function countWrites(stream: Socket): { count(): number } {
  let count = 0;
  const s = stream as Socket & {
    _write: (...args: unknown[]) => void;
    _writev?: ((...args: unknown[]) => void) | null;
  };
  const write = s._write.bind(s);
  s._write = (...args) => {
    count++;
    write(...args);
  };
  const writev = s._writev?.bind(s);
  if (writev) {
    s._writev = (...args) => {
      count++;
      writev(...args);
    };
  }
  return { count: () => count };
}

/** Writes a distinct line to every channel in one turn; resolves with the login socket's writes of that turn and the echoes. */
async function oneTurn(j: Jumped, channels: ClientChannel[]): Promise<{ writes: number; echoed: string[] }> {
  const answers = channels.map(
    (channel, i) =>
      new Promise<string>((resolve) => {
        let got = '';
        const want = `line ${i}\n`;
        const onData = (d: Buffer) => {
          got += d.toString();
          if (got.length >= want.length) {
            channel.off('data', onData);
            resolve(got);
          }
        };
        channel.on('data', onData);
      }),
  );
  const counter = countWrites(j.loginSocket);
  for (const [i, channel] of channels.entries()) channel.write(`line ${i}\n`);
  // The turn's flush is the first setImmediate queued (at the first write): this one runs right after
  // it, in the same check phase, before any later turn could write (a keepalive, say).
  await new Promise((resolve) => setImmediate(resolve));
  const writes = counter.count();
  return { writes, echoed: await Promise.all(answers) };
}

describe('write coalescing on a jumped connection (login sshd, then node sshd through it)', () => {
  it('is applied to the login TCP socket and to the jump channel the node connection runs on', async () => {
    const j = await jumpToNode();
    try {
      expect(isCoalesced(j.loginSocket), 'login socket').toBe(true);
      expect(isCoalesced(j.jump), 'jump channel').toBe(true);
    } finally {
      j.close();
    }
  }, 30_000);

  it(`${CHANNELS} inner packets written in one turn leave on the login socket as one write, and every byte comes back`, async () => {
    const j = await jumpToNode();
    try {
      const channels = await Promise.all(Array.from({ length: CHANNELS }, () => cat(j.node)));
      await new Promise((resolve) => setTimeout(resolve, 200)); // window adjusts and the like are done
      const { writes, echoed } = await oneTurn(j, channels);
      expect(echoed).toEqual(channels.map((_, i) => `line ${i}\n`));
      expect(writes, `login-socket writes for ${CHANNELS} inner packets written in one turn`).toBe(1);
      for (const channel of channels) channel.end();
    } finally {
      j.close();
    }
  }, 30_000);

  it('with BACKHAUL_WRITE_COALESCING=off (the kill switch) each inner packet is a write of its own', async () => {
    process.env.BACKHAUL_WRITE_COALESCING = 'off';
    let j: Jumped;
    try {
      j = await jumpToNode();
    } finally {
      delete process.env.BACKHAUL_WRITE_COALESCING;
    }
    try {
      expect(isCoalesced(j.loginSocket)).toBe(false);
      const channels = await Promise.all(Array.from({ length: CHANNELS }, () => cat(j.node)));
      await new Promise((resolve) => setTimeout(resolve, 200));
      const { writes, echoed } = await oneTurn(j, channels);
      expect(echoed).toEqual(channels.map((_, i) => `line ${i}\n`));
      expect(writes, 'login-socket writes without coalescing').toBeGreaterThanOrEqual(CHANNELS);
    } finally {
      j.close();
    }
  }, 30_000);
});
