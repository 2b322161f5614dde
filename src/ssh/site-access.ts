import { readFile } from 'node:fs/promises';
import type { SiteConfig } from '../contract/site-config.js';
import type { CarrierSite } from './carrier.js';
import { type KnownHostEntry, parseKnownHosts, verifyHostKey } from './known-hosts.js';
import { LoginPool } from './login-pool.js';
import type { SshTarget } from './ssh-connect.js';

const MiB = 1024 * 1024;

/**
 * What reaching one site takes, as plain data: it crosses to tunnel threads (structured clone turns
 * Buffers into Uint8Arrays; `accessFromData` turns them back).
 */
export interface SiteAccessData {
  login: {
    label: string;
    host: string;
    port: number;
    username: string;
    keepaliveIntervalMs: number;
    readyTimeoutMs?: number;
    slurmQueryTimeoutMs?: number;
  };
  /** `InsecureAcceptAnyHostKey` without a known_hosts file: the login host key is not checked. */
  acceptAnyLoginKey: boolean;
  loginMaxSessions: number;
  carrier: CarrierSite;
}

/** What a session host (or a tunnel thread) needs to reach one site: the login pool and the carriers' settings. */
export interface SiteAccess {
  pool: LoginPool;
  carrier: CarrierSite;
  login: SshTarget;
  data: SiteAccessData;
}

/** Reads the key and known_hosts named by the site configuration (once per process, not per pod). */
export async function openSiteAccess(config: SiteConfig): Promise<SiteAccess> {
  const ssh = config.Network.SSH;
  const privateKey = await readFile(ssh.KeyFile).catch((err: NodeJS.ErrnoException) => {
    throw new Error(`Network.SSH.KeyFile ${ssh.KeyFile}: cannot read the SSH key (${err.code ?? err.message})`);
  });
  let knownHosts: KnownHostEntry[] = [];
  if (ssh.KnownHostsFile) {
    const path = ssh.KnownHostsFile;
    const text = await readFile(path, 'utf8').catch((err: NodeJS.ErrnoException) => {
      throw new Error(`Network.SSH.KnownHostsFile ${path}: cannot read (${err.code ?? err.message})`);
    });
    knownHosts = parseKnownHosts(text);
  }
  const keepaliveIntervalMs = config.Backhaul.KeepaliveInterval;
  return accessFromData({
    login: {
      label: `login ${ssh.LoginHost}:${ssh.Port}`,
      host: ssh.LoginHost,
      port: ssh.Port,
      username: ssh.User,
      keepaliveIntervalMs,
      readyTimeoutMs: ssh.ConnectTimeout,
      slurmQueryTimeoutMs: ssh.SlurmQueryTimeout,
    },
    acceptAnyLoginKey: ssh.InsecureAcceptAnyHostKey && !ssh.KnownHostsFile,
    loginMaxSessions: config.Backhaul.LoginMaxSessions,
    carrier: {
      user: ssh.User,
      privateKey,
      knownHosts,
      sshdPath: ssh.Reverse.SshdPath,
      nodeSshPort: ssh.Reverse.NodeSshPort,
      keepaliveIntervalMs,
      readyTimeoutMs: ssh.ConnectTimeout,
      channelWindowMax: config.Backhaul.ChannelWindowMaxMiB * MiB,
      channelWindowBudget: config.Backhaul.ChannelWindowBudgetMiB * MiB,
    },
  });
}

/** A login pool of its own over the same site (in this thread). */
export function accessFromData(data: SiteAccessData): SiteAccess {
  const carrier: CarrierSite = {
    ...data.carrier,
    privateKey:
      typeof data.carrier.privateKey === 'string' ? data.carrier.privateKey : Buffer.from(data.carrier.privateKey),
    knownHosts: data.carrier.knownHosts.map((entry) => ({ ...entry, key: Buffer.from(entry.key) })),
  };
  const { host, port } = data.login;
  const login: SshTarget = {
    ...data.login,
    privateKey: carrier.privateKey,
    verifyHostKey: (key) =>
      data.acceptAnyLoginKey ? { ok: true } : verifyHostKey(carrier.knownHosts, host, port, key),
  };
  const pool = new LoginPool(login, data.loginMaxSessions, undefined, carrier.channelWindowMax);
  return { login, pool, carrier, data: { ...data, carrier } };
}
