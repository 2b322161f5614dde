import { type CarrierMode, carrierMode } from '../contract/carrier-mode.js';
import { bindAddress, socketDir, withSlots } from '../contract/derivations.js';
import { InputError } from '../contract/input-error.js';
import type { PodRef } from '../contract/pod.js';
import type { ReverseRequest } from '../contract/reverse-request.js';
import type { SiteConfig } from '../contract/site-config.js';
import { carrierCommandTemplates } from './carrier-command.js';
import { hostsText } from './hosts-file.js';
import { checkSocketPaths } from './socket-paths.js';
import { carrierPaths } from './userspace-sshd.js';

/**
 * Everything the session host needs to serve one pod, computed once from the pod, its request and the
 * site: plain JSON, so it can be stored with the machine's context and shown by `backhaul render plan`.
 */
export interface SessionPlan {
  uid: string;
  namespace: string;
  name: string;
  /** The pod's first address (group 0), derived; the relay may hold another when it is taken. */
  bindAddress: string;
  socketDir: string;
  forwards: PlannedForward[];
  /** The SOCKS port the sshd listens on (127.0.0.1 of the batch host), or null. */
  socks: number | null;
  carrier: CarrierPlan;
  /** What the prelude appends to the job's hosts file (several lines when long), or null. */
  hostsLine: string | null;
  waitForForwardsMs: number;
}

export interface PlannedForward {
  listenPort: number;
  host: string;
  port: number;
  dialHost: string;
  /** The address derived for its Service (one per Service, ARCHITECTURE.md, "Derivations"). */
  bindAddress: string;
  socketPath: string;
  names: string[];
}

interface LoginHop {
  loginHost: string;
  loginPort: number;
  user: string;
}

export type CarrierPlan =
  | (LoginHop & { mode: 'node'; nodeSshPort: number })
  | (LoginHop & {
      mode: 'userspace';
      nodeSshPort: number;
      carrierDir: string;
      bootstrapCommand: string;
      sshdCommand: string;
    })
  | (LoginHop & {
      mode: 'srun';
      carrierDir: string;
      /** Templates: `<job>` and `<batch-host>` are filled in once squeue reports the job. */
      bootstrapCommand: string;
      sshdCommand: string;
    });

export function renderSessionPlan(pod: PodRef, request: ReverseRequest, site: SiteConfig): SessionPlan {
  const { uid } = pod;
  if (uid === undefined || uid === '') {
    throw new InputError('metadata.uid', 'the pod has no UID yet', {
      accepted: 'a pod as the API server returns it, with metadata.uid',
    });
  }
  const ssh = site.Network.SSH;
  const reverse = ssh.Reverse;
  const slotted = withSlots(request.forwards);
  checkSocketPaths(
    reverse.SocketRoot,
    slotted.map((f) => f.socketName),
  );
  const address = bindAddress(uid);
  const dir = socketDir(reverse.SocketRoot, uid);
  const forwards = slotted.map((f) => ({
    listenPort: f.listenPort,
    host: f.host,
    port: f.port,
    dialHost: f.dialHost,
    bindAddress: bindAddress(uid, f.group),
    socketPath: `${dir}/${f.socketName}`,
    names: [...f.names],
  }));
  const hop: LoginHop = { loginHost: ssh.LoginHost, loginPort: ssh.Port, user: ssh.User };
  return {
    uid,
    namespace: pod.namespace,
    name: pod.name,
    bindAddress: address,
    socketDir: dir,
    forwards,
    socks: request.socksPort ?? null,
    carrier: carrierPlan(carrierMode(reverse, request.nodeExec), hop, site, dir),
    hostsLine: hostsText(forwards) ?? null,
    waitForForwardsMs: reverse.WaitForForwards,
  };
}

function carrierPlan(mode: CarrierMode, hop: LoginHop, site: SiteConfig, dir: string): CarrierPlan {
  const reverse = site.Network.SSH.Reverse;
  const commands = carrierCommandTemplates(mode, {
    sshdPath: reverse.SshdPath,
    socketDir: dir,
    nodeSshPort: reverse.NodeSshPort,
  });
  const carrierDir = carrierPaths(dir).dir;
  switch (commands.mode) {
    case 'node':
      return { ...hop, mode: 'node', nodeSshPort: reverse.NodeSshPort };
    case 'userspace':
      return {
        ...hop,
        mode: 'userspace',
        nodeSshPort: reverse.NodeSshPort,
        carrierDir,
        bootstrapCommand: commands.bootstrapCommand,
        sshdCommand: commands.sshdCommand,
      };
    case 'srun':
      return {
        ...hop,
        mode: 'srun',
        carrierDir,
        bootstrapCommand: commands.bootstrapCommand,
        sshdCommand: commands.sshdCommand,
      };
  }
}
