/**
 * What the benchmarks share: sizes from the environment, a cleanup list run on any exit (signals too),
 * child processes that die with the benchmark (PR_SET_PDEATHSIG), timeouts and small statistics.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';
import { stat } from 'node:fs/promises';
import { fileURLToPath } from 'node:url';
import { descendantsOf, isAlive } from '../tools/sandbox/sshd.js';
import { type TestUser, userEnv } from '../tools/sandbox/users.js';

export const MiB = 1024 * 1024;
export const ROOT = fileURLToPath(new URL('..', import.meta.url));
/** The job user's python (pyenv shims under /root are not reachable for bhjob). */
export const PYTHON = '/usr/bin/python3';

let prefix = 'bench';
/** Progress lines on stderr, prefixed with the benchmark's name. */
export const say = (line: string) => process.stderr.write(`${prefix}: ${line}\n`);
export function benchName(name: string): void {
  prefix = name;
}

export function parseBytes(text: string | undefined, fallback: number): number {
  if (text === undefined || text.trim() === '') return fallback;
  const m = /^\s*(\d+(?:\.\d+)?)\s*([KMG]?)i?B?\s*$/i.exec(text);
  if (!m) throw new Error(`bad size ${JSON.stringify(text)} (e.g. 1073741824, 256M, 1G)`);
  const unit = { '': 1, K: 1024, M: MiB, G: 1024 * MiB }[(m[2] ?? '').toUpperCase()] ?? 1;
  return Math.round(Number(m[1]) * unit);
}

// ------------------------------------------------------------------------------------------ cleanup

