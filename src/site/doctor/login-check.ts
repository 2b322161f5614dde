import { hostKeyName, verifyHostKey } from '../../ssh/known-hosts.js';
import { connectSsh } from '../../ssh/ssh-connect.js';
import { bounded, type CheckResult, fail, pass } from './check-result.js';
import { acceptsAnyLoginKey, type DoctorContext } from './doctor-context.js';
import { describeKey, entriesFor, HostKeyWitness, hostKeyFailureDetail } from './host-key-advice.js';
import { keyscanFix } from './known-hosts-check.js';
import { classifyConnectFailure } from './ssh-failure.js';

/**
 * Check 4: an SSH connection to the login node with its host key verified, told apart as
 * unreachable / unknown host / host key mismatch (with the presented SHA256 fingerprint) / auth
 * refused. The connection stays open for the checks that follow.
 */
export async function checkLogin(ctx: DoctorContext): Promise<CheckResult> {
  const ssh = ctx.config.Network.SSH;
  const known = ctx.knownHosts ?? [];
  const acceptAny = acceptsAnyLoginKey(ctx.config);
  const witness = new HostKeyWitness((key) =>
    acceptAny ? { ok: true } : verifyHostKey(known, ssh.LoginHost, ssh.Port, key),
  );
  const where = `${ssh.LoginHost}:${ssh.Port}`;
  try {
    const login = await bounded(
      `the SSH handshake with ${where}`,
      ctx.timeoutMs,
      connectSsh({
        label: `login ${where}`,
        host: ssh.LoginHost,
        port: ssh.Port,
        username: ssh.User,
        privateKey: ctx.privateKey ?? '',
        keepaliveIntervalMs: ctx.config.Backhaul.KeepaliveInterval,
        // ssh2 reports a stalled handshake itself, a little before the check's own limit.
        readyTimeoutMs: Math.max(1000, ctx.timeoutMs - 1000),
        verifyHostKey: witness.verify,
      }),
      (late) => late.client.end(),
    );
    // A later error (keepalive timeout, reset) must not crash the process: the checks see it fail.
    login.client.on('error', () => undefined);
    ctx.login = login;
    const key = witness.presented ? describeKey(witness.presented) : 'host key';
    const verified = acceptAny ? 'NOT verified (InsecureAcceptAnyHostKey)' : `verified against ${ssh.KnownHostsFile}`;
    return pass('login', `${where}: ${key} ${verified}; logged in as ${ssh.User}`);
  } catch (err) {
    const refused = witness.refused;
    const failure = classifyConnectFailure(err, refused !== undefined);
    const file = ssh.KnownHostsFile ?? 'the known_hosts file';
    switch (failure.kind) {
      case 'host-key': {
        if (!refused || !witness.presented) break;
        const detail = hostKeyFailureDetail(refused, witness.presented, entriesFor(known, ssh.LoginHost, ssh.Port));
        const fp = describeKey(witness.presented);
        if (refused.reason === 'unknown-host') {
          return fail('login', detail, keyscanFix(ssh.LoginHost, ssh.Port, file));
        }
        return fail(
          'login',
          detail,
          `confirm ${fp} with the site's admins; only if the login node's key really changed, ` +
            `run ssh-keygen -R '${hostKeyName(ssh.LoginHost, ssh.Port)}' -f ${file} and then ${keyscanFix(ssh.LoginHost, ssh.Port, file)}. ` +
            'Otherwise do not go live: the connection may be intercepted',
        );
      }
      case 'auth-refused':
        return fail(
          'login',
          `auth refused: ${where} did not accept the key ${ctx.keyFingerprint ?? ''} for user ${ssh.User}`,
          `add the public half of ${ssh.KeyFile} (${ctx.keyFingerprint ?? 'its .pub file'}) to ~${ssh.User}/.ssh/authorized_keys on the login node, or correct Network.SSH.User`,
        );
      case 'unreachable':
      case 'timeout':
        return fail(
          'login',
          `unreachable: ${where}: ${failure.why}`,
          'check Network.SSH.LoginHost and Network.SSH.Port, and that this machine may reach that port (DNS, firewall, VPN)',
        );
    }
    throw err;
  }
}
