import * as fs from 'node:fs';
import * as fsp from 'node:fs/promises';
import * as os from 'node:os';
import * as path from 'node:path';
import { stringify as toYaml } from 'yaml';
import { ensureSlurm, SLURM_NODE } from './slurm.js';
import {
  type ClientKey,
  generateClientKey,
  knownHostsFile,
  type SshdInstance,
  startSshd,
  type TcpForwarding,
} from './sshd.js';
import { ensureUser, JOB_USER, type TestUser } from './users.js';

/**
 * The whole HPC site on loopback (ARCHITECTURE.md, "How it is tested"), for the integration tests, the benches and the demo (`npm run demo`); in tools/, not in the package: the real Slurm (node `bhnode1` -> 127.0.0.1), a
 * "login" sshd on 127.0.0.1 and the compute node's own sshd, reached by the name bhnode1 (it listens
 * on 127.0.0.1 too). Both authorize one fresh client key for the job user `bhjob`; a known_hosts
 * file pins both host keys (login as `[127.0.0.1]:port`, node as `[bhnode1]:port`), and a site
 * configuration (src/contract/site-config.ts) points at all of it.
 */

export type NodeForwarding = 'allowed' | 'refused';

export interface LoopbackSiteOptions {
  /**
   * 'allowed': the node sshd has `AllowStreamLocalForwarding yes` + `AllowTcpForwarding remote`.
   * 'refused': `AllowStreamLocalForwarding no` + `AllowTcpForwarding no` (the client is told
   * "Server has disabled streamlocal forwarding.").
   */
  nodeForwarding?: NodeForwarding;
  /** Bring up Slurm too (default true). */
  slurm?: boolean;
  /** The job user (default bhjob). */
  user?: string;
  /** Extra sshd_config lines for the login / node sshd (see startSshd's `extra`). */
  loginExtra?: string[];
  nodeExtra?: string[];
  /** LogLevel of both sshds (see startSshd's `logLevel`). */
  logLevel?: 'VERBOSE' | 'DEBUG1' | 'DEBUG2';
  /**
   * Both sshds in this network namespace (bench:wan: the site on the far side of an emulated WAN), on
   * fixed ports: the login sshd on `loginListen`, the node sshd on the namespace's 127.0.0.1.
   */
  netns?: { name: string; loginListen: string; loginPort: number; nodePort: number };
}

/** The site configuration as data (before defaults), matching src/contract/site-config.ts. */
/**
 * Everything in a loopback site is on 127.0.0.1 (the endpoints the tests and the demo dial too): the
 * endpoint policy must name loopback, which it never opens otherwise.
 */
export const LOOPBACK_ENDPOINT_POLICY = { Allow: { CIDRs: ['127.0.0.0/8'] } };
/**
 * A site without a cluster (the demo, the fleet's tests: pods are sent to the control role directly):
 * no namespace to label, no NetworkPolicies to read, so the cluster checks are off.
 */
export const NO_CLUSTER_CHECKS = { NamespaceLabel: '', NetworkPolicies: false } as const;

export interface LoopbackSiteConfig {
  Network: {
    SSH: {
      LoginHost: string;
      Port: number;
      User: string;
      KeyFile: string;
      KnownHostsFile: string;
      Reverse: {
        Enabled: boolean;
        Sshd: 'node';
        NodeExec: 'ssh';
        NodeSshPort: number;
      };
    };
  };
  Backhaul: { EndpointPolicy: typeof LOOPBACK_ENDPOINT_POLICY; Kubernetes: typeof NO_CLUSTER_CHECKS };
}

export interface LoopbackSite {
  user: TestUser;
  nodeForwarding: NodeForwarding;
  /** 127.0.0.1 */
  loginHost: string;
  loginPort: number;
  /** bhnode1: Slurm's node name and the name the node sshd is reached by. */
  nodeHost: string;
  nodePort: number;
  login: SshdInstance;
  node: SshdInstance;
  clientKey: ClientKey;
  /** Private key of the client (root-owned 0600); its public half is authorized for `user` on both sshds. */
  keyFile: string;
  knownHostsPath: string;
  /**
   * An OpenSSH client config: `Host bh-login` (127.0.0.1:loginPort) and `Host bhnode1` (port nodePort,
   * ProxyJump bh-login), and for every host the key, the known_hosts, StrictHostKeyChecking yes and
   * BatchMode yes. Use it with `-F`: ProxyJump hops do not inherit `-o` options, only `-F`.
   */
  sshConfigPath: string;
  /** `bhjob@127.0.0.1:<loginPort>`, the value for `ssh -J`. */
  jumpSpec: string;
  /** Site configuration data, its YAML text and a file holding it. */
  siteConfig: LoopbackSiteConfig;
  siteConfigYaml: string;
  siteConfigPath: string;
  /** Temp dir holding known_hosts, ssh_config and site.yaml. */
  dir: string;
  /** Arguments for `ssh` to run COMMAND on the node through the login jump: ['-F', cfg, '-J', jump, '-p', port, 'bhjob@bhnode1', ...]. */
  sshToNodeArgs(command?: string[]): string[];
  /** Stops both sshds and removes every file of the site. Slurm stays up (shared). Idempotent. */
  stop(): Promise<void>;
}

const LOGIN_ALIAS = 'bh-login';

const openSites = new Set<string>();
process.on('exit', () => {
  for (const dir of openSites) {
    try {
      fs.rmSync(dir, { recursive: true, force: true });
    } catch {
      // exiting anyway
    }
  }
});

