import { type ChildProcess, spawn } from 'node:child_process';
import { closeSync, openSync, readFileSync } from 'node:fs';
import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { stringify } from 'yaml';

/** The built command (`npm run build` first; `npm test` and `npm run demo` do). */
export const BIN = new URL('../../bin/backhaul.js', import.meta.url).pathname;
const running = new Set<ChildProcess>();
process.on('exit', () => {
  for (const child of running) child.kill('SIGKILL');
});

export interface WorkerProcess {
  child: ChildProcess;
  hostId: string;
  /** Everything it logged (JSON lines). */
  log(): string;
  kill(signal: NodeJS.Signals): void;
  exited: Promise<number | null>;
}

/** Writes a site configuration file for worker processes. */
export async function writeConfig(dir: string, name: string, config: unknown): Promise<string> {
  const path = join(dir, name);
  await writeFile(path, stringify(config));
  return path;
}

/** More for one worker process: its environment (REDIS_PASSWORD…) and command-line flags. */
export interface WorkerExtras {
  env?: Record<string, string>;
  args?: string[];
}

/**
 * `backhaul worker` as its own process. Its log (JSON lines on stderr) is kept in memory, or appended
 * to LOGFILE when one is given (the demo keeps the terminal for people).
 */
export function startWorker(
  configPath: string,
  redisUrl: string,
  roles: string,
  hostId: string,
  logFile?: string,
  extras: WorkerExtras = {},
): WorkerProcess {
  const fd = logFile === undefined ? undefined : openSync(logFile, 'a');
  let child: ChildProcess;
  try {
    child = spawn(
      process.execPath,
      [
        '--single-threaded-gc',
        BIN,
        'worker',
        '--roles',
        roles,
        '--config',
        configPath,
        '--redis',
        redisUrl,
        '--host-id',
        hostId,
        ...(extras.args ?? []),
      ],
      {
        stdio: ['ignore', fd ?? 'pipe', fd ?? 'pipe'],
        env: { ...process.env, BACKHAUL_LOG_LEVEL: 'info', ...extras.env },
      },
    );
  } finally {
    if (fd !== undefined) closeSync(fd);
  }
  running.add(child);
  let output = '';
  child.stdout?.on('data', (d: Buffer) => {
    output += d.toString();
  });
  child.stderr?.on('data', (d: Buffer) => {
    output += d.toString();
  });
  const exited = new Promise<number | null>((resolve) =>
    child.once('exit', (code) => {
      running.delete(child);
      resolve(code);
    }),
  );
  const log = logFile === undefined ? () => output : () => readFileSync(logFile, 'utf8');
  return { child, hostId, log, kill: (signal) => child.kill(signal), exited };
}

/** Waits until the worker has logged that it started (its queues and workers are up). */
export async function workerStarted(worker: WorkerProcess, timeoutMs = 30_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!worker.log().includes('fleet started')) {
    if (worker.child.exitCode !== null) throw new Error(`worker ${worker.hostId} exited: ${worker.log()}`);
    if (Date.now() > deadline) throw new Error(`worker ${worker.hostId} did not start: ${worker.log()}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

/** SIGTERM (the worker hands its shadows back and stops), SIGKILL after GRACEMS. */
export async function stopWorker(worker: WorkerProcess, graceMs = 15_000): Promise<void> {
  if (worker.child.exitCode !== null || worker.child.signalCode !== null) return;
  worker.kill('SIGTERM');
  const timer = setTimeout(() => worker.kill('SIGKILL'), graceMs);
  await worker.exited;
  clearTimeout(timer);
}

/** kill -9 of every worker in WORKERS (woken first, should one be stopped), emptying the list, once each has exited. */
export async function killWorkers(workers: WorkerProcess[]): Promise<void> {
  for (const worker of workers.splice(0)) {
    worker.kill('SIGCONT');
    worker.kill('SIGKILL');
    await worker.exited;
  }
}
