import { createHash, randomBytes } from 'node:crypto';
import { chown, mkdtemp, rm } from 'node:fs/promises';
import { createConnection, createServer, type Server, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseSiteConfig } from '../../src/contract/site-config.js';
import { BASE_WINDOW, DEFAULT_MAX_WINDOW, windowForRtt } from '../../src/ssh/channel-window.js';
import { openSiteAccess } from '../../src/ssh/site-access.js';
import { type DelayProxy, startDelayProxy } from '../../tools/sandbox/delay-proxy.js';
import { LOOPBACK_ENDPOINT_POLICY, NO_CLUSTER_CHECKS, startLoopbackSite } from '../../tools/sandbox/loopback-site.js';
import {
  type Harness,
  jobScript,
  MiB,
  PYTHON,
  planFor,
  startSession,
  uid,
  waitForForwards,
} from '../../tools/sandbox/shadow-harness.js';
import { cancelSubmittedJobs, SLURM_NODE, sbatch } from '../../tools/sandbox/slurm.js';
import { knownHostsFile } from '../../tools/sandbox/sshd.js';

/**
 * The window a shadow session advertises, seen from the sshds that receive it (issue 26): the session
 * host reaches the login sshd through a proxy that delays each direction by DELAY_MS, so the carrier's
 * measured round trip is over 2 × DELAY_MS and its forward channels are sized to it. The node sshd logs the
 * window each forward channel was confirmed with (LogLevel DEBUG2: "open confirm rwindow"), the login
 * sshd the window of the jump channel the carrier runs in (DEBUG1: "ctype direct-tcpip ... win").
 * The per-thread budget (Backhaul.ChannelWindowBudgetMiB, 12 here) bounds what channels hold together,
 * and a reader that stops bounds what the writer in the job can push: no more than the window and the
 * sockets' own buffers, then nothing lost once it reads again.
 */

const DELAY_MS = 10;
const BUDGET_MIB = 12;
const CONFIRMED = /open confirm rwindow (\d+) rmax/g;
const JUMP = /ctype direct-tcpip rchan \d+ win (\d+) max/g;
/** What sits between the job's writer and a stalled endpoint besides the channel window: the unix socket, the node sshd's own read, the endpoint socket's kernel buffers on loopback. */
const SOCKET_BUFFERS = 8 * MiB;

let h: Harness;
let proxy: DelayProxy;
let endpoint: { server: Server; port: number; held: Socket[] };

function windows(log: string, pattern: RegExp): number[] {
  return [...log.matchAll(pattern)].map((m) => Number(m[1]));
}

