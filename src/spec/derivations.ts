import { createHash } from 'node:crypto';

/**
 * ARCHITECTURE.md §3.3. The relay (src/render/relay.py) implements the same functions; both are checked
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

/** A loopback address held by the pod's relay; never in 127.0.0.0/24 (that is where node services live). */
export function bindAddress(uid: string): string {
  const h = fnv1a32(uid);
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

export function socketPath(dir: string, listenPort: number): string {
  return `${dir}/${listenPort}.sock`;
}