const cleanups: { what: string; fn: () => Promise<unknown> | unknown }[] = [];
export function onCleanup(what: string, fn: () => Promise<unknown> | unknown): void {
  cleanups.push({ what, fn });
}
let cleaning: Promise<void> | undefined;
export function cleanupAll(): Promise<void> {
  cleaning ??= (async () => {
    while (cleanups.length > 0) {
      const step = cleanups.pop();
      if (!step) break;
      try {
        await withTimeout(Promise.resolve(step.fn()), 20_000, `cleanup: ${step.what}`);
      } catch (err) {
        say(`cleanup of ${step.what} failed: ${(err as Error).message}`);
      }
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

// ------------------------------------------------------------------------------------------ children

export interface Child {
  name: string;
  proc: ChildProcess;
  pid: number;
  stdout(): string;
  stderr(): string;
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  /** Resolves with the first stdout line that matches; rejects if the child exits first. */
  line(match: RegExp, timeoutMs: number): Promise<string>;
  stop(): Promise<void>;
}

const children = new Set<Child>();
onCleanup('child processes', async () => {
  await Promise.all([...children].map((c) => c.stop()));
});

/**
 * Spawns through setpriv with PR_SET_PDEATHSIG: a child dies with this process even after a SIGKILL.
 * With USER it runs as that user (real and effective ids, the user's groups, a login-like env).
 */
export function start(name: string, command: string, args: readonly string[], user?: TestUser): Child {
  const ids = user ? [`--reuid=${user.uid}`, `--regid=${user.gid}`, '--init-groups'] : [];
  const proc = spawn('setpriv', ['--pdeathsig', 'KILL', ...ids, '--', command, ...args], {
    cwd: user ? user.home : ROOT,
    env: user ? userEnv(user) : process.env,
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  let err = '';
  const waiters: (() => void)[] = [];
  proc.stdout?.setEncoding('utf8').on('data', (s: string) => {
    out += s;
    for (const w of waiters.splice(0)) w();
  });
  proc.stderr?.setEncoding('utf8').on('data', (s: string) => {
    err = (err + s).slice(-20_000);
  });
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) => {
    proc.once('error', (e) => {
      err += `spawn error: ${e.message}`;
      resolve({ code: null, signal: null });
    });
    proc.once('close', (code, signal) => resolve({ code, signal }));
  });
  let done = false;
  const child: Child = {
    name,
    proc,
    pid: proc.pid ?? -1,
    stdout: () => out,
    stderr: () => err,
    exited,
    line: (match, timeoutMs) =>
      withTimeout(
        new Promise<string>((resolve, reject) => {
          const look = () => {
            const found = out.split('\n').find((l) => match.test(l));
            if (found !== undefined) return resolve(found);
            if (done) return reject(new Error(`${name} exited: ${err.trim().split('\n').slice(-5).join(' | ')}`));
            waiters.push(look);
          };
          void exited.then(() => {
            done = true;
            look();
          });
          look();
        }),
        timeoutMs,
        `${name}: waiting for ${match}`,
      ),
    stop: async () => {
      if (!done && proc.exitCode === null && proc.signalCode === null) {
        proc.kill('SIGTERM');
        const killer = setTimeout(() => proc.kill('SIGKILL'), 3_000);
        await exited;
        clearTimeout(killer);
      }
      children.delete(child);
    },
  };
  void exited.then(() => {
    done = true;
    children.delete(child);
    for (const w of waiters.splice(0)) w();
  });
  children.add(child);
  return child;
}

// ------------------------------------------------------------------------------------------ CPU accounting

export async function waitForSocket(path: string, timeoutMs: number, alive: () => boolean): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const st = await stat(path).catch(() => undefined);
    if (st?.isSocket()) return;
    if (!alive()) throw new Error(`the process that should bind ${path} exited`);
    if (Date.now() > deadline) throw new Error(`${path} did not appear within ${timeoutMs} ms`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

export const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? (s[m] as number) : ((s[m - 1] as number) + (s[m] as number)) / 2;
};
export const best = (xs: number[]) => Math.max(...xs);
export const pad = (s: string, n: number) => (s.length >= n ? s : s + ' '.repeat(n - s.length));
export const lpad = (s: string, n: number) => (s.length >= n ? s : ' '.repeat(n - s.length) + s);

export function commandExists(name: string): Promise<boolean> {
  return new Promise((resolve) => {
    const p = spawn('sh', ['-c', `command -v ${name}`], { stdio: 'ignore' });
    p.once('close', (code) => resolve(code === 0));
    p.once('error', () => resolve(false));
  });
}

// ------------------------------------------------------------------------------------------ CPU accounting

const CLK_TCK = 100;

/** utime+stime+cutime+cstime of a process in seconds (reaped children included), 0 if gone. */
export function cpuSeconds(pid: number): number {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    // fields after ")" start at field 3 (state): utime is field 14 -> index 11.
    return (Number(f[11]) + Number(f[12]) + Number(f[13]) + Number(f[14])) / CLK_TCK;
  } catch {
    return 0;
  }
}

/** stime+cstime of a process in seconds: the part of cpuSeconds spent in the kernel, 0 if gone. */
export function kernelSeconds(pid: number): number {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return (Number(f[12]) + Number(f[14])) / CLK_TCK;
  } catch {
    return 0;
  }
}

/** read + write system calls of a process (reaped children included, like cutime), 0 if gone. */
export function syscalls(pid: number | 'self'): number {
  try {
    const io = readFileSync(`/proc/${pid}/io`, 'utf8');
    const r = /syscr: (\d+)/.exec(io);
    const w = /syscw: (\d+)/.exec(io);
    return Number(r?.[1] ?? 0) + Number(w?.[1] ?? 0);
  } catch {
    return 0;
  }
}

/** Busy and total jiffies of the whole machine (every engineer's processes, not only ours). */
export function machineJiffies(): { busy: number; total: number } {
  const line = readFileSync('/proc/stat', 'utf8').split('\n')[0] ?? '';
  const v = line.trim().split(/\s+/).slice(1).map(Number);
  const total = v.reduce((a, b) => a + b, 0);
  const idle = (v[3] ?? 0) + (v[4] ?? 0);
  return { busy: total - idle, total };
}

export type CpuGroups = Record<string, () => number[]>;
export interface CpuSnapshot {
  groups: Record<string, Map<number, { cpu: number; kernel: number; sys: number }>>;
  self: NodeJS.CpuUsage;
  selfSys: number;
  machine: { busy: number; total: number };
}

export function snapshot(groups: CpuGroups): CpuSnapshot {
  const out: CpuSnapshot['groups'] = {};
  for (const [name, pids] of Object.entries(groups)) {
    out[name] = new Map(pids().map((p) => [p, { cpu: cpuSeconds(p), kernel: kernelSeconds(p), sys: syscalls(p) }]));
  }
  return { groups: out, self: process.cpuUsage(), selfSys: syscalls('self'), machine: machineJiffies() };
}

/** CPU seconds used per group between two snapshots (processes that ended in between are lost). */
export function cpuDelta(
  before: CpuSnapshot,
  groups: CpuGroups,
): {
  cpu: Record<string, number>;
  /** The part of cpu spent in the kernel (system time). */
  kernel: Record<string, number>;
  sys: Record<string, number>;
  machineBusy: number;
  machineBusySeconds: number;
} {
  const after = snapshot(groups);
  const cpu: Record<string, number> = {};
  const kernel: Record<string, number> = {};
  const sys: Record<string, number> = {};
  for (const [name, now] of Object.entries(after.groups)) {
    const then = before.groups[name] ?? new Map<number, { cpu: number; kernel: number; sys: number }>();
    let sumCpu = 0;
    let sumKernel = 0;
    let sumSys = 0;
    for (const [pid, v] of now) {
      sumCpu += v.cpu - (then.get(pid)?.cpu ?? 0);
      sumKernel += v.kernel - (then.get(pid)?.kernel ?? 0);
      sumSys += v.sys - (then.get(pid)?.sys ?? 0);
    }
    cpu[name] = Math.max(0, sumCpu);
    kernel[name] = Math.max(0, sumKernel);
    sys[name] = Math.max(0, sumSys);
  }
  const self = process.cpuUsage(before.self);
  cpu['bench process (ssh2)'] = (self.user + self.system) / 1e6;
  kernel['bench process (ssh2)'] = self.system / 1e6;
  sys['bench process (ssh2)'] = after.selfSys - before.selfSys;
  const dBusy = after.machine.busy - before.machine.busy;
  const dTotal = after.machine.total - before.machine.total;
  return { cpu, kernel, sys, machineBusy: dTotal > 0 ? dBusy / dTotal : 0, machineBusySeconds: dBusy / CLK_TCK };
}

export const treeOf = (pid: number) => (isAlive(pid) ? [pid, ...descendantsOf(pid)] : []);

export function safeReaddir(dir: string): string[] {
  try {
    return readdirSync(dir);
  } catch {
    return [];
  }
}
