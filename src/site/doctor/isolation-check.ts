import { type CheckResult, pass } from './check-result.js';
import { type DoctorContext, socketRoot } from './doctor-context.js';
import { runCommand } from './remote-run.js';

/** What the site's Slurm says of how it keeps jobs apart (`scontrol show config`), by key. */
export function slurmSettings(text: string): Map<string, string> {
  const settings = new Map<string, string>();
  for (const line of text.split('\n')) {
    const m = /^(\w+)\s*=\s*(.*)$/.exec(line.trim());
    if (m?.[1]) settings.set(m[1], (m[2] ?? '').trim());
  }
  return settings;
}

export interface SiteIsolation {
  relay: 'job' | 'user';
  sockets: 'job' | 'user';
  /** Why, in words, for the doctor's row and the fleet's log. */
  detail: string;
}

/**
 * The isolation a site gives the tunnels of pods whose jobs share the site user (docs/SECURITY.md):
 * the relay admits only its job on every site (the prelude's relay runs with --job-only; how it
 * knows the job: the job's cgroup with proctrack/cgroup, else its process tree and steps); the sockets
 * are per job only where they live on the job's private /tmp (job_container/tmpfs) and the carrier
 * that binds them runs inside the job (srun).
 */
export function siteIsolation(
  mode: 'node' | 'userspace' | 'srun',
  root: string,
  settings: ReadonlyMap<string, string> | undefined,
): SiteIsolation {
  const proctrack = settings?.get('ProctrackType');
  const container = settings?.get('JobContainerType');
  const how =
    proctrack === undefined
      ? 'its process tree and steps, or its cgroup'
      : proctrack.includes('cgroup')
        ? `its cgroup (${proctrack})`
        : `the descendants of its shell and its steps (${proctrack})`;
  const privateTmp = container?.includes('tmpfs') === true;
  const underTmp = root === '/tmp' || root.startsWith('/tmp/') || root.startsWith('/dev/shm/');
  const perJob = mode === 'srun' && privateTmp && underTmp;
  const sockets = perJob
    ? `per job (${container}: the job's private /tmp, where the srun carrier's sshd binds them)`
    : `per user (${
        mode !== 'srun'
          ? `carrier ${mode}: the node's sshd binds them outside the job`
          : !privateTmp
            ? `JobContainerType is ${container ?? 'unknown'}, not job_container/tmpfs`
            : `SocketRoot ${root} is not under the job's private /tmp`
      }): every process of the site user on the node can open them`;
  return {
    relay: 'job',
    sockets: perJob ? 'job' : 'user',
    detail: `relay per job (the job's processes, by ${how}); sockets ${sockets}`,
  };
}

/** Check: what separates two pods whose jobs share the site user. Informational: it passes either way. */
export async function checkIsolation(ctx: DoctorContext): Promise<CheckResult> {
  const login = ctx.login;
  if (!login) throw new Error('no login connection');
  const result = await runCommand(login.client, 'scontrol show config', ctx.timeoutMs, 'scontrol show config');
  const settings = result.code === 0 ? slurmSettings(result.stdout) : undefined;
  const level = siteIsolation(ctx.mode, socketRoot(ctx.config), settings);
  const note =
    level.sockets === 'user'
      ? `; pods of different namespaces that share ${ctx.config.Network.SSH.User} get a ReverseTunnelSharedUser Warning`
      : '';
  return pass('isolation', `${level.detail}${note}`);
}
