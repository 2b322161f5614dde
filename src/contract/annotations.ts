/** The pod annotations backhaul reads and writes (ARCHITECTURE.md, "Annotations"). */
export const ANNOTATION = {
  forwards: 'interlink.eu/reverse-forwards',
  socksPort: 'interlink.eu/reverse-socks-port',
  nodeExec: 'interlink.eu/reverse-node-exec',
  podVpn: 'interlink.eu/pod-vpn',
  preExec: 'slurm-job.vk.io/pre-exec',
  /** Pasted by interLink's Slurm plugin into `enroot start …` in job.sh, unquoted. */
  enrootMounts: 'slurm-job.vk.io/enroot-mounts',
} as const;

export const REVERSE_ANNOTATIONS = [ANNOTATION.forwards, ANNOTATION.socksPort, ANNOTATION.nodeExec] as const;

export const MAX_FORWARDS = 64;
export const MIN_LISTEN_PORT = 1024;
