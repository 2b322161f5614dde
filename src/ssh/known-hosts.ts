import { createHash, createHmac, timingSafeEqual } from 'node:crypto';

/**
 * OpenSSH known_hosts, read so that the login node and compute nodes are verified against the
 * same file the site admin already keeps. Supports host patterns (comma lists, `*`/`?` wildcards,
 * `!` negation), `[host]:port`, hashed entries (`|1|salt|hash`) and `@revoked`; `@cert-authority`
 * lines are ignored (ssh2 does not verify host certificates).
 */

export interface KnownHostEntry {
  marker: 'revoked' | undefined;
  patterns: string[];
  keyType: string;
  key: Buffer;
}

export function parseKnownHosts(text: string): KnownHostEntry[] {
  const entries: KnownHostEntry[] = [];
  for (const raw of text.split('\n')) {
    const line = raw.trim();
    if (line === '' || line.startsWith('#')) continue;
    const fields = line.split(/\s+/);
    let marker: KnownHostEntry['marker'];
    if (fields[0]?.startsWith('@')) {
      const word = fields.shift();
      if (word !== '@revoked') continue;
      marker = 'revoked';
    }
    const [hosts, keyType, keyBase64] = fields;
    if (!hosts || !keyType || !keyBase64) continue;
    entries.push({ marker, patterns: hosts.split(','), keyType, key: Buffer.from(keyBase64, 'base64') });
  }
  return entries;
}

/** The name OpenSSH looks up: `host` on port 22, `[host]:port` otherwise. */
export function hostKeyName(host: string, port: number): string {
  return port === 22 ? host : `[${host}]:${port}`;
}

function globToRegExp(pattern: string): RegExp {
  const escaped = pattern
    .replace(/[.+^${}()|[\]\\]/g, '\\$&')
    .replace(/\*/g, '.*')
    .replace(/\?/g, '.');
  return new RegExp(`^${escaped}$`, 'i');
}

function matchesHashed(pattern: string, name: string): boolean {
  const [, magic, salt, hash] = pattern.split('|');
  if (magic !== '1' || !salt || !hash) return false;
  const expected = Buffer.from(hash, 'base64');
  const actual = createHmac('sha1', Buffer.from(salt, 'base64')).update(name).digest();
  return expected.length === actual.length && timingSafeEqual(expected, actual);
}

function entryMatches(entry: KnownHostEntry, name: string): boolean {
  let matched = false;
  for (const pattern of entry.patterns) {
    if (pattern.startsWith('|')) {
      if (matchesHashed(pattern, name)) matched = true;
    } else if (pattern.startsWith('!')) {
      if (globToRegExp(pattern.slice(1)).test(name)) return false;
    } else if (globToRegExp(pattern).test(name)) {
      matched = true;
    }
  }
  return matched;
}

export type HostKeyVerdict =
  | { ok: true }
  | { ok: false; reason: 'unknown-host' | 'mismatch' | 'revoked'; name: string };

/** Checks a presented host key (the SSH wire-format public key blob) for host:port. */
export function verifyHostKey(
  entries: readonly KnownHostEntry[],
  host: string,
  port: number,
  key: Buffer,
): HostKeyVerdict {
  const name = hostKeyName(host, port);
  const matching = entries.filter((e) => entryMatches(e, name));
  if (matching.some((e) => e.marker === 'revoked' && e.key.equals(key))) return { ok: false, reason: 'revoked', name };
  const known = matching.filter((e) => e.marker === undefined);
  if (known.length === 0) return { ok: false, reason: 'unknown-host', name };
  return known.some((e) => e.key.equals(key)) ? { ok: true } : { ok: false, reason: 'mismatch', name };
}

/** The SHA256 fingerprint as OpenSSH prints it, for messages. */
export function fingerprint(key: Buffer): string {
  return `SHA256:${createHash('sha256').update(key).digest('base64').replace(/=+$/, '')}`;
}
