import type { Duplex } from 'node:stream';
import ssh2, { type Client } from 'ssh2';
import type { CarrierMode } from '../contract/carrier-mode.js';
import { type BatchJob, carrierCommands } from '../render/carrier-command.js';
import { BOOTSTRAP_EXIT, HOSTKEY_PREFIX, renderBootstrap } from '../render/userspace-sshd.js';
import { pingMs, RTT_SAMPLES_MS, RttEstimate, sampleRtt } from './channel-window.js';
import { dataPlane } from './data-plane-meter.js';
import { type KnownHostEntry, verifyHostKey } from './known-hosts.js';
import { type LoginHop, sshLoginHop } from './login-hop.js';
import { SessionError } from './session-error.js';
import { connectSsh, type ServerMessages } from './ssh-connect.js';

export interface CarrierSite {
  user: string;
  privateKey: Buffer | string;
  knownHosts: readonly KnownHostEntry[];
  sshdPath: string;
  nodeSshPort: number;
  keepaliveIntervalMs: number;
  /** Backhaul.ChannelWindowMaxMiB in bytes: the most window one channel advertises (channel-window.ts). */
  channelWindowMax?: number;
  /** Backhaul.ChannelWindowBudgetMiB in bytes: window above the base all channels of a thread may hold. */
  channelWindowBudget?: number;
  /** Network.SSH.ConnectTimeout: the batch host's handshake. */
  readyTimeoutMs?: number;
}

export interface CarrierRequest {
  mode: CarrierMode;
  job: BatchJob;
  socketDir: string;
}

/** An SSH connection to an sshd on the batch host, ready for forwards. */
export interface Carrier {
  readonly mode: CarrierMode;
  readonly client: Client;
  readonly serverMessages: ServerMessages;
  /** Settles once, with why the carrier went away (never rejects). */
  readonly lost: Promise<string>;
  /**
   * The round trip to the batch host's sshd in ms, once measured (one keepalive sent as the carrier
   * opens, answered before the first forward request is: no round trip is added); undefined before.
   */
  readonly rttMs: number | undefined;
  /** The last round trip measured (ms): a sample a second after it opened, then every CARRIER_RTT_EVERY_MS. */
  readonly lastRttMs: number | undefined;
  close(): void;
}

/** How often an open carrier's round trip is measured, for backhaul_carrier_rtt_seconds and `status`. */
export const CARRIER_RTT_EVERY_MS = 30_000;

/**
 * Opens the carrier of ARCHITECTURE.md, "Carriers and shadow sessions" through an open login connection:
 * - node: a direct-tcpip channel from the login node to `<batch host>:<NodeSshPort>`;
 * - userspace: the same hop, then a bootstrap and `sshd -i` exec'd over it;
 * - srun: the bootstrap and `sshd -i` exec'd on the login node inside `srun --overlap`.
 * The user-space sshd gets a fresh host key per attempt, pinned from the bootstrap's output, and
 * authorizes a fresh client key made here: nothing long-lived is left on the node.
 */
export async function openCarrier(login: LoginHop, site: CarrierSite, req: CarrierRequest): Promise<Carrier> {
  const commands = carrierCommands(
    req.mode,
    { sshdPath: site.sshdPath, socketDir: req.socketDir, nodeSshPort: site.nodeSshPort },
    req.job,
  );
  const hops: Client[] = [];
  try {
    if (commands.mode === 'node') {
      const { client, serverMessages } = await jumpToNode(login, site, commands.nodeTarget);
      return carrier(req.mode, client, serverMessages, hops);
    }
    let execOn: Pick<LoginHop, 'exec' | 'run'> = login;
    if (commands.mode === 'userspace') {
      const node = await jumpToNode(login, site, commands.nodeTarget);
      hops.push(node.client);
      execOn = sshLoginHop(node.client);
    }
    const clientKey = ssh2.utils.generateKeyPairSync('ed25519');
    const hostKey = await bootstrap(execOn, commands.bootstrapCommand, {
      socketDir: req.socketDir,
      sshdPath: site.sshdPath,
      authorizedKey: clientKey.public,
      clientAliveIntervalS: Math.max(1, Math.round(site.keepaliveIntervalMs / 1000)),
    });
    const channel = await execOn.exec(commands.sshdCommand);
    const sshdLog: string[] = [];
    channel.stderr.on('data', (chunk: Buffer) => {
      if (sshdLog.length < 50) sshdLog.push(chunk.toString('utf8').trim());
    });
    try {
      const { client, serverMessages } = await connectSsh({
        label: `user-space sshd on ${req.job.batchHost}`,
        hop: 'node',
        host: req.job.batchHost,
        port: 0,
        username: site.user,
        privateKey: clientKey.private,
        sock: channel.stream,
        keepaliveIntervalMs: site.keepaliveIntervalMs,
        ...(site.readyTimeoutMs ? { readyTimeoutMs: site.readyTimeoutMs } : {}),
        verifyHostKey: (key) =>
          key.equals(hostKey) ? { ok: true } : { ok: false, reason: 'mismatch', name: 'the bootstrapped host key' },
      });
      return carrier(req.mode, client, serverMessages, hops);
    } catch (err) {
      channel.close();
      if (err instanceof SessionError && err.kind === 'node-unreachable') {
        const said = sshdLog.join(' | ');
        throw new SessionError(
          'carrier-lost',
          `the user-space sshd on ${req.job.batchHost} did not start: ${said || err.message}`,
          {
            cause: err,
          },
        );
      }
      throw err;
    }
  } catch (err) {
    for (const hop of hops) hop.end();
    throw err;
  }
}

