import { createHash } from 'node:crypto';
import { deflateSync } from 'node:zlib';
import { ANNOTATION } from '../contract/annotations.js';
import { type ForwardSlot, repeatOnAddress, SOCKS_SOCKET, withSlots } from '../contract/derivations.js';
import { isDnsName } from '../contract/host-names.js';
import { InputError } from '../contract/input-error.js';
import type { Forward } from '../contract/reverse-request.js';
import type { ReverseConfig } from '../contract/site-config.js';
import { base85 } from './base85.js';
import { renderJobFile } from './job-template.js';
import { hasPrelude, PRELUDE_BEGIN, PRELUDE_END } from './prelude-markers.js';
import { bootSource } from './relay-source.js';
import { checkSocketPaths } from './socket-paths.js';

export { hasPrelude, PRELUDE_BEGIN, PRELUDE_END, stripPrelude } from './prelude-markers.js';

/** The part of a ReverseRequest the prelude needs. */
export type PreludeRequest = {
  forwards: readonly Pick<Forward, 'listenPort' | 'dialHost' | 'names'>[];
  /** The SOCKS port: one more port of the relay's first address, joined to `<socket dir>/socks.sock`. */
  socksPort?: number | undefined;
};
type SlottedForward = PreludeRequest['forwards'][number] & ForwardSlot;
/** The site settings the prelude needs (WaitForForwards in milliseconds). */
export type PreludeSettings = Pick<ReverseConfig, 'SocketRoot' | 'PythonPath' | 'WaitForForwards'> &
  Partial<Pick<ReverseConfig, 'PrivateSocketRoot'>>;

/**
 * The shell fragment interLink's Slurm plugin pastes verbatim into the batch script (ARCHITECTURE.md, "The prelude").
 *
 * It carries only the relay's boot (relay-boot.py, a few KiB): the boot makes the socket dir and binds
 * the pod's addresses at once, and the fleet delivers the relay itself and the Services' names over the
 * carrier, so the annotation stays under 8 KiB for any pod (MAX_PRELUDE_BYTES). The pod UID, and with it
 * the bind address and socket dir, is only known on the compute node (a pod has no UID at admission). The
 * batch script runs under bash, but the fragment sticks to POSIX sh so dash can run it too, and it
 * behaves under `set -e` and `set -u` should the script have them. Variables start with `bh_` to stay
 * clear of the plugin's own.
 *
 * The plugin appends " <job.sh>" right after the pre-exec text, so the fragment ends with a newline:
 * otherwise job.sh would become part of the closing marker comment and never run.
 */
export function renderPrelude(request: PreludeRequest, settings: PreludeSettings, boot = bootSource()): string {
  const forwards = withSlots(request.forwards);
  // The relay listens for SOCKS like for a forward, on the pod's first address, with the same owner check.
  const relayed = request.socksPort === undefined ? forwards : [...forwards, socksForward(request.socksPort)];
  checkPorts(relayed);
  checkNames(forwards);
  checkSocketPaths(
    settings.SocketRoot,
    relayed.map((f) => f.socketName),
  );
  const waitMs = settings.WaitForForwards;
  if (!Number.isFinite(waitMs) || waitMs < 0) {
    throw new InputError('Network.SSH.Reverse.WaitForForwards', `not a duration: ${waitMs} ms`);
  }
  if (hasPrelude(boot) || boot.split('\n').some((line) => line.startsWith('# <<< backhaul prelude'))) {
    // stripPrelude works line by line: a marker inside the embedded source would cut the block short.
    throw new Error('the relay boot contains a prelude marker line');
  }

  const api = forwards.find((f) => f.names.includes(API_SERVICE_NAME));
  const body = renderJobFile('prelude.sh', {
    values: {
      PYTHON: settings.PythonPath,
      BOOT: packBoot(boot),
      UNPACK,
      SOCKET_ROOT: settings.SocketRoot,
      PRIVATE: settings.PrivateSocketRoot ? ['--private'] : [],
      ...(relayed.length > 0
        ? { FORWARDS: relayed.map(relayForward).join(' '), WAIT_S: Math.ceil(waitMs / 1000) }
        : {}),
      ...(api ? { API_HOST: API_SERVICE_NAME, API_PORT: api.listenPort } : {}),
      ...(request.socksPort === undefined ? {} : { SOCKS_PORT: request.socksPort }),
    },
    flags: { RELAY: relayed.length > 0, API: api !== undefined, SOCKS: request.socksPort !== undefined },
  });
  const text = [
    PRELUDE_BEGIN,
    '# Reverse forwards of this pod (backhaul). The admission webhook rewrites this block.',
    `# relay-boot.py (sha256 ${createHash('sha256').update(boot).digest('hex').slice(0, 16)}…), zlib, base85: backhaul render boot`,
    body.trimEnd(),
    PRELUDE_END,
    '',
  ].join('\n');
  const bytes = Buffer.byteLength(text);
  if (bytes > MAX_PRELUDE_BYTES) {
    // Only site settings of unusual length can get here (a test renders the largest pod at 64 forwards).
    throw new InputError(
      'Network.SSH.Reverse.PythonPath',
      `the prelude would be ${bytes} bytes, over the ${MAX_PRELUDE_BYTES} a pod's annotation may carry`,
      { accepted: 'a shorter PythonPath or SocketRoot' },
    );
  }
  return text;
}

