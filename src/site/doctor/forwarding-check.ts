import type { Client } from 'ssh2';
import { type CheckResult, fail, pass } from './check-result.js';
import { type DoctorContext, socketRoot } from './doctor-context.js';
import { makeTempDir, removeTempDir } from './node-temp-dir.js';
import { cancelForward, tryStreamLocalForward } from './stream-local-forward.js';

/** Time kept for removing the scratch dir, on top of the check's own limit. */
export const CLEANUP_MS = 5_000;

export const NODE_FORWARDING_FIX =
  'set AllowStreamLocalForwarding remote and AllowTcpForwarding remote on the node sshd ' +
  '(both are needed; a Match User block can limit them to that user), or use Sshd: userspace (Network.SSH.Reverse.Sshd)';

export function socketRootFix(ctx: DoctorContext): string {
  return (
    `create Network.SSH.Reverse.SocketRoot (${ctx.config.Network.SSH.Reverse.SocketRoot}) on the compute nodes, ` +
    `writable by ${ctx.config.Network.SSH.User}, or point it at a directory that exists there`
  );
}

/** A fresh 0700 scratch dir under SocketRoot on the node, or the failed check saying why there is none. */
export async function scratchDir(
  ctx: DoctorContext,
  node: Client,
  timeoutMs: number,
): Promise<{ dir: string } | CheckResult> {
  const root = socketRoot(ctx.config);
  const made = await makeTempDir(node, root, timeoutMs, ctx.config.Network.SSH.Reverse.PrivateSocketRoot);
  if ('dir' in made) return made;
  return fail('forwarding', `no scratch dir on ${ctx.nodeName}: ${made.error}`, socketRootFix(ctx));
}

/**
 * Check 7, mode node: a real remote unix-socket forward on the node's own sshd, the very request a
 * carrier makes. The socket goes into a fresh 0700 dir under SocketRoot, which is removed
 * afterwards whatever happened.
 */
export async function checkNodeForwarding(ctx: DoctorContext): Promise<CheckResult> {
  const node = ctx.node;
  if (!node) throw new Error('no node connection');
  const where = `${ctx.nodeName}:${ctx.config.Network.SSH.Reverse.NodeSshPort}`;
  const deadline = performance.now() + ctx.timeoutMs;
  const left = () => Math.max(500, deadline - performance.now());

  const made = await scratchDir(ctx, node.client, left());
  if (!('dir' in made)) return made;
  const socket = `${made.dir}/doctor.sock`;
  let result: CheckResult;
  let leftover: string | undefined;
  try {
    const outcome = await tryStreamLocalForward(node, socket, left());
    if (outcome.granted) {
      await cancelForward(node.client, socket);
      result = pass('forwarding', `the sshd on ${where} granted a stream-local forward of ${socket}`);
    } else {
      const reason = outcome.reason || 'it gave no reason';
      result = fail(
        'forwarding',
        `the sshd on ${where} refused a stream-local forward: ${reason} (ssh2: ${outcome.clientError})`,
        NODE_FORWARDING_FIX,
      );
    }
  } finally {
    leftover = await removeTempDir(node.client, made.dir, CLEANUP_MS);
  }
  return withLeftover(result, made.dir, leftover);
}

/** Says so in the row when the scratch dir could not be removed: the admin must know it stayed behind. */
export function withLeftover(result: CheckResult, dir: string, leftover: string | undefined): CheckResult {
  if (leftover === undefined) return result;
  return { ...result, detail: `${result.detail}; NOTE: could not remove ${dir}: ${leftover}` };
}
