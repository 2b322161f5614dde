import { defineConfig } from 'vitest/config';
import { ALONE, LANE_B } from './test/lanes.js';

const shared = {
  globalSetup: ['test/global-teardown.ts'],
  // Integration tests start real sshd, Slurm and relay processes as other users: give them room on 2 cores.
  testTimeout: 60_000,
  hookTimeout: 120_000,
  // One file at a time within a project: its files share fixtures (test users, databases, Slurm).
  fileParallelism: false,
};

/**
 * Three projects (test/lanes.ts): `npm test` (scripts/test-lanes.sh) runs `alone` first, then `lane-a`
 * and `lane-b` side by side as two vitest runs. A plain `vitest run` runs them one after another.
 */
export default defineConfig({
  test: {
    reporters: ['default'],
    projects: [
      // Each its own range of ports for the servers its tests start (tools/sandbox/sshd.ts freePort).
      { test: { ...shared, name: 'alone', include: [...ALONE], env: { BH_TEST_PORTS: '20000-23999' } } },
      {
        test: {
          ...shared,
          name: 'lane-a',
          include: ['test/**/*.test.ts'],
          exclude: [...ALONE, ...LANE_B],
          env: { BH_TEST_PORTS: '24000-27999' },
        },
      },
      { test: { ...shared, name: 'lane-b', include: [...LANE_B], env: { BH_TEST_PORTS: '28000-31999' } } },
    ],
  },
});
