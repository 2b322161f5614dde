/**
 * Shared pieces of the control-plane benchmark (bench/control.ts): cleanup on exit and on signals,
 * child processes that die with the benchmark, CPU accounting from /proc, Redis INFO diffs, statistics.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { createWriteStream, readFileSync } from 'node:fs';
import type { Redis } from 'ioredis';

export const say = (line: string): void => {
  process.stderr.write(`bench: ${line}\n`);
};

// ------------------------------------------------------------------------------------------ cleanup

const cleanups: { what: string; fn: () => Promise<unknown> | unknown; timeoutMs: number }[] = [];

/** Registers a cleanup step; steps run last-registered first. Returns a function that runs it now. */
export function onCleanup(what: string, fn: () => Promise<unknown> | unknown, timeoutMs = 60_000): () => Promise<void> {
  const step = { what, fn, timeoutMs };
  cleanups.push(step);
  return async () => {
    const at = cleanups.indexOf(step);
    if (at < 0) return;
    cleanups.splice(at, 1);
    await runStep(step);
  };
}

async function runStep(step: { what: string; fn: () => Promise<unknown> | unknown; timeoutMs: number }): Promise<void> {
  try {
    await withTimeout(Promise.resolve(step.fn()), step.timeoutMs, `cleanup: ${step.what}`);
  } catch (err) {
    say(`cleanup of ${step.what} failed: ${(err as Error).message}`);
  }
}

let cleaning: Promise<void> | undefined;
export function cleanupAll(): Promise<void> {
  cleaning ??= (async () => {
    while (cleanups.length > 0) {
      const step = cleanups.pop();
      if (step) await runStep(step);
    }
  })();
  return cleaning;
}

for (const signal of ['SIGINT', 'SIGTERM', 'SIGHUP'] as const) {
  process.once(signal, () => {
    say(`${signal}: cleaning up`);
    void cleanupAll().finally(() => process.exit(130));
  });
}

