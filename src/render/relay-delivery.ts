import { withSlots } from '../contract/derivations.js';
import { hostNameGroups, namesByGroup } from './hosts-file.js';
import {
  PREPARE_DIR_MISSING,
  PREPARE_DIR_UNSAFE,
  RELAY_PIDS_FILE,
  RELAY_READY_FILE,
  relayAliveFunction,
} from './node-scripts.js';
import { RELAY_HANDOFF } from './relay-source.js';
import { shellQuote } from './shell-quote.js';

/**
 * What the session host delivers into a job whose prelude carries only the boot (ARCHITECTURE.md, "The relay"):
 * the Services' names on the addresses the boot holds (the hosts file), and the relay, which the boot
 * then execs on its listeners. Run over the carrier before the forwards are bound, so that no socket
 * appears (and the prelude lets the workload start) before the relay runs.
 */
export interface RelayDelivery {
  socketDir: string;
  uid: string;
  /** The pod's forwards, in the annotation's order (their names and Services make the address groups). */
  forwards: readonly { listenPort: number; dialHost: string; names: string[] }[];
  relay: string;
}

/** The script's last line: how it went. */
export const DELIVERY = {
  /** The relay runs on the boot's listeners (now, or since an earlier session). */
  delivered: 'backhaul-relay-delivered',
  /** A prelude of before the boot, which carries its own relay and writes its own hosts file. */
  embedded: 'backhaul-relay-embedded',
  /** The boot asks for another hand-off (a prelude newer than this fleet). */
  unsupported: 'backhaul-relay-unsupported',
  /** No boot said ready within 10 s of the socket dir. */
  noBoot: 'backhaul-relay-no-boot',
  /** The relay was delivered but did not say it runs within 10 s (it wrote why to the job's stderr). */
  silent: 'backhaul-relay-silent',
  /** No process of the boot or relay is alive any more (the job is ending: scancel's TERM). */
  gone: 'backhaul-relay-gone',
} as const;

const HEREDOC_END = 'BACKHAUL_RELAY_END';

export function renderDeliverRelay(delivery: RelayDelivery): string {
  if (delivery.relay.split('\n').includes(HEREDOC_END)) throw new Error(`the relay holds the line ${HEREDOC_END}`);
  const d = shellQuote(delivery.socketDir);
  const groups = namesByGroup(withSlots(delivery.forwards));
  // Each group's names on its address: positional parameter k+1 once the ready line is split.
  const lines = groups.flatMap((names, k) =>
    hostNameGroups(names).map((line) => `  printf '%s %s\\n' "\${${k + 1}}" ${shellQuote(line.join(' '))}`),
  );
  const ready = `${d}/${RELAY_READY_FILE}`;
  return [
    `if [ ! -d ${d} ]; then exit ${PREPARE_DIR_MISSING}; fi`,
    `if [ -L ${d} ] || [ ! -O ${d} ]; then echo 'socket dir is not owned by this user' >&2; exit ${PREPARE_DIR_UNSAFE}; fi`,
    // The job's own processes (kill -0 works on the user's): a job being cancelled need not be waited for.
    ...relayAliveFunction(shellQuote(`${delivery.socketDir}/${RELAY_PIDS_FILE}`), 'dead'),
    'n=0',
    `until [ -f ${d}/relay.want ]; do`,
    `  if [ ! -d ${d} ]; then exit ${PREPARE_DIR_MISSING}; fi`,
    `  if [ -f ${d}/relay.py ] && [ ! -f ${d}/relay-boot.py ]; then echo ${DELIVERY.embedded}; exit 0; fi`,
    `  n=$((n + 1)); if [ "$n" -gt 100 ]; then echo ${DELIVERY.noBoot}; exit 0; fi`,
    '  sleep 0.1 2>/dev/null || sleep 1',
    'done',
    `IFS= read -r want <${d}/relay.want || :`,
    `if [ "$want" != ${shellQuote(RELAY_HANDOFF)} ]; then printf '%s %s\\n' ${DELIVERY.unsupported} "$want"; exit 0; fi`,
    'ready=',
    `IFS= read -r ready <${ready} || :`,
    'set -f',
    '# shellcheck disable=SC2086',
    'set -- $ready',
    'set +f',
    `if [ "\${1:-}" != ready ] || [ $# -le ${groups.length} ]; then printf '%s %s\\n' ${DELIVERY.noBoot} "$ready"; exit 0; fi`,
    'shift',
    '{',
    '  cat /etc/hosts 2>/dev/null || :',
    // The leading newline guards against an /etc/hosts whose last line has no newline.
    `  printf '\\n# backhaul: Services forwarded to pod %s\\n' ${shellQuote(delivery.uid)}`,
    ...lines,
    `} >${d}/hosts.new`,
    // Written in place: a container the job started already (WaitForForwards ran out) has it bound.
    `cat ${d}/hosts.new >${d}/hosts`,
    `rm -f ${d}/hosts.new`,
    `if ! grep -q '^isolation ' ${ready}; then`,
    `  cat >${d}/relay.py.new <<'${HEREDOC_END}'`,
    delivery.relay.replace(/\n$/, ''),
    HEREDOC_END,
    `  mv -f ${d}/relay.py.new ${d}/relay.py`,
    // The boot looks every second; the signal wakes it at once. Only a live boot of this dir gets it (a
    // pid reused by another process of the user must not: SIGUSR1 ends most programs).
    `  p=$(cat ${d}/${RELAY_PIDS_FILE} 2>/dev/null) || p=`,
    '  case $p in',
    "    '' | *[!0-9]*) ;;",
    `    *) if grep -qaF -- ${shellQuote(`${delivery.socketDir}/relay-boot.py`)} "/proc/$p/cmdline" 2>/dev/null; then kill -USR1 "$p" 2>/dev/null || :; fi ;;`,
    '  esac',
    'fi',
    'n=0',
    `until grep -q '^isolation ' ${ready}; do`,
    `  if [ ! -d ${d} ]; then exit ${PREPARE_DIR_MISSING}; fi`,
    `  if ! relay_alive; then echo ${DELIVERY.gone}; exit 0; fi`,
    `  n=$((n + 1)); if [ "$n" -gt 200 ]; then echo ${DELIVERY.silent}; exit 0; fi`,
    '  sleep 0.05 2>/dev/null || sleep 1',
    'done',
    `echo ${DELIVERY.delivered}`,
    '',
  ].join('\n');
}

/** The outcome named by the script's last line, or undefined when it printed none of them. */
export function parseDelivery(stdout: string): { outcome: keyof typeof DELIVERY; detail: string } | undefined {
  const last = stdout.trimEnd().split('\n').at(-1) ?? '';
  for (const [outcome, token] of Object.entries(DELIVERY) as [keyof typeof DELIVERY, string][]) {
    if (last === token || last.startsWith(`${token} `)) return { outcome, detail: last.slice(token.length).trim() };
  }
  return undefined;
}
