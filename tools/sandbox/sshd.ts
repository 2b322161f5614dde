import { type ChildProcess, execFile, spawn } from 'node:child_process';
import { once } from 'node:events';
import * as fs from 'node:fs';
import * as fsp from 'node:fs/promises';
import * as net from 'node:net';
import * as os from 'node:os';
import * as path from 'node:path';
import { promisify } from 'node:util';
import { descendantsOf, isAlive } from './processes.js';

export { descendantsOf, isAlive } from './processes.js';

/**
 * Real OpenSSH sshd instances on loopback ports for the loopback site of the tests and the demo
 * (ARCHITECTURE.md, "How it is tested"): they play the site's login node and the compute node's own sshd. Each instance is a root `sshd -D -e -f CFG`
 * with its own directory (host key, config, pid file, log, authorized keys), removed by stop().
 */

const execFileAsync = promisify(execFile);

export const SSHD_PATH = '/usr/sbin/sshd';

/**
 * Instance directories live under /run, not /tmp: sshd (StrictModes yes, the default and what a real
 * site runs) walks every directory above an AuthorizedKeysFile and refuses group/world-writable ones
 * ("bad ownership or modes for directory /tmp"). Under /run/backhaul-test every component is root
 * 0755, and the files are root 0644, so StrictModes stays on. Override with BH_TEST_RUNDIR.
 */
export const RUN_ROOT = process.env.BH_TEST_RUNDIR ?? '/run/backhaul-test';

export type TcpForwarding = 'yes' | 'no' | 'remote' | 'local';

export interface AuthorizedKeys {
  user: string;
  keys: string[];
}

export interface SshdOptions {
  /** Short label used in the directory name and in errors (letters, digits, - and _). */
  name: string;
  listen?: string;
  /** Fixed port; when absent a free one is picked (and another tried if it is taken meanwhile). */
  port?: number;
  allowStreamLocal: boolean;
  allowTcpForwarding: TcpForwarding;
  authorizedKeys: AuthorizedKeys[];
  /**
   * More sshd_config lines. They are written BEFORE the defaults, because sshd keeps the first value
   * it reads for a keyword, so they override; a `Match` line and everything after it goes at the end.
   */
  extra?: string[];
  /** How long to wait for "Server listening" (ms). */
  startTimeoutMs?: number;
  /**
   * A network namespace (`ip netns` name) to run the sshd in (bench:wan's site side). Its ports cannot
   * be probed from here: give `port`.
   */
  netns?: string;
  /** sshd's LogLevel (VERBOSE unless told; DEBUG1 logs every global request and channel open, DEBUG2 the window a peer confirms). */
  logLevel?: 'VERBOSE' | 'DEBUG1' | 'DEBUG2';
}

export interface SshdInstance {
  name: string;
  host: string;
  port: number;
  pid: number;
  /** Public host key, `ssh-ed25519 AAAA...` (no comment). */
  hostKeyPub: string;
  /** A known_hosts line for this sshd under HOSTALIAS (default: its listen address). */
  knownHostsLine(hostAlias?: string): string;
  dir: string;
  configPath: string;
  logPath: string;
  /** The log so far. */
  readLog(): string;
  /** The listener and every process it has forked that is still alive (connection sshds, shells). */
  processes(): number[];
  /** TERM, KILL after 2 s, wait, remove the directory. Idempotent. */
  stop(): Promise<void>;
}

export interface ClientKey {
  dir: string;
  privateKeyPath: string;
  /** `ssh-ed25519 AAAA... comment` */
  publicKey: string;
  remove(): Promise<void>;
}

export interface KnownHostsEntry {
  /** `127.0.0.1`, `bhnode1`, ...; with a port other than 22 written as `[host]:port`. */
  host: string;
  port?: number;
  /** `ssh-ed25519 AAAA...` */
  key: string;
}

const live = new Map<number, { child: ChildProcess; dir: string; collect: () => number[] }>();
/** Temp dirs of client keys and known_hosts files made here and not removed yet. */
const tempDirs = new Set<string>();

