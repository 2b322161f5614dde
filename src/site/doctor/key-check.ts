import { readFile, stat } from 'node:fs/promises';
import { userInfo } from 'node:os';
import ssh2, { type ParsedKey } from 'ssh2';
import { fingerprint } from '../../ssh/known-hosts.js';
import { type CheckResult, fail, pass } from './check-result.js';
import type { DoctorContext } from './doctor-context.js';

/**
 * Check 2: Network.SSH.KeyFile is a private key ssh2 can use, kept private. A key that is usable but
 * readable by others fails the check, yet still lets the login check run: the two faults are
 * independent, and the admin wants to hear about both at once.
 */
export async function checkKey(ctx: DoctorContext): Promise<CheckResult> {
  const file = ctx.config.Network.SSH.KeyFile;
  const runner = userInfo().username;
  let mode: number;
  let data: Buffer;
  try {
    const st = await stat(file);
    if (!st.isFile()) {
      return fail('key', `${file} is not a regular file`, 'set Network.SSH.KeyFile to the private key file itself');
    }
    mode = st.mode & 0o777;
    data = await readFile(file);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code ?? (err as Error).message;
    return fail(
      'key',
      `${file}: cannot read as ${runner} (${code})`,
      code === 'EACCES'
        ? `make ${file} owned by ${runner} (the user that runs backhaul) and chmod 600 it`
        : `set Network.SSH.KeyFile to the private key that logs ${ctx.config.Network.SSH.User} in to the login node`,
    );
  }

  const parsed = ssh2.utils.parseKey(data);
  if (parsed instanceof Error) {
    const encrypted = /encrypted|passphrase/i.test(parsed.message);
    return fail(
      'key',
      `${file}: not a private key ssh2 can use: ${parsed.message}`,
      encrypted
        ? `backhaul runs unattended and cannot type a passphrase: give it a key without one (ssh-keygen -t ed25519 -N '' -f ${file})`
        : `set Network.SSH.KeyFile to an OpenSSH or PEM private key (ssh-keygen -t ed25519 -N '' -f ${file})`,
    );
  }
  const key = Array.isArray(parsed) ? (parsed[0] as ParsedKey) : parsed;
  if (!key.isPrivateKey()) {
    return fail(
      'key',
      `${file} holds a ${key.type} public key, not a private key`,
      'set Network.SSH.KeyFile to the private half of the key pair (the file without .pub)',
    );
  }

  ctx.privateKey = data;
  ctx.keyFingerprint = fingerprint(key.getPublicSSH());
  const shown = `${key.type} private key (public ${ctx.keyFingerprint})`;
  const octal = mode.toString(8).padStart(4, '0');
  if ((mode & 0o077) !== 0) {
    return fail('key', `${file}: ${shown} has mode ${octal}: group or others may read it`, `chmod 600 ${file}`);
  }
  return pass('key', `${file}: ${shown}, mode ${octal}`);
}
