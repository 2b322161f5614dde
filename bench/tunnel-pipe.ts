/**
 * Baseline (a) of bench/tunnel.ts, in its own process: a unix socket whose server pipes every
 * connection to a TCP endpoint with the same Node stream plumbing as src/ssh/reverse-forwards.ts
 * (connect first, allowHalfOpen, noDelay, one pipeline per direction), minus SSH.
 *
 *   node --import tsx bench/tunnel-pipe.ts SOCKET_PATH TCP_PORT OWNER_UID OWNER_GID
 *
 * Prints `ready` once listening; the socket is 0600 and owned by OWNER (the job user).
 */
import { chmodSync, chownSync, rmSync } from 'node:fs';
import { connect, createServer } from 'node:net';
import { pipeline } from 'node:stream';

const [socketPath, portText, uidText, gidText] = process.argv.slice(2);
if (!socketPath || !portText || !uidText || !gidText) {
  process.stderr.write('usage: tunnel-pipe.ts SOCKET_PATH TCP_PORT OWNER_UID OWNER_GID\n');
  process.exit(2);
}
const port = Number(portText);

const server = createServer({ allowHalfOpen: true }, (local) => {
  const remote = connect({ host: '127.0.0.1', port, allowHalfOpen: true, noDelay: true });
  const abort = (err: Error | null) => {
    if (!err) return;
    local.destroy();
    remote.destroy();
  };
  remote.once('error', abort);
  remote.once('connect', () => {
    pipeline(local, remote, abort);
    pipeline(remote, local, abort);
  });
});

rmSync(socketPath, { force: true });
server.listen(socketPath, () => {
  chownSync(socketPath, Number(uidText), Number(gidText));
  chmodSync(socketPath, 0o600);
  process.stdout.write('ready\n');
});

const stop = () => {
  server.close();
  rmSync(socketPath, { force: true });
  process.exit(0);
};
process.on('SIGTERM', stop);
process.on('SIGINT', stop);
