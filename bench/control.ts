/**
 * Control-plane benchmark (ARCHITECTURE.md, "Aims (what good looks like)": ≥ 2,000 transitions/s on 2 cores against one Redis; an idle shadow
 * under 256 KiB of heap): `npm run bench:control` (needs root, Redis on 127.0.0.1:6379, `npm run build`).
 *
 * Parts (BENCH_PARTS, comma-separated; all by default):
 *   throughput   BENCH_PODS pods (1000) end to end — POD_UPSERT → validate/render/launch steps → the four
 *                session reports → TEARDOWN → teardown step → done — against ONE and TWO real
 *                `backhaul worker --roles control` processes; transitions/s, the ratio, CPU per transition.
 *                See bench/control-throughput.ts for the event stream.
 *   profile      one such run with `node --cpu-prof` on the worker: where its CPU goes.
 *   micro        the pieces alone, in this process: the pure machine step (zod, XState, JSON), applyWithRetry,
 *                applyPodEvent without queues, bare BullMQ jobs, batching a pod's events (bench/control-micro.ts).
 *   experiments  the same end-to-end run with src's ControlWorker at other settings (bench/control-worker-variant.ts):
 *                concurrency 32/16, 128/64 (the default), 256/128, and ioredis auto-pipelining; 1 and 2 processes.
 *   shadows      heap per idle shadow on the loopback site (bench/control-shadows.ts, in a child with
 *                --expose-gc), BENCH_SHADOWS shadows (100) in each of BENCH_SHADOW_MODES (session,raw; takeover:
 *                the session host as a process, killed with SIGKILL once every shadow is up, and the time
 *                until a second one holds them all), after
 *                BENCH_SHADOW_WARM (10) warm ones, read after BENCH_SHADOW_IDLE_MS (15000) of idling; the
 *                heap of every thread (the session host's tunnel threads hold the carriers). BENCH_SHADOW_PAUSE_MS
 *                shortens its two settling pauses (3 s, 5 s): the CI smoke test does.
 *
 * Other settings: BENCH_REPEAT (3) runs of each end-to-end configuration (median and best are reported);
 * BENCH_EXP_REPEAT (2) runs of each experiment; BENCH_QUIET (30): seconds to wait, before each run, for the
 * shared machine to be under 35 % busy (it runs anyway after that; the share others used is reported);
 * BENCH_EXPERIMENTS: names of the experiments to run (default all; see EXPERIMENTS); BENCH_COMPARE_ROOT: a
 * second checkout whose control worker is run as the experiments `compare` and `compare-2` (an A/B);
 * BENCH_JSON: write every figure to this file. Redis database 9 is flushed before and after.
 */
import { execFile } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { cpus, tmpdir, totalmem } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { createRedis } from '../src/store/redis.js';
import { JOB_USER } from '../tools/sandbox/users.js';
import { cleanupAll, fmt, machineCpu, median, onCleanup, say, sleep, spawnChild, table } from './control-common.js';
import { summarizeProfile } from './control-cpuprofile.js';
import { benchBatching, benchBullmq, benchEventStream, benchMachine, benchStore } from './control-micro.js';
import { cancelRun, cancelRunMs, runPrefix } from './control-slurm.js';
import {
  driveOnce,
  startWorkers,
  type ThroughputResult,
  TRANSITIONS_PER_POD,
  type WorkerSpec,
  writeControlConfig,
} from './control-throughput.js';

const execFileAsync = promisify(execFile);
const ROOT = fileURLToPath(new URL('..', import.meta.url));
const URL_ = 'redis://127.0.0.1:6379/9';
const AIM_RATE = 2_000;
const AIM_HEAP_KIB = 256;

