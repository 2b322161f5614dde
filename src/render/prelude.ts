// biome-ignore-all lint/suspicious/noTemplateCurlyInString: these strings are shell code; ${...} is shell parameter expansion.
import { createHash } from 'node:crypto';
import { deflateSync } from 'node:zlib';
import { ANNOTATION } from '../contract/annotations.js';
import { type ForwardSlot, repeatOnAddress, SOCKS_SOCKET, withSlots } from '../contract/derivations.js';
import { isDnsName } from '../contract/host-names.js';
import { InputError } from '../contract/input-error.js';
import type { Forward } from '../contract/reverse-request.js';
import type { ReverseConfig } from '../contract/site-config.js';
import { base85 } from './base85.js';
import { hasPrelude, PRELUDE_BEGIN, PRELUDE_END } from './prelude-markers.js';
import { bootSource } from './relay-source.js';
import { shellQuote } from './shell-quote.js';
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

  const text = [
    PRELUDE_BEGIN,
    '# Reverse forwards of this pod (backhaul). The admission webhook rewrites this block.',
    // The socket dir, hosts file and boot copy must be private to the job's user from the start.
    'bh_umask=$(umask)',
    'umask 077',
    ...cleanupTrap(),
    `bh_py=${shellQuote(settings.PythonPath)}`,
    'bh_uid=${BACKHAUL_POD_UID:-${SLURM_JOB_NAME:-}}',
    // Single quotes rather than a heredoc inside $(...): every shell reads them the same way (old
    // bash versions mis-parse some heredocs in command substitutions), and nothing in them expands.
    '# shellcheck disable=SC2016',
    `# relay-boot.py (sha256 ${createHash('sha256').update(boot).digest('hex').slice(0, 16)}…), zlib, base85: backhaul render boot`,
    `bh_boot=${shellQuote(packBoot(boot))}`,
    ...prepare(settings),
    ...(relayed.length > 0 ? startRelay(relayed) : ['bh_addrs=']),
    'BACKHAUL_HOSTS_FILE=$bh_dir/hosts',
    'BACKHAUL_BIND_ADDRESS=${bh_addrs%% *}',
    'BACKHAUL_SOCKET_DIR=$bh_dir',
    'export BACKHAUL_HOSTS_FILE BACKHAUL_BIND_ADDRESS BACKHAUL_SOCKET_DIR',
    ...kubernetesServiceEnv(forwards),
    ...socksEnv(request.socksPort),
    ...containerBinds(),
    ...(relayed.length > 0
      ? [
          `"$bh_py" "$bh_dir"/relay-boot.py wait --socket-dir="$bh_dir" --forward="$bh_fw" --limit=${Math.ceil(waitMs / 1000)} || :`,
        ]
      : []),
    'umask "$bh_umask"',
    // bh_dir and bh_relay_pid stay: the EXIT trap needs them.
    'unset bh_umask bh_uid bh_py bh_boot bh_fw bh_rc bh_ready bh_addrs bh_bind',
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
 * Set before anything is made: a TERM that lands while the boot makes the socket dir is handled when it
 * returns (the boot ignores it meanwhile and prints the dir first), and without a trap by then the shell
 * would die and leave the new dir behind (seen in CI: an empty socket dir of a job cancelled at its
 * start). So the cleanup removes only a real directory of this user: a refused one (another user's, a
 * symbolic link) is never printed. HUP, INT and TERM become a plain exit so that the EXIT trap runs in
 * dash too (dash does not run it when a signal kills the shell); inside the cleanup they are ignored.
 */
function cleanupTrap(): string[] {
  return [
    'bh_dir=',
    'bh_relay_pid=',
    'bh_cleanup() {',
    // A second signal (a TERM again from Slurm or from a second scancel) must not cut the cleanup
    // short: ignored here, and so in the rm it starts, it would otherwise leave half the dir behind.
    "  trap '' HUP INT TERM",
    '  if [ -n "$bh_relay_pid" ]; then',
    '    kill "$bh_relay_pid" 2>/dev/null || :',
    '  fi',
    '  if [ -n "$bh_dir" ] && [ -d "$bh_dir" ] && [ ! -L "$bh_dir" ] && [ -O "$bh_dir" ]; then',
    // The relay's relaying process, finding its holder gone (a TERM storm can kill the holder before
    // it stops its child), writes relay.pids once: an rm that raced with that write is run again, with
    // its error in the job's output.
    '    rm -rf -- "$bh_dir" 2>/dev/null || { sleep 1; rm -rf -- "$bh_dir"; }',
    '  fi',
    '}',
    'trap bh_cleanup EXIT',
    // Each ignores the three before it exits: a second TERM that came between the exit and the cleanup's
    // own `trap ''` would run `exit` again inside the EXIT trap, and dash then leaves at once with the
    // dir in place (seen: 6 TERMs 2 ms apart, every file left; Slurm's TERM to the job can come twice).
    `trap 'trap "" HUP INT TERM; exit 129' HUP`,
    `trap 'trap "" HUP INT TERM; exit 130' INT`,
    `trap 'trap "" HUP INT TERM; exit 143' TERM`,
  ];
}

/**
 * The boot checks the UID, makes the socket dir (and a per-user root) private or refuses one another
 * user made, removes stale sockets, writes the shell's pid (the session host tells a trap still to come
 * from one that never ran: renderRemoveDeadJobDir) and the hosts file the fleet adds the names to. It
 * says why itself when it refuses; the trap runs `rm -rf` on the dir, so its shape is checked too.
 */
function prepare(settings: PreludeSettings): string[] {
  const root = shellQuote(settings.SocketRoot);
  return [
    'bh_rc=0',
    `bh_dir=$("$bh_py" -c ${shellQuote(UNPACK)} "$bh_boot" prepare --uid="$bh_uid" --socket-root=${root} --shell=$$${settings.PrivateSocketRoot ? ' --private' : ''}) || bh_rc=$?`,
    'case $bh_rc:$bh_dir in',
    '  0:/*/bh-*) ;;',
    '  12[67]:*)',
    `    printf 'backhaul: cannot run %s: Python 3 is needed on the compute node (Network.SSH.Reverse.PythonPath)\\n' "$bh_py" >&2`,
    '    exit 1 ;;',
    '  *)',
    `    printf 'backhaul: the relay boot failed (status %s)\\n' "$bh_rc" >&2`,
    '    exit 1 ;;',
    'esac',
  ];
}

/**
 * A forward to the Kubernetes API points in-cluster clients (client-go, the Python, Java and JavaScript
 * clients' in-cluster loading) at it: they build https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT.
 * The host is `kubernetes.default.svc`, a name the hosts file maps to the relay and every API server's
 * certificate carries, so the certificate is still verified (and the prelude's length does not grow
 * with the cluster's domain).
 */
function kubernetesServiceEnv(forwards: PreludeRequest['forwards']): string[] {
  const api = forwards.find((f) => f.names.some((name) => name === API_SERVICE_NAME));
  if (!api) return [];
  const port = shellQuote(String(api.listenPort));
  return [
    `KUBERNETES_SERVICE_HOST=${API_SERVICE_NAME}`,
    `KUBERNETES_SERVICE_PORT=${port}`,
    `KUBERNETES_SERVICE_PORT_HTTPS=${port}`,
    'export KUBERNETES_SERVICE_HOST KUBERNETES_SERVICE_PORT KUBERNETES_SERVICE_PORT_HTTPS',
  ];
}

const API_SERVICE_NAME = 'kubernetes.default.svc';

/**
 * Apptainer reads APPTAINER_BIND and ignores SINGULARITY_BIND when both are set, so binds that were
 * only in SINGULARITY_BIND are carried into APPTAINER_BIND; SingularityCE reads SINGULARITY_BIND.
 */
function containerBinds(): string[] {
  return [
    'bh_bind=$BACKHAUL_HOSTS_FILE:/etc/hosts',
    'APPTAINER_BIND=${APPTAINER_BIND:-${SINGULARITY_BIND:-}}',
    'APPTAINER_BIND=${APPTAINER_BIND:+$APPTAINER_BIND,}$bh_bind',
    'SINGULARITY_BIND=${SINGULARITY_BIND:+$SINGULARITY_BIND,}$bh_bind',
    'export APPTAINER_BIND SINGULARITY_BIND',
  ];
}

/**
 * A plain background child (no setsid or nohup): scancel signals the whole job, and the boot, and the
 * relay it becomes, also leave when their parent, this script, ends. It binds the pod's addresses (each
 * Service's own) and holds them from now on, before the workload starts, closing what connects until
 * the fleet has delivered the relay. Its ready line comes through the fifo `prepare` made: the read
 * returns as soon as it is written, or empty when the boot exits without it (its messages say why).
 * It runs from the copy in the socket dir, so ps shows a short command line.
 */
function startRelay(slotted: readonly SlottedForward[]): string[] {
  return [
    `bh_fw=${shellQuote(slotted.map(relayForward).join(' '))}`,
    '"$bh_py" "$bh_dir"/relay-boot.py serve --job-only --uid="$bh_uid" --socket-dir="$bh_dir" --forward="$bh_fw" >"$bh_dir"/relay.ready 3>"$bh_dir"/relay.fifo &',
    'bh_relay_pid=$!',
    'bh_ready=',
    'IFS= read -r bh_ready <"$bh_dir"/relay.fifo || :',
    "case $bh_ready in 'ready 127.'*) ;; *)",
    "  echo 'backhaul: the relay could not start (its messages are above)' >&2",
    '  exit 1 ;;',
    'esac',
    'bh_addrs=${bh_ready#ready }',
  ];
}

/** The SOCKS port as the relay sees it: a port of group 0 whose socket is SOCKS_SOCKET. */
function socksForward(port: number): SlottedForward {
  return { listenPort: port, dialHost: '', names: [], group: 0, socketName: SOCKS_SOCKET };
}

/** BACKHAUL_SOCKS_PROXY for the workload (`ALL_PROXY=$BACKHAUL_SOCKS_PROXY curl …`). */
function socksEnv(port: number | undefined): string[] {
  if (port === undefined) return [];
  return [`BACKHAUL_SOCKS_PROXY=socks5h://$BACKHAUL_BIND_ADDRESS:${port}`, 'export BACKHAUL_SOCKS_PROXY'];
}

/**
 * `[GROUP:]PORT[=SOCKET]` (relay-boot.py): the group left out for 0, the socket for the one the boot
 * derives (`<port>.sock`, `<port>.<n>.sock` for the n-th forward on a port, as `withSlots` names them).
 */
function relayForward(f: SlottedForward): string {
  const group = f.group === 0 ? '' : `${f.group}:`;
  return f.socketName === SOCKS_SOCKET ? `${group}${f.listenPort}=${f.socketName}` : `${group}${f.listenPort}`;
}
