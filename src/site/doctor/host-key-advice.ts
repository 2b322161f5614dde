import { fingerprint, type HostKeyVerdict, type KnownHostEntry, verifyHostKey } from '../../ssh/known-hosts.js';

/** The key type named inside an SSH public key blob (its first string), e.g. `ssh-ed25519`. */
export function keyType(blob: Buffer): string {
  if (blob.length < 4) return 'key';
  const length = blob.readUInt32BE(0);
  return length > 0 && 4 + length <= blob.length ? blob.subarray(4, 4 + length).toString('latin1') : 'key';
}

export function describeKey(blob: Buffer): string {
  return `${keyType(blob)} ${fingerprint(blob)}`;
}

/** The plain (not revoked) known_hosts entries that apply to host:port. */
export function entriesFor(entries: readonly KnownHostEntry[], host: string, port: number): KnownHostEntry[] {
  // verifyHostKey against an entry's own key is ok exactly when the entry's patterns match the name.
  return entries.filter((e) => e.marker === undefined && verifyHostKey([e], host, port, e.key).ok);
}

/** Records what the server presented and what known_hosts made of it, for the check's message. */
export class HostKeyWitness {
  presented: Buffer | undefined;
  verdict: HostKeyVerdict | undefined;

  constructor(private readonly decide: (key: Buffer) => HostKeyVerdict) {}

  readonly verify = (key: Buffer): HostKeyVerdict => {
    this.presented = key;
    this.verdict = this.decide(key);
    return this.verdict;
  };

  get refused(): (HostKeyVerdict & { ok: false }) | undefined {
    return this.verdict && !this.verdict.ok ? this.verdict : undefined;
  }
}

export interface HostKeyFailure {
  detail: string;
  /** The file and names to put in the fix. */
  file: string;
  name: string;
}

/** "host key mismatch for [h]:p: presented ssh-ed25519 SHA256:x; known_hosts has ssh-ed25519 SHA256:y". */
export function hostKeyFailureDetail(
  verdict: HostKeyVerdict & { ok: false },
  presented: Buffer,
  known: readonly KnownHostEntry[],
): string {
  const shown = describeKey(presented);
  switch (verdict.reason) {
    case 'unknown-host':
      return `unknown host: no known_hosts entry for ${verdict.name}; it presented ${shown}`;
    case 'revoked':
      return `host key revoked: ${verdict.name} presented ${shown}, which known_hosts marks @revoked`;
    case 'mismatch':
      return `host key mismatch for ${verdict.name}: it presented ${shown}; known_hosts has ${
        known.map((e) => describeKey(e.key)).join(', ') || 'other keys'
      }`;
  }
}