/**
 * Last resort when a test run (or the demo) dies without calling stop(): kill every sshd this process started (and
 * what they forked) and remove their directories. The sshds are also started with PR_SET_PDEATHSIG
 * (setpriv --pdeathsig KILL), so the listener dies with this process even after a SIGKILL.
 */
process.on('exit', () => {
  for (const [pid, entry] of live) {
    for (const p of [pid, ...entry.collect()]) {
      try {
        process.kill(p, 'SIGKILL');
      } catch {
        // already gone
      }
    }
    try {
      fs.rmSync(entry.dir, { recursive: true, force: true });
    } catch {
      // nothing more to do on exit
    }
  }
  for (const dir of tempDirs) {
    try {
      fs.rmSync(dir, { recursive: true, force: true });
    } catch {
      // nothing more to do on exit
    }
  }
});

/**
 * A port that was free a moment ago on HOST. Under `npm test` (BH_TEST_PORTS=LOW-HIGH, one range per
 * lane: vitest.config.ts) it is drawn from the lane's own range, below the kernel's ephemeral ports:
 * bind :0 and every outgoing connection take theirs from the ephemeral range, so a server that starts
 * (or restarts, on the same port) a moment after the port was found free could otherwise find it taken
 * by the other lane, and a client would reach the other lane's server. Without the variable: bind :0.
 */
export async function freePort(host = '127.0.0.1'): Promise<number> {
  const range = /^(\d+)-(\d+)$/.exec(process.env.BH_TEST_PORTS ?? '');
  if (!range) return bindable(host, 0);
  const [low, high] = [Number(range[1]), Number(range[2])];
  for (let attempt = 0; attempt < 100; attempt++) {
    const port = low + Math.floor(Math.random() * (high - low + 1));
    const got = await bindable(host, port).catch(() => undefined);
    if (got !== undefined) return got;
  }
  throw new Error(`no free port in BH_TEST_PORTS=${range[0]} on ${host} after 100 tries`);
}

/** Binds HOST:PORT (0: any), closes, and says which port it was. */
async function bindable(host: string, port: number): Promise<number> {
  const server = net.createServer();
  const failed = new Promise<never>((_, reject) => server.once('error', reject));
  server.listen(port, host);
  await Promise.race([once(server, 'listening'), failed]);
  const address = server.address();
  server.close();
  await once(server, 'close');
  if (address === null || typeof address === 'string') throw new Error(`no port from bind :${port}`);
  return address.port;
}

async function ensureRunRoot(): Promise<void> {
  await fsp.mkdir(RUN_ROOT, { recursive: true, mode: 0o755 });
  await fsp.chmod(RUN_ROOT, 0o755);
  // sshd's privilege separation directory (normally made by systemd's RuntimeDirectory).
  await fsp.mkdir('/run/sshd', { recursive: true, mode: 0o755 });
  await sweepStale();
}

/**
 * Removes instance directories left by a test process that was killed (SIGKILL skips every exit
 * hook; its sshds died with it through PDEATHSIG): those whose sshd.pid names no live sshd and that
 * are older than a minute (younger ones may belong to an sshd that is starting in another process).
 */
async function sweepStale(): Promise<void> {
  let names: string[];
  try {
    names = await fsp.readdir(RUN_ROOT);
  } catch {
    return;
  }
  for (const name of names) {
    if (!name.startsWith('sshd-')) continue;
    const dir = path.join(RUN_ROOT, name);
    try {
      const st = await fsp.stat(dir);
      if (Date.now() - st.mtimeMs < 60_000) continue;
      const pid = Number((await fsp.readFile(path.join(dir, 'sshd.pid'), 'utf8').catch(() => '')).trim());
      if (pid > 0 && isAlive(pid) && fs.readFileSync(`/proc/${pid}/comm`, 'utf8').trim() === 'sshd') continue;
      await fsp.rm(dir, { recursive: true, force: true });
    } catch {
      // raced with its owner: leave it
    }
  }
}

