import path from 'node:path';
import { MAX_FORWARDS } from '../../contract/annotations.js';
import { MAX_SOCKET_PATH_BYTES, socketDir, socketPath } from '../../contract/derivations.js';
import { shellQuote } from '../../render/shell-quote.js';
import { type CheckResult, fail, lastLines, pass } from './check-result.js';
import type { DoctorContext } from './doctor-context.js';
import { runScript } from './remote-run.js';

/**
 * The longest socket path a pod can get under a root: a 16-hex-digit dir name, a 5-digit port, and
 * the 64th forward on that port (every Service of the pod on one port).
 */
export function longestSocketPath(root: string): string {
  return socketPath(socketDir(root, 'x'), 65535, MAX_FORWARDS);
}

/**
 * Check 9: SocketRoot on the node is a directory the user can write, where others cannot remove or
 * rename the pods' socket dirs: sticky (like /tmp) or owned by the user and writable by nobody else;
 * and the longest socket path under it fits in a unix socket address (107 bytes).
 */
export async function checkSocketRoot(ctx: DoctorContext): Promise<CheckResult> {
  const node = ctx.node;
  if (!node) throw new Error('no node connection');
  const { SocketRoot: socketRoot, PrivateSocketRoot: perUser } = ctx.config.Network.SSH.Reverse;
  const user = ctx.config.Network.SSH.User;
  const key = `Network.SSH.Reverse.SocketRoot (${socketRoot})`;
  const longest = longestSocketPath(socketRoot);
  // A per-user root is made by the first job: what must be right on the node is the dir it is made in.
  const root = perUser ? path.posix.dirname(socketRoot) : socketRoot;
  if (perUser) {
    const own = await checkOwnRoot(ctx, socketRoot, key);
    if (own) return own;
  }
  const bytes = Buffer.byteLength(longest);
  if (bytes > MAX_SOCKET_PATH_BYTES) {
    return fail(
      'socket_root',
      `socket paths under ${root} reach ${bytes} bytes (${longest}); unix sockets allow ${MAX_SOCKET_PATH_BYTES}`,
      `set ${key} to a directory at most ${MAX_SOCKET_PATH_BYTES - (bytes - Buffer.byteLength(root))} bytes long`,
    );
  }
  const result = await runScript(
    node.client,
    [
      `d=${shellQuote(root)}`,
      'if [ ! -e "$d" ]; then echo missing; exit 0; fi',
      'if [ ! -d "$d" ]; then echo notdir; exit 0; fi',
      'echo "uid $(id -u)"',
      'if [ -w "$d" ] && [ -x "$d" ]; then echo writable; fi',
      'ls -ldLn -- "$d"',
      '',
    ].join('\n'),
    ctx.timeoutMs,
    `looking at ${root}`,
  );
  const lines = result.stdout.split('\n').map((l) => l.trim());
  if (result.code !== 0) {
    return fail(
      'socket_root',
      `cannot look at ${root} on ${ctx.nodeName}: ${lastLines(result.stderr) || `exit status ${result.code}`}`,
      `set ${key} to a directory that exists on the compute nodes`,
    );
  }
  if (lines.includes('missing') || lines.includes('notdir')) {
    return fail(
      'socket_root',
      `${root} on ${ctx.nodeName} ${lines.includes('missing') ? 'does not exist' : 'is not a directory'}`,
      `create ${root} on the compute nodes (sticky like /tmp, or owned by ${user} and mode 0700), or set ${key} to such a directory`,
    );
  }
  const uid = /^uid (\d+)$/m.exec(result.stdout)?.[1];
  const ls = lines.find((l) => /^d[-rwxsStT]{9}/.test(l));
  const fields = ls?.split(/\s+/) ?? [];
  const mode = fields[0] ?? '';
  const owner = fields[2];
  if (!uid || !ls) {
    return fail(
      'socket_root',
      `cannot read the mode of ${root} on ${ctx.nodeName}`,
      `make ${root} on the compute nodes a directory ${user} can list`,
    );
  }
  const sticky = /[tT]$/.test(mode);
  const owned = owner === uid;
  const othersWrite = mode[5] === 'w' || mode[8] === 'w';
  const shown = `${root} on ${ctx.nodeName}: ${mode.slice(0, 10)} owner uid ${owner}`;
  if (!lines.includes('writable')) {
    return fail(
      'socket_root',
      `${shown}: ${user} (uid ${uid}) cannot create directories in it`,
      `make ${root} writable by ${user} (chmod 1777 like /tmp, or chown ${user} and chmod 700), or set ${key} to such a directory`,
    );
  }
  if (!sticky && !(owned && !othersWrite)) {
    return fail(
      'socket_root',
      `${shown}: not sticky and ${owned ? 'writable by others' : `not owned by ${user}`}, so other users could rename or remove the pods' socket dirs`,
      `chmod +t ${root} (sticky, like /tmp), or set ${key} to a directory owned by ${user} that nobody else can write`,
    );
  }
  return pass(
    'socket_root',
    `${shown} (${sticky ? 'sticky' : `owned by ${user}`}); longest socket path ${bytes} of ${MAX_SOCKET_PATH_BYTES} bytes`,
  );
}

/** A per-user root that exists already must be the user's own and private; undefined when it is (or is not there yet). */
async function checkOwnRoot(ctx: DoctorContext, root: string, key: string): Promise<CheckResult | undefined> {
  const node = ctx.node;
  if (!node) throw new Error('no node connection');
  const user = ctx.config.Network.SSH.User;
  const result = await runScript(
    node.client,
    [
      `d=${shellQuote(root)}`,
      'if [ ! -e "$d" ] && [ ! -L "$d" ]; then echo absent; exit 0; fi',
      'if [ -L "$d" ]; then echo symlink; exit 0; fi',
      'if [ ! -d "$d" ] || [ ! -O "$d" ]; then echo foreign; exit 0; fi',
      'echo own',
      '',
    ].join('\n'),
    ctx.timeoutMs,
    `looking at ${root}`,
  );
  const verdict = result.stdout.trim();
  if (result.code === 0 && (verdict === 'absent' || verdict === 'own')) return undefined;
  return fail(
    'socket_root',
    `${root} on ${ctx.nodeName} ${verdict === 'symlink' ? 'is a symbolic link' : verdict === 'foreign' ? `is not a directory owned by ${user}` : `cannot be looked at: ${lastLines(result.stderr)}`}: every job of ${user} on this node will refuse it`,
    `remove ${root} on ${ctx.nodeName} (another user may have made it to intercept the forwards), or set ${key} elsewhere`,
  );
}
