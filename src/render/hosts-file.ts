import type { ForwardSlot } from '../contract/derivations.js';
import type { Forward } from '../contract/reverse-request.js';

/**
 * The lines the prelude appends to the job's copy of /etc/hosts (ARCHITECTURE.md, "The prelude"): each Service's
 * names on its own address.
 *
 * Lines are kept short because musl (Alpine images) reads hosts files with a 512-byte line buffer and
 * misparses longer lines; glibc has no such limit. 64 forwards to Services can carry 256 names, so
 * the names are split over as many lines as needed, each starting with the address.
 */
export const MAX_HOSTS_LINE_LENGTH = 255;

/** The longest bind address (127.255.255.255); grouping assumes it so the prelude and plans agree. */
const LONGEST_ADDRESS = 15;

/** The names to map, each once, in the order of the forwards. */
export function hostNames(forwards: readonly Pick<Forward, 'names'>[]): string[] {
  return [...new Set(forwards.flatMap((f) => f.names))];
}

/**
 * The names of each address group (index = group), each name once and in the first group naming it;
 * a group may have none (IPv4 endpoints only).
 */
export function namesByGroup(forwards: readonly (Pick<Forward, 'names'> & Pick<ForwardSlot, 'group'>)[]): string[][] {
  const groups: string[][] = [];
  const seen = new Set<string>();
  for (const f of forwards) {
    const group = groups[f.group] ?? [];
    groups[f.group] = group;
    for (const name of f.names) {
      if (seen.has(name)) continue;
      seen.add(name);
      group.push(name);
    }
  }
  return Array.from(groups, (group) => group ?? []);
}

/**
 * The names split into groups that fit one hosts line each. The grouping does not depend on the
 * address, because the prelude only learns the addresses on the compute node.
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

/**
 * The text appended to the hosts file for forwards with their addresses (lines joined by newlines),
 * or undefined when there is none.
 */
export function hostsText(forwards: readonly (Pick<Forward, 'names'> & { bindAddress: string })[]): string | undefined {
  const addresses = [...new Set(forwards.map((f) => f.bindAddress))];
  const groups = namesByGroup(forwards.map((f) => ({ names: f.names, group: addresses.indexOf(f.bindAddress) })));
  const lines = groups.flatMap((names, k) => hostsLines(addresses[k] ?? '', names));
  return lines.length > 0 ? lines.join('\n') : undefined;
}
