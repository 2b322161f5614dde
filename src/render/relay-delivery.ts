import { withSlots } from '../contract/derivations.js';
import { hostNameGroups, namesByGroup } from './hosts-file.js';
import { renderJobFile } from './job-template.js';
import {
  PREPARE_DIR_MISSING,
  PREPARE_DIR_UNSAFE,
  RELAY_PIDS_FILE,
  RELAY_READY_FILE,
  relayAliveFunction,
} from './node-scripts.js';
import { RELAY_HANDOFF } from './relay-source.js';

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

export function renderDeliverRelay(delivery: RelayDelivery): string {
  const groups = namesByGroup(withSlots(delivery.forwards));
  // Each line of a group's names, after the group's number (its address is the number-th of the ready line's).
  const hosts = groups.flatMap((names, k) => hostNameGroups(names).flatMap((line) => [k + 1, line.join(' ')]));
  return (
    relayAliveFunction(delivery.socketDir, 'dead') +
    renderJobFile('deliver-relay.sh', {
      values: {
        DIR: delivery.socketDir,
        DIR_MISSING: PREPARE_DIR_MISSING,
        DIR_UNSAFE: PREPARE_DIR_UNSAFE,
        READY_FILE: `${delivery.socketDir}/${RELAY_READY_FILE}`,
        PIDS_NAME: RELAY_PIDS_FILE,
        HANDOFF: RELAY_HANDOFF,
        GROUPS: groups.length,
        UID: delivery.uid,
        HOSTS: hosts,
        RELAY: delivery.relay,
        EMBEDDED: DELIVERY.embedded,
        NO_BOOT: DELIVERY.noBoot,
        UNSUPPORTED: DELIVERY.unsupported,
        GONE: DELIVERY.gone,
        SILENT: DELIVERY.silent,
        DELIVERED: DELIVERY.delivered,
      },
    })
  );
}

/** The outcome named by the script's last line, or undefined when it printed none of them. */
export function parseDelivery(stdout: string): { outcome: keyof typeof DELIVERY; detail: string } | undefined {
  const last = stdout.trimEnd().split('\n').at(-1) ?? '';
  for (const [outcome, token] of Object.entries(DELIVERY) as [keyof typeof DELIVERY, string][]) {
    if (last === token || last.startsWith(`${token} `)) return { outcome, detail: last.slice(token.length).trim() };
  }
  return undefined;
}
