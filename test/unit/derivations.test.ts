import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { bindAddress, fnv1a32, socketDir, socketPath } from '../../src/contract/derivations.js';

interface Vector {
  uid: string;
  fnv1a32: number;
  bindAddress: string;
  socketRoot: string;
  socketDir: string;
  socket9000: string;
  groupAddresses: Record<string, string>;
}

const { vectors } = JSON.parse(readFileSync(new URL('../vectors/derivations.json', import.meta.url), 'utf8')) as {
  vectors: Vector[];
};

describe('derivations (ARCHITECTURE.md, "Derivations")', () => {
  it('FNV-1a-32 matches the published test values', () => {
    expect(fnv1a32('')).toBe(0x811c9dc5);
    expect(fnv1a32('a')).toBe(0xe40c292c);
    expect(fnv1a32('foobar')).toBe(0xbf9cf968);
  });

  it.each(vectors)('vector $uid', (v) => {
    expect(fnv1a32(v.uid)).toBe(v.fnv1a32);
    expect(bindAddress(v.uid)).toBe(v.bindAddress);
    expect(socketDir(v.socketRoot, v.uid)).toBe(v.socketDir);
    expect(socketPath(v.socketDir, 9000)).toBe(v.socket9000);
    for (const [group, address] of Object.entries(v.groupAddresses)) {
      expect(bindAddress(v.uid, Number(group)), `group ${group}`).toBe(address);
    }
    expect(socketPath(v.socketDir, 9000, 2)).toBe(v.socket9000.replace(/9000\.sock$/, '9000.2.sock'));
  });

  it('never derives an address in 127.0.0.0/24 or an invalid octet', () => {
    for (let i = 0; i < 20_000; i += 1) {
      const octets = bindAddress(`uid-${i}`, i % 64)
        .split('.')
        .map(Number);
      expect(octets[0]).toBe(127);
      expect(octets[1]).toBeGreaterThanOrEqual(1);
      expect(octets[1]).toBeLessThanOrEqual(254);
      expect(octets[2]).toBeGreaterThanOrEqual(0);
      expect(octets[2]).toBeLessThanOrEqual(255);
      expect(octets[3]).toBeGreaterThanOrEqual(1);
      expect(octets[3]).toBeLessThanOrEqual(254);
    }
  });
});
