import { execFile } from 'node:child_process';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';

/**
 * `npm run bench:control` as docs/PERFORMANCE.md says to run it, every part at its smallest size: a bench
 * that breaks (it once waited 600 s per run while every pod failed the cluster checks) fails here, not
 * on the day someone needs its figures. The figures themselves are not judged: this machine is shared.
 */

const ROOT = new URL('../..', import.meta.url).pathname;
const PODS = 5;

const run = z.looseObject({ complete: z.boolean(), median: z.number().positive() });
const figures = z.looseObject({
  throughput: z.looseObject({ one: run, two: run }),
  profile: z.looseObject({
    run: z.looseObject({ transitions: z.number(), expected: z.number() }),
  }),
  micro: z.looseObject({ machine: z.looseObject({ total: z.number().positive() }) }),
  experiments: z.looseObject({ rows: z.array(run).min(1) }),
  shadows: z
    .array(
      z.looseObject({
        mode: z.string(),
        failures: z.number(),
        sockets: z.number(),
        expectedSockets: z.number(),
        heapPerShadowKiB: z.number(),
        threadsHeapPerShadowKiB: z.number(),
        takeover: z
          .looseObject({ shadows: z.number(), backOnB: z.number(), allSeconds: z.number().nullable() })
          .optional(),
      }),
    )
    .length(2),
});

let dir = '';
let ran: { code: number; output: string } = { code: -1, output: '' };

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'bh-bench-smoke-'));
  ran = await new Promise((resolve) => {
    execFile(
      'npm',
      ['run', 'bench:control'],
      {
        cwd: ROOT,
        timeout: 600_000,
        maxBuffer: 64 << 20,
        env: {
          ...process.env,
          BENCH_PODS: String(PODS),
          BENCH_REPEAT: '1',
          BENCH_EXP_REPEAT: '1',
          BENCH_EXPERIMENTS: 'conc-32',
          BENCH_QUIET: '0',
          BENCH_SHADOWS: '2',
          BENCH_SHADOW_WARM: '1',
          BENCH_SHADOW_IDLE_MS: '1000',
          BENCH_SHADOW_PAUSE_MS: '500',
          // The session host in this process, and as two processes with a takeover (kill -9 of the first);
          // the raw mode (ShadowSessions without the fleet) is the session mode's own path below the fleet.
          BENCH_SHADOW_MODES: 'session,takeover',
          BENCH_JSON: join(dir, 'figures.json'),
        },
      },
      (err, stdout, stderr) => {
        const code = err ? (typeof err.code === 'number' ? err.code : 1) : 0;
        resolve({ code, output: `${stdout}\n${stderr}` });
      },
    );
  });
}, 660_000);

afterAll(async () => {
  if (dir) await rm(dir, { recursive: true, force: true });
});

describe('npm run bench:control, every part at its smallest size', () => {
  it('runs to its end and writes a figure for every part: every pod through, every shadow up', async () => {
    expect(ran.code, ran.output.slice(-4000)).toBe(0);
    const parsed = figures.safeParse(JSON.parse(await readFile(join(dir, 'figures.json'), 'utf8')));
    expect(parsed.error?.issues ?? [], ran.output.slice(-3000)).toEqual([]);
    const f = parsed.data;
    if (!f) return;
    expect([f.throughput.one.complete, f.throughput.two.complete]).toEqual([true, true]);
    expect(f.profile.run.transitions).toBe(f.profile.run.expected);
    expect(f.experiments.rows.every((r) => r.complete)).toBe(true);
    for (const s of f.shadows) {
      expect(s.failures, s.mode).toBe(0);
      expect(s.sockets, s.mode).toBe(s.expectedSockets);
    }
    // The session host's carriers live in its tunnel threads: their heap is counted.
    expect(f.shadows.find((s) => s.mode === 'session')?.threadsHeapPerShadowKiB).not.toBe(0);
    // Every shadow of the killed host is back on the other one.
    const takeover = f.shadows.find((s) => s.mode === 'takeover')?.takeover;
    expect(takeover, ran.output.slice(-3000)).toBeDefined();
    expect(takeover?.backOnB, JSON.stringify(takeover)).toBe(takeover?.shadows);
    expect(takeover?.allSeconds, JSON.stringify(takeover)).not.toBeNull();
  });
});
