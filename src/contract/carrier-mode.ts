import type { NodeExec } from './reverse-request.js';
import type { ReverseConfig } from './site-config.js';

/**
 * ARCHITECTURE.md, "Carriers and shadow sessions": how the session host reaches an sshd on the batch host.
 * - node: jump through the login node to the node's own sshd;
 * - userspace: ssh to the node, exec a user-space `sshd -i` (for nodes whose sshd refuses forwarding);
 * - srun: `srun --overlap` a user-space `sshd -i` into the job (for sites that forbid ssh to nodes).
 */
export type CarrierMode = 'node' | 'userspace' | 'srun';

export function carrierMode(reverse: Pick<ReverseConfig, 'Sshd' | 'NodeExec'>, podOverride?: NodeExec): CarrierMode {
  const exec = podOverride ?? reverse.NodeExec;
  // srun cannot reach the node's own sshd: it starts a process in the job, so it implies the user-space sshd.
  if (exec === 'srun') return 'srun';
  return reverse.Sshd === 'userspace' ? 'userspace' : 'node';
}
