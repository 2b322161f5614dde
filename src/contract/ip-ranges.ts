import { BlockList, isIPv4, isIPv6 } from 'node:net';

/**
 * Address ranges the fleet never dials through a broad rule, and the IPv6 forms that carry an IPv4
 * address inside them (so that `::ffff:127.0.0.1`, `64:ff9b::a9fe:a9fe` and `2002:7f00:1::` are judged
 * as the IPv4 address they reach).
 */

const CIDR = /^(\d{1,3}(?:\.\d{1,3}){3})\/(\d{1,2})$/;

export function validCidr(text: string): boolean {
  const m = CIDR.exec(text);
  return !!m && isIPv4(m[1] ?? '') && Number(m[2]) <= 32;
}

export function parseCidr(text: string): { address: string; prefix: number } {
  const m = CIDR.exec(text);
  return { address: m?.[1] ?? '0.0.0.0', prefix: Number(m?.[2] ?? 32) };
}

export function blockOf(cidrs: readonly string[]): BlockList {
  const list = new BlockList();
  for (const cidr of cidrs) {
    const { address, prefix } = parseCidr(cidr);
    list.addSubnet(address, prefix, 'ipv4');
  }
  return list;
}

/** Is the range `inner` inside `outer`? */
export function cidrInside(inner: string, outer: string): boolean {
  const i = parseCidr(inner);
  const o = parseCidr(outer);
  return i.prefix >= o.prefix && blockOf([outer]).check(i.address, 'ipv4');
}

/**
 * IPv4 ranges reached only through a rule inside them (a CIDR rule within the range): the fleet's
 * loopback, link-local (cloud metadata), "this network", multicast and the reserved block, and the
 * metadata and platform addresses clouds put outside link-local.
 */
export const PROTECTED_V4: ReadonlyArray<{ cidr: string; what: string }> = [
  { cidr: '127.0.0.0/8', what: 'loopback (the fleet itself)' },
  { cidr: '169.254.0.0/16', what: 'link-local (cloud metadata)' },
  { cidr: '0.0.0.0/8', what: '"this network"' },
  { cidr: '224.0.0.0/4', what: 'multicast' },
  { cidr: '240.0.0.0/4', what: 'reserved (and broadcast)' },
  { cidr: '100.100.100.200/32', what: 'cloud metadata (Alibaba Cloud)' },
  { cidr: '168.63.129.16/32', what: 'the cloud platform (Azure WireServer)' },
];

/** IPv6 ranges never dialled: rules are IPv4 only, so nothing opens them. */
const PROTECTED_V6: ReadonlyArray<{ block: BlockList; what: string }> = (
  [
    ['::1', 128, 'loopback (the fleet itself)'],
    ['::', 128, 'unspecified'],
    ['fe80::', 10, 'link-local'],
    ['fec0::', 10, 'site-local'],
    ['ff00::', 8, 'multicast'],
    ['fd00:ec2::254', 128, 'cloud metadata'],
    ['2001::', 32, 'Teredo (an IPv4 address hidden in IPv6)'],
    ['64:ff9b:1::', 48, 'local-use NAT64 (an IPv4 address hidden in IPv6)'],
  ] as const
).map(([address, prefix, what]) => {
  const block = new BlockList();
  block.addSubnet(address, prefix, 'ipv6');
  return { block, what };
});

export function protectedV6(address: string): string | undefined {
  return PROTECTED_V6.find((p) => p.block.check(address, 'ipv6'))?.what;
}

/** The 8 groups of an IPv6 address as numbers, or undefined. */
function groupsOf(address: string): number[] | undefined {
  if (!isIPv6(address)) return undefined;
  let text = address.toLowerCase();
  const dotted = /(\d+\.\d+\.\d+\.\d+)$/.exec(text)?.[1];
  if (dotted) {
    const [a = 0, b = 0, c = 0, d = 0] = dotted.split('.').map(Number);
    text = `${text.slice(0, -dotted.length)}${((a << 8) | b).toString(16)}:${((c << 8) | d).toString(16)}`;
  }
  const [head = '', tail] = text.split('::');
  const left = head === '' ? [] : head.split(':');
  const right = tail === undefined || tail === '' ? [] : tail.split(':');
  const fill = tail === undefined ? [] : Array<string>(8 - left.length - right.length).fill('0');
  const all = [...left, ...fill, ...right].map((g) => Number.parseInt(g, 16));
  return all.length === 8 && all.every((g) => Number.isInteger(g)) ? all : undefined;
}

function v4Of(high: number, low: number): string {
  return `${high >> 8}.${high & 255}.${low >> 8}.${low & 255}`;
}

/**
 * The IPv4 address an IPv6 address reaches, when it carries one the network will use: IPv4-mapped
 * (`::ffff:a.b.c.d`), IPv4-compatible (`::a.b.c.d`, deprecated), NAT64's well-known prefix
 * (`64:ff9b::/96`) and 6to4 (`2002:aabb:ccdd::/48`). Undefined otherwise.
 */
export function embeddedV4(address: string): { v4: string; how: string } | undefined {
  const g = groupsOf(address);
  if (!g) return undefined;
  const [g0, g1, g2, g3, g4, g5, g6 = 0, g7 = 0] = g;
  const zeros = (...xs: (number | undefined)[]) => xs.every((x) => x === 0);
  if (zeros(g0, g1, g2, g3, g4) && g5 === 0xffff) return { v4: v4Of(g6, g7), how: 'IPv4-mapped' };
  if (zeros(g0, g1, g2, g3, g4, g5) && (g6 !== 0 || g7 > 1)) return { v4: v4Of(g6, g7), how: 'IPv4-compatible' };
  if (g0 === 0x64 && g1 === 0xff9b && zeros(g2, g3, g4, g5)) return { v4: v4Of(g6, g7), how: 'NAT64' };
  if (g0 === 0x2002) return { v4: v4Of(g1 ?? 0, g2 ?? 0), how: '6to4' };
  return undefined;
}
