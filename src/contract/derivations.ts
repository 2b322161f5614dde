import { createHash } from 'node:crypto';

/**
 * ARCHITECTURE.md, "Derivations". The relay boot (src/job/relay-boot.py) implements the same functions; both are checked
 * against test/vectors/derivations.json.
 */

/** Longest unix socket path the kernel accepts (sun_path is 108 bytes including the NUL). */
export const MAX_SOCKET_PATH_BYTES = 107;

export function fnv1a32(text: string): number {
  let h = 0x811c9dc5;
  for (const byte of Buffer.from(text, 'utf8')) {
    h ^= byte;
    h = Math.imul(h, 0x01000193) >>> 0;
  }
  return h >>> 0;
}

/**
 * The loopback address the pod's relay tries first for address group GROUP (0: the pod's first
 * address, `BACKHAUL_BIND_ADDRESS`; one group per Service, see `withSlots`). Never in 127.0.0.0/24
 * (that is where node services live). Group k > 0 hashes `<uid>/<k>`: "/" is not a UID character, so
 * it cannot be another pod's group 0.
 */
export function bindAddress(uid: string, group = 0): string {
  const h = fnv1a32(group === 0 ? uid : `${uid}/${group}`);
  const b = 1 + (((h >>> 16) & 255) % 254);
  const c = (h >>> 8) & 255;
  const d = 1 + ((h & 255) % 254);
  return `127.${b}.${c}.${d}`;
}

export function socketDir(socketRoot: string, uid: string): string {
  const digest = createHash('sha256').update(uid, 'utf8').digest('hex').slice(0, 16);
  const root = socketRoot.length > 1 ? socketRoot.replace(/\/+$/, '') : socketRoot;
  return `${root === '/' ? '' : root}/bh-${digest}`;
}

/** The SOCKS port's socket in the socket dir: the relay joins its connections to it like a forward's. */
export const SOCKS_SOCKET = 'socks.sock';

/**
 * `<port>.sock` for the first forward listening on PORT, `<port>.<n>.sock` for the n-th (n ≥ 2; two
 * Services on one port). A pod whose listen ports are distinct keeps the paths it always had.
 */
export function socketName(listenPort: number, nth = 1): string {
  return nth === 1 ? `${listenPort}.sock` : `${listenPort}.${nth}.sock`;
}

export function socketPath(dir: string, listenPort: number, nth = 1): string {
  return `${dir}/${socketName(listenPort, nth)}`;
}

/** What `withSlots` needs of a forward. */
export interface SlotInput {
  listenPort: number;
  dialHost: string;
  /** Names in the hosts file; none for an IPv4 endpoint. */
  names: readonly string[];
}

/** Where one forward listens on the node and where its reverse forward ends. */
export interface ForwardSlot {
  /** Index of its address (`bindAddress(uid, group)` first; the relay reports the one it holds). */
  group: number;
  /** File name of its socket in the socket dir. */
  socketName: string;
}

/**
 * One loopback address per Service: the forwards to one Service (one dial host) share an address, so
 * two Services may both listen on 5432 and keep their names and ports. A forward without names (an
 * IPv4 endpoint) is reached by the pod's first address, `BACKHAUL_BIND_ADDRESS`, so it is in group 0.
 * Groups are numbered in the order the forwards first name them.
 */
export function withSlots<F extends SlotInput>(forwards: readonly F[]): (F & ForwardSlot)[] {
  const groupKeys: string[] = [];
  const seenPorts = new Map<number, number>();
  return forwards.map((f) => {
    const key = f.names.length === 0 ? (groupKeys[0] ?? '') : f.dialHost;
    let group = groupKeys.indexOf(key);
    if (group < 0) group = groupKeys.push(key) - 1;
    const nth = (seenPorts.get(f.listenPort) ?? 0) + 1;
    seenPorts.set(f.listenPort, nth);
    return { ...f, group, socketName: socketName(f.listenPort, nth) };
  });
}

/**
 * The first forward whose listen port repeats on its own address (the same Service, or two IPv4
 * endpoints), with the index of the forward it repeats; undefined when there is none.
 */
export function repeatOnAddress(
  slotted: readonly (Pick<SlotInput, 'listenPort'> & Pick<ForwardSlot, 'group'>)[],
): { index: number; previous: number } | undefined {
  const taken = new Map<string, number>();
  for (const [index, f] of slotted.entries()) {
    const key = `${f.group}:${f.listenPort}`;
    const previous = taken.get(key);
    if (previous !== undefined) return { index, previous };
    taken.set(key, index);
  }
  return undefined;
}
