import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    globalSetup: ['test/global-teardown.ts'],
    // Integration tests start real sshd, Slurm and relay processes as other users: give them room on 2 cores.
    testTimeout: 60_000,
    hookTimeout: 120_000,
    // Suites share machine-wide fixtures (test users, Slurm): run files one after another.
    fileParallelism: false,
    reporters: ['default'],
  },
});