const PODS = Number(process.env.BENCH_PODS ?? 1000);
const REPEAT = Math.max(1, Number(process.env.BENCH_REPEAT ?? 3));
const QUIET_S = Number(process.env.BENCH_QUIET ?? 30);
const EXP_REPEAT = Math.max(1, Number(process.env.BENCH_EXP_REPEAT ?? 2));
const PARTS = new Set(
  (process.env.BENCH_PARTS ?? 'throughput,profile,micro,experiments,shadows').split(',').map((p) => p.trim()),
);
const SHADOWS = Number(process.env.BENCH_SHADOWS ?? 100);
const SHADOW_MODES = (process.env.BENCH_SHADOW_MODES ?? 'session,raw').split(',').map((m) => m.trim());
/** Shadows established before the baseline heap is read (one-time costs), and the idling before the reading. */
const SHADOW_WARM = Number(process.env.BENCH_SHADOW_WARM ?? 10);
const SHADOW_IDLE_MS = Number(process.env.BENCH_SHADOW_IDLE_MS ?? 15_000);
/** The shadows part's two pauses (3 s after the warm shadows, 5 s before the second reading); unset: those. */
const SHADOW_PAUSE_MS = process.env.BENCH_SHADOW_PAUSE_MS;

interface Experiment {
  name: string;
  workers: number;
  spec: WorkerSpec;
}
const variant = (label: string, ...args: string[]): WorkerSpec => ({ kind: 'variant', label, args });
/** src's ControlWorker with other concurrency or ioredis auto-pipelining, with one and two processes. */
const EXPERIMENTS: Experiment[] = [1, 2].flatMap((workers) => {
  const suffix = workers === 1 ? '' : '-2';
  return [
    {
      name: `conc-32${suffix}`,
      workers,
      spec: variant('concurrency events 32 / steps 16', '--events', '32', '--steps', '16'),
    },
    { name: `conc-128${suffix}`, workers, spec: variant('concurrency events 128 / steps 64 (default)') },
    {
      name: `conc-256${suffix}`,
      workers,
      spec: variant('concurrency events 256 / steps 128', '--events', '256', '--steps', '128'),
    },
    { name: `auto-pipeline${suffix}`, workers, spec: variant('128/64 + ioredis auto-pipelining', '--auto-pipeline') },
  ];
});
// BENCH_COMPARE_ROOT: another checkout (e.g. `git worktree add /tmp/base <commit>` with node_modules
// linked) whose control worker runs beside this one's in the same run: an A/B of two commits.
const COMPARE_ROOT = process.env.BENCH_COMPARE_ROOT;
if (COMPARE_ROOT) {
  for (const workers of [1, 2]) {
    const spec: WorkerSpec = { kind: 'variant', label: `128/64 of ${COMPARE_ROOT}`, args: [], root: COMPARE_ROOT };
    EXPERIMENTS.push({ name: workers === 1 ? 'compare' : 'compare-2', workers, spec });
  }
}
const SELECTED = process.env.BENCH_EXPERIMENTS
  ? new Set(process.env.BENCH_EXPERIMENTS.split(',').map((e) => e.trim()))
  : undefined;

const results: Record<string, unknown> = {
  startedAt: new Date().toISOString(),
  machine: { cpus: cpus().length, model: cpus()[0]?.model, memGiB: totalmem() / 2 ** 30, node: process.version },
  settings: { pods: PODS, repeat: REPEAT, shadows: SHADOWS },
};
const workDir = mkdtempSync(join(tmpdir(), 'bh-bench-control-'));
// Registered first, so it runs last: the figures so far are written even when a signal ends the run.
onCleanup('figures', () => {
  if (!process.env.BENCH_JSON) return;
  writeFileSync(
    process.env.BENCH_JSON,
    JSON.stringify(results, (_k, v) => (v instanceof Map ? Object.fromEntries(v) : v), 2),
  );
  say(`figures written to ${process.env.BENCH_JSON}`);
});
say(`work dir ${workDir} (worker logs, profiles)`);

// ------------------------------------------------------------------------------------------ preconditions

