import type { Forward } from '../spec/reverse-request.js';

/**
 * The lines the prelude appends to the job's copy of /etc/hosts (ARCHITECTURE.md §3.4).
 *
 * Lines are kept short because musl (Alpine images) reads hosts files with a 512-byte line buffer and
 * misparses longer lines; glibc has no such limit. 64 forwards to Services can carry 256 names, so
 * the names are split over as many lines as needed, each starting with the bind address.
 */
export const MAX_HOSTS_LINE_LENGTH = 255;

/** The longest bind address (127.255.255.255); grouping assumes it so the prelude and plans agree. */
const LONGEST_ADDRESS = 15;

/** The names to map to the bind address, each once, in the order of the forwards. */
export function hostNames(forwards: readonly Pick<Forward, 'names'>[]): string[] {
  return [...new Set(forwards.flatMap((f) => f.names))];
}

/**
 * The names split into groups that fit one hosts line each. The grouping does not depend on the bind
 * address, because the prelude only learns the address on the compute node.
 */
export function hostNameGroups(names: readonly string[]): string[][] {
  const groups: string[][] = [];
  let current: string[] = [];
  let length = LONGEST_ADDRESS;
  for (const name of names) {
    if (current.length > 0 && length + 1 + name.length > MAX_HOSTS_LINE_LENGTH) {
      groups.push(current);
      current = [];
      length = LONGEST_ADDRESS;
    }
    current.push(name);
    length += 1 + name.length;
  }
  if (current.length > 0) groups.push(current);
  return groups;
}

/** `<address> <names…>` lines; none when there are no names (e.g. only IPv4 endpoints). */
export function hostsLines(address: string, names: readonly string[]): string[] {
  return hostNameGroups(names).map((group) => `${address} ${group.join(' ')}`);
}

/** The text appended to the hosts file (lines joined by newlines), or undefined when there is none. */
export function hostsLine(address: string, names: readonly string[]): string | undefined {
  const lines = hostsLines(address, names);
  return lines.length > 0 ? lines.join('\n') : undefined;
}
