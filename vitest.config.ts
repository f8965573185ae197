import { availableParallelism } from 'node:os';
import { defineConfig } from 'vitest/config';

/**
 * Three tiers, one command. `unit` needs nothing; `contract` runs every port's contract suite against
 * each adapter with the real services; `blackbox` drives the built server over HTTP in both profiles.
 * The global setup starts (or finds) Redis, MariaDB and a Kafka broker and fails loudly when it cannot.
 */
export default defineConfig({
  test: {
    globalSetup: ['./test/rig/global-setup.ts'],
    // Unit and contract files at least two at a time (the default, a worker per core but one, runs
    // them one by one on a two-core machine); black-box files, whose processes and timings need the
    // machine to themselves, one at a time (their project says so).
    maxWorkers: Math.max(2, availableParallelism() - 1),
    testTimeout: 30_000,
    hookTimeout: 120_000,
    teardownTimeout: 60_000,
    reporters: ['default'],
    projects: [
      {
        extends: true,
        test: { name: 'unit', include: ['src/**/*.test.ts'], exclude: ['src/**/*.it.test.ts'] },
      },
      {
        extends: true,
        test: { name: 'contract', include: ['src/**/*.it.test.ts'] },
      },
      {
        extends: true,
        test: { name: 'blackbox', include: ['test/blackbox/**/*.test.ts'], fileParallelism: false },
      },
    ],
  },
});
