// biome-ignore-all lint/suspicious/noTemplateCurlyInString: these strings are shell code; ${...} is shell parameter expansion.
import { ANNOTATION } from '../spec/annotations.js';
import { type ForwardSlot, repeatOnAddress, SOCKS_SOCKET, withSlots } from '../spec/derivations.js';
import { isDnsName } from '../spec/host-names.js';
import type { Forward } from '../spec/reverse-request.js';
import type { ReverseConfig } from '../spec/site-config.js';
import { SpecError } from '../spec/spec-error.js';
import { hostNameGroups, namesByGroup } from './hosts-file.js';
import { JOB_SHELL_PID_FILE, RELAY_READY_FILE } from './node-scripts.js';
import { hasPrelude, PRELUDE_BEGIN, PRELUDE_END } from './prelude-markers.js';
import { relaySource } from './relay-source.js';
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

/** How long the prelude waits for the relay to report that every port is bound. */
const RELAY_READY_SECONDS = 10;
/** How often the wait for the forwards reports progress. */
const PROGRESS_EVERY_SECONDS = 30;

/**
 * The shell fragment interLink's Slurm plugin pastes verbatim into the batch script (ARCHITECTURE.md §3.4).
 *
 * The pod UID, and with it the bind address and socket dir, is only known on the compute node (a pod
 * has no UID at admission), so the fragment derives them there with the relay's own `derive`. The
 * batch script runs under bash, but the fragment sticks to POSIX sh so dash can run it too, and it
 * behaves under `set -e` and `set -u` should the script have them. Variables start with `bh_` to stay
 * clear of the plugin's own.
 *
 * The plugin appends " <job.sh>" right after the pre-exec text, so the fragment ends with a newline:
 * otherwise job.sh would become part of the closing marker comment and never run.
 */
export function renderPrelude(request: PreludeRequest, settings: PreludeSettings, relay = relaySource()): string {
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
    throw new SpecError('Network.SSH.Reverse.WaitForForwards', `not a duration: ${waitMs} ms`);
  }
  const waitSeconds = Math.ceil(waitMs / 1000);
  if (hasPrelude(relay) || relay.split('\n').some((line) => line.startsWith('# <<< backhaul prelude'))) {
    // stripPrelude works line by line: a marker inside the embedded source would cut the block short.
    throw new Error('the relay source contains a prelude marker line');
  }

  return [
    PRELUDE_BEGIN,
    '# Reverse forwards of this pod (backhaul). The admission webhook rewrites this block.',
    ...header(settings.PythonPath, relay, settings.SocketRoot),
    ...cleanupTrap(),
    ...(settings.PrivateSocketRoot ? privateSocketRoot(settings.SocketRoot) : []),
    ...socketDirSetup(),
    ...shellPidFile(),
    // The relay picks the address (another one if the derived one is taken), so the hosts file comes after it.
    ...(relayed.length > 0 ? startRelay(relayed) : []),
    ...hostsFile(namesByGroup(forwards)),
    ...kubernetesServiceEnv(forwards),
    ...socksEnv(request.socksPort),
    ...containerBinds(),
    ...(relayed.length > 0 ? waitForSockets(relayed, waitSeconds) : []),
    '# Files the workload creates keep the permissions it expects.',
    'umask "$bh_umask"',
    // bh_dir and bh_relay_pid stay: the EXIT trap needs them.
    'unset -f bh_next_addr 2>/dev/null || :',
    'unset bh_root bh_umask bh_uid bh_py bh_relay_src bh_derived bh_addr bh_addrs bh_rest bh_why bh_hosts bh_bind bh_relay_py bh_ready_file bh_tick bh_ticks bh_n bh_ready bh_rc bh_limit bh_waited bh_missing',
    PRELUDE_END,
    '',
  ].join('\n');
}

function checkPorts(forwards: readonly SlottedForward[]): void {
  for (const { listenPort: port } of forwards) {
    if (!Number.isInteger(port) || port < 1 || port > 65535) {
      throw new SpecError(ANNOTATION.forwards, `listen port ${port} is not a port number`, {
        accepted: 'ports 1-65535',
      });
    }
  }
  if (repeatOnAddress(forwards)) {
    throw new SpecError(ANNOTATION.forwards, 'listen ports repeat on one address', {
      accepted: 'distinct listen ports for the forwards to one Service (different Services may share a port)',
    });
  }
}