function stripComment(pub: string): string {
  return pub.trim().split(/\s+/).slice(0, 2).join(' ');
}

function hostPattern(host: string, port: number): string {
  return port === 22 ? host : `[${host}]:${port}`;
}

function renderConfig(o: SshdOptions, dir: string, listen: string, port: number): string {
  const extra = o.extra ?? [];
  const matchAt = extra.findIndex((line) => /^\s*Match\s/i.test(line));
  const head = matchAt < 0 ? extra : extra.slice(0, matchAt);
  const tail = matchAt < 0 ? [] : extra.slice(matchAt);
  const users = o.authorizedKeys.map((a) => a.user);
  return [
    `# backhaul test sshd "${o.name}"`,
    ...head,
    `ListenAddress ${listen}:${port}`,
    `HostKey ${dir}/ssh_host_ed25519_key`,
    `PidFile ${dir}/sshd.pid`,
    // One file per user in this instance's own directory (see RUN_ROOT for why StrictModes stays on).
    `AuthorizedKeysFile ${dir}/authorized_keys/%u`,
    'AuthorizedKeysCommand none',
    'StrictModes yes',
    ...(users.length > 0 ? [`AllowUsers ${users.join(' ')}`] : []),
    'PermitRootLogin no',
    'UsePAM no',
    'PasswordAuthentication no',
    'KbdInteractiveAuthentication no',
    'PubkeyAuthentication yes',
    'HostbasedAuthentication no',
    'PermitEmptyPasswords no',
    `AllowStreamLocalForwarding ${o.allowStreamLocal ? 'yes' : 'no'}`,
    `AllowTcpForwarding ${o.allowTcpForwarding}`,
    'AllowAgentForwarding no',
    'X11Forwarding no',
    'PermitTunnel no',
    'GatewayPorts no',
    'MaxSessions 64',
    'MaxStartups 100:30:200',
    'LoginGraceTime 30',
    'ClientAliveInterval 2',
    'ClientAliveCountMax 2',
    `LogLevel ${o.logLevel ?? 'VERBOSE'}`,
    'PrintMotd no',
    'PrintLastLog no',
    'UseDNS no',
    'Banner none',
    'AcceptEnv none',
    ...tail,
    '',
  ].join('\n');
}

async function writeAuthorizedKeys(dir: string, entries: AuthorizedKeys[]): Promise<void> {
  const keysDir = path.join(dir, 'authorized_keys');
  await fsp.mkdir(keysDir, { mode: 0o755 });
  for (const { user, keys } of entries) {
    if (!/^[a-z_][a-z0-9_.-]{0,31}$/.test(user)) throw new Error(`bad user name ${user}`);
    // Root-owned, not writable by anyone else, readable by the user (sshd opens it with the user's uid).
    await fsp.writeFile(path.join(keysDir, user), keys.map((k) => `${k.trim()}\n`).join(''), { mode: 0o644 });
  }
}