if (process.getuid?.() !== 0) throw new Error('run as root (the shadows part starts sshds and submits Slurm jobs)');
if (!existsSync(join(ROOT, 'dist', 'cli', 'main.js'))) throw new Error('dist/ is missing: run `npm run build` first');
{
  const built = statSync(join(ROOT, 'dist', 'cli', 'main.js')).mtimeMs;
  const newer: string[] = [];
  const walk = (dir: string) => {
    for (const e of readdirSync(dir, { withFileTypes: true })) {
      const p = join(dir, e.name);
      if (e.isDirectory()) walk(p);
      else if (p.endsWith('.ts') && statSync(p).mtimeMs > built) newer.push(p.slice(ROOT.length));
    }
  };
  walk(join(ROOT, 'src'));
  if (newer.length > 0) {
    say(`WARNING: dist/ is older than ${newer.length} source files (e.g. ${newer[0]}): run \`npm run build\``);
  }
}
const admin = createRedis(URL_, { connectionName: 'bench-control-admin' });
await admin.flushdb();
onCleanup('redis db 9', async () => {
  await admin.flushdb().catch(() => undefined);
  admin.disconnect();
});
const configPath = writeControlConfig(workDir, URL_);

/** Waits (up to BENCH_QUIET s) until the shared machine is under 35 % busy; returns the busy share seen. */
async function quietGate(): Promise<number> {
  const deadline = Date.now() + QUIET_S * 1000;
  let share = 1;
  for (;;) {
    const a = machineCpu();
    await sleep(2_000);
    const b = machineCpu();
    share = (b.busy - a.busy) / Math.max(0.01, b.total - a.total);
    if (share < 0.35 || Date.now() >= deadline) return share;
  }
}

interface RunRecord extends ThroughputResult {
  busyBefore: number;
  /** Share of the machine's CPU used by other processes during the run. */
  othersShare: number;
}

async function endToEnd(spec: WorkerSpec, workers: number, run: number, cpuProfDir?: string): Promise<RunRecord> {
  const busyBefore = await quietGate();
  await admin.flushdb();
  const children = await startWorkers({
    spec,
    count: workers,
    configPath,
    url: URL_,
    logDir: workDir,
    ...(cpuProfDir ? { cpuProfDir } : {}),
  });
  const stop = onCleanup('control workers', () => Promise.all(children.map((c) => c.stop())));
  try {
    const r = await driveOnce({ url: URL_, pods: PODS, run, workers: children, spec: spec.kind });
    const ours = r.cpu.workers.reduce((a, b) => a + b, 0) + r.cpu.bench + r.cpu.redis;
    const othersShare = Math.max(0, (r.cpu.machineBusy - ours) / (cpus().length * r.cpu.wall));
    const rec = { ...r, busyBefore, othersShare };
    say(
      `  ${workers} worker(s): ${fmt(r.transitions)}/${fmt(r.expected)} transitions in ${fmt(r.seconds, 2)} s = ${fmt(r.perSecond)}/s` +
        ` (worker CPU ${fmt(((ours - r.cpu.bench - r.cpu.redis) * 1000) / r.transitions, 2)} ms/transition, others used ${fmt(othersShare * 100)} % of the machine)`,
    );
    if (r.transitions !== r.expected || r.extraEvents.size > 0) {
      say(`  WARNING: expected ${r.expected} transitions; extra events ${JSON.stringify([...r.extraEvents])}`);
    }
    return rec;
  } finally {
    await stop();
    await admin.flushdb();
  }
}

interface Summary {
  label: string;
  workers: number;
  runs: number;
  median: number;
  best: number;
  /** CPU ms per stored transition (medians over the runs). */
  workerMs: number;
  redisMs: number;
  driverMs: number;
  othersShare: number;
  bound2: number;
  complete: boolean;
}

function summarize(label: string, runs: RunRecord[]): Summary {
  const per = (f: (r: RunRecord) => number) => median(runs.map(f));
  const workerMs = per((r) => (r.cpu.workers.reduce((a, b) => a + b, 0) * 1000) / r.transitions);
  const redisMs = per((r) => (r.cpu.redis * 1000) / r.transitions);
  return {
    label,
    workers: runs[0]?.workers ?? 0,
    runs: runs.length,
    median: per((r) => r.perSecond),
    best: Math.max(...runs.map((r) => r.perSecond)),
    workerMs,
    redisMs,
    driverMs: per((r) => (r.cpu.bench * 1000) / r.transitions),
    othersShare: per((r) => r.othersShare),
    // If the workers and Redis had both cores to themselves and never waited: an upper bound.
    bound2: (2 * 1000) / (workerMs + redisMs),
    complete: runs.every((r) => r.transitions === r.expected && r.extraEvents.size === 0),
  };
}