async function stallingEndpoint(): Promise<{ server: Server; port: number; held: Socket[] }> {
  const held: Socket[] = [];
  const server = createServer((socket) => {
    // It reads nothing: the forward's writer must be stopped by the window, not buffered without end.
    socket.pause();
    socket.on('error', () => undefined);
    held.push(socket);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const address = server.address();
  if (!address || typeof address === 'string') throw new Error('no port');
  return { server, port: address.port, held };
}

function connectUnix(path: string): Promise<Socket> {
  return new Promise((resolve, reject) => {
    const socket = createConnection(path, () => resolve(socket));
    socket.once('error', reject);
  });
}

/** Writes until the socket takes nothing for QUIET_MS; what the path accepted and the hash of all written. */
async function writeUntilStalled(
  socket: Socket,
  quietMs: number,
): Promise<{ accepted: number; written: number; hash: ReturnType<typeof createHash> }> {
  const block = randomBytes(256 * 1024);
  const hash = createHash('sha256');
  let written = 0;
  for (;;) {
    while (socket.write(block)) {
      hash.update(block);
      written += block.length;
    }
    hash.update(block);
    written += block.length;
    const drained = await new Promise<boolean>((resolve) => {
      const timer = setTimeout(() => resolve(false), quietMs);
      socket.once('drain', () => {
        clearTimeout(timer);
        resolve(true);
      });
    });
    if (!drained) return { accepted: written - socket.writableLength, written, hash };
    if (written > 512 * MiB) throw new Error(`the path took ${written} bytes without stalling: no backpressure`);
  }
}

beforeAll(async () => {
  const site = await startLoopbackSite({ nodeForwarding: 'allowed', logLevel: 'DEBUG2' });
  proxy = await startDelayProxy({ host: site.loginHost, port: site.loginPort }, DELAY_MS);
  const dir = await mkdtemp(join(tmpdir(), 'bh-window-'));
  const knownHosts = await knownHostsFile(
    [
      { host: '127.0.0.1', port: proxy.port, key: site.login.hostKeyPub },
      { host: SLURM_NODE, port: site.nodePort, key: site.node.hostKeyPub },
    ],
    join(dir, 'known_hosts'),
  );
  const ssh = site.siteConfig.Network.SSH;
  const config = parseSiteConfig({
    Network: {
      SSH: {
        ...ssh,
        LoginHost: '127.0.0.1',
        Port: proxy.port,
        KnownHostsFile: knownHosts,
        Reverse: { ...ssh.Reverse, PythonPath: PYTHON, WaitForForwards: '60s' },
      },
    },
    Backhaul: {
      EndpointPolicy: LOOPBACK_ENDPOINT_POLICY,
      Kubernetes: NO_CLUSTER_CHECKS,
      ChannelWindowBudgetMiB: BUDGET_MIB,
      SocketCheckInterval: '1s',
    },
  });
  const access = await openSiteAccess(config);
  await chown(dir, site.user.uid, site.user.gid);
  h = { site, config, access, workdir: dir };
  endpoint = await stallingEndpoint();
}, 120_000);

afterAll(async () => {
  await cancelSubmittedJobs();
  h?.access.pool.close();
  endpoint?.server.close();
  for (const s of endpoint?.held ?? []) s.destroy();
  await proxy?.close();
  await h?.site.stop();
  if (h) await rm(h.workdir, { recursive: true, force: true });
});

describe('forward channel windows over a path with a round trip', () => {
  it('advertises the window sized to the measured RTT, within the budget, and a stalled reader holds the writer to it', async () => {
    const podUid = uid();
    const plan = planFor(h, podUid, `15030:127.0.0.1:${endpoint.port}`);
    const jobId = await sbatch(h.site.user, jobScript(h, plan, 'sleep 600\n'), { jobName: podUid });
    const started = startSession(h, plan);
    await waitForForwards(started, jobId, 90_000);
    const socketPath = plan.forwards[0]?.socketPath as string;
    expect(proxy.connections, 'login connections through the delaying proxy').toBeGreaterThan(0);

    // The jump channel (login sshd) is opened with twice the path's window: it carries the node
    // connection, whose own channels nest inside it.
    const jump = windows(h.site.login.readLog(), JUMP);
    const said = () =>
      `login jump windows ${jump.join(',')}; node confirmed ${windows(h.site.node.readLog(), CONFIRMED).join(',')}; phases ${JSON.stringify(started.phases)}`;
    const least = windowForRtt(2 * DELAY_MS);
    expect(least, 'the window a 20 ms path needs is above ssh2 own').toBeGreaterThan(BASE_WINDOW);
    expect(jump.length, said()).toBeGreaterThan(0);
    for (const w of jump) {
      expect(w, said()).toBeGreaterThanOrEqual(2 * least);
      expect(w, said()).toBeLessThanOrEqual(2 * DEFAULT_MAX_WINDOW);
    }

    // First connection: the whole path's window.
    const before = windows(h.site.node.readLog(), CONFIRMED).length;
    const first = await connectUnix(socketPath);
    const second = await connectUnix(socketPath);
    const confirmed = async (n: number) => {
      const deadline = Date.now() + 10_000;
      for (;;) {
        const got = windows(h.site.node.readLog(), CONFIRMED).slice(before);
        if (got.length >= n) return got;
        if (Date.now() > deadline) throw new Error(`${got.length} of ${n} forward channels confirmed: ${said()}`);
        await new Promise((r) => setTimeout(r, 50));
      }
    };
    const [w1, w2] = await confirmed(2);
    expect(w1, said()).toBeGreaterThanOrEqual(least);
    expect(w1, said()).toBeLessThanOrEqual(windowForRtt(2 * DELAY_MS + 40));
    // The second, open at the same time, gets what the budget has left above the base.
    const left = BUDGET_MIB * MiB - ((w1 as number) - BASE_WINDOW);
    expect(w2, `budget left ${left}: ${said()}`).toBe(
      BASE_WINDOW + Math.max(0, Math.min(left, (w1 as number) - BASE_WINDOW)),
    );

    // The endpoint reads nothing: the writer in the job is held to the window and the sockets' buffers.
    const stalled = await writeUntilStalled(first, 2_000);
    expect(stalled.accepted, `accepted before stalling, window ${w1}`).toBeGreaterThanOrEqual(w1 as number);
    expect(stalled.accepted, `accepted before stalling, window ${w1}`).toBeLessThanOrEqual(
      (w1 as number) + SOCKET_BUFFERS,
    );

    // It reads again: every byte arrives, in order.
    const far = endpoint.held[0];
    expect(far, 'the endpoint holds the first connection').toBeDefined();
    const arrived = createHash('sha256');
    let bytes = 0;
    const done = new Promise<void>((resolve) => far?.on('end', resolve));
    far?.on('data', (d: Buffer) => {
      arrived.update(d);
      bytes += d.length;
    });
    far?.resume();
    first.end();
    await done;
    expect(bytes, 'bytes the endpoint got').toBe(stalled.written);
    expect(arrived.digest('hex')).toBe(stalled.hash.digest('hex'));

    // Both closed: their grants are back, and the next channel gets a whole window again (never more than
    // the first: the round-trip estimate only falls as samples come in; without the grants back the
    // budget would be spent and it would get 2 MiB).
    second.destroy();
    await new Promise((r) => setTimeout(r, 500));
    const third = await connectUnix(socketPath);
    const [, , w3] = await confirmed(3);
    expect(w3, said()).toBeGreaterThanOrEqual(least);
    expect(w3, said()).toBeLessThanOrEqual(w1 as number);
    third.destroy();
    await started.session.close('test');
  }, 180_000);
});
