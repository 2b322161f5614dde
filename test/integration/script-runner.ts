// biome-ignore-all lint/suspicious/noTemplateCurlyInString: these strings are shell code; ${...} is shell parameter expansion.
import type { ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync } from 'node:fs';
import { chmod, mkdtemp, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { type RelayDelivery, renderDeliverRelay } from '../../src/render/relay-delivery.js';
import { relaySource } from '../../src/render/relay-source.js';
import { runAs, spawnAs, type TestUser, userEnv } from '../../tools/sandbox/users.js';

/**
 * Runs generated scripts as an unprivileged user and lets a test look at them while they run: the
 * script prints `checkpoint` and then waits for a line on stdin before it goes on.
 */

/** A pod UID no other test (here or in the relay tests) uses. */
export function uniqueUid(label: string): string {
  return `bhtest-${label}-${process.pid}-${randomBytes(4).toString('hex')}`;
}

/**
 * Prints the state a test checks, then holds until the test writes `go` (or closes stdin); any other
 * line is a command run inside the job, as its workload would (RunningScript.inJob).
 */
/** The line of STATE_SNIPPET that holds the job (a test replaces it with `sleep 600` to hold it otherwise). */
export const HOLD_LINE = 'while IFS= read -r bh_test_go; do [ "$bh_test_go" = go ] && break; eval "$bh_test_go"; done';

export const STATE_SNIPPET = [
  'echo "state pid=$$"',
  'echo "state dir=${BACKHAUL_SOCKET_DIR-<unset>}"',
  'echo "state addr=${BACKHAUL_BIND_ADDRESS-<unset>}"',
  'echo "state hosts=${BACKHAUL_HOSTS_FILE-<unset>}"',
  'echo "state apptainer=${APPTAINER_BIND-<unset>}"',
  'echo "state singularity=${SINGULARITY_BIND-<unset>}"',
  'echo "state umask=$(umask)"',
  'echo checkpoint',
  HOLD_LINE,
  'echo workload-done',
  '',
].join('\n');

export interface Exit {
  code: number | null;
  signal: NodeJS.Signals | null;
}

export class RunningScript {
  stdout = '';
  stderr = '';
  /** What each delivery of the relay into this job printed (`<status> <stdout> <stderr>`). */
  readonly deliveries: string[] = [];
  readonly startedAt = Date.now();
  readonly exited: Promise<Exit>;

  constructor(
    readonly child: ChildProcess,
    private readonly cleanup: () => Promise<void>,
  ) {
    child.stdout?.setEncoding('utf8').on('data', (chunk: string) => {
      this.stdout += chunk;
    });
    child.stderr?.setEncoding('utf8').on('data', (chunk: string) => {
      this.stderr += chunk;
    });
    this.exited = new Promise((resolve, reject) => {
      child.on('error', reject);
      child.on('close', (code, signal) => {
        void this.cleanup().then(() => resolve({ code, signal }));
      });
    });
  }

  get pid(): number {
    if (this.child.pid === undefined) throw new Error('not started');
    return this.child.pid;
  }

  /** Resolves once the stream matches; rejects on timeout or when the script ends first. */
  async waitFor(
    pattern: RegExp,
    stream: 'stdout' | 'stderr' = 'stdout',
    timeoutMs = 20_000,
  ): Promise<RegExpMatchArray> {
    const deadline = Date.now() + timeoutMs;
    let ended = false;
    void this.exited.then(() => {
      ended = true;
    });
    for (;;) {
      const match = this[stream].match(pattern);
      if (match) return match;
      if (ended || Date.now() > deadline) {
        throw new Error(
          `${stream} did not match ${pattern} (${ended ? 'script ended' : 'timeout'})\nstdout:\n${this.stdout}\nstderr:\n${this.stderr}`,
        );
      }
      await sleep(25);
    }
  }

  /** The `state key=value` lines of STATE_SNIPPET. */
  async state(): Promise<Record<string, string>> {
    await this.waitFor(/^checkpoint$/m);
    const state: Record<string, string> = {};
    for (const [, key, value] of this.stdout.matchAll(/^state (\w+)=(.*)$/gm)) {
      if (key !== undefined) state[key] = value ?? '';
    }
    return state;
  }

  release(): void {
    this.child.stdin?.write('go\n');
  }

  private commands = 0;

  /** Runs COMMAND (sh) inside the job, as a child of its shell, and returns what it printed. */
  async inJob(command: string, timeoutMs = 20_000): Promise<string> {
    this.commands += 1;
    const marker = `in-job-done-${this.commands}`;
    const start = this.stdout.length;
    this.child.stdin?.write(`${command}; echo ${marker}\n`);
    await this.waitFor(new RegExp(`^${marker}$`, 'm'), 'stdout', timeoutMs);
    const out = this.stdout.slice(start);
    return out.slice(0, out.indexOf(marker));
  }

  async finish(timeoutMs = 20_000): Promise<Exit> {
    this.release();
    this.child.stdin?.end();
    const timer = setTimeout(() => this.child.kill('SIGKILL'), timeoutMs);
    try {
      return await this.exited;
    } finally {
      clearTimeout(timer);
    }
  }
}

/** Writes TEXT to a file USER can read and runs it with SHELL; stdin stays open for release(). */
export async function startScript(
  user: TestUser,
  shell: string,
  text: string,
  env: Record<string, string>,
): Promise<RunningScript> {
  const dir = await mkdtemp('/tmp/bh-script-');
  await chmod(dir, 0o755);
  const file = join(dir, 'job.sh');
  await writeFile(file, text, { mode: 0o644 });
  const child = spawnAs(user, shell, [file], { env: userEnv(user, env), stdio: ['pipe', 'pipe', 'pipe'] });
  return new RunningScript(child, () => rm(dir, { recursive: true, force: true }));
}

export function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/** Parent pid and state of a live process, from /proc; undefined once it is gone (or a zombie). */
export async function processInfo(pid: number): Promise<{ ppid: number; state: string; cmdline: string } | undefined> {
  try {
    const stat = await readFile(`/proc/${pid}/stat`, 'utf8');
    // The command name is in parentheses and may contain anything: parse from the last ')'.
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    const state = fields[0] ?? '?';
    if (state === 'Z' || state === 'X') return undefined;
    const cmdline = (await readFile(`/proc/${pid}/cmdline`, 'utf8')).split('\0').join(' ').trim();
    return { ppid: Number(fields[1]), state, cmdline };
  } catch {
    return undefined;
  }
}

/** Live processes whose command line contains every one of NEEDLES. */
export async function findProcesses(...needles: string[]): Promise<number[]> {
  const found: number[] = [];
  for (const entry of await readdir('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    const info = await processInfo(Number(entry));
    if (info && needles.every((n) => info.cmdline.includes(n))) found.push(Number(entry));
  }
  return found;
}

/** Polls until CHECK is true; false if it never became true. */
export async function eventually(check: () => boolean | Promise<boolean>, timeoutMs = 5_000): Promise<boolean> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (await check()) return true;
    if (Date.now() > deadline) return false;
    await sleep(50);
  }
}

export function gone(path: string): boolean {
  return !existsSync(path);
}

/**
 * What the session host does once it reaches the job (ShadowSession.deliverRelay): the same script, as
 * USER, from the job's socket dir. Returns what it printed (`<status> <stdout> <stderr>`).
 */
export async function deliverRelay(user: TestUser, delivery: Omit<RelayDelivery, 'relay'>): Promise<string> {
  const input = renderDeliverRelay({ ...delivery, relay: relaySource() });
  const ran = await runAs(user, '/bin/sh', ['-s'], { input });
  return `${ran.code} ${ran.stdout.trim()} ${ran.stderr.trim()}`;
}