function summaryTable(rows: Summary[]): string {
  return table(
    [
      [
        'configuration',
        'workers',
        'runs',
        'median/s',
        'best/s',
        'worker ms/tr',
        'redis ms/tr',
        'driver ms/tr',
        'others %',
        '2-core bound/s',
      ],
      ...rows.map((s) => [
        s.label + (s.complete ? '' : ' (!)'),
        String(s.workers),
        String(s.runs),
        fmt(s.median),
        fmt(s.best),
        fmt(s.workerMs, 2),
        fmt(s.redisMs, 2),
        fmt(s.driverMs, 2),
        fmt(s.othersShare * 100),
        fmt(s.bound2),
      ]),
    ],
    [false, true, true, true, true, true, true, true, true, true],
  );
}

const report: string[] = [];
const out = (line = '') => {
  report.push(line);
  process.stdout.write(`${line}\n`);
};

try {
  let runNo = 0;
  // -------------------------------------------------------------------------------- throughput
  if (PARTS.has('throughput')) {
    say(`throughput: ${PODS} pods × ${TRANSITIONS_PER_POD} transitions, 1 and 2 worker processes, ${REPEAT} runs each`);
    const runs: Record<1 | 2, RunRecord[]> = { 1: [], 2: [] };
    for (let rep = 0; rep < REPEAT; rep += 1) {
      for (const n of rep % 2 === 0 ? ([1, 2] as const) : ([2, 1] as const)) {
        runNo += 1;
        runs[n].push(await endToEnd({ kind: 'cli' }, n, runNo));
      }
    }
    const one = summarize('backhaul worker --roles control', runs[1]);
    const two = summarize('backhaul worker --roles control', runs[2]);
    results.throughput = { one, two, runs };
    out('');
    out(
      `== Control plane end to end: ${PODS} pods, ${TRANSITIONS_PER_POD} stored transitions each (aim ≥ ${fmt(AIM_RATE)}/s)`,
    );
    out(summaryTable([one, two]));
    out(
      `ratio 2 workers / 1 worker: median ${fmt(two.median / one.median, 2)}, best ${fmt(two.best / one.best, 2)}; ` +
        `best vs aim: ${fmt((Math.max(one.best, two.best) / AIM_RATE) * 100)} %`,
    );
    const r0 = runs[1][0];
    if (r0) {
      out(
        `per stored transition (1 worker, run 1): ${fmt(r0.events.sent / r0.transitions, 2)} events ` +
          `(${fmt(r0.events.ignored / r0.transitions, 2)} of them storing none, ${r0.events.dead} buried), ${fmt(r0.stepJobs.completed / r0.transitions, 2)} step jobs, ` +
          `${fmt(
            [...r0.commandsPerTransition.values()].reduce((a, b) => a + b, 0),
            0,
          )} Redis commands (incl. those run inside Lua)`,
      );
      const top = [...r0.commandsPerTransition.entries()].sort((a, b) => b[1] - a[1]).slice(0, 10);
      out(`  top commands per transition: ${top.map(([c, n]) => `${c} ${fmt(n, 1)}`).join(', ')}`);
    }
  }

  // -------------------------------------------------------------------------------- profile
  if (PARTS.has('profile')) {
    say('profile: one run, 1 worker with --cpu-prof');
    const profDir = join(workDir, 'cpuprof');
    runNo += 1;
    const r = await endToEnd({ kind: 'cli' }, 1, runNo, profDir);
    const file = readdirSync(profDir).find((f) => f.endsWith('.cpuprofile'));
    if (file) {
      const s = summarizeProfile(join(profDir, file));
      const busy = [...s.byCategory.entries()].filter(([c]) => c !== 'idle').reduce((a, [, ms]) => a + ms, 0);
      results.profile = { run: r, byCategory: [...s.byCategory], inclusive: [...s.inclusive], topSelf: s.topSelf };
      out('');
      out(`== Where the worker's CPU goes (node --cpu-prof, 1 worker, ${PODS} pods; profiler overhead included)`);
      out(
        table(
          [
            ['self time by package', 'ms', '% of busy'],
            ...[...s.byCategory.entries()]
              .filter(([c, ms]) => c !== 'idle' && ms >= busy * 0.005)
              .sort((a, b) => b[1] - a[1])
              .map(([c, ms]) => [c, fmt(ms), fmt((ms / busy) * 100, 1)]),
          ],
          [false, true, true],
        ),
      );
      out(
        table(
          [
            ['inclusive time of', 'ms', '% of busy', 'µs per transition'],
            ...[...s.inclusive.entries()]
              .sort((a, b) => b[1] - a[1])
              .map(([f, ms]) => [f, fmt(ms), fmt((ms / busy) * 100, 1), fmt((ms * 1000) / r.transitions)]),
          ],
          [false, true, true, true],
        ),
      );
      out(
        `top self time: ${s.topSelf
          .slice(0, 8)
          .map((t) => `${t.name} ${fmt(t.ms)} ms`)
          .join('; ')}`,
      );
    }
  }

  // -------------------------------------------------------------------------------- micro
  if (PARTS.has('micro')) {
    say('micro: machine, store, BullMQ, batching (in this process)');
    await quietGate();
    const machine = benchMachine(3_000);
    await admin.flushdb();
    const store = await benchStore(URL_, PODS);
    const bull = await benchBullmq(URL_, 10_000);
    const stream = await benchEventStream(URL_, 10_000);
    const batching = await benchBatching(URL_, PODS);
    results.micro = { machine, store, bull, batching };
    out('');
    out('== The pieces alone (this process; CPU µs for the pure parts, wall clock for the Redis parts)');
    out(
      table(
        [
          ['pure step, per transition', 'CPU µs'],
          ['parsePodEvent (zod)', fmt(machine.parseEvent, 1)],
          ['restorePod (JSON.parse + zod + resolveState)', fmt(machine.restore, 1)],
          ['applyEvent (machine.transition, one shared actor scope)', fmt(machine.applyEvent, 1)],
          ["  XState's transition() (an inert actor per call)", fmt(machine.xstateTransition, 1)],
          ['persistPod (structuredClone)', fmt(machine.persist, 1)],
          ['JSON.stringify of the snapshot', fmt(machine.json, 1)],
          ['all of it, as applyPodEvent decides', fmt(machine.total, 1)],
        ],
        [false, true],
      ),
    );
    out(`stored snapshot: ${machine.snapshotBytes} bytes of JSON on average`);
    const rateRow = (label: string, r: { perSecond: number; cpuMsPerOp: number; latencyMs?: number }) => [
      label,
      fmt(r.perSecond),
      fmt(r.cpuMsPerOp * 1000),
      r.latencyMs === undefined ? '' : fmt(r.latencyMs * 1000),
    ];
    out(
      table(
        [
          ['with Redis', 'per s', 'CPU µs/op (this process)', 'latency µs'],
          rateRow('applyWithRetry, fixed write, 1 at a time', store.casSequential),
          rateRow('applyWithRetry, fixed write, 32 at a time', store.casConcurrent),
          rateRow('applyPodEvent, whole lifecycles, 32 pods at a time', store.applyPodEvent),
          rateRow('  + runEffects (step and deadline jobs added)', store.applyPodEventWithEffects),
          rateRow('sendEvent (one XADD), 32 at a time', stream.add),
          rateRow('EventConsumer, no-op handler, concurrency 32', stream.process),
          rateRow('BullMQ add (the job options events had), 32 at a time', bull.add),
          rateRow('BullMQ no-op Worker, concurrency 32', bull.process),
          rateRow(`${batching.k} reports of a pod: ${batching.k} CAS rounds (per report)`, batching.separate),
          rateRow(`${batching.k} reports of a pod: 1 CAS round (per report)`, batching.batched),
        ],
        [false, true, true, true],
      ),
    );
  }

  // -------------------------------------------------------------------------------- experiments
  if (PARTS.has('experiments')) {
    const chosen = EXPERIMENTS.filter((e) => !SELECTED || SELECTED.has(e.name));
    say(`experiments: ${chosen.map((e) => e.name).join(', ')}; ${EXP_REPEAT} runs each`);
    const byName = new Map<string, RunRecord[]>(chosen.map((e) => [e.name, []]));
    // Round-robin, so that a noisy neighbour does not hit one experiment only.
    for (let rep = 0; rep < EXP_REPEAT; rep += 1) {
      for (const e of chosen) {
        runNo += 1;
        say(`experiment ${e.name} (${rep + 1}/${EXP_REPEAT})`);
        byName.get(e.name)?.push(await endToEnd(e.spec, e.workers, runNo));
      }
    }
    const rows = chosen.map((e) =>
      summarize(`${e.name}: ${e.spec.kind === 'variant' ? e.spec.label : ''}`, byName.get(e.name) ?? []),
    );
    results.experiments = { rows, runs: Object.fromEntries(byName) };
    out('');
    out(`== Experiments (bench/control-worker-variant.ts, src run through tsx), ${PODS} pods`);
    out(summaryTable(rows));
  }

  // -------------------------------------------------------------------------------- shadows
  if (PARTS.has('shadows')) {
    const shadowResults: unknown[] = [];
    for (const mode of SHADOW_MODES) {
      say(`shadows: ${SHADOWS} idle shadows, mode ${mode}`);
      shadowResults.push(await idleShadows(mode));
    }
    results.shadows = shadowResults;
    out('');
    out(`== Heap per idle shadow (aim ≤ ${AIM_HEAP_KIB} KiB), loopback site, 2 forwards per pod`);
    out(
      table(
        [
          [
            'mode',
            'shadows',
            'failed',
            'restarted',
            'sockets',
            'heap KiB/shadow (all threads)',
            'in tunnel threads',
            '+5 s',
            'external KiB',
            'fds/shadow',
            'node carrier PSS KiB',
            'slurmctld job RPCs',
            'vs aim',
          ],
          ...shadowResults.map((r) => {
            const x = r as Record<string, number | string>;
            return [
              String(x.mode),
              String(x.shadows),
              String(x.failures),
              String(x.retries),
              `${x.sockets}/${x.expectedSockets}`,
              fmt(Number(x.heapPerShadowKiB), 1),
              fmt(Number(x.threadsHeapPerShadowKiB ?? 0), 1),
              fmt(Number(x.heapPerShadowLaterKiB), 1),
              fmt(Number(x.externalPerShadowKiB), 1),
              fmt(Number(x.fdsPerShadow ?? 0), 1),
              fmt(Number(x.nodeCarrierPssPerShadowKiB)),
              String(x.slurmJobRpcs ?? ''),
              `${fmt((Number(x.heapPerShadowKiB) / AIM_HEAP_KIB) * 100)} %`,
            ];
          }),
        ],
        [false, true, true, true, true, true, true, true, true, true, true, true, true],
      ),
    );
    const takeovers = shadowResults
      .map((r) => (r as { takeover?: Record<string, number | null> }).takeover)
      .filter((t) => t !== undefined);
    for (const t of takeovers) {
      out('');
      out(`== Takeover: session host A (${t.onHostA} shadows) killed with SIGKILL, host B takes them over`);
      out(
        `back on B: ${t.backOnB}/${t.shadows}; first ${fmt(Number(t.firstSeconds), 1)} s, median ${fmt(Number(t.medianSeconds), 1)} s, ` +
          `p90 ${fmt(Number(t.p90Seconds), 1)} s, all ${t.allSeconds === null ? 'not within 30 min' : `${fmt(Number(t.allSeconds), 1)} s`} after the kill; sockets ${t.socketsAfter}`,
      );
    }
  }
} finally {
  await cleanupAll();
  rmSync(join(workDir, 'cpuprof'), { recursive: true, force: true });
}

