/**
 * A control worker process for the benchmark's experiments (bench/control.ts): src's ControlWorker,
 * with knobs the CLI does not have. src/ is not changed.
 *
 *   node --import tsx bench/control-worker-variant.ts --config SITE.yaml --redis URL
 *        [--events 128] [--steps 64] [--auto-pipeline]
 *
 *   --events/--steps   jobs run at once (the CLI's defaults: CONTROL_CONCURRENCY)
 *   --auto-pipeline    ioredis enableAutoPipelining: commands issued in the same tick share one write.
 *
 * Prints "fleet started" when it takes jobs; SIGTERM stops it.
 */
import { readFileSync } from 'node:fs';
import { parseArgs } from 'node:util';
import { parseSiteConfigYaml } from '../src/contract/site-config.js';
import { createLogger } from '../src/log.js';
import { fleetDeps } from '../src/pods/fleet-deps.js';
import { createRedis } from '../src/store/redis.js';
import { preloadScripts } from '../src/store/scripts.js';
import { CONTROL_CONCURRENCY, ControlWorker } from '../src/workers/control-worker.js';

const { values } = parseArgs({
  options: {
    config: { type: 'string' },
    redis: { type: 'string' },
    events: { type: 'string', default: String(CONTROL_CONCURRENCY.events) },
    steps: { type: 'string', default: String(CONTROL_CONCURRENCY.steps) },
    'auto-pipeline': { type: 'boolean', default: false },
  },
});
if (!values.config || !values.redis) throw new Error('--config and --redis are required');
const concurrency = { events: Number(values.events), steps: Number(values.steps) };

const config = parseSiteConfigYaml(readFileSync(values.config, 'utf8'), values.config);
const log = createLogger('bench-control');
const redis = createRedis(values.redis, {
  connectionName: `bench-variant-${process.pid}`,
  ...(values['auto-pipeline'] ? { options: { enableAutoPipelining: true } } : {}),
});
const deps = fleetDeps(config, redis, log);
await preloadScripts(redis);

const control = new ControlWorker(deps, { events: redis, steps: redis }, { concurrency });
log.info({ concurrency, argv: process.argv.slice(2) }, 'fleet started');

await new Promise<void>((resolve) => {
  process.once('SIGTERM', resolve);
  process.once('SIGINT', resolve);
});
await control.close();
await deps.queues.close();
redis.disconnect();
log.info('fleet stopped');
