/**
 * `npm test` runs the files that must run alone, then two lanes side by side, each one file at a time
 * (scripts/test-lanes.sh, vitest.config.ts). Most integration tests wait on processes (sshd, Slurm jobs, timeouts) rather than
 * use the CPU: one after another they took 19 minutes on this 2-core machine, of which 8 on the CPU.
 *
 * What the lanes share: the machine's Slurm (64 CPUs declared, so both lanes' jobs run at once), its test
 * users, and the Redis at 127.0.0.1:6379, where each file works in its own database (LANE_B_DATABASES:
 * the ones lane B's files use, which no file of lane A may use; test/unit/test-lanes.test.ts checks).
 */

/** Files that stop or restart what both lanes share (slurmctld SIGSTOPped, Slurm started again). */
export const ALONE: readonly string[] = [
  'test/integration/fleet-faults.test.ts',
  'test/integration/loopback-site.test.ts',
  'test/integration/slurm-up.test.ts',
];

/** The second lane, about half of the suite's time (the first is every other file). */
export const LANE_B: readonly string[] = [
  'test/e2e/bench-control-smoke.test.ts',
  'test/e2e/modes.test.ts',
  'test/integration/cli-fleet.test.ts',
  'test/integration/fleet-chaos.test.ts',
  'test/integration/fleet-redis-restart.test.ts',
  'test/integration/image-build.test.ts',
  'test/integration/prelude.test.ts',
  'test/integration/redis-sentinel.test.ts',
  'test/integration/redis-sentinel-clients.test.ts',
  'test/integration/shadow-session.test.ts',
];

/** Databases of 127.0.0.1:6379 that lane B's files use (bench:control uses 9: bench/control.ts). */
export const LANE_B_DATABASES: readonly number[] = [4, 7, 9, 12];