// ------------------------------------------------------------------------------------------ shadows

/**
 * Runs bench/control-shadows.ts as a child with --expose-gc. The partition is allowed to share CPUs
 * (OverSubscribe=FORCE) for the run when the shadows' jobs would not fit the node's CPUs otherwise, and
 * put back as it was afterwards; every job the child submitted is cancelled even if it crashes.
 */
async function idleShadows(mode: string): Promise<unknown> {
  const warm = SHADOW_WARM;
  const restore = await oversubscribe(SHADOWS + warm);
  const jobsFile = join(workDir, `shadow-jobs-${mode}.txt`);
  const run = runPrefix();
  // Whatever happens to the child, its jobs (found by name) and their socket dirs go.
  const cancelJobs = onCleanup(
    `shadow jobs (${mode})`,
    () => cancelRun(run, JOB_USER, '/tmp', SHADOWS + warm),
    cancelRunMs(SHADOWS + warm),
  );
  try {
    await quietGate();
    const child = spawnChild(
      `shadows-${mode}`,
      process.execPath,
      [
        '--expose-gc',
        '--import',
        'tsx',
        join(ROOT, 'bench', 'control-shadows.ts'),
        '--mode',
        mode,
        '--shadows',
        String(SHADOWS),
        '--warm',
        String(warm),
        '--idle-ms',
        String(SHADOW_IDLE_MS),
        ...(SHADOW_PAUSE_MS === undefined ? [] : ['--pause-ms', SHADOW_PAUSE_MS]),
        '--jobs-file',
        jobsFile,
        '--run',
        run,
        '--redis',
        URL_,
      ],
      { cwd: ROOT, logFile: join(workDir, `shadows-${mode}.log`) },
    );
    const stopChild = onCleanup(`shadows child (${mode})`, () => child.stop(45_000));
    const { code } = await child.exited;
    await stopChild();
    const line = child
      .output()
      .split('\n')
      .find((l) => l.startsWith('RESULT '));
    if (!line) throw new Error(`shadows (${mode}) exited ${code} without a result:\n${child.output().slice(-3000)}`);
    return JSON.parse(line.slice('RESULT '.length)) as unknown;
  } finally {
    await cancelJobs();
    await restore();
  }
}

