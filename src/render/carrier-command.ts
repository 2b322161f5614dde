import type { CarrierMode } from '../contract/carrier-mode.js';
import { isSlurmNodeName } from '../contract/host-names.js';
import { InputError } from '../contract/input-error.js';
import { shellWord } from './shell-quote.js';
import { carrierPaths } from './userspace-sshd.js';

/**
 * The commands the session host execs to reach an sshd on the batch host (ARCHITECTURE.md, "Carriers and shadow sessions"). They are run
 * by the HPC user's login shell, which may be csh: a few plain words, no redirections, no quoting
 * tricks; the bootstrap script itself is sent on stdin.
 *
 * - node: no command; the session host opens `direct-tcpip` from the login node to the node's sshd.
 * - userspace: via the node's sshd (reached like node mode), `/bin/sh -s` then `exec sshd -i`.
 * - srun: on the login node, the same two wrapped in `srun --overlap` into the running job. `-u`
 *   because srun otherwise holds back output that does not end in a newline, which stalls SSH.
 */

export interface CarrierSettings {
  sshdPath: string;
  socketDir: string;
  nodeSshPort: number;
}

/** Where a job runs, as squeue reports it on the login node. */
export interface BatchJob {
  jobId: string;
  batchHost: string;
}

export interface NodeTarget {
  host: string;
  port: number;
}

export type CarrierCommands =
  | { mode: 'node'; nodeTarget: NodeTarget }
  | { mode: 'userspace'; nodeTarget: NodeTarget; bootstrapCommand: string; sshdCommand: string }
  | { mode: 'srun'; bootstrapCommand: string; sshdCommand: string };

/** Job ids as squeue prints them: digits, or `<array job>_<task>` for array jobs. */
const JOB_ID = /^[0-9]{1,18}(?:_[0-9]{1,9})?$/;

/** Throws InputError unless the id is a Slurm job id: it comes from a remote machine's squeue output. */
export function validateJobId(jobId: string): string {
  if (!JOB_ID.test(jobId)) {
    throw new InputError('jobId', 'not a Slurm job id', {
      entry: jobId,
      accepted: 'digits, or digits_digits for an array job',
    });
  }
  return jobId;
}

/** Throws InputError unless the name is a plain host name: it comes from a remote machine's squeue output. */
export function validateBatchHost(batchHost: string): string {
  if (!isSlurmNodeName(batchHost)) {
    throw new InputError('batchHost', 'not a host name', {
      entry: batchHost,
      accepted: 'a host name of letters, digits, "-", "_" and "."',
    });
  }
  return batchHost;
}

export function carrierCommands(mode: CarrierMode, settings: CarrierSettings, job: BatchJob): CarrierCommands {
  const jobId = validateJobId(job.jobId);
  const batchHost = validateBatchHost(job.batchHost);
  return render(mode, settings, jobId, batchHost);
}

/** The same with `<job>` and `<batch-host>` placeholders: for plans and status output, not for running. */
export function carrierCommandTemplates(mode: CarrierMode, settings: CarrierSettings): CarrierCommands {
  return render(mode, settings, '<job>', '<batch-host>');
}

function render(mode: CarrierMode, settings: CarrierSettings, jobId: string, batchHost: string): CarrierCommands {
  checkSettings(settings);
  const config = carrierPaths(settings.socketDir).config;
  const sshd = [settings.sshdPath, '-i', '-e', '-f', config].map(shellWord).join(' ');
  switch (mode) {
    case 'node':
      return { mode, nodeTarget: { host: batchHost, port: settings.nodeSshPort } };
    case 'userspace':
      return {
        mode,
        nodeTarget: { host: batchHost, port: settings.nodeSshPort },
        bootstrapCommand: '/bin/sh -s',
        sshdCommand: `exec ${sshd}`,
      };
    case 'srun': {
      const srun = `srun -u --overlap --jobid=${jobId} -w ${batchHost} -N1 -n1`;
      return { mode, bootstrapCommand: `${srun} /bin/sh -s`, sshdCommand: `exec ${srun} ${sshd}` };
    }
  }
}

function checkSettings(settings: CarrierSettings): void {
  for (const [field, path] of [
    ['Network.SSH.Reverse.SshdPath', settings.sshdPath],
    ['Network.SSH.Reverse.SocketRoot', settings.socketDir],
  ] as const) {
    if (!/^\/[A-Za-z0-9._/+-]*$/.test(path)) {
      throw new InputError(field, `${JSON.stringify(path)} is not an absolute path of letters, digits and . _ / + -`);
    }
  }
  if (!Number.isInteger(settings.nodeSshPort) || settings.nodeSshPort < 1 || settings.nodeSshPort > 65535) {
    throw new InputError('Network.SSH.Reverse.NodeSshPort', `${settings.nodeSshPort} is not a port number`);
  }
}