/** Names are single-quoted anyway; this keeps the hosts file itself well-formed (no blanks, no newlines). */
function checkNames(forwards: readonly Pick<Forward, 'names'>[]): void {
  for (const name of forwards.flatMap((f) => f.names)) {
    if (!isDnsName(name)) {
      throw new SpecError(ANNOTATION.forwards, `${JSON.stringify(name)} is not a host name`, {
        accepted: 'RFC 1123 host names',
      });
    }
  }
}

function header(pythonPath: string, relay: string, socketRoot: string): string[] {
  return [
    // The socket dir, hosts file and relay copy must be private to the job's user from the start.
    'bh_umask=$(umask)',
    'umask 077',
    'bh_uid=${BACKHAUL_POD_UID:-${SLURM_JOB_NAME:-}}',
    'if [ -z "$bh_uid" ]; then',
    "  echo 'backhaul: no pod UID: neither BACKHAUL_POD_UID nor SLURM_JOB_NAME is set, so the reverse forwards cannot be set up' >&2",
    '  exit 1',
    'fi',
    'case $bh_uid in',
    '  [!A-Za-z0-9]* | *[!A-Za-z0-9._-]*)',
    `    printf 'backhaul: %s is not a pod UID (letters, digits, ".", "_" and "-"), so the reverse forwards cannot be set up\\n' "$bh_uid" >&2`,
    '    exit 1 ;;',
    'esac',
    `bh_py=${shellQuote(pythonPath)}`,
    // Single quotes rather than a heredoc inside $(...): every shell reads them the same way (old
    // bash versions mis-parse some heredocs in command substitutions), and nothing in them expands.
    '# shellcheck disable=SC2016',
    `bh_relay_src=${shellQuote(relay)}`,
    `if ! bh_derived=$("$bh_py" -c "$bh_relay_src" derive --uid="$bh_uid" --socket-root=${shellQuote(socketRoot)}); then`,
    `  printf 'backhaul: %s could not run the relay; Python 3 is needed on the compute node (Network.SSH.Reverse.PythonPath)\\n' "$bh_py" >&2`,
    '  exit 1',
    'fi',
    'bh_addr=${bh_derived%% *}',
    'bh_addrs=$bh_addr',
    'bh_dir=${bh_derived#* }',
    // The trap runs `rm -rf` on this path: make sure it is what derive promises.
    'case $bh_addr:$bh_dir in',
    '  127.*:/*bh-*) ;;',
    '  *)',
    `    printf 'backhaul: the relay derived %s, not "<address> <socket dir>"\\n' "$bh_derived" >&2`,
    '    exit 1 ;;',
    'esac',
  ];
}

/**
 * A per-user socket root (`%u` in SocketRoot) is made private by the first job of the user on the node
 * and reused by the next ones. Inside it, nobody else can make or take a pod's socket dir; only the
 * root itself could be made first by another user, which is refused with a message saying so.
 */
function privateSocketRoot(root: string): string[] {
  return [
    `bh_root=${shellQuote(root)}`,
    ...ownPrivateDir({
      variable: 'bh_root',
      what: 'socket root',
      missing: 'does its parent exist on this node? Network.SSH.Reverse.SocketRoot',
      foreign:
        'Network.SSH.Reverse.SocketRoot has %%u, so the dir belongs to this user alone; another user may have made it to intercept the forwards: remove it',
    }),
  ];
}

/**
 * The socket dir's name is predictable and its parent is a shared directory such as /tmp, so another
 * user could create it first (or plant a symlink) to receive the forwarded connections.
 */
function socketDirSetup(): string[] {
  return ownPrivateDir({
    variable: 'bh_dir',
    what: 'socket dir',
    missing: 'does Network.SSH.Reverse.SocketRoot exist on this node?',
    foreign: 'it sits in a shared directory, so another user may have made it to intercept the forwards',
    // Left by an earlier run of this pod that was killed before its trap ran: those sockets lead
    // nowhere and would end the wait for the forwards at once.
    reused: ['rm -f -- "$bh_dir"/*.sock'],
  });
}

/**
 * Makes the directory in $VARIABLE with mode 0700, or reuses one only if it is a real directory owned by
 * this user (made private again, then `reused` run); anything else stops the job with a message.
 * `missing` and `foreign` are printf text (a literal % is %%).
 */
