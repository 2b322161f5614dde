import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';
import { CLUSTER_ADDRESS, createWan, SITE_ADDRESS, wanNamespaces } from '../../bench/wan-topology.js';

const run = promisify(execFile);

/**
 * bench:wan's WAN, made and removed as the bench does (two namespaces, tun devices, the user-space
 * delayer at a real-time priority): the round trip is the one asked for, TCP crosses it, a loss
 * fraction drops packets, and close() leaves no namespace and no delayer.
 */
describe('the emulated WAN of bench:wan', () => {
  it('delays by the round trip asked for, drops what it is told to, and leaves nothing behind', async () => {
    const wan = await createWan({ rttMs: 20, loss: 0.05 });
    let closed = false;
    try {
      expect((await wanNamespaces()).sort()).toEqual([wan.cluster, wan.site].sort());
      // ping: createWan measured the echoes of its 5 that came back (at 5 % loss each way, nearly all).
      expect(wan.measuredRttMs, `ping across the WAN: ${wan.measuredRttMs} ms`).toBeGreaterThanOrEqual(19.5);
      expect(wan.measuredRttMs).toBeLessThan(35);
      // TCP across it (retransmitting through the losses), from the site to a listener in the cluster.
      const server = run(
        'ip',
        [
          'netns',
          'exec',
          wan.cluster,
          'python3',
          '-c',
          `import socket\ns=socket.socket();s.bind(("${CLUSTER_ADDRESS}",7070));s.listen(1);c,_=s.accept();c.sendall(c.recv(64)[::-1]);c.close()`,
        ],
        { timeout: 30_000 },
      );
      await new Promise((r) => setTimeout(r, 500));
      const { stdout } = await run(
        'ip',
        [
          'netns',
          'exec',
          wan.site,
          'python3',
          '-c',
          `import socket\nc=socket.create_connection(("${CLUSTER_ADDRESS}",7070),timeout=20);c.sendall(b"from ${SITE_ADDRESS}");print(c.recv(64).decode())`,
        ],
        { timeout: 30_000 },
      );
      await server;
      // 400 packets at 5 % each way: some are dropped (all passing has a chance of 1 in 10^9).
      const { stdout: pings } = await run(
        'ip',
        ['netns', 'exec', wan.cluster, 'ping', '-q', '-c', '200', '-i', '0.005', '-W', '1', SITE_ADDRESS],
        { timeout: 30_000 },
      ).catch((e: { stdout?: string }) => ({ stdout: e.stdout ?? '' }));
      const lost = Number(/([\d.]+)% packet loss/.exec(pings)?.[1]);
      expect(lost, pings).toBeGreaterThan(0);
      expect(lost, pings).toBeLessThan(40);
      expect(stdout.trim()).toBe(`from ${SITE_ADDRESS}`.split('').reverse().join(''));
      const counters = await wan.close();
      closed = true;
      expect(counters?.passed, JSON.stringify(counters)).toBeGreaterThan(10);
      expect(counters?.dropped, JSON.stringify(counters)).toBeGreaterThan(0);
    } finally {
      if (!closed) await wan.close();
    }
    expect(await wanNamespaces()).toEqual([]);
    const { stdout: delayers } = await run('pgrep', ['-f', 'wan_delay.py']).catch(() => ({ stdout: '' }));
    expect(delayers.trim(), 'delayer processes left').toBe('');
  }, 60_000);
});
