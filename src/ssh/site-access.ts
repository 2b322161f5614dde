import { readFile } from 'node:fs/promises';
import type { SiteConfig } from '../spec/site-config.js';
import type { CarrierSite } from './carrier.js';
import { type KnownHostEntry, parseKnownHosts, verifyHostKey } from './known-hosts.js';
import { LoginPool } from './login-pool.js';
import type { SshTarget } from './ssh-connect.js';

/** What a session host needs to reach one site: the login pool and the carriers' settings. */
export interface SiteAccess {
  pool: LoginPool;
  carrier: CarrierSite;
  login: SshTarget;
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
  const acceptAny = ssh.InsecureAcceptAnyHostKey && !ssh.KnownHostsFile;
  const keepaliveIntervalMs = config.Backhaul.KeepaliveInterval;
  const login: SshTarget = {
    label: `login ${ssh.LoginHost}:${ssh.Port}`,
    host: ssh.LoginHost,
    port: ssh.Port,
    username: ssh.User,
    privateKey,
    keepaliveIntervalMs,
    verifyHostKey: (key) => (acceptAny ? { ok: true } : verifyHostKey(knownHosts, ssh.LoginHost, ssh.Port, key)),
  };
  return {
    login,
    pool: new LoginPool(login, config.Backhaul.LoginMaxSessions),
    carrier: {
      user: ssh.User,
      privateKey,
      knownHosts,
      sshdPath: ssh.Reverse.SshdPath,
      nodeSshPort: ssh.Reverse.NodeSshPort,
      keepaliveIntervalMs,
    },
  };
}
