import { createHmac, randomBytes } from 'node:crypto';
import ssh2 from 'ssh2';
import { describe, expect, it } from 'vitest';
import { hostKeyName, parseKnownHosts, verifyHostKey } from '../../src/ssh/known-hosts.js';

const key = () => ssh2.utils.generateKeyPairSync('ed25519').public;
const blob = (line: string) => Buffer.from(line.split(' ')[1] ?? '', 'base64');

function hashed(name: string): string {
  const salt = randomBytes(20);
  return `|1|${salt.toString('base64')}|${createHmac('sha1', salt).update(name).digest('base64')}`;
}

describe('known_hosts', () => {
  const login = key();
  const node = key();
  const other = key();
  const entries = parseKnownHosts(
    [
      '# comment',
      `[127.0.0.1]:2222 ${login}`,
      `${hashed('[bhnode1]:22022')} ${node}`,
      `cn*.cluster,!cn9.cluster ${node}`,
      `@revoked * ${other}`,
      `@cert-authority *.cluster ${other}`,
      'garbage',
      '',
    ].join('\n'),
  );

  it('names hosts as OpenSSH does', () => {
    expect(hostKeyName('h', 22)).toBe('h');
    expect(hostKeyName('h', 2222)).toBe('[h]:2222');
  });

  it('accepts the pinned key, refuses another, and says which', () => {
    expect(verifyHostKey(entries, '127.0.0.1', 2222, blob(login))).toEqual({ ok: true });
    expect(verifyHostKey(entries, '127.0.0.1', 2222, blob(node))).toEqual({
      ok: false,
      reason: 'mismatch',
      name: '[127.0.0.1]:2222',
    });
    expect(verifyHostKey(entries, '127.0.0.1', 22, blob(login))).toMatchObject({ ok: false, reason: 'unknown-host' });
  });

  it('matches hashed names, wildcards and negations', () => {
    expect(verifyHostKey(entries, 'bhnode1', 22022, blob(node))).toEqual({ ok: true });
    expect(verifyHostKey(entries, 'bhnode1', 22, blob(node))).toMatchObject({ reason: 'unknown-host' });
    expect(verifyHostKey(entries, 'cn1.cluster', 22, blob(node))).toEqual({ ok: true });
    expect(verifyHostKey(entries, 'cn9.cluster', 22, blob(node))).toMatchObject({ reason: 'unknown-host' });
  });

  it('refuses a revoked key even where it would match', () => {
    const withRevoked = parseKnownHosts(`h ${other}\n@revoked * ${other}\n`);
    expect(verifyHostKey(withRevoked, 'h', 22, blob(other))).toMatchObject({ ok: false, reason: 'revoked' });
  });
});
