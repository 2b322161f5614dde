import type { ExecResult } from '../../ssh/remote-exec.js';
import { type CheckResult, fail, lastLines, pass } from './check-result.js';
import type { DoctorContext } from './doctor-context.js';
import { notFound, runCommand } from './remote-run.js';

const VERSION_COMMANDS = ['squeue', 'sbatch', 'srun'] as const;

/**
 * Check 5: the Slurm client commands backhaul uses answer on the login node: squeue (finding a
 * pod's job), sbatch and srun (srun carriers), and sinfo lists partitions (so a controller answers).
 */
export async function checkSlurm(ctx: DoctorContext): Promise<CheckResult> {
  const login = ctx.login;
  if (!login) throw new Error('no login connection');
  const user = ctx.config.Network.SSH.User;
  const pathFix =
    `install the Slurm client commands on the login node and put them on the PATH of a non-interactive login of ${user} ` +
    '(ssh runs them without a terminal, so profile scripts that wait for one do not apply)';
  const deadline = performance.now() + ctx.timeoutMs;
  const left = () => Math.max(500, deadline - performance.now());

  const versions = new Map<string, string>();
  for (const command of VERSION_COMMANDS) {
    const result = await runCommand(login.client, `${command} --version`, left(), `${command} --version`);
    if (result.code !== 0) {
      // How it ended is part of the message: a signal, or no status at all from the login sshd.
      const said = `${exitOf(result)}${lastLines(result.stderr || result.stdout) ? `: ${lastLines(result.stderr || result.stdout)}` : ''}`;
      return fail(
        'slurm',
        `${command} --version on the login node: ${notFound(result) ? 'command not found' : said}`,
        pathFix,
      );
    }
    versions.set(command, result.stdout.trim().split('\n')[0] ?? '');
  }

  const sinfo = await runCommand(login.client, "sinfo -h -o '%P'", left(), 'sinfo -h -o %P');
  if (sinfo.code !== 0) {
    const said = `${exitOf(sinfo)}${lastLines(sinfo.stderr) ? `: ${lastLines(sinfo.stderr)}` : ''}`;
    return fail(
      'slurm',
      `sinfo -h -o %P on the login node: ${notFound(sinfo) ? 'command not found' : said}`,
      notFound(sinfo)
        ? pathFix
        : 'make sure the login node reaches the cluster controller (SlurmctldHost in its slurm.conf, munge running)',
    );
  }
  const partitions = sinfo.stdout
    .split('\n')
    .map((l) => l.trim())
    .filter((l) => l !== '');
  if (partitions.length === 0) {
    return fail(
      'slurm',
      'sinfo lists no partitions on the login node',
      `check that the login node's slurm.conf names this cluster's controller and that ${user} may see its partitions`,
    );
  }
  const distinct = [...new Set(versions.values())];
  const version =
    distinct.length === 1
      ? `${distinct[0]} (squeue, sbatch, srun)`
      : [...versions].map(([command, v]) => `${command}: ${v}`).join(', ');
  return pass('slurm', `${version}; partitions: ${partitions.join(' ')}`);
}

/** How a remote command ended, in words: its exit status, the signal that killed it, or that sshd sent neither. */
function exitOf(result: ExecResult): string {
  if (result.code !== null) return `exit status ${result.code}`;
  return result.signal ? `killed by SIG${result.signal}` : 'no exit status from the login sshd';
}