function ownPrivateDir(dir: {
  variable: string;
  what: string;
  missing: string;
  foreign: string;
  reused?: readonly string[];
}): string[] {
  const v = `"$${dir.variable}"`;
  return [
    `if ! mkdir -m 700 ${v} 2>/dev/null; then`,
    '  bh_why=',
    `  if [ -L ${v} ]; then`,
    "    bh_why='is a symbolic link'",
    `  elif [ ! -e ${v} ]; then`,
    `    printf 'backhaul: cannot create the ${dir.what} %s (${dir.missing})\\n' ${v} >&2`,
    '    exit 1',
    `  elif [ ! -d ${v} ]; then`,
    "    bh_why='is not a directory'",
    `  elif [ ! -O ${v} ]; then`,
    "    bh_why='belongs to another user'",
    '  fi',
    '  if [ -n "$bh_why" ]; then',
    `    printf 'backhaul: refusing the ${dir.what} %s: it %s (${dir.foreign})\\n' ${v} "$bh_why" >&2`,
    '    exit 1',
    '  fi',
    `  if ! chmod 700 ${v}; then`,
    `    printf 'backhaul: cannot make the ${dir.what} %s private\\n' ${v} >&2`,
    '    exit 1',
    '  fi',
    ...(dir.reused ?? []).map((line) => `  ${line}`),
    'fi',
  ];
}

/**
 * Set before the socket dir is made: a TERM that lands while `mkdir` runs is handled when it returns,
 * and without a trap by then the shell dies and leaves the new dir behind (seen in CI: an empty socket
 * dir of a job cancelled at its start). So the cleanup removes only a real directory of this user: a
 * refused one (another user's, a symbolic link) stays. HUP, INT and TERM become a plain exit so that
 * the EXIT trap runs in dash too (dash does not run it when a signal kills the shell); inside the
 * cleanup they are ignored.
 */
function cleanupTrap(): string[] {
  return [
    'bh_relay_pid=',
    'bh_cleanup() {',
    // A second signal (a TERM again from Slurm or from a second scancel) must not cut the cleanup
    // short: ignored here, and so in the rm it starts, it would otherwise leave half the dir behind.
    "  trap '' HUP INT TERM",
    '  if [ -n "$bh_relay_pid" ]; then',
    '    kill "$bh_relay_pid" 2>/dev/null || :',
    '  fi',
    '  if [ -d "$bh_dir" ] && [ ! -L "$bh_dir" ] && [ -O "$bh_dir" ]; then',
    // The relay's relaying process, finding its holder gone (a TERM storm can kill the holder before
    // it stops its child), writes relay.pids once: an rm that raced with that write is run again.
    '    rm -rf -- "$bh_dir" 2>/dev/null || { sleep 1; rm -rf -- "$bh_dir"; }',
    '  fi',
    '}',
    'trap bh_cleanup EXIT',
    "trap 'exit 129' HUP",
    "trap 'exit 130' INT",
    "trap 'exit 143' TERM",
  ];
}

/**
 * The session host tells a trap still to come (this shell lives) from one that never ran (gone, the dir
 * left): renderRemoveDeadJobDir. Without it (a full disk) it waits 2 s instead: not fatal.
 */
function shellPidFile(): string[] {
  return [`printf '%s\\n' "$$" >"$bh_dir"/${JOB_SHELL_PID_FILE} 2>/dev/null || :`];
}

/**
 * Each address group's names on the address the relay reported for it (`ready <a0> <a1> …`, in group
 * order). The names are quoted as a group: one printf argument per hosts line.
 */
function hostsFile(groups: readonly string[][]): string[] {
  const single = groups.length <= 1;
  const lines = (names: readonly string[]) =>
    hostNameGroups(names).map((line) => `  printf '%s %s\\n' "$bh_addr" ${shellQuote(line.join(' '))}`);
  return [
    'bh_hosts=$bh_dir/hosts',
    ...(single ? [] : nextAddress()),
    'if ! {',
    '  cat /etc/hosts 2>/dev/null || :',
    // The leading newline guards against an /etc/hosts whose last line has no newline.
    `  printf '\\n# backhaul: Services forwarded to pod %s\\n' "$bh_uid"`,
    ...(single ? lines(groups[0] ?? []) : groups.flatMap((names, k) => [`  bh_next_addr ${k + 1}`, ...lines(names)])),
    '} >"$bh_hosts"; then',
    `  printf 'backhaul: cannot write %s\\n' "$bh_hosts" >&2`,
    '  exit 1',
    'fi',
    // The first address: IPv4 endpoints (no names) are reached there.
    'bh_addr=${bh_addrs%% *}',
    'BACKHAUL_HOSTS_FILE=$bh_hosts',
    'BACKHAUL_BIND_ADDRESS=$bh_addr',
    'BACKHAUL_SOCKET_DIR=$bh_dir',
    'export BACKHAUL_HOSTS_FILE BACKHAUL_BIND_ADDRESS BACKHAUL_SOCKET_DIR',
  ];
}

