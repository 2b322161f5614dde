import { execFile, spawn } from 'node:child_process';
import { closeSync, openSync } from 'node:fs';
import { promisify } from 'node:util';

const execFileAsync = promisify(execFile);

/** The Debian packages the loopback site and the demo use (ARCHITECTURE.md, "How it is tested"). */
export const DEMO_PACKAGES = [
  'openssh-server',
  'openssh-client',
  'python3',
  'bubblewrap',
  'munge',
  'slurmctld',
  'slurmd',
  'slurm-client',
  'redis-server',
] as const;

/** The packages of LIST that dpkg does not report installed. */
export async function missingPackages(list: readonly string[] = DEMO_PACKAGES): Promise<string[]> {
  let out: string;
  try {
    // biome-ignore lint/suspicious/noTemplateCurlyInString: dpkg-query's own format, not a template.
    out = (await execFileAsync('dpkg-query', ['-W', '-f=${Package} ${Status}\\n', ...list])).stdout;
  } catch (error) {
    const e = error as { code?: string | number; stdout?: string };
    if (e.code === 'ENOENT') throw new Error('dpkg-query not found: the demo needs a Debian (or Ubuntu) machine');
    out = e.stdout ?? ''; // exit 1 when some package is unknown: the known ones are still listed
  }
  const installed = new Set(
    out
      .split('\n')
      .filter((line) => line.endsWith(' install ok installed'))
      .map((line) => line.split(' ')[0]),
  );
  return list.filter((p) => !installed.has(p));
}

/** The one command that installs PACKAGES. */
export function installCommand(packages: readonly string[]): string {
  return `apt-get install -y --no-install-recommends ${packages.join(' ')}`;
}

function run(command: string, args: readonly string[], logFile: string): Promise<number | null> {
  const fd = openSync(logFile, 'a');
  try {
    const child = spawn(command, args, {
      stdio: ['ignore', fd, fd],
      env: { ...process.env, DEBIAN_FRONTEND: 'noninteractive' },
    });
    return new Promise((resolve, reject) => {
      child.once('error', reject);
      child.once('exit', (code) => resolve(code));
    });
  } finally {
    closeSync(fd);
  }
}

/**
 * `apt-get install -y --no-install-recommends PACKAGES`; only when that fails, `apt-get update` and
 * once more. apt's output goes to LOGFILE. Needs root.
 */
export async function installPackages(packages: readonly string[], logFile: string): Promise<void> {
  const install = ['install', '-y', '--no-install-recommends', ...packages];
  if ((await run('apt-get', install, logFile)) === 0) return;
  if ((await run('apt-get', ['update'], logFile)) !== 0) throw new Error(`apt-get update failed (see ${logFile})`);
  if ((await run('apt-get', install, logFile)) !== 0) throw new Error(`apt-get install failed (see ${logFile})`);
}