/** Starts one sshd. Rejects with the log's tail when it does not come up. */
export async function startSshd(options: SshdOptions): Promise<SshdInstance> {
  if (!/^[A-Za-z0-9_-]{1,32}$/.test(options.name)) throw new Error(`bad sshd name ${options.name}`);
  if (process.getuid?.() !== 0) throw new Error('startSshd needs root (it plays a system sshd)');
  await ensureRunRoot();
  const listen = options.listen ?? '127.0.0.1';
  if (options.netns !== undefined && options.port === undefined) {
    throw new Error(`sshd ${options.name}: a port is needed in network namespace ${options.netns}`);
  }
  const dir = await fsp.mkdtemp(path.join(RUN_ROOT, `sshd-${options.name}-`));
  try {
    await fsp.chmod(dir, 0o755); // the job user must traverse it to read its authorized_keys
    const hostKey = path.join(dir, 'ssh_host_ed25519_key');
    await execFileAsync('ssh-keygen', ['-q', '-t', 'ed25519', '-N', '', '-C', `bh-${options.name}`, '-f', hostKey]);
    const hostKeyPub = stripComment(await fsp.readFile(`${hostKey}.pub`, 'utf8'));
    await writeAuthorizedKeys(dir, options.authorizedKeys);
    const configPath = path.join(dir, 'sshd_config');
    const logPath = path.join(dir, 'sshd.log');

    const attempts = options.port === undefined ? 5 : 1;
    let lastError: Error | undefined;
    for (let attempt = 0; attempt < attempts; attempt++) {
      const port = options.port ?? (await freePort(listen));
      await fsp.writeFile(configPath, renderConfig(options, dir, listen, port), { mode: 0o644 });
      await fsp.writeFile(logPath, '', { mode: 0o644 });
      try {
        const child = await launch(configPath, logPath, port, options.startTimeoutMs ?? 10_000, options.netns);
        return makeInstance(options.name, listen, port, hostKeyPub, dir, configPath, logPath, child);
      } catch (error) {
        lastError = error as Error;
        if (!/Address already in use/.test(lastError.message)) break;
      }
    }
    throw lastError ?? new Error(`sshd ${options.name} did not start`);
  } catch (error) {
    await fsp.rm(dir, { recursive: true, force: true });
    throw error;
  }
}

async function launch(
  configPath: string,
  logPath: string,
  port: number,
  timeoutMs: number,
  netns?: string,
): Promise<ChildProcess> {
  const log = fs.openSync(logPath, 'a');
  let child: ChildProcess;
  try {
    // `ip netns exec` enters the namespace and execs setpriv, which execs sshd: one pid all along.
    const argv = ['setpriv', '--pdeathsig', 'KILL', '--', SSHD_PATH, '-D', '-e', '-f', configPath];
    const [command = 'setpriv', ...args] = netns === undefined ? argv : ['ip', 'netns', 'exec', netns, ...argv];
    child = spawn(command, args, { stdio: ['ignore', log, log] });
  } finally {
    fs.closeSync(log);
  }
  let exited: { code: number | null; signal: NodeJS.Signals | null } | undefined;
  child.on('exit', (code, signal) => {
    exited = { code, signal };
  });
  const spawnError = new Promise<Error>((resolve) => child.on('error', resolve));
  let error: Error | undefined;
  void spawnError.then((e) => {
    error = e;
  });
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const text = fs.readFileSync(logPath, 'utf8');
    if (text.includes(`Server listening on`) && text.includes(`port ${port}.`)) break;
    if (error) throw new Error(`could not run sshd: ${error.message}`);
    if (exited) {
      throw new Error(
        `sshd (${configPath}) exited (${exited.code ?? exited.signal}) before listening on port ${port}:\n${tail(text)}`,
      );
    }
    if (Date.now() > deadline) {
      child.kill('SIGKILL');
      throw new Error(`sshd (${configPath}) not listening on port ${port} after ${timeoutMs} ms:\n${tail(text)}`);
    }
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
  return child;
}

function tail(text: string, lines = 20): string {
  return text.trimEnd().split('\n').slice(-lines).join('\n');
}

