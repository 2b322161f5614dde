import { execFile } from 'node:child_process';
import { readFile } from 'node:fs/promises';
import { createServer, type Server } from 'node:net';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { PodDetail } from '../../src/cli/pod-status.js';
import { PYTHON, uid, waitFor } from '../../tools/sandbox/shadow-harness.js';
import { cancelSubmittedJobs } from '../../tools/sandbox/slurm.js';
import { freePort } from '../../tools/sandbox/sshd.js';
import {
  BIN,
  killWorkers,
  startWorker,
  type WorkerProcess,
  workerStarted,
} from '../../tools/sandbox/worker-process.js';
import { allActive } from '../fixtures/fault-probes.js';
import { type ProcessFleetSite, privateRedis, processFleetSite, submitPod } from '../fixtures/fleet-harness.js';

const run = promisify(execFile);
const MiB = 1024 * 1024;
const DOWN = 16 * MiB;
const UP = 3 * MiB;

/**
 * What operators see of one pod's data plane (issue 28, item 4): `backhaul status POD` shows each
 * forward's connections and bytes, and the carrier's round trip; /metrics has the carriers' round trips
 * and the channel window stalls. The job reads nothing for a while (its tunnel's window fills: stalls),
 * then takes 16 MiB, sends 3 MiB and keeps the connection open; a second forward's endpoint is down.
 */
describe('traffic per forward, carrier round trips and window stalls', () => {
  let redis: Awaited<ReturnType<typeof privateRedis>>;
  let site: ProcessFleetSite;
  let source: Server;
  let sourcePort: number;
  let received = 0;
  const workers: WorkerProcess[] = [];

  beforeAll(async () => {
    redis = await privateRedis(11);
    site = await processFleetSite(redis.url);
    // Sends DOWN bytes to each connection and counts what comes back; never closes first.
    source = createServer((socket) => {
      socket.on('error', () => undefined);
      socket.on('data', (chunk) => {
        received += chunk.length;
      });
      socket.write(Buffer.alloc(DOWN, 7));
    });
    await new Promise<void>((resolve) => source.listen(0, '127.0.0.1', resolve));
    sourcePort = (source.address() as { port: number }).port;
  }, 120_000);

  afterAll(async () => {
    await killWorkers(workers);
    await cancelSubmittedJobs();
    source?.close();
    await site?.close();
    await redis?.close();
  });

  it('status POD shows each forward (open, opened, failed, bytes each way) and the round trip; /metrics the round trips and stalls', async () => {
    const healthPort = await freePort();
    const worker = startWorker(site.configPath, redis.url, 'control,session', 'host-traffic', undefined, {
      args: ['--health-port', String(healthPort), '--health-address', '127.0.0.1'],
    });
    workers.push(worker);
    await workerStarted(worker);
    const deadPort = await freePort();
    const podUid = uid();
    const out = join(site.h.workdir, `${podUid}.out`);
    const job = `${PYTHON} - <<'PYEOF'
import os, socket, time
addr = os.environ['BACKHAUL_BIND_ADDRESS']
# The endpoint of 15801 is down: the tunnel closes the connection once the fleet's dial fails.
try:
    d = socket.create_connection((addr, 15801), timeout=10)
    print('dead endpoint said', d.recv(16), flush=True)
    d.close()
except OSError as e:
    print('dead endpoint:', e, flush=True)
s = socket.create_connection((addr, 15800))
time.sleep(4)
got = 0
while got < ${DOWN}:
    b = s.recv(1 << 20)
    if not b:
        break
    got += len(b)
s.sendall(b'u' * ${UP})
print('done', got, flush=True)
time.sleep(600)
PYEOF
`;
    await submitPod(site, podUid, 'traffic', `15800:127.0.0.1:${sourcePort} 15801:127.0.0.1:${deadPort}`, job, out);
    const seen = async () =>
      `job: ${await readFile(out, 'utf8').catch(() => '')}\nworker: ${worker.log().slice(-3000)}`;
    await waitFor('the pod active', () => allActive(site.deps, [podUid]), 90_000).catch(async (err: Error) => {
      throw new Error(`${err.message}\n${await seen()}`);
    });
    await waitFor(
      'the job through',
      async () => ((await readFile(out, 'utf8')).includes('done') ? true : undefined),
      60_000,
    );
    await waitFor('the bytes at the endpoint', () => (received === UP ? true : undefined), 20_000);

    const status = async (): Promise<PodDetail> =>
      JSON.parse((await run('node', [BIN, 'status', podUid, '--redis', redis.url, '--json'])).stdout) as PodDetail;
    const wanted = [
      { forward: `127.0.0.1:${sourcePort}`, open: 1, opened: 1, failed: 0, toService: UP, fromService: DOWN },
      { forward: `127.0.0.1:${deadPort}`, open: 0, opened: 0, failed: 1, toService: 0, fromService: 0 },
    ];
    const traffic = await waitFor(
      'the traffic in status',
      async () => {
        const t = (await status()).traffic;
        const forwards = [...(t?.forwards ?? [])].sort((a, b) => a.forward.localeCompare(b.forward));
        const expected = [...wanted].sort((a, b) => a.forward.localeCompare(b.forward));
        return t && t.rttMs !== undefined && JSON.stringify(forwards) === JSON.stringify(expected) ? t : undefined;
      },
      20_000,
    ).catch(async (err: Error) => {
      throw new Error(`${err.message}: ${JSON.stringify((await status()).traffic)}\n${await seen()}`);
    });
    expect(traffic.host).toBe('host-traffic');
    expect(traffic.rttMs).toBeGreaterThan(0);
    const text = (await run('node', [BIN, 'status', podUid, '--redis', redis.url])).stdout;
    expect(text).toMatch(
      new RegExp(`127\\.0\\.0\\.1:${sourcePort}\\s+1 open, 1 opened, 0 failed; 3\\.0 MiB to it, 16\\.0 MiB from it`),
    );
    expect(text).toMatch(/carrier round trip \d/);

    const metrics = await (await fetch(`http://127.0.0.1:${healthPort}/metrics`)).text();
    const value = (name: string) => Number(new RegExp(`^${name} (\\S+)$`, 'm').exec(metrics)?.[1] ?? 'NaN');
    console.log(
      `status: ${JSON.stringify(traffic)}\nwindow stalls ${value('backhaul_channel_window_stalls_total')}, carrier rtt samples ${value('backhaul_carrier_rtt_seconds_count')} (sum ${value('backhaul_carrier_rtt_seconds_sum')} s)\n${text}`,
    );
    // The job read nothing for 4 s while 16 MiB came: the channel toward it ran out of window.
    expect(value('backhaul_channel_window_stalls_total'), metrics).toBeGreaterThan(0);
    expect(value('backhaul_carrier_rtt_seconds_count'), metrics).toBeGreaterThan(0);

    // Once the session ends, the pod's traffic goes with it.
    await cancelSubmittedJobs();
    await waitFor(
      'the pod forgotten',
      async () => ((await site.deps.store.load(podUid)) === null ? true : undefined),
      60_000,
    );
    expect(await redis.redis.exists(site.deps.keys.traffic(podUid))).toBe(0);
  }, 180_000);
});
