import { sshCryptoPath } from '../../ssh/crypto-path.js';
import { type CheckResult, fail, pass } from './check-result.js';

/**
 * Check 2: the code that will encrypt the tunnels on this machine (where the fleet runs). Without
 * ssh2's native binding every tunnel is several times slower per byte, and without our ssh2 patch a
 * round trip can wait for delayed ACKs (docs/history/performance-notebook.md "Round trips").
 */
export async function checkCrypto(): Promise<CheckResult> {
  const crypto = sshCryptoPath();
  const detail = `ssh2 on this machine (${process.version}): ${crypto.description}`;
  return crypto.ok ? pass('crypto', detail) : fail('crypto', detail, crypto.fix);
}
