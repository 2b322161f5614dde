import { type ChildProcess, execFile, type SpawnOptions, spawn } from 'node:child_process';
import { promisify } from 'node:util';
import { processTable } from './processes.js';

/**
 * Unprivileged local users playing the site's job user, for the integration tests and the demo (both
 * run as root). ensureUser is idempotent and safe to call from several test files; the tests keep
 * their users, the demo removes the one it created (removeUser).
 */

const execFileAsync = promisify(execFile);

export interface TestUser {
  name: string;
  uid: number;
  gid: number;
  home: string;
}

/** Users the test suites use. */
export const JOB_USER = 'bhjob';
export const OTHER_USER = 'bhother';

/** The user's passwd entry, or undefined when there is no such user. */
export async function lookupUser(name: string): Promise<TestUser | undefined> {
  try {
    const { stdout } = await execFileAsync('getent', ['passwd', name]);
    const fields = stdout.trim().split('\n')[0]?.split(':') ?? [];
    if (fields.length < 7 || fields[0] !== name) return undefined;
    return { name, uid: Number(fields[2]), gid: Number(fields[3]), home: fields[5] ?? `/home/${name}` };
  } catch {
    return undefined; // getent exits 2 when the user does not exist
  }
}

const pending = new Map<string, Promise<TestUser>>();

/**
 * Makes sure NAME exists (`useradd -m -s /bin/bash NAME`), with its password set to '*' so that sshd
 * does not treat the account as locked. Requires root.
 */
export function ensureUser(name: string): Promise<TestUser> {
  if (!/^[a-z_][a-z0-9_-]{0,30}$/.test(name)) throw new Error(`bad user name ${name}`);
  let promise = pending.get(name);
  if (!promise) {
    promise = createUser(name);
    pending.set(name, promise);
    promise.catch(() => pending.delete(name));
  }
  return promise;
}

async function createUser(name: string): Promise<TestUser> {
  let lastError: unknown;
  for (let attempt = 0; attempt < 10; attempt++) {
    if (!(await lookupUser(name))) {
      try {
        await execFileAsync('useradd', ['-m', '-s', '/bin/bash', name]);
      } catch (error) {
        // Another process may have created it meanwhile, or holds /etc/passwd.lock: look again.
        lastError = error;
        await new Promise((resolve) => setTimeout(resolve, 200));
        continue;
      }
    }
    try {
      await execFileAsync('usermod', ['-p', '*', name]);
    } catch (error) {
      lastError = error;
      await new Promise((resolve) => setTimeout(resolve, 200));
      continue;
    }
    const user = await lookupUser(name);
    if (user) return user;
  }
  throw new Error(`could not create user ${name}: ${String(lastError)}`);
}

/**
 * `userdel -r NAME` (its home and mail spool go too), once the user's last process has ended (up to
 * WAITMS); a user that is already gone is not an error.
 */
export async function removeUser(name: string, waitMs = 15_000): Promise<void> {
  const user = await lookupUser(name);
  if (!user) return;
  pending.delete(name);
  const deadline = Date.now() + waitMs;
  while (processTable().some((p) => p.uid === user.uid) && Date.now() < deadline) {
    await new Promise((resolve) => setTimeout(resolve, 200));
  }
  try {
    await execFileAsync('userdel', ['-r', name]);
  } catch (error) {
    // userdel -r exits 12 when only the mail spool was missing: the user itself is gone.
    if (await lookupUser(name)) throw new Error(`userdel -r ${name} failed: ${(error as Error).message}`);
  }
}

/** A minimal login-like environment for USER, with EXTRA added. */
export function userEnv(user: TestUser, extra: Record<string, string> = {}): NodeJS.ProcessEnv {
  return {
    PATH: '/usr/local/bin:/usr/bin:/bin',
    HOME: user.home,
    USER: user.name,
    LOGNAME: user.name,
    LANG: 'C.UTF-8',
    ...extra,
  };
}

/**
 * Spawns COMMAND as USER (real and effective uid/gid, with the user's supplementary groups) via
 * setpriv, which execs: the returned child's pid is the command's own pid. Asynchronous on purpose:
 * tests that hold sockets open must keep their event loop running.
 */
export function spawnAs(
  user: TestUser,
  command: string,
  args: readonly string[],
  options: SpawnOptions = {},
): ChildProcess {
  return spawn('setpriv', [`--reuid=${user.uid}`, `--regid=${user.gid}`, '--init-groups', '--', command, ...args], {
    env: userEnv(user),
    ...options,
  });
}

export interface RunResult {
  code: number | null;
  signal: NodeJS.Signals | null;
  stdout: string;
  stderr: string;
}

/** Runs COMMAND as USER to completion and collects its output (asynchronously). */
export function runAs(
  user: TestUser,
  command: string,
  args: readonly string[],
  options: SpawnOptions & { input?: string | Buffer; timeoutMs?: number } = {},
): Promise<RunResult> {
  const { input, timeoutMs = 30_000, ...spawnOptions } = options;
  return new Promise((resolve, reject) => {
    const child = spawnAs(user, command, args, { ...spawnOptions, stdio: ['pipe', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout?.setEncoding('utf8').on('data', (chunk: string) => {
      stdout += chunk;
    });
    child.stderr?.setEncoding('utf8').on('data', (chunk: string) => {
      stderr += chunk;
    });
    const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs);
    child.on('error', (error) => {
      clearTimeout(timer);
      reject(error);
    });
    child.on('close', (code, signal) => {
      clearTimeout(timer);
      resolve({ code, signal, stdout, stderr });
    });
    child.stdin?.end(input);
  });
}
