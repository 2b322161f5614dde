import ssh2 from 'ssh2';
import { describe, expect, it } from 'vitest';

/**
 * Each user-space and srun carrier authorizes a fresh ed25519 client key from
 * `ssh2.utils.generateKeyPairSync` (src/ssh/carrier.ts). Unpatched, ssh2 1.17.0 stripped every leading
 * zero byte of the public key, so 1 key in 256 came out 31 bytes long and its own parser refused it:
 * the carrier failed with "Cannot parse privateKey: Malformed OpenSSH private key" (seen in CI, stop
 * 20; mscdex/ssh2#1390, #1513). patches/ssh2+1.17.0.patch keeps the key's 32 bytes. 5,000 keys meet
 * such a key about 20 times, so without the patch this test fails all but never.
 */
describe('ssh2 ed25519 key generation (patched)', () => {
  it('gives keys ssh2 parses back, each with the 32-byte key OpenSSH expects', () => {
    const refused: string[] = [];
    for (let i = 0; i < 5000; i += 1) {
      const pair = ssh2.utils.generateKeyPairSync('ed25519');
      for (const text of [pair.public, pair.private]) {
        const parsed = ssh2.utils.parseKey(text);
        if (parsed instanceof Error) refused.push(`${parsed.message}: ${text}`);
      }
      // "ssh-ed25519 <base64 of: string 'ssh-ed25519', string <32-byte key>>"
      const blob = Buffer.from(pair.public.split(' ')[1] ?? '', 'base64');
      if (blob.length !== 4 + 11 + 4 + 32) refused.push(`public blob of ${blob.length} bytes: ${pair.public}`);
    }
    expect(refused.slice(0, 3), `${refused.length} of 10,000 keys refused`).toEqual([]);
  });
});
