import fsp from 'node:fs/promises';
import type { Client } from 'ssh2';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { execCapture } from '../../src/ssh/remote-exec.js';
import { connectSsh } from '../../src/ssh/ssh-connect.js';
import { type ClientKey, generateClientKey, type SshdInstance, startSshd } from '../../tools/sandbox/sshd.js';
import { ensureUser, JOB_USER } from '../../tools/sandbox/users.js';

/**
 * execCapture against a real sshd, with this process made as slow to read as it is in CI's two lanes: the
 * command's output, its exit status and the channel's close come in the same read as the exec's
 * confirmation. ssh2 emits the status from inside its packet loop; a listener attached after the channel
 * was handed over missed it, and the command read as one that ended without a status (seen in CI as
 * `srun --version` and `test -d` "without an exit status").
 */

let sshd: SshdInstance;
let key: ClientKey;
let client: Client;

beforeAll(async () => {
  const user = await ensureUser(JOB_USER);
  key = await generateClientKey();
  sshd = await startSshd({
    name: 'remote-exec',
    allowStreamLocal: false,
    allowTcpForwarding: 'no',
    authorizedKeys: [{ user: user.name, keys: [key.publicKey] }],
  });
  // The fleet's own connect, the test sshd's host key pinned.
  const hostKey = Buffer.from(sshd.hostKeyPub.split(' ')[1] ?? '', 'base64');
  ({ client } = await connectSsh({
    label: `remote-exec ${sshd.host}:${sshd.port}`,
    host: sshd.host,
    port: sshd.port,
    username: user.name,
    privateKey: await fsp.readFile(key.privateKeyPath),
    keepaliveIntervalMs: 0,
    verifyHostKey: (presented) =>
      presented.equals(hostKey) ? { ok: true } : { ok: false, reason: 'mismatch', name: 'the test sshd' },
  }));
}, 30_000);

afterAll(async () => {
  client?.end();
  await sshd?.stop();
  await key?.remove();
});

/** Keeps this process's event loop from reading its socket for MS right after the exec request is sent. */
function busyAfterExec(c: Client, ms: number): () => void {
  const protocol = (c as unknown as { _protocol: { exec: (...a: unknown[]) => unknown } })._protocol;
  const exec = protocol.exec;
  protocol.exec = function (this: unknown, ...args: unknown[]) {
    const r = exec.apply(this, args);
    setImmediate(() => {
      const until = performance.now() + ms;
      while (performance.now() < until) {}
    });
    return r;
  };
  return () => {
    protocol.exec = exec;
  };
}

describe('execCapture', () => {
  it('keeps the exit status of a command that ended before the channel was handed over', async () => {
    const restore = busyAfterExec(client, 300);
    try {
      const results = [];
      for (let i = 0; i < 5; i++) results.push(await execCapture(client, 'echo said; echo warned >&2; exit 3'));
      const seen = JSON.stringify(results);
      expect(
        results.map((r) => [r.code, r.signal, r.stdout, r.stderr]),
        seen,
      ).toEqual(Array(5).fill([3, undefined, 'said\n', 'warned\n']));
    } finally {
      restore();
    }
  }, 30_000);
});
