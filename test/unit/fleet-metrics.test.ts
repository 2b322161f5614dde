import { describe, expect, it } from 'vitest';
import { silentLogger } from '../../src/log.js';
import { FleetMetrics } from '../../src/metrics/fleet-metrics.js';
import { fleetDeps } from '../../src/pods/fleet-deps.js';
import { createRedis } from '../../src/store/redis.js';
import { siteWith } from './contract-fixtures.js';

const config = siteWith();

describe('fleet metrics', () => {
  it('counts per fleet member: two registries in one process count apart', async () => {
    const a = new FleetMetrics();
    const b = new FleetMetrics();
    a.transitions.inc({ to: 'active', event: 'FORWARDS_READY' });
    a.dataPlane.apply({
      endpoints: [],
      carrierRttSeconds: [0.002],
      windowStalls: 3,
      squeue: { queries: 2, failures: 1 },
    });
    const textA = await a.registry.metrics();
    const textB = await b.registry.metrics();
    expect(textA).toMatch(/^backhaul_transitions_total\{to="active",event="FORWARDS_READY"\} 1$/m);
    expect(textA).toMatch(/^backhaul_channel_window_stalls_total 3$/m);
    expect(textA).toMatch(/^backhaul_squeue_queries_total 2$/m);
    expect(textA).toMatch(/^backhaul_squeue_failures_total 1$/m);
    expect(textB).not.toMatch(/^backhaul_transitions_total\{/m);
    expect(textB).toMatch(/^backhaul_squeue_queries_total 0$/m);
  });

  it('gives each fleet its own unless one is handed in (the worker command hands in the one /metrics serves)', async () => {
    const redis = createRedis('redis://127.0.0.1:6379/15', { options: { lazyConnect: true } });
    try {
      const own = fleetDeps(config, redis, silentLogger());
      const other = fleetDeps(config, redis, silentLogger());
      expect(own.metrics).not.toBe(other.metrics);
      const served = new FleetMetrics();
      expect(fleetDeps(config, redis, silentLogger(), { metrics: served }).metrics).toBe(served);
      await Promise.all([own.queues.close(), other.queues.close()]);
    } finally {
      redis.disconnect();
    }
  });
});
