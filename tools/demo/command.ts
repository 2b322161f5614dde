import { type Command, Option } from 'commander';
import { DEFAULT_REDIS_URL } from '../../src/store/redis.js';
import { DEFAULT_DEMO_BYTES, DEMO_MODES, DEMO_USER, type DemoMode } from './demo-options.js';

interface DemoFlags {
  mode: DemoMode;
  redis?: string;
  user: string;
  mib: string;
}

export function registerDemo(program: Command): void {
  program
    .command('demo')
    .description(
      'the whole flow on this machine, on loopback: Redis, an HPC site with real Slurm, an in-cluster service, ' +
        'the fleet; one pod from submit to teardown, then everything is cleaned up (needs root, Debian)',
    )
    .addOption(
      new Option('--mode <mode>', 'how the fleet reaches the compute node').choices(DEMO_MODES).default('node'),
    )
    .option(
      '--redis <url>',
      `Redis to use (its database 15) if it answers (default: $REDIS_URL, else ${DEFAULT_REDIS_URL}); else a private redis-server`,
    )
    .option('--user <name>', 'the job user to create (and remove) for the demo', DEMO_USER)
    .option('--mib <n>', 'MiB the workload uploads and reads back', String(DEFAULT_DEMO_BYTES / (1024 * 1024)))
    .action(async (flags: DemoFlags) => {
      const mib = Number(flags.mib);
      // Loaded here: the demo's code (SSH, Slurm, the fleet) is not needed by any other command.
      const { runDemo } = await import('./run-demo.js');
      await runDemo({
        mode: flags.mode,
        redis: flags.redis ?? process.env.REDIS_URL ?? DEFAULT_REDIS_URL,
        user: flags.user,
        bytes: Number.isFinite(mib) && mib > 0 ? Math.round(mib * 1024 * 1024) : DEFAULT_DEMO_BYTES,
      });
    });
}