/** Lets the partition share CPUs when `jobs` more jobs would not fit; returns how to put it back. */
async function oversubscribe(jobs: number): Promise<() => Promise<void>> {
  const { stdout } = await execFileAsync('scontrol', ['show', 'partition', 'debug', '-o']);
  const current = /OverSubscribe=(\S+)/.exec(stdout)?.[1] ?? 'NO';
  const cpusTotal = Number(/TotalCPUs=(\d+)/.exec(stdout)?.[1] ?? 64);
  const { stdout: q } = await execFileAsync('squeue', ['-h', '-t', 'R,PD', '-o', '%C']);
  const inUse = q
    .split('\n')
    .filter(Boolean)
    .reduce((a, c) => a + Number(c), 0);
  const needed = inUse + jobs + 32; // room for other test runs' jobs meanwhile
  if (needed <= cpusTotal) return async () => undefined;
  const factor = Math.ceil(needed / cpusTotal);
  say(
    `slurm: partition debug OverSubscribe ${current} → FORCE:${factor} for the shadows run (${needed} jobs on ${cpusTotal} CPUs)`,
  );
  await execFileAsync('scontrol', ['update', 'PartitionName=debug', `OverSubscribe=FORCE:${factor}`]);
  const undo = onCleanup('partition OverSubscribe', async () => {
    await execFileAsync('scontrol', ['update', 'PartitionName=debug', `OverSubscribe=${current}`]);
    say(`slurm: partition debug OverSubscribe back to ${current}`);
  });
  return undo;
}
