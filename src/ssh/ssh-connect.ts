import { Socket } from 'node:net';
import type { Duplex } from 'node:stream';
import { Client, type ConnectConfig } from 'ssh2';
import { fingerprint, type HostKeyVerdict } from './known-hosts.js';
import { SessionError } from './session-error.js';
import { coalesceWrites } from './write-coalescing.js';

export interface SshTarget {
  /** For messages: which hop this is ("login 127.0.0.1:22", "node bhnode1:22"). */
  label: string;
  /**
   * Which machine this is, for what a failure means: the login node unreachable concerns every pod of
   * the site (they wait without spending their relaunches), a compute node only its own pods.
   */
  hop?: 'login' | 'node';
  host: string;
  port: number;
  username: string;
  privateKey: Buffer | string;
  verifyHostKey: (key: Buffer) => HostKeyVerdict;
  /** An established stream to the sshd (a jump channel, an exec channel); else TCP to host:port. */
  sock?: Duplex;
  keepaliveIntervalMs: number;
  keepaliveCountMax?: number;
  readyTimeoutMs?: number;
  /** Login only: how long one `squeue` may take (Network.SSH.SlurmQueryTimeout). */
  slurmQueryTimeoutMs?: number;
}

/** Lines ssh2 logs that carry the server's own reason ("Debug output from server: ..."). */
export type ServerMessages = string[];

/**
 * Opens one SSH connection with the host key verified (no trust on first use) and errors
 * classified. aes128-gcm first: with ssh2's native binding (crypto-path.ts) it is OpenSSL's
 * AES-GCM, as in OpenSSH.
 */
export function connectSsh(target: SshTarget): Promise<{ client: Client; serverMessages: ServerMessages }> {
  const client = new Client();
  const serverMessages: ServerMessages = [];
  let verdict: HostKeyVerdict | undefined;
  let presented: Buffer | undefined;
  const config: ConnectConfig = {
    host: target.host,
    port: target.port,
    username: target.username,
    privateKey: target.privateKey,
    keepaliveInterval: target.keepaliveIntervalMs,
    // ssh2 counts only unanswered keepalives, and a reply can queue behind bulk data on a busy host:
    // three misses (about 6-8 s at the default 2 s) tell a dead hop from a slow one.
    keepaliveCountMax: target.keepaliveCountMax ?? 3,
    readyTimeout: target.readyTimeoutMs ?? 20_000,
    algorithms: {
      cipher: [
        'aes128-gcm@openssh.com',
        'aes256-gcm@openssh.com',
        'aes128-ctr',
        'aes256-ctr',
        'chacha20-poly1305@openssh.com',
      ],
    },
    hostVerifier: (key: Buffer) => {
      presented = key;
      verdict = target.verifyHostKey(key);
      return verdict.ok;
    },
    debug: (line: string) => {
      // Keep only what the server said: it explains refusals that the callback errors do not.
      const at = line.indexOf('Debug output from server: ');
      if (at >= 0) serverMessages.push(line.slice(at + 'Debug output from server: '.length).replace(/^"|"$/g, ''));
    },
  };
  if (target.sock) {
    coalesceWrites(target.sock);
    config.sock = target.sock as unknown as ConnectConfig['sock'];
  }

  return new Promise((resolve, reject) => {
    const onError = (err: Error & { level?: string }) => {
      client.removeListener('ready', onReady);
      client.removeListener('close', onClose);
      // ssh2 may report a second error for the same failure ("Connection lost before handshake" after a
      // timeout); unheard, it would crash the thread and every tunnel in it.
      client.on('error', () => undefined);
      client.end();
      reject(classifyConnectError(target, err, verdict, presented));
    };
    // A transport that closes before the handshake (a jump channel closed by the login node) makes no
    // error in ssh2: without this the connect would wait forever.
    const onClose = () => onError(new Error('the connection closed before the SSH handshake finished'));
    const onReady = () => {
      client.removeListener('error', onError);
      client.removeListener('close', onClose);
      resolve({ client, serverMessages });
    };
    client.once('error', onError);
    client.once('close', onClose);
    client.once('ready', onReady);
    client.connect(config);
    // ssh2 leaves Nagle on. Every packet it writes is whole, but a reply written while an earlier
    // segment is unacknowledged would wait for the peer's delayed ACK (about 40 ms a round trip).
    // Applied to the socket ssh2 made (kept until it connects); a stream handed in as `sock` is not TCP.
    if (!target.sock) {
      client.setNoDelay(true);
      coalesceWrites(tcpSocketOf(client));
    }
  });
}

/**
 * The TCP socket ssh2 made for a connection (set by `connect()`; ssh2 has no public accessor). Checked,
 * so an ssh2 upgrade that renames it fails here, not silently.
 */
export function tcpSocketOf(client: Client): Socket {
  const sock = (client as unknown as { _sock?: unknown })._sock;
  if (!(sock instanceof Socket)) throw new Error('ssh2 Client has no TCP socket in _sock (ssh2 changed?)');
  return sock;
}

function classifyConnectError(
  target: SshTarget,
  err: Error & { level?: string },
  verdict: HostKeyVerdict | undefined,
  presented: Buffer | undefined,
): SessionError {
  if (verdict && !verdict.ok && presented) {
    const what =
      verdict.reason === 'unknown-host'
        ? `no known_hosts entry for ${verdict.name}`
        : `host key ${verdict.reason} for ${verdict.name}`;
    return new SessionError(
      'host-key-mismatch',
      `${target.label}: ${what} (presented ${fingerprint(presented)}); nothing was sent`,
      {
        cause: err,
      },
    );
  }
  if (err.level === 'client-authentication') {
    return new SessionError('auth-refused', `${target.label}: authentication refused for user ${target.username}`, {
      cause: err,
    });
  }
  const kind = target.hop === 'node' ? 'node-unreachable' : 'login-unreachable';
  return new SessionError(kind, `${target.label}: ${err.message}`, { cause: err });
}