/** Takes the next address of the relay's ready line into bh_addr; the line must hold one per group. */
function nextAddress(): string[] {
  return [
    'bh_rest=$bh_addrs',
    'bh_next_addr() {',
    '  bh_addr=${bh_rest%% *}',
    '  bh_rest=${bh_rest#"$bh_addr"}',
    '  bh_rest=${bh_rest# }',
    '  case $bh_addr in',
    "    127.*[!0-9.]* | '') ;;",
    '    127.*) return 0 ;;',
    '  esac',
    `  printf 'backhaul: the relay reported fewer than %s addresses: %s\\n' "$1" "$bh_addrs" >&2`,
    '  exit 1',
    '}',
  ];
}

/**
 * A forward to the Kubernetes API points in-cluster clients (client-go, the Python, Java and JavaScript
 * clients' in-cluster loading) at it: they build https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT.
 * The host is the Service's name, which the hosts file maps to the relay, so the API server's
 * certificate is still verified against a name it carries (kubernetes.default.svc.<domain>).
 */
function kubernetesServiceEnv(forwards: PreludeRequest['forwards']): string[] {
  const api = forwards.find((f) => f.names.some((name) => name === 'kubernetes.default.svc'));
  const host = api?.names[0];
  if (!api || !host) return [];
  const port = shellQuote(String(api.listenPort));
  return [
    `KUBERNETES_SERVICE_HOST=${shellQuote(host)}`,
    `KUBERNETES_SERVICE_PORT=${port}`,
    `KUBERNETES_SERVICE_PORT_HTTPS=${port}`,
    'export KUBERNETES_SERVICE_HOST KUBERNETES_SERVICE_PORT KUBERNETES_SERVICE_PORT_HTTPS',
  ];
}

/**
 * Apptainer reads APPTAINER_BIND and ignores SINGULARITY_BIND when both are set, so binds that were
 * only in SINGULARITY_BIND are carried into APPTAINER_BIND; SingularityCE reads SINGULARITY_BIND.
 */
function containerBinds(): string[] {
  return [
    'bh_bind=$bh_hosts:/etc/hosts',
    'if [ -n "${APPTAINER_BIND:-}" ]; then',
    '  APPTAINER_BIND=$APPTAINER_BIND,$bh_bind',
    'elif [ -n "${SINGULARITY_BIND:-}" ]; then',
    '  APPTAINER_BIND=$SINGULARITY_BIND,$bh_bind',
    'else',
    '  APPTAINER_BIND=$bh_bind',
    'fi',
    'SINGULARITY_BIND=${SINGULARITY_BIND:+$SINGULARITY_BIND,}$bh_bind',
    'export APPTAINER_BIND SINGULARITY_BIND',
  ];
}

/**
 * A plain background child (no setsid or nohup): scancel signals the whole job, and the relay also
 * leaves when its parent, this script, ends. The source is written into the socket dir so that ps
 * shows a short command line.
 */
function startRelay(slotted: readonly SlottedForward[]): string[] {
  const forwards = slotted.map(relayForward).join(' ');
  return [
    'bh_relay_py=$bh_dir/relay.py',
    `bh_ready_file=$bh_dir/${RELAY_READY_FILE}`,
    'if ! printf \'%s\\n\' "$bh_relay_src" >"$bh_relay_py"; then',
    `  printf 'backhaul: cannot write %s\\n' "$bh_relay_py" >&2`,
    '  exit 1',
    'fi',
    `"$bh_py" "$bh_relay_py" serve --job-only --uid="$bh_uid" --socket-dir="$bh_dir" ${forwards} >"$bh_ready_file" &`,
    'bh_relay_pid=$!',
    // POSIX sleep takes whole seconds; GNU and busybox sleep take fractions, which start jobs sooner.
    'if sleep 0.01 2>/dev/null; then',
    `  bh_tick=0.1 bh_ticks=${RELAY_READY_SECONDS * 10}`,
    'else',
    `  bh_tick=1 bh_ticks=${RELAY_READY_SECONDS}`,
    'fi',
    'bh_n=0',
    'while :; do',
    '  bh_ready=',
    '  if [ -s "$bh_ready_file" ]; then',
    '    IFS= read -r bh_ready <"$bh_ready_file" || :',
    '  fi',
    '  case $bh_ready in',
    "    'ready 127.'*)",
    '      bh_addrs=${bh_ready#ready }',
    '      bh_addr=${bh_addrs%% *}',
    '      break ;;',
    '  esac',
    '  if ! kill -0 "$bh_relay_pid" 2>/dev/null; then',
    '    bh_rc=0',
    '    wait "$bh_relay_pid" || bh_rc=$?',
    '    bh_relay_pid=',
    `    printf 'backhaul: the relay exited with status %s before it was ready (its messages are above)\\n' "$bh_rc" >&2`,
    '    exit 1',
    '  fi',
    '  bh_n=$((bh_n + 1))',
    '  if [ "$bh_n" -ge "$bh_ticks" ]; then',
    `    echo 'backhaul: the relay did not report ready within ${RELAY_READY_SECONDS} s' >&2`,
    '    exit 1',
    '  fi',
    '  sleep "$bh_tick"',
    'done',
  ];
}

