import { createRequire } from 'node:module';

/**
 * Which code encrypts the SSH packets. ssh2 ships an optional native binding
 * (lib/protocol/crypto/build/Release/sshcrypto.node, built by its install script with node-gyp):
 * OpenSSL's AES-GCM and chacha20-poly1305, one write per packet. Without it ssh2 falls back to
 * JavaScript (and WebAssembly for poly1305). Our patch (patches/ssh2+1.17.0.patch, applied by
 * `npm ci`) takes packet padding from a pooled CSPRNG buffer and makes the fallback write each packet
 * once: unpatched, the fallback's three writes per packet made every round trip wait for a delayed
 * ACK (46 ms, docs/history/performance-notebook.md "Round trips"). The fleet runs either way but says which (a log
 * line, `backhaul_ssh_crypto_info`, `backhaul doctor`).
 */
export interface SshCryptoPath {
  /** The native binding is loaded. */
  native: boolean;
  /** patches/ssh2+1.17.0.patch is applied. */
  patched: boolean;
  /** Both: the path the figures in docs/history/performance-notebook.md were measured on. */
  ok: boolean;
  /** One line for logs and doctor. */
  description: string;
  /** What to do when it is not ok (empty when it is). */
  fix: string;
}

const require = createRequire(import.meta.url);

interface Ssh2Crypto {
  bindingAvailable?: unknown;
  backhaulPatched?: unknown;
}

let cached: SshCryptoPath | undefined;

export function sshCryptoPath(): SshCryptoPath {
  if (cached) return cached;
  let loaded: Ssh2Crypto = {};
  try {
    loaded = require('ssh2/lib/protocol/crypto.js') as Ssh2Crypto;
  } catch {
    // ssh2 itself would fail to load first; report both as missing.
  }
  const native = loaded.bindingAvailable === true;
  const patched = loaded.backhaulPatched === true;
  const fixes: string[] = [];
  if (!native) {
    fixes.push(
      'build ssh2\'s native binding with "npm rebuild ssh2" in the install directory (needs python3, make and g++; ' +
        'package.json allowScripts must allow ssh2 and cpu-features)',
    );
  }
  if (!patched) fixes.push('apply patches/ with "npx patch-package" (npm ci runs it as postinstall)');
  cached = {
    native,
    patched,
    ok: native && patched,
    description: `${native ? 'native binding (OpenSSL)' : 'JavaScript fallback: the native binding is not built'}, ${patched ? 'patched' : 'NOT patched'}`,
    fix: fixes.join('; '),
  };
  return cached;
}
