import type { Client, ClientChannel } from 'ssh2';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseSiteConfig } from '../../src/contract/site-config.js';
import { openSiteAccess, type SiteAccess } from '../../src/ssh/site-access.js';
import { type LoopbackSite, startLoopbackSite } from '../../tools/sandbox/loopback-site.js';
import { connectNodeThroughLogin } from '../../tools/sandbox/node-hop.js';

/**
 * Keepalives as OpenSSH's ServerAliveInterval sends them (patches/ssh2+1.17.0.patch): only after an
 * interval in which nothing arrived. ssh2 sent one every interval whatever the traffic, and each one sent
 * mid-traffic put its reply just before a data reply; over a 20 ms WAN that cost 1 % of round trips
 * 40-60 ms (issue 26, bench:wan). Dead-peer detection stays: a silent peer still gets its keepalives and
 * the connection fails "Keepalive timeout". The node connection runs through the login one, as a carrier's
 * does; the node sshd logs every global request (LogLevel DEBUG1).
 */

const INTERVAL_MS = 250;
const KEEPALIVE = /server_input_global_request: rtype keepalive@openssh\.com/g;

let site: LoopbackSite;
let access: SiteAccess;

beforeAll(async () => {
  site = await startLoopbackSite({ slurm: false, logLevel: 'DEBUG1' });
  access = await openSiteAccess(parseSiteConfig(site.siteConfig));
}, 60_000);

afterAll(async () => {
  access?.pool.close();
  await site?.stop();
});

function cat(node: Client): Promise<ClientChannel> {
  return new Promise((resolve, reject) =>
    node.exec('cat', (err, channel) => (err ? reject(err) : resolve(channel as ClientChannel))),
  );
}

/** Round trips through `cat` on the node, one after another, for MS: the traffic of a busy forward. */
async function busyFor(channel: ClientChannel, ms: number): Promise<number> {
  const until = performance.now() + ms;
  let trips = 0;
  while (performance.now() < until) {
    await new Promise<void>((resolve) => {
      channel.once('data', () => resolve());
      channel.write('x');
    });
    trips++;
    await new Promise((r) => setTimeout(r, 5));
  }
  return trips;
}

const keepalivesLogged = () => (site.node.readLog().match(KEEPALIVE) ?? []).length;

describe('keepalives', () => {
  it('are not sent while data arrives, are sent once it stops, and still find a peer that went silent', async () => {
    const { login, node, errors } = await connectNodeThroughLogin(site, access, {
      intervalMs: INTERVAL_MS,
      countMax: 3,
    });
    try {
      const channel = await cat(node);
      const before = keepalivesLogged();
      const trips = await busyFor(channel, 12 * INTERVAL_MS);
      // The last keepalive may be logged a moment after it was sent: give the log that moment.
      await new Promise((r) => setTimeout(r, 100));
      const duringTraffic = keepalivesLogged() - before;
      expect(trips, 'round trips made').toBeGreaterThan(100);
      expect(duringTraffic, `keepalives during ${trips} round trips over ${12 * INTERVAL_MS} ms`).toBe(0);

      await new Promise((r) => setTimeout(r, 6 * INTERVAL_MS));
      const whileIdle = keepalivesLogged() - before;
      expect(whileIdle, `keepalives in ${6 * INTERVAL_MS} ms idle`).toBeGreaterThanOrEqual(3);

      // The node sshd's process for this connection stops answering (SIGSTOP): no data, only keepalives,
      // and after keepaliveCountMax unanswered ones the connection fails.
      const stopped = site.node.processes().filter((pid) => pid !== site.node.pid);
      expect(
        stopped.length,
        `the node sshd's connection processes (${site.node.processes().join(' ')})`,
      ).toBeGreaterThan(0);
      for (const pid of stopped) process.kill(pid, 'SIGSTOP');
      const t0 = performance.now();
      try {
        await new Promise<void>((resolve, reject) => {
          const timer = setTimeout(
            () => reject(new Error(`no keepalive timeout; errors ${errors.join(', ')}`)),
            20 * INTERVAL_MS,
          );
          const check = setInterval(() => {
            if (errors.some((e) => /Keepalive timeout/.test(e.message))) {
              clearTimeout(timer);
              clearInterval(check);
              resolve();
            }
          }, 20);
        });
      } finally {
        for (const pid of stopped) process.kill(pid, 'SIGCONT');
      }
      const detectedMs = performance.now() - t0;
      // Up to two intervals before the first is sent, then 3 unanswered ones and the 4th tick: about 5
      // intervals; the bound leaves room for a loaded machine's timers.
      expect(detectedMs, 'time to detect the silent peer').toBeLessThan(12 * INTERVAL_MS);
    } finally {
      node.end();
      login.end();
    }
  }, 60_000);
});