/**
 * The boot travels compressed (zlib, then base85: no quote or backslash, so it sits in single quotes as
 * it is) and a one-line wrapper runs it: a third of its text's size. `B` is the text, which `prepare`
 * writes into the socket dir as relay-boot.py for the steps after it.
 */
const UNPACK = 'import base64,sys,zlib;B=zlib.decompress(base64.b85decode(sys.argv.pop(1)));exec(B)';

function packBoot(boot: string): string {
  return base85(deflateSync(boot, { level: 9 }));
}

/** The largest pre-exec the webhook may write (issue 28): etcd and every watch event carry it. */
export const MAX_PRELUDE_BYTES = 8 * 1024;

function checkPorts(forwards: readonly SlottedForward[]): void {
  for (const { listenPort: port } of forwards) {
    if (!Number.isInteger(port) || port < 1 || port > 65535) {
      throw new InputError(ANNOTATION.forwards, `listen port ${port} is not a port number`, {
        accepted: 'ports 1-65535',
      });
    }
  }
  if (repeatOnAddress(forwards)) {
    throw new InputError(ANNOTATION.forwards, 'listen ports repeat on one address', {
      accepted: 'distinct listen ports for the forwards to one Service (different Services may share a port)',
    });
  }
}

/** Names are single-quoted anyway; this keeps the hosts file itself well-formed (no blanks, no newlines). */
function checkNames(forwards: readonly Pick<Forward, 'names'>[]): void {
  for (const name of forwards.flatMap((f) => f.names)) {
    if (!isDnsName(name)) {
      throw new InputError(ANNOTATION.forwards, `${JSON.stringify(name)} is not a host name`, {
        accepted: 'RFC 1123 host names',
      });
    }
  }
}

/**
 * A forward to the Kubernetes API points in-cluster clients at it (KUBERNETES_SERVICE_HOST/PORT): by a
 * name the hosts file maps to the relay and every API server's certificate carries.
 */
const API_SERVICE_NAME = 'kubernetes.default.svc';

/** The SOCKS port as the relay sees it: a port of group 0 whose socket is SOCKS_SOCKET. */
function socksForward(port: number): SlottedForward {
  return { listenPort: port, dialHost: '', names: [], group: 0, socketName: SOCKS_SOCKET };
}

/**
 * `[GROUP:]PORT[=SOCKET]` (relay-boot.py): the group left out for 0, the socket for the one the boot
 * derives (`<port>.sock`, `<port>.<n>.sock` for the n-th forward on a port, as `withSlots` names them).
 */
function relayForward(f: SlottedForward): string {
  const group = f.group === 0 ? '' : `${f.group}:`;
  return f.socketName === SOCKS_SOCKET ? `${group}${f.listenPort}=${f.socketName}` : `${group}${f.listenPort}`;
}
