import type { TunnelIsolation } from '../machines/pod-types.js';
import { renderJobFile } from './job-template.js';

/**
 * Small scripts the session host runs on the batch host over the carrier (fed to `/bin/sh -s`, as
 * the bootstrap is, because the login shell may be csh).
 */

/** Exit status of the prepare script when the prelude has not made the socket dir (yet). */
export const PREPARE_DIR_MISSING = 10;
/** Exit status of the prepare script when the socket dir is not the user's own private dir. */
export const PREPARE_DIR_UNSAFE = 12;

/**
 * Before forwards on the node's own sshd: the socket dir must be the one the prelude made, and
 * sockets left by an earlier attempt must go — sshd never unlinks them, and with the default
 * `StreamLocalBindUnlink no` a stale file makes the bind fail.
 */
export function renderPrepareSockets(socketDir: string, socketPaths: readonly string[]): string {
  return renderJobFile('prepare-sockets.sh', {
    values: { DIR: socketDir, SOCKETS: socketPaths, DIR_MISSING: PREPARE_DIR_MISSING, DIR_UNSAFE: PREPARE_DIR_UNSAFE },
  });
}

/**
 * `relay_alive`: whether a process of the relay's pids file answers `kill -0` (the user's own processes).
 * Without the file it answers `withoutFile`: the watch takes a prelude too old to write one for alive.
 */
export function relayAliveFunction(socketDir: string, withoutFile: 'alive' | 'dead'): string {
  return renderJobFile('relay-alive.sh', {
    values: { PIDS: `${socketDir}/${RELAY_PIDS_FILE}` },
    flags: { ALIVE_WITHOUT_FILE: withoutFile === 'alive' },
  });
}

/** Token the watch prints when the socket dir or a socket is gone. */
export const WATCH_VANISHED = 'backhaul-vanished';
/** Token the watch prints when every process of the job's relay is gone while its sockets remain. */
export const WATCH_RELAY_DEAD = 'backhaul-relay-dead';
/** Written by the relay (src/job/relay.py RELAY_PIDS_FILE): the pids of its holder and relaying process. */
export const RELAY_PIDS_FILE = 'relay.pids';
/** The relay's stdout as the prelude keeps it (`ready <address per Service group>`). */
export const RELAY_READY_FILE = 'relay.ready';
/** Written by the prelude once its EXIT trap is set: the batch shell's pid (the trap runs in it). */
export const JOB_SHELL_PID_FILE = 'job-shell.pid';

/**
 * Runs for the life of the forwards: ends, printing WATCH_VANISHED, when the socket dir or one of
 * the sockets disappears (the job's trap removes the dir when the batch script ends), or
 * WATCH_RELAY_DEAD when none of the relay's processes is alive (kill -0 works on the user's own
 * processes) and the dir is still there a moment later (at the job's end the relay stops just before
 * the trap removes the dir). A job without a pids file (a prelude of an older version) is not checked.
 * It prints a dot each round so that, once the carrier is gone, the next write kills it (SIGPIPE)
 * instead of leaving a loop behind on the node.
 */
export function renderSocketWatch(socketDir: string, socketPaths: readonly string[], intervalS: number): string {
  if (!Number.isInteger(intervalS) || intervalS < 1) throw new RangeError('intervalS must be a positive integer');
  return (
    relayAliveFunction(socketDir, 'alive') +
    renderJobFile('socket-watch.sh', {
      values: {
        DIR: socketDir,
        SOCKETS: socketPaths,
        INTERVAL_S: intervalS,
        RELAY_DEAD: WATCH_RELAY_DEAD,
        VANISHED: WATCH_VANISHED,
      },
    })
  );
}

/** Removes sockets by path, whoever bound them (test fixtures and one-off carriers). */
export function renderRemoveSockets(socketPaths: readonly string[]): string {
  return renderJobFile('remove-sockets.sh', { values: { SOCKETS: socketPaths } });
}

/**
 * Prints `<inode> <path>` for each socket that exists: what a session bound, so that its teardown can
 * later remove exactly those (`ls -di` is POSIX, unlike stat's options).
 */
export function renderSocketInodes(socketPaths: readonly string[]): string {
  return `${socketInodeLines(socketPaths)}exit 0\n`;
}

function socketInodeLines(socketPaths: readonly string[]): string {
  return renderJobFile('socket-inodes.sh', { values: { SOCKETS: socketPaths } });
}

/** The line renderForwardsUp prints between the socket inodes and the relay's lines. */
const RELAY_PART = '--- relay';

/**
 * Once the forwards are bound, one script instead of two (each exec is 3 round trips to the node, over
 * a WAN 60 ms and more): renderSocketInodes' lines, then, for a pod with a relay (RELAY_SOCKET_DIR),
 * renderRelayReady's after a RELAY_PART line. parseForwardsUp takes the output apart.
 */
export function renderForwardsUp(socketPaths: readonly string[], relaySocketDir: string | undefined): string {
  if (relaySocketDir === undefined) return renderSocketInodes(socketPaths);
  return `${socketInodeLines(socketPaths)}${renderJobFile('forwards-up.sh', { values: { RELAY_PART } })}${renderRelayReady(relaySocketDir)}`;
}