function carrier(mode: CarrierMode, client: Client, serverMessages: ServerMessages, hops: Client[]): Carrier {
  let closing = false;
  // Sampled a few times (channel-window.ts): the first ping of a carrier waits behind its own set-up.
  const rtt = new RttEstimate();
  let lastRttMs: number | undefined;
  const measured = (ms: number) => {
    lastRttMs = ms;
    dataPlane.carrierRtt(ms / 1000);
  };
  // The first two samples wait behind the carrier's own set-up: the estimate takes them, the metric does not.
  const stopSampling = sampleRtt(client, rtt, undefined, RTT_SAMPLES_MS, (ms, index) => {
    if (index >= 2) measured(ms);
  });
  const every = setInterval(() => pingMs(client).then(measured, () => undefined), CARRIER_RTT_EVERY_MS);
  every.unref();
  client.once('close', () => clearInterval(every));
  const lost = new Promise<string>((resolve) => {
    // `on`, not `once`: ssh2 may emit a second error (e.g. a keepalive timeout after a reset).
    client.on('error', (err: Error) => resolve(closing ? 'closed' : err.message));
    client.once('close', () => resolve(closing ? 'closed' : 'the connection to the batch host closed'));
    for (const hop of hops) hop.once('close', () => resolve(closing ? 'closed' : 'the hop to the batch host closed'));
  });
  return {
    mode,
    client,
    serverMessages,
    lost,
    get rttMs() {
      return rtt.ms;
    },
    get lastRttMs() {
      return lastRttMs;
    },
    close() {
      closing = true;
      stopSampling();
      clearInterval(every);
      client.end();
      for (const hop of hops) hop.end();
    },
  };
}

async function jumpToNode(
  login: LoginHop,
  site: CarrierSite,
  target: { host: string; port: number },
): Promise<{ client: Client; serverMessages: ServerMessages }> {
  const channel: Duplex = await login.jump(target.host, target.port);
  return connectSsh({
    label: `node sshd ${target.host}:${target.port}`,
    hop: 'node',
    host: target.host,
    port: target.port,
    username: site.user,
    privateKey: site.privateKey,
    sock: channel,
    keepaliveIntervalMs: site.keepaliveIntervalMs,
    ...(site.readyTimeoutMs ? { readyTimeoutMs: site.readyTimeoutMs } : {}),
    verifyHostKey: (key) => verifyHostKey(site.knownHosts, target.host, target.port, key),
  });
}

const BOOTSTRAP_KIND: Readonly<Record<number, SessionError['kind']>> = {
  [BOOTSTRAP_EXIT.dirMissing]: 'job-not-running',
};

/** Runs the bootstrap; returns the fresh host key's wire blob to pin. */
async function bootstrap(
  on: Pick<LoginHop, 'run'>,
  command: string,
  input: Parameters<typeof renderBootstrap>[0],
): Promise<Buffer> {
  const result = await on.run(command, { stdin: renderBootstrap(input), timeoutMs: 60_000 });
  const line = result.stdout.split('\n').find((l) => l.startsWith(`${HOSTKEY_PREFIX} `));
  if (result.code !== 0 || !line) {
    const why = result.stderr.trim().split('\n').slice(-3).join(' | ') || `exit status ${result.code}`;
    const kind = BOOTSTRAP_KIND[result.code ?? -1] ?? 'bootstrap-failed';
    throw new SessionError(kind, `carrier bootstrap on the batch host failed: ${why}`);
  }
  const [, , blob = ''] = line.trim().split(/\s+/);
  return Buffer.from(blob, 'base64');
}
