import { readFile } from 'node:fs/promises';
import { hostKeyName, parseKnownHosts } from '../../ssh/known-hosts.js';
import { type CheckResult, fail, pass } from './check-result.js';
import type { DoctorContext } from './doctor-context.js';
import { describeKey, entriesFor } from './host-key-advice.js';

export function keyscanFix(host: string, port: number, file: string): string {
  return `ssh-keyscan -p ${port} ${host} >> ${file}, then verify the fingerprint out of band (ask the site's admins, or run ssh-keygen -lf on the host's /etc/ssh/ssh_host_*_key.pub)`;
}

/**
 * Check 3: the known_hosts file is readable and pins the login host:port. When it is readable but
 * lacks the login entry the login check still runs: it fails without sending anything, and it
 * prints the fingerprint the login node presents, which the admin needs to verify.
 */
export async function checkKnownHosts(ctx: DoctorContext): Promise<CheckResult> {
  const ssh = ctx.config.Network.SSH;
  const file = ssh.KnownHostsFile;
  if (!file) {
    ctx.knownHosts = [];
    return fail(
      'known_hosts',
      'no KnownHostsFile: InsecureAcceptAnyHostKey is set, so the login host key is not verified and no compute node can be',
      'set Network.SSH.KnownHostsFile to a known_hosts file with the login node and compute nodes, and remove InsecureAcceptAnyHostKey',
    );
  }
  let text: string;
  try {
    text = await readFile(file, 'utf8');
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code ?? (err as Error).message;
    return fail(
      'known_hosts',
      `${file}: cannot read (${code})`,
      `create it: ${keyscanFix(ssh.LoginHost, ssh.Port, file)}`,
    );
  }
  const entries = parseKnownHosts(text);
  ctx.knownHosts = entries;
  const name = hostKeyName(ssh.LoginHost, ssh.Port);
  const login = entriesFor(entries, ssh.LoginHost, ssh.Port);
  if (login.length === 0) {
    return fail(
      'known_hosts',
      `${file}: ${entries.length} entries, none for the login node ${name}`,
      keyscanFix(ssh.LoginHost, ssh.Port, file),
    );
  }
  return pass('known_hosts', `${file}: ${name} pinned (${login.map((e) => describeKey(e.key)).join(', ')})`);
}
