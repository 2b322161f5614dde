import { shellQuote } from '../../render/shell-quote.js';
import { type Carrier, openCarrier } from '../../ssh/carrier.js';
import { sshLoginHop } from '../../ssh/login-hop.js';
import { isSessionError } from '../../ssh/session-error.js';
import { bounded, type CheckResult, errorMessage, fail, lastLines, pass } from './check-result.js';
import type { DoctorContext } from './doctor-context.js';
import { CLEANUP_MS, scratchDir, withLeftover } from './forwarding-check.js';
import { removeTempDir } from './node-temp-dir.js';
import { runScript } from './remote-run.js';
import { cancelForward, tryStreamLocalForward } from './stream-local-forward.js';

/** Exit statuses of the precheck script. */
const NO_SSHD = 20;
const NO_KEYGEN = 21;

/**
 * Check 7, mode userspace: the real thing, not a look at the binary. In a fresh 0700 scratch dir
 * under SocketRoot (standing in for a pod's socket dir) the carrier code of src/ssh/carrier.ts runs
 * the bootstrap (fresh host key, authorized key, sshd_config, `sshd -t`), starts `<SshdPath> -i`
 * over an exec channel, connects to it with the pinned host key and asks it for a stream-local
 * forward. Then everything is closed and the scratch dir removed.
 */
export async function checkUserspaceSshd(ctx: DoctorContext): Promise<CheckResult> {
  const node = ctx.node;
  const login = ctx.login;
  const nodeName = ctx.nodeName;
  if (!node || !login || !nodeName) throw new Error('no node connection');
  const ssh = ctx.config.Network.SSH;
  const sshdPath = ssh.Reverse.SshdPath;
  const deadline = performance.now() + ctx.timeoutMs;
  const left = () => Math.max(500, deadline - performance.now());

  const precheck = await runScript(
    node.client,
    [
      `s=${shellQuote(sshdPath)}`,
      `if [ ! -f "$s" ] || [ ! -x "$s" ]; then echo "$s: no such executable" >&2; exit ${NO_SSHD}; fi`,
      `command -v ssh-keygen >/dev/null 2>&1 || { echo "ssh-keygen is not on the PATH" >&2; exit ${NO_KEYGEN}; }`,
      '',
    ].join('\n'),
    left(),
    'looking for sshd and ssh-keygen',
  );
  if (precheck.code === NO_SSHD) {
    return fail(
      'forwarding',
      `no sshd on ${nodeName}: ${lastLines(precheck.stderr)}`,
      `set Network.SSH.Reverse.SshdPath to the OpenSSH sshd binary on the compute nodes (OpenSSH 7.8 or later)`,
    );
  }
  if (precheck.code !== 0) {
    return fail(
      'forwarding',
      `on ${nodeName}: ${lastLines(precheck.stderr) || `exit status ${precheck.code}`}`,
      `install the OpenSSH client tools (ssh-keygen) on the compute nodes, on the PATH of ${ssh.User}`,
    );
  }

  const made = await scratchDir(ctx, node.client, left());
  if (!('dir' in made)) return made;
  let carrier: Carrier | undefined;
  let result: CheckResult;
  let leftover: string | undefined;
  try {
    result = await startAndForward(ctx, nodeName, made.dir, left, (c) => {
      carrier = c;
    });
  } finally {
    carrier?.close();
    leftover = await removeTempDir(node.client, made.dir, CLEANUP_MS);
  }
  return withLeftover(result, made.dir, leftover);
}

async function startAndForward(
  ctx: DoctorContext,
  nodeName: string,
  dir: string,
  left: () => number,
  track: (carrier: Carrier) => void,
): Promise<CheckResult> {
  const login = ctx.login;
  if (!login) throw new Error('no login connection');
  const ssh = ctx.config.Network.SSH;
  const sshdPath = ssh.Reverse.SshdPath;
  let carrier: Carrier;
  try {
    carrier = await bounded(
      `starting the user-space sshd on ${nodeName}`,
      left(),
      openCarrier(
        sshLoginHop(login.client),
        {
          user: ssh.User,
          privateKey: ctx.privateKey ?? '',
          knownHosts: ctx.knownHosts ?? [],
          sshdPath,
          nodeSshPort: ssh.Reverse.NodeSshPort,
          keepaliveIntervalMs: ctx.config.Backhaul.KeepaliveInterval,
        },
        // The scratch dir stands in for a pod's socket dir; no job is involved in this mode.
        { mode: 'userspace', job: { jobId: '0', batchHost: nodeName }, socketDir: dir },
      ),
      (late) => late.close(),
    );
  } catch (err) {
    return startFailure(ctx, nodeName, err);
  }
  track(carrier);
  carrier.client.on('error', () => undefined);
  const socket = `${dir}/doctor.sock`;
  const outcome = await tryStreamLocalForward(carrier, socket, left());
  if (!outcome.granted) {
    return fail(
      'forwarding',
      `the user-space sshd ${sshdPath} on ${nodeName} refused a stream-local forward: ${outcome.reason || 'it gave no reason'} (ssh2: ${outcome.clientError})`,
      'point Network.SSH.Reverse.SshdPath at an OpenSSH sshd 7.8 or later (StreamLocal forwarding and PermitListen)',
    );
  }
  await cancelForward(carrier.client, socket);
  return pass(
    'forwarding',
    `user-space sshd ${sshdPath} on ${nodeName}: bootstrapped in ${dir} (sshd -t accepted its config), ` +
      `started with -i, granted a stream-local forward of ${socket}`,
  );
}

function startFailure(ctx: DoctorContext, nodeName: string, err: unknown): CheckResult {
  const sshdPath = ctx.config.Network.SSH.Reverse.SshdPath;
  const message = errorMessage(err);
  if (isSessionError(err, 'bootstrap-failed') && /refuses the configuration/.test(message)) {
    return fail(
      'forwarding',
      message,
      `point Network.SSH.Reverse.SshdPath at an OpenSSH sshd 7.8 or later on the compute nodes (the carrier's sshd_config uses PermitListen and StreamLocal options)`,
    );
  }
  return fail(
    'forwarding',
    `the user-space sshd ${sshdPath} did not start on ${nodeName}: ${message}`,
    'the detail holds what the node said: fix that; where users may not run their own sshd on the nodes, ' +
      'use Sshd: node with forwarding allowed on the node sshd',
  );
}
