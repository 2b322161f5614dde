import { isInputError } from '../../contract/input-error.js';
import { validateBatchHost } from '../../render/carrier-command.js';
import { DirectTcpipError, openDirectTcpip } from '../../ssh/direct-tcpip.js';
import { hostKeyName, verifyHostKey } from '../../ssh/known-hosts.js';
import { connectSsh } from '../../ssh/ssh-connect.js';
import { bounded, type CheckResult, fail, lastLines, pass } from './check-result.js';
import type { DoctorContext } from './doctor-context.js';
import { describeKey, entriesFor, HostKeyWitness, hostKeyFailureDetail } from './host-key-advice.js';
import { runCommand } from './remote-run.js';
import { classifyConnectFailure } from './ssh-failure.js';

/** sinfo's compact node states that can run a job now (`*` marks a node that does not respond). */
const USABLE_STATE = /^(idle|mix|mixed|alloc|allocated|comp|completing)$/;

/**
 * The node to test: `--node`, else the first node sinfo lists in a usable state (else the first
 * at all). Returns the name, or a failed check.
 */
async function pickNode(ctx: DoctorContext, deadline: number): Promise<{ node: string; how: string } | CheckResult> {
  if (ctx.requestedNode) return { node: ctx.requestedNode, how: '--node' };
  const login = ctx.login;
  if (!login) throw new Error('no login connection');
  const result = await runCommand(
    login.client,
    "sinfo -h -N -o '%N %t'",
    Math.max(500, deadline - performance.now()),
    'sinfo -h -N -o %N',
  );
  const rows = result.stdout
    .split('\n')
    .map((l) => l.trim().split(/\s+/))
    .filter((r): r is [string, ...string[]] => r[0] !== undefined && r[0] !== '');
  if (result.code !== 0 || rows.length === 0) {
    return fail(
      'node',
      `cannot pick a node: sinfo -h -N -o %N ${result.code !== 0 ? `failed: ${lastLines(result.stderr)}` : 'lists no nodes'}`,
      'pass --node HOST to name a compute node to test',
    );
  }
  const usable = rows.find((r) => USABLE_STATE.test(r[1] ?? ''));
  const [node] = usable ?? rows[0] ?? [''];
  try {
    validateBatchHost(node);
  } catch (err) {
    if (!isInputError(err)) throw err;
    return fail('node', `sinfo names a node ${JSON.stringify(node)} that is not a host name`, 'pass --node HOST');
  }
  return { node, how: usable ? 'first usable node in sinfo' : 'first node in sinfo; none is idle or allocated' };
}

/** `bhnode1` -> `bhnode*`: a known_hosts pattern for nodes that share a host key. */
function wildcard(node: string): string {
  return /\d/.test(node) ? node.replace(/\d+/, '*') : `${node}*`;
}

/**
 * Check 6 (modes node and userspace): ssh to a compute node through the login node (direct-tcpip,
 * like `ssh -J`) at NodeSshPort, with the node's host key verified against known_hosts. The
 * connection stays open for the forwarding, python and socket-root checks.
 */
export async function checkNode(ctx: DoctorContext): Promise<CheckResult> {
  const login = ctx.login;
  if (!login) throw new Error('no login connection');
  const ssh = ctx.config.Network.SSH;
  const port = ssh.Reverse.NodeSshPort;
  const deadline = performance.now() + ctx.timeoutMs;
  const picked = await pickNode(ctx, deadline);
  if ('status' in picked) return picked;
  const { node, how } = picked;
  ctx.nodeName = node;
  const where = `${node}:${port}`;
  const known = ctx.knownHosts ?? [];
  const file = ssh.KnownHostsFile ?? 'the known_hosts file';
  const name = hostKeyName(node, port);

  let channel: Awaited<ReturnType<typeof openDirectTcpip>>;
  try {
    channel = await bounded(
      `a channel from the login node to ${where}`,
      Math.max(500, deadline - performance.now()),
      openDirectTcpip(login.client, node, port),
      (late) => late.destroy(),
    );
  } catch (err) {
    if (err instanceof DirectTcpipError && err.refusal === 'prohibited') {
      return fail(
        'node',
        `the login node refused to open a channel to ${where} (administratively prohibited)`,
        "set AllowTcpForwarding local (or yes) on the login node's sshd: carriers reach the nodes through it like ssh -J",
      );
    }
    return fail(
      'node',
      `the login node could not connect to ${where}: ${err instanceof Error ? err.message : String(err)}`,
      `check Network.SSH.Reverse.NodeSshPort (now ${port}) and that sshd runs on the compute nodes and the login node reaches them; where ssh to nodes is forbidden, use NodeExec: srun`,
    );
  }

  const witness = new HostKeyWitness((key) => verifyHostKey(known, node, port, key));
  try {
    const conn = await bounded(
      `the SSH handshake with ${where}`,
      Math.max(500, deadline - performance.now()),
      connectSsh({
        label: `node ${where}`,
        host: node,
        port,
        username: ssh.User,
        privateKey: ctx.privateKey ?? '',
        sock: channel,
        keepaliveIntervalMs: ctx.config.Backhaul.KeepaliveInterval,
        readyTimeoutMs: Math.max(1000, deadline - performance.now() - 500),
        verifyHostKey: witness.verify,
      }),
      (late) => late.client.end(),
    );
    conn.client.on('error', () => undefined);
    ctx.node = conn;
    const key = witness.presented ? describeKey(witness.presented) : 'host key';
    return pass('node', `${node} (${how}): ${name} ${key} verified; logged in as ${ssh.User}`);
  } catch (err) {
    channel.destroy();
    const refused = witness.refused;
    const failure = classifyConnectFailure(err, refused !== undefined);
    switch (failure.kind) {
      case 'host-key': {
        if (!refused || !witness.presented) break;
        const detail = hostKeyFailureDetail(refused, witness.presented, entriesFor(known, node, port));
        if (refused.reason === 'unknown-host') {
          return fail(
            'node',
            detail,
            `add the compute nodes' host keys to ${file}: ${name} lines (run ssh-keyscan -p ${port} ${node} on the login node and verify the fingerprint), ` +
              `or one line with a wildcard pattern such as ${hostKeyName(wildcard(node), port)} when the nodes share a host key`,
          );
        }
        return fail(
          'node',
          detail,
          `confirm ${describeKey(witness.presented)} with the site's admins; only if ${node}'s key really changed, run ssh-keygen -R '${name}' -f ${file} and add the new key`,
        );
      }
      case 'auth-refused':
        return fail(
          'node',
          `auth refused: the sshd on ${where} did not accept the key ${ctx.keyFingerprint ?? ''} for user ${ssh.User}`,
          `authorize the public half of ${ssh.KeyFile} for ${ssh.User} on the compute nodes (a shared home usually does it); ` +
            `where pam_slurm_adopt guards the nodes, ssh works only while ${ssh.User} has a job there: run doctor with --node set to such a node, or use NodeExec: srun`,
        );
      case 'unreachable':
      case 'timeout':
        return fail(
          'node',
          `no SSH handshake with ${where} through the login node: ${failure.why}`,
          `check that an sshd listens on Network.SSH.Reverse.NodeSshPort (now ${port}) on ${node}`,
        );
    }
    throw err;
  }
}