export async function startLoopbackSite(options: LoopbackSiteOptions = {}): Promise<LoopbackSite> {
  const nodeForwarding = options.nodeForwarding ?? 'allowed';
  const [user] = await Promise.all([
    ensureUser(options.user ?? JOB_USER),
    options.slurm === false ? Promise.resolve('') : ensureSlurm(),
  ]);
  const clientKey = await generateClientKey({ comment: `backhaul-loopback-${user.name}` });
  const dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'bh-site-'));
  openSites.add(dir);
  openSites.add(clientKey.dir);
  const started: SshdInstance[] = [];
  try {
    const authorizedKeys = [{ user: user.name, keys: [clientKey.publicKey] }];
    const ns = options.netns;
    const loginHost = ns?.loginListen ?? '127.0.0.1';
    const placed = (port: number | undefined) => (ns ? { netns: ns.name, port } : {});
    const nodeTcp: TcpForwarding = nodeForwarding === 'allowed' ? 'remote' : 'no';
    const [login, node] = await Promise.all([
      startSshd({
        name: 'login',
        listen: loginHost,
        ...placed(ns?.loginPort),
        // The login node passes carriers on with direct-tcpip (`ssh -J`, ssh2 forwardOut): local only.
        allowStreamLocal: false,
        allowTcpForwarding: 'local',
        authorizedKeys,
        extra: options.loginExtra ?? [],
        logLevel: options.logLevel,
      }).then((s) => {
        started.push(s);
        return s;
      }),
      startSshd({
        name: nodeForwarding === 'allowed' ? 'node' : 'node-refusing',
        listen: '127.0.0.1',
        ...placed(ns?.nodePort),
        allowStreamLocal: nodeForwarding === 'allowed',
        allowTcpForwarding: nodeTcp,
        authorizedKeys,
        extra: options.nodeExtra ?? [],
        logLevel: options.logLevel,
      }).then((s) => {
        started.push(s);
        return s;
      }),
    ]);

    const knownHostsPath = path.join(dir, 'known_hosts');
    await knownHostsFile(
      [
        { host: loginHost, port: login.port, key: login.hostKeyPub },
        { host: SLURM_NODE, port: node.port, key: node.hostKeyPub },
      ],
      knownHostsPath,
    );

    const sshConfigPath = path.join(dir, 'ssh_config');
    await fsp.writeFile(
      sshConfigPath,
      [
        `Host ${LOGIN_ALIAS}`,
        `  HostName ${loginHost}`,
        `  Port ${login.port}`,
        `Host ${SLURM_NODE}`,
        `  Port ${node.port}`,
        `  ProxyJump ${LOGIN_ALIAS}`,
        'Host *',
        `  User ${user.name}`,
        `  IdentityFile ${clientKey.privateKeyPath}`,
        '  IdentitiesOnly yes',
        '  IdentityAgent none',
        `  UserKnownHostsFile ${knownHostsPath}`,
        '  GlobalKnownHostsFile /dev/null',
        '  StrictHostKeyChecking yes',
        '  UpdateHostKeys no',
        '  CheckHostIP no',
        '  BatchMode yes',
        '  ConnectTimeout 10',
        '',
      ].join('\n'),
      { mode: 0o644 },
    );

    const siteConfig: LoopbackSiteConfig = {
      Network: {
        SSH: {
          LoginHost: loginHost,
          Port: login.port,
          User: user.name,
          KeyFile: clientKey.privateKeyPath,
          KnownHostsFile: knownHostsPath,
          Reverse: { Enabled: true, Sshd: 'node', NodeExec: 'ssh', NodeSshPort: node.port },
        },
      },
      Backhaul: { EndpointPolicy: LOOPBACK_ENDPOINT_POLICY, Kubernetes: NO_CLUSTER_CHECKS },
    };
    const siteConfigYaml = toYaml(siteConfig);
    const siteConfigPath = path.join(dir, 'site.yaml');
    await fsp.writeFile(siteConfigPath, siteConfigYaml, { mode: 0o644 });

    const jumpSpec = `${user.name}@${loginHost}:${login.port}`;
    let stopping: Promise<void> | undefined;
    return {
      user,
      nodeForwarding,
      loginHost,
      loginPort: login.port,
      nodeHost: SLURM_NODE,
      nodePort: node.port,
      login,
      node,
      clientKey,
      keyFile: clientKey.privateKeyPath,
      knownHostsPath,
      sshConfigPath,
      jumpSpec,
      siteConfig,
      siteConfigYaml,
      siteConfigPath,
      dir,
      sshToNodeArgs: (command = []) => [
        '-F',
        sshConfigPath,
        '-J',
        jumpSpec,
        '-p',
        String(node.port),
        `${user.name}@${SLURM_NODE}`,
        ...command,
      ],
      stop: () => {
        stopping ??= (async () => {
          await Promise.all([login.stop(), node.stop()]);
          await clientKey.remove();
          await fsp.rm(dir, { recursive: true, force: true });
          openSites.delete(dir);
          openSites.delete(clientKey.dir);
        })();
        return stopping;
      },
    };
  } catch (error) {
    await Promise.all(started.map((s) => s.stop()));
    await clientKey.remove();
    await fsp.rm(dir, { recursive: true, force: true });
    openSites.delete(dir);
    openSites.delete(clientKey.dir);
    throw error;
  }
}