function makeInstance(
  name: string,
  host: string,
  port: number,
  hostKeyPub: string,
  dir: string,
  configPath: string,
  logPath: string,
  child: ChildProcess,
): SshdInstance {
  const pid = child.pid as number;
  // Processes seen so far: sshd's connection children call setsid() and are reparented to init when
  // the listener dies, so remember them while the tree is still intact.
  const known = new Set<number>();
  const collect = (): number[] => {
    for (const p of descendantsOf(pid)) known.add(p);
    return [...known].filter(isAlive);
  };
  let exited = child.exitCode !== null || child.signalCode !== null;
  const exitPromise = exited ? Promise.resolve() : once(child, 'exit').then(() => undefined);
  void exitPromise.then(() => {
    exited = true;
  });
  live.set(pid, { child, dir, collect });
  let stopping: Promise<void> | undefined;

  const stop = (): Promise<void> => {
    stopping ??= (async () => {
      const others = collect();
      for (const p of [pid, ...others]) {
        try {
          process.kill(p, 'SIGTERM');
        } catch {
          // gone
        }
      }
      const deadline = Date.now() + 2000;
      while (Date.now() < deadline && (!exited || others.some(isAlive))) {
        await new Promise((resolve) => setTimeout(resolve, 25));
      }
      for (const p of [pid, ...others.filter(isAlive)]) {
        if (p === pid && exited) continue;
        try {
          process.kill(p, 'SIGKILL');
        } catch {
          // gone
        }
      }
      await exitPromise;
      const killDeadline = Date.now() + 2000;
      while (Date.now() < killDeadline && others.some(isAlive)) {
        await new Promise((resolve) => setTimeout(resolve, 25));
      }
      live.delete(pid);
      await fsp.rm(dir, { recursive: true, force: true });
    })();
    return stopping;
  };

  return {
    name,
    host,
    port,
    pid,
    hostKeyPub,
    knownHostsLine: (hostAlias = host) => `${hostPattern(hostAlias, port)} ${hostKeyPub}`,
    dir,
    configPath,
    logPath,
    readLog: () => {
      try {
        return fs.readFileSync(logPath, 'utf8');
      } catch {
        return '';
      }
    },
    processes: () => [pid, ...collect()].filter(isAlive),
    stop,
  };
}

/**
 * A fresh ed25519 client key in its own temp dir (0700). OWNER (uid/gid) makes the files that user's,
 * for an ssh client that runs as that user; by default they belong to the caller (root).
 */
export async function generateClientKey(
  options: { comment?: string; owner?: { uid: number; gid: number } } = {},
): Promise<ClientKey> {
  const dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'bh-client-key-'));
  const privateKeyPath = path.join(dir, 'id_ed25519');
  await execFileAsync('ssh-keygen', [
    '-q',
    '-t',
    'ed25519',
    '-N',
    '',
    '-C',
    options.comment ?? 'backhaul-test',
    '-f',
    privateKeyPath,
  ]);
  if (options.owner) {
    for (const p of [dir, privateKeyPath, `${privateKeyPath}.pub`]) {
      await fsp.chown(p, options.owner.uid, options.owner.gid);
    }
  }
  tempDirs.add(dir);
  const publicKey = (await fsp.readFile(`${privateKeyPath}.pub`, 'utf8')).trim();
  return {
    dir,
    privateKeyPath,
    publicKey,
    remove: async () => {
      await fsp.rm(dir, { recursive: true, force: true });
      tempDirs.delete(dir);
    },
  };
}

/** The text of a known_hosts file for ENTRIES (not hashed). */
export function knownHostsText(entries: KnownHostsEntry[]): string {
  return entries.map((e) => `${hostPattern(e.host, e.port ?? 22)} ${stripComment(e.key)}\n`).join('');
}

/**
 * Writes a known_hosts file (mode 0644) at FILE, or in a new temp dir when FILE is absent (that dir
 * is removed when the process exits, or by the caller); returns its path.
 */
export async function knownHostsFile(entries: KnownHostsEntry[], file?: string): Promise<string> {
  let target = file;
  if (target === undefined) {
    const dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'bh-known-hosts-'));
    tempDirs.add(dir);
    target = path.join(dir, 'known_hosts');
  }
  await fsp.writeFile(target, knownHostsText(entries), { mode: 0o644 });
  return target;
}

/** Stops every sshd this process started (for afterAll hooks). */
export async function stopAllSshd(): Promise<void> {
  const pending: Promise<void>[] = [];
  for (const [pid, entry] of live) {
    // Instances made by startSshd have their own stop(); this is for the ones a test forgot.
    pending.push(
      (async () => {
        for (const p of [pid, ...entry.collect()]) {
          try {
            process.kill(p, 'SIGKILL');
          } catch {
            // gone
          }
        }
        if (entry.child.exitCode === null && entry.child.signalCode === null) await once(entry.child, 'exit');
        live.delete(pid);
        await fsp.rm(entry.dir, { recursive: true, force: true });
      })(),
    );
  }
  await Promise.all(pending);
}