/** renderForwardsUp's output: path → inode of each socket found, and the relay's lines (undefined: none). */
export function parseForwardsUp(
  output: string,
  socketPaths: readonly string[],
): { inodes: Map<string, string>; relay: string | undefined } {
  const lines = output.split('\n');
  const at = lines.indexOf(RELAY_PART);
  if (at < 0) return { inodes: parseSocketInodes(output, socketPaths), relay: undefined };
  return {
    inodes: parseSocketInodes(lines.slice(0, at).join('\n'), socketPaths),
    relay: lines.slice(at + 1).join('\n'),
  };
}

/**
 * Prints the first line of the relay's ready file (`<socket dir>/relay.ready`, written by the prelude's
 * relay: `ready <address per Service group>`); nothing when it is absent. The prelude makes the socket
 * dir before it starts the relay, so a node carrier can bind the forwards before the relay has written
 * the line: it waits for it up to 3 s (the relay writes it once it listens, within milliseconds).
 */
export function renderRelayReady(socketDir: string): string {
  return `${renderJobFile('relay-ready.sh', { values: { READY_FILE: `${socketDir}/${RELAY_READY_FILE}` } })}exit 0\n`;
}

/** At most one address per forward, and a pod has at most 64. */
const MAX_RELAY_ADDRESSES = 64;
const LOOPBACK_V4 = /^127\.(25[0-5]|2[0-4]\d|1?\d?\d)\.(25[0-5]|2[0-4]\d|1?\d?\d)\.(25[0-5]|2[0-4]\d|1?\d?\d)$/;

/**
 * The addresses of the relay's ready line, in Service-group order. The job's user writes that file, so
 * anything but `ready` and 1–64 loopback IPv4 addresses is not believed (undefined).
 */
export function parseRelayReady(output: string): string[] | undefined {
  const [word, ...addresses] = (output.split('\n')[0] ?? '').trim().split(/\s+/);
  if (word !== 'ready' || addresses.length === 0 || addresses.length > MAX_RELAY_ADDRESSES) return undefined;
  return addresses.every((a) => LOOPBACK_V4.test(a)) ? addresses : undefined;
}

/** The relay's second line, `isolation relay=… sockets=… via=…`; undefined from a relay too old to write it. */
export function parseRelayIsolation(output: string): TunnelIsolation | undefined {
  const line = (output.split('\n')[1] ?? '').trim();
  const m = /^isolation relay=(job|user) sockets=(job|user)(?: via=[a-z-]+)?$/.exec(line);
  return m ? { relay: m[1] as 'job' | 'user', sockets: m[2] as 'job' | 'user' } : undefined;
}

/** Parses renderSocketInodes' output into path → inode. */
export function parseSocketInodes(output: string, socketPaths: readonly string[]): Map<string, string> {
  const found = new Map<string, string>();
  for (const line of output.split('\n')) {
    const match = /^\s*(\d+) (.+)$/.exec(line);
    if (match?.[1] && match[2] && socketPaths.includes(match[2])) found.set(match[2], match[1]);
  }
  return found;
}

/**
 * Removes the socket dir of a job that ended without running its trap (SIGKILL, the OOM killer): the
 * hosts file, the relay's copy and files, what sshd bound. Only a real directory of this user, and
 * only once the job's shell (JOB_SHELL_PID_FILE) is gone: the trap runs in that shell, so while it lives
 * the trap is still to come (Slurm's TERM kills the relay at once, but the shell runs its trap only when
 * the workload has exited, which may take until KillWait), and once it is gone with the dir still there
 * the trap did not run. Also only once no relay process of its pids file is alive (it follows its
 * shell within half a second) and no socket is left in it (the session's own are removed first: one
 * left is another session's, of a newer job of the pod). A job that died before writing its shell's
 * pid (or an older prelude) gets 2 s for a trap in flight, and a live relay then means the job is
 * ending. At most 3.5 s, within the session's 5 s for the step. Prints DEAD_JOB_DIR_REMOVED when it
 * removed the dir.
 */
export function renderRemoveDeadJobDir(socketDir: string): string {
  return `${removeDeadJobDir(socketDir)}exit 0\n`;
}

function removeDeadJobDir(socketDir: string): string {
  return (
    relayAliveFunction(socketDir, 'dead') +
    renderJobFile('remove-dead-job-dir.sh', {
      values: {
        DIR: socketDir,
        SHELL_PID_FILE: `${socketDir}/${JOB_SHELL_PID_FILE}`,
        REMOVED: DEAD_JOB_DIR_REMOVED,
      },
    })
  );
}

/** Printed by renderRemoveDeadJobDir when it removed the dir. */
export const DEAD_JOB_DIR_REMOVED = 'backhaul-dead-job-dir-removed';

/**
 * Removes only the sockets a session bound itself: each path whose inode is still the one recorded
 * (sshd never unlinks them). A socket bound at the same path by a later session of the pod (after a
 * takeover) has another inode and stays: a stale session host that wakes up never removes its
 * successor's sockets. With `deadJobDir`, the dead job's dir follows in the same script
 * (renderRemoveDeadJobDir).
 */
export function renderRemoveOwnSockets(owned: ReadonlyMap<string, string>, deadJobDir?: string): string {
  const pairs = [...owned].flatMap(([path, inode]) => {
    if (!/^\d+$/.test(inode)) throw new RangeError(`not an inode number: ${inode}`);
    return [path, inode];
  });
  // Then, in the same exec, the dead job's dir: it must come after, since a socket left in it keeps it.
  const dead = deadJobDir === undefined ? '' : removeDeadJobDir(deadJobDir);
  return `${renderJobFile('remove-own-sockets.sh', { values: { OWNED: pairs } })}${dead}exit 0\n`;
}