export function withTimeout<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: timed out after ${ms} ms`)), ms);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

export const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));

// ------------------------------------------------------------------------------------------ children

export interface Child {
  name: string;
  proc: ChildProcess;
  pid: number;
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  /** Output so far (stdout and stderr interleaved; the last 1 MiB). */
  output(): string;
  /** Resolves when the output matches; rejects when the child exits first or on timeout. */
  waitFor(match: RegExp, timeoutMs: number): Promise<void>;
  /** SIGTERM, then SIGKILL after `graceMs`; resolves once it has exited. */
  stop(graceMs?: number): Promise<void>;
}

/**
 * Spawns through `setpriv --pdeathsig TERM`: the child gets SIGTERM if the benchmark dies, even by SIGKILL.
 * Its output also goes to `logFile` when given.
 */
export function spawnChild(
  name: string,
  command: string,
  args: readonly string[],
  opts: { env?: NodeJS.ProcessEnv; cwd?: string; logFile?: string } = {},
): Child {
  const proc = spawn('setpriv', ['--pdeathsig', 'TERM', '--', command, ...args], {
    env: opts.env ?? process.env,
    cwd: opts.cwd,
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  if (proc.pid === undefined) throw new Error(`could not start ${name}`);
  const pid = proc.pid;
  const log = opts.logFile ? createWriteStream(opts.logFile, { flags: 'a' }) : undefined;
  let text = '';
  const listeners = new Set<() => void>();
  const onData = (chunk: Buffer) => {
    log?.write(chunk);
    text = (text + chunk.toString('utf8')).slice(-(1 << 20));
    for (const listener of listeners) listener();
  };
  proc.stdout?.on('data', onData);
  proc.stderr?.on('data', onData);
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) => {
    proc.once('exit', (code, signal) => {
      log?.end();
      resolve({ code, signal });
      for (const listener of listeners) listener();
    });
  });
  let isDone = false;
  void exited.then(() => {
    isDone = true;
  });
  const child: Child = {
    name,
    proc,
    pid,
    exited,
    output: () => text,
    waitFor: (match, timeoutMs) =>
      new Promise<void>((resolve, reject) => {
        const check = () => {
          if (match.test(text)) {
            finish();
            resolve();
          } else if (isDone || proc.exitCode !== null || proc.signalCode !== null) {
            finish();
            reject(new Error(`${name} exited before printing ${match}:\n${text.slice(-2000)}`));
          }
        };
        const timer = setTimeout(() => {
          finish();
          reject(new Error(`${name}: no ${match} within ${timeoutMs} ms:\n${text.slice(-2000)}`));
        }, timeoutMs);
        const finish = () => {
          clearTimeout(timer);
          listeners.delete(check);
        };
        listeners.add(check);
        check();
      }),
    stop: async (graceMs = 15_000) => {
      if (proc.exitCode !== null || proc.signalCode !== null) return;
      proc.kill('SIGTERM');
      const killer = setTimeout(() => proc.kill('SIGKILL'), graceMs);
      await exited;
      clearTimeout(killer);
    },
  };
  return child;
}

// ------------------------------------------------------------------------------------------ CPU

const CLK_TCK = 100;

/** User + system CPU seconds a process has used so far (0 when it is gone). */
export function procCpuSeconds(pid: number): number {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    // Fields after the command (which may contain spaces) start after the last ')'.
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return (Number(fields[11]) + Number(fields[12])) / CLK_TCK;
  } catch {
    return 0;
  }
}

/** CPU seconds of this process so far. */
export function selfCpuSeconds(): number {
  const u = process.cpuUsage();
  return (u.user + u.system) / 1e6;
}

/** Whole-machine busy and total CPU seconds (from /proc/stat), to see what others used meanwhile. */
export function machineCpu(): { busy: number; total: number } {
  const line = readFileSync('/proc/stat', 'utf8').split('\n')[0] ?? '';
  const v = line.trim().split(/\s+/).slice(1).map(Number);
  const idle = (v[3] ?? 0) + (v[4] ?? 0);
  const total = v.reduce((a, b) => a + b, 0);
  return { busy: (total - idle) / CLK_TCK, total: total / CLK_TCK };
}

// ------------------------------------------------------------------------------------------ Redis INFO

export async function redisInfo(redis: Redis, section: string): Promise<Map<string, string>> {
  const text = await redis.info(section);
  const map = new Map<string, string>();
  for (const line of text.split('\r\n')) {
    const at = line.indexOf(':');
    if (at > 0 && !line.startsWith('#')) map.set(line.slice(0, at), line.slice(at + 1));
  }
  return map;
}

/** Calls per command (server-wide: other clients of this Redis are counted too). */
export async function commandCalls(redis: Redis): Promise<Map<string, number>> {
  const info = await redisInfo(redis, 'commandstats');
  const calls = new Map<string, number>();
  for (const [key, value] of info) {
    const m = /calls=(\d+)/.exec(value);
    if (key.startsWith('cmdstat_') && m) calls.set(key.slice('cmdstat_'.length), Number(m[1]));
  }
  return calls;
}

export function diffCalls(before: Map<string, number>, after: Map<string, number>): Map<string, number> {
  const diff = new Map<string, number>();
  for (const [cmd, n] of after) {
    const d = n - (before.get(cmd) ?? 0);
    if (d > 0) diff.set(cmd, d);
  }
  return diff;
}

/** Redis server CPU seconds (user + sys) so far. */
export async function redisCpuSeconds(redis: Redis): Promise<number> {
  const info = await redisInfo(redis, 'cpu');
  return Number(info.get('used_cpu_user') ?? 0) + Number(info.get('used_cpu_sys') ?? 0);
}

// ------------------------------------------------------------------------------------------ statistics

export function median(values: readonly number[]): number {
  if (values.length === 0) return Number.NaN;
  const sorted = [...values].sort((a, b) => a - b);
  const mid = Math.floor(sorted.length / 2);
  return sorted.length % 2 === 1 ? (sorted[mid] ?? Number.NaN) : ((sorted[mid - 1] ?? 0) + (sorted[mid] ?? 0)) / 2;
}

export const fmt = (n: number, digits = 0): string =>
  Number.isFinite(n)
    ? n.toLocaleString('en-US', { maximumFractionDigits: digits, minimumFractionDigits: digits })
    : '-';

/** A plain text table: the first row is the header. */
export function table(rows: readonly (readonly string[])[], alignRight: readonly boolean[] = []): string {
  const widths: number[] = [];
  for (const row of rows) {
    row.forEach((cell, i) => {
      widths[i] = Math.max(widths[i] ?? 0, cell.length);
    });
  }
  const line = (row: readonly string[]) =>
    row
      .map((cell, i) => (alignRight[i] ? cell.padStart(widths[i] ?? 0) : cell.padEnd(widths[i] ?? 0)))
      .join('  ')
      .trimEnd();
  const [head, ...rest] = rows;
  if (!head) return '';
  return [line(head), widths.map((w) => '-'.repeat(w)).join('  '), ...rest.map(line)].join('\n');
}
