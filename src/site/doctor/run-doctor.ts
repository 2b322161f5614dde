import { carrierMode } from '../../contract/carrier-mode.js';
import type { SiteConfig } from '../../contract/site-config.js';
import {
  bounded,
  type CheckName,
  type CheckResult,
  CheckTimeout,
  errorMessage,
  fail,
  formatSeconds,
  pass,
  skip,
} from './check-result.js';
import { checkCrypto } from './crypto-check.js';
import { acceptsAnyLoginKey, type DoctorContext } from './doctor-context.js';
import { CLEANUP_MS, checkNodeForwarding } from './forwarding-check.js';
import { checkIsolation } from './isolation-check.js';
import { checkKey } from './key-check.js';
import { checkKnownHosts } from './known-hosts-check.js';
import { checkLogin } from './login-check.js';
import { checkNode } from './node-check.js';
import { checkPython } from './python-check.js';
import { checkSlurm } from './slurm-check.js';
import { checkSocketRoot } from './socket-root-check.js';
import { checkUserspaceSshd } from './userspace-sshd-check.js';

export interface DoctorOptions {
  /** `--node`: test this compute node instead of the first one sinfo lists. */
  node?: string | undefined;
  /** Time limit of each check (default 20 s). */
  timeoutMs?: number;
  /** Called with each result as soon as it is known. */
  onResult?: (result: CheckResult) => void;
}

export const DEFAULT_CHECK_TIMEOUT_MS = 20_000;

const SRUN = 'srun mode does not ssh to nodes';

interface Step {
  name: CheckName;
  /** Why the check cannot run (a prerequisite failed), or undefined to run it. */
  blocked?: (ctx: DoctorContext) => string | undefined;
  run: (ctx: DoctorContext) => Promise<CheckResult>;
  /** Extra time beyond the check's limit (for removing what it made on the node). */
  graceMs?: number;
}

const needLogin = (ctx: DoctorContext) => (ctx.login ? undefined : 'no login connection (the login check failed)');

const needNode = (ctx: DoctorContext, srunReason: string) => {
  if (ctx.mode === 'srun') return srunReason;
  if (!ctx.login) return 'no login connection (the login check failed)';
  return ctx.node ? undefined : 'no ssh to a compute node (the node check failed)';
};

const STEPS: readonly Step[] = [
  { name: 'crypto', run: checkCrypto },
  { name: 'key', run: checkKey },
  { name: 'known_hosts', run: checkKnownHosts },
  {
    name: 'login',
    blocked: (ctx) => {
      if (!ctx.privateKey) return 'no usable private key (the key check failed)';
      if (!ctx.knownHosts && !acceptsAnyLoginKey(ctx.config)) {
        return 'no host keys to verify the login node with (the known_hosts check failed)';
      }
      return undefined;
    },
    run: checkLogin,
  },
  { name: 'slurm', blocked: needLogin, run: checkSlurm },
  {
    name: 'node',
    blocked: (ctx) => (ctx.mode === 'srun' ? SRUN : needLogin(ctx)),
    run: checkNode,
  },
  {
    name: 'forwarding',
    blocked: (ctx) =>
      needNode(
        ctx,
        `${SRUN}: its user-space sshd runs inside a job (srun --overlap), so only a running pod can test it`,
      ),
    run: (ctx) => (ctx.mode === 'userspace' ? checkUserspaceSshd(ctx) : checkNodeForwarding(ctx)),
    graceMs: CLEANUP_MS + 1_000,
  },
  {
    name: 'python',
    blocked: (ctx) => needNode(ctx, `${SRUN}: the relay's Python can only be run inside a job`),
    run: checkPython,
  },
  {
    name: 'socket_root',
    blocked: (ctx) => needNode(ctx, `${SRUN}: SocketRoot on the nodes can only be seen from inside a job`),
    run: checkSocketRoot,
  },
  { name: 'isolation', blocked: needLogin, run: checkIsolation },
];

/**
 * Runs the checks of `backhaul doctor` in order against a parsed site configuration. Each check is
 * bounded in time; a check whose prerequisite failed is skipped with the reason. Every connection
 * opened on the way is closed before this returns.
 */
export async function runDoctor(
  config: SiteConfig,
  configPath: string,
  opts: DoctorOptions = {},
): Promise<CheckResult[]> {
  const ssh = config.Network.SSH;
  const mode = carrierMode(ssh.Reverse);
  const ctx: DoctorContext = {
    config,
    configPath,
    mode,
    timeoutMs: opts.timeoutMs ?? DEFAULT_CHECK_TIMEOUT_MS,
    requestedNode: opts.node,
  };
  const results: CheckResult[] = [];
  const report = (result: CheckResult) => {
    results.push(result);
    opts.onResult?.(result);
  };
  const enabled = ssh.Reverse.Enabled
    ? ''
    : '; NOTE: Reverse.Enabled is false, so pods asking for reverse forwards are refused';
  report(
    pass(
      'config',
      `${configPath}: ${ssh.User}@${ssh.LoginHost}:${ssh.Port}, carrier ${mode} ` +
        `(Sshd: ${ssh.Reverse.Sshd}, NodeExec: ${ssh.Reverse.NodeExec})${enabled}`,
    ),
  );
  try {
    for (const step of STEPS) {
      const reason = step.blocked?.(ctx);
      report(reason === undefined ? await runStep(step, ctx) : skip(step.name, reason));
    }
  } finally {
    ctx.node?.client.end();
    ctx.login?.client.end();
  }
  return results;
}

async function runStep(step: Step, ctx: DoctorContext): Promise<CheckResult> {
  const limit = ctx.timeoutMs + (step.graceMs ?? 0);
  try {
    // The checks bound their own steps; this is the last resort, so that doctor never hangs.
    return await bounded(`the ${step.name} check`, limit + 1_000, step.run(ctx));
  } catch (err) {
    if (err instanceof CheckTimeout) {
      return fail(
        step.name,
        `timed out: ${err.message}`,
        `find out what stalls (network, an overloaded login node); run again with a longer --timeout (now ${formatSeconds(ctx.timeoutMs)})`,
      );
    }
    return fail(step.name, errorMessage(err), 'unexpected: run again; if it persists, report it with this output');
  }
}
