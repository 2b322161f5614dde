/**
 * The tunnels the benchmarks compare, set up on the loopback site: OpenSSH `ssh -J -R`, backhaul's
 * carrier with its reverse forwards, and the job-side relay in front of either. Each registers its
 * own cleanup (harness.ts), so a benchmark that fails half-way leaves nothing behind.
 */
import { randomBytes } from 'node:crypto';
import { chmodSync } from 'node:fs';
import { copyFile, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { bindAddress } from '../src/contract/derivations.js';
import { type Carrier, openCarrier } from '../src/ssh/carrier.js';
import type { LoginLease } from '../src/ssh/login-pool.js';
import { type ForwardTarget, ReverseForwards } from '../src/ssh/reverse-forwards.js';
import type { SiteAccess } from '../src/ssh/site-access.js';
import { loopbackDialer } from '../tools/sandbox/dial-rules.js';
import type { LoopbackSite } from '../tools/sandbox/loopback-site.js';
import { freePort, isAlive } from '../tools/sandbox/sshd.js';
import type { TestUser } from '../tools/sandbox/users.js';
import { type Child, onCleanup, PYTHON, ROOT, say, start, waitForSocket } from './harness.js';

/** The one cipher both sshds accept in the benchmarks: ssh2 and OpenSSH use it on every hop. */
export const CIPHER = 'aes128-gcm@openssh.com';

/** sshd_config lines that pin the cipher on the loopback site's login and node sshds. */
export const PINNED_CIPHER = [`Ciphers ${CIPHER}`];

/** A unix socket on the node and the cluster-side TCP port it reaches (on 127.0.0.1). */
export interface Forward {
  socket: string;
  port: number;
}

/** The site's own ssh_config with the cipher pinned first: ProxyJump hops read -F, not -o/-c. */
export async function pinnedSshConfig(site: LoopbackSite, work: string): Promise<string> {
  const config = join(work, 'ssh_config');
  if (!(await stat(config).catch(() => undefined))) {
    await writeFile(config, `Ciphers ${CIPHER}\n${await readFile(site.sshConfigPath, 'utf8')}`, { mode: 0o644 });
  }
  return config;
}

/**
 * (b) OpenSSH: `ssh -J bh-login -N -R <sock>:127.0.0.1:<port> ... bhjob@bhnode1`, run as root with the
 * site's key; checks from `-v` that both hops negotiated CIPHER.
 */
export async function openSshReverse(
  site: LoopbackSite,
  work: string,
  user: TestUser,
  forwards: readonly Forward[],
): Promise<Child> {
  const config = await pinnedSshConfig(site, work);
  const ssh = start('ssh -J -R', 'ssh', [
    '-v',
    '-F',
    config,
    '-c',
    CIPHER,
    '-J',
    'bh-login',
    '-N',
    '-o',
    'ExitOnForwardFailure=yes',
    ...forwards.flatMap((f) => ['-R', `${f.socket}:127.0.0.1:${f.port}`]),
    `${user.name}@${site.nodeHost}`,
  ]);
  for (const f of forwards) {
    await waitForSocket(f.socket, 30_000, () => isAlive(ssh.pid));
    onCleanup(f.socket, () => rm(f.socket, { force: true }));
  }
  // -v is passed on to the jump's ssh: expect the cipher in both directions on both hops.
  const said = ssh.stderr().match(/cipher: \S+/g) ?? [];
  say(`OpenSSH negotiated: ${[...new Set(said)].join(', ')} (${said.length} lines over both hops)`);
  if (said.length < 4 || said.some((s) => s !== `cipher: ${CIPHER}`)) {
    throw new Error(`OpenSSH did not use ${CIPHER} on both hops: ${said.join(', ')}`);
  }
  return ssh;
}

export interface BackhaulTunnel {
  carrier: Carrier;
  forwards: ReverseForwards;
}

/** (c) backhaul: a carrier and its reverse forwards, as a shadow session holds them. */
export async function openBackhaulForwards(
  access: SiteAccess,
  site: LoopbackSite,
  opts: {
    mode: 'node' | 'srun';
    jobId?: string;
    socketDir: string;
    forwards: readonly Forward[];
  },
): Promise<BackhaulTunnel> {
  const { mode } = opts;
  const lease: LoginLease = await access.pool.acquire(mode === 'srun' ? 1 : 0);
  onCleanup(`${mode} login lease`, () => lease.release());
  const carrier = await openCarrier(lease.hop, access.carrier, {
    mode,
    job: { jobId: opts.jobId ?? '0', batchHost: site.nodeHost },
    socketDir: opts.socketDir,
  });
  onCleanup(`${mode} carrier`, () => carrier.close());
  const targets: ForwardTarget[] = opts.forwards.map((f) => ({
    socketPath: f.socket,
    dialHost: '127.0.0.1',
    port: f.port,
  }));
  const log = {
    warn: (m: string, d?: Record<string, unknown>) => say(`forward warning: ${m} ${JSON.stringify(d ?? {})}`),
  };
  const forwards = new ReverseForwards(carrier.client, targets, carrier.serverMessages, log, {
    dialer: loopbackDialer(),
  });
  await forwards.establish();
  onCleanup(`${mode} forwards`, async () => {
    await forwards.cancel();
    await Promise.all(opts.forwards.map((f) => rm(f.socket, { force: true })));
  });
  void carrier.lost.then((why) => {
    if (why !== 'closed') say(`${mode} carrier lost: ${why}`);
  });
  for (const f of opts.forwards) await waitForSocket(f.socket, 10_000, () => true);
  return { carrier, forwards };
}

/**
 * The job-side relay (src/job/relay.py) in front of forwarded sockets, as the prelude and the fleet
 * start it: the boot (relay-boot.py, next to RELAY) binds the pod's derived loopback address as the job
 * user (it passes only peers of its own uid), each forward on its own cluster port, and execs the relay
 * delivered into the socket dir. RELAY is a copy readable by the job user.
 */
export async function startRelay(
  user: TestUser,
  relay: string,
  socketDir: string,
  forwards: readonly Forward[],
): Promise<{ address: string; ports: number[]; child: Child }> {
  const uid = `bench-${randomBytes(6).toString('hex')}`;
  const address = bindAddress(uid);
  const ports = await Promise.all(forwards.map(() => freePort(address)));
  const boot = join(dirname(relay), 'relay-boot.py');
  await copyFile(join(ROOT, 'src', 'job', 'relay-boot.py'), boot);
  chmodSync(boot, 0o644);
  await copyFile(relay, join(socketDir, 'relay.py'));
  chmodSync(join(socketDir, 'relay.py'), 0o644);
  const child = start(
    'relay',
    PYTHON,
    [
      boot,
      'serve',
      '--foreground',
      `--uid=${uid}`,
      `--socket-dir=${socketDir}`,
      `--forward=${forwards.map((f, i) => `${ports[i]}=${f.socket}`).join(' ')}`,
      `--bind=${address}`,
    ],
    user,
  );
  await child.line(/^isolation /, 15_000);
  return { address, ports, child };
}