/**
 * The forwards come up when the session host reaches the job, which can take a while after the job
 * starts. The workload should not start before them, but must not hang forever either: after the wait
 * it starts anyway, and the relay closes connections to ports whose forward is not up yet.
 */
function waitForSockets(slotted: readonly SlottedForward[], waitSeconds: number): string[] {
  const labels = forwardLabels(slotted);
  const list = shellQuote(labels.join(' '));
  return [
    `bh_limit=${waitSeconds}`,
    'bh_waited=0',
    `printf 'backhaul: waiting up to %s s for the forwards of ports %s\\n' "$bh_limit" ${list} >&2`,
    'while :; do',
    '  bh_missing=',
    // One test per socket rather than a loop over a quoted list (shellcheck takes a one-word list for
    // a mistake).
    ...slotted.map(
      (f, i) =>
        `  if [ ! -S "$bh_dir"/${shellQuote(f.socketName)} ]; then bh_missing="$bh_missing "${shellQuote(labels[i] ?? '')}; fi`,
    ),
    '  if [ -z "$bh_missing" ]; then',
    `    printf 'backhaul: forwards ready after %s s\\n' "$bh_waited" >&2`,
    '    break',
    '  fi',
    '  if [ "$bh_waited" -ge "$bh_limit" ]; then',
    `    printf 'backhaul: warning: forwards not ready after %s s, missing ports:%s; starting the workload anyway (connections to those ports are closed until their forwards are up)\\n' "$bh_limit" "$bh_missing" >&2`,
    '    break',
    '  fi',
    `  if [ "$bh_waited" -gt 0 ] && [ $((bh_waited % ${PROGRESS_EVERY_SECONDS})) -eq 0 ]; then`,
    `    printf 'backhaul: still waiting for the forwards of ports%s (%s s of %s s)\\n' "$bh_missing" "$bh_waited" "$bh_limit" >&2`,
    '  fi',
    '  sleep 1',
    '  bh_waited=$((bh_waited + 1))',
    'done',
  ];
}

/** The SOCKS port as the relay sees it: a port of group 0 whose socket is SOCKS_SOCKET. */
function socksForward(port: number): SlottedForward {
  return { listenPort: port, dialHost: '', names: [], group: 0, socketName: SOCKS_SOCKET };
}

/** BACKHAUL_SOCKS_PROXY for the workload (`ALL_PROXY=$BACKHAUL_SOCKS_PROXY curl …`). */
function socksEnv(port: number | undefined): string[] {
  if (port === undefined) return [];
  return [`BACKHAUL_SOCKS_PROXY=socks5h://$bh_addr:${port}`, 'export BACKHAUL_SOCKS_PROXY'];
}

/** `--forward=[GROUP:]PORT[=SOCKET]` (relay.py); a pod with one Service and distinct ports gets `--forward=PORT`. */
function relayForward(f: SlottedForward): string {
  const group = f.group === 0 ? '' : `${f.group}:`;
  const socket = f.socketName === `${f.listenPort}.sock` ? '' : `="$bh_dir"/${shellQuote(f.socketName)}`;
  return `--forward=${shellQuote(`${group}${f.listenPort}`)}${socket}`;
}

/** How the wait names a forward: its port, or `host:port` where Services share the port. */
function forwardLabels(slotted: readonly SlottedForward[]): string[] {
  const count = new Map<number, number>();
  for (const f of slotted) count.set(f.listenPort, (count.get(f.listenPort) ?? 0) + 1);
  return slotted.map((f) =>
    (count.get(f.listenPort) ?? 0) > 1 ? `${f.names[0] ?? f.dialHost}:${f.listenPort}` : String(f.listenPort),
  );
}
