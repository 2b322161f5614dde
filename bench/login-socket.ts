import { connect, type Socket } from 'node:net';

/**
 * EXPERIMENT for bench/tunnel.ts (BENCH_EXPERIMENT=…:LOGIN): the login connection's TCP socket made here instead of by ssh2, with TCP_NODELAY and,
 * unless 'nodelay', corked from its first write until the next tick / the end of the poll phase, so
 * that the SSH packets ssh2 writes one by one (<= 32 KiB each, and the small tail of every inner
 * packet that did not fit the outer one) leave in one writev.
 */
export async function loginSocket(host: string, port: number, mode: 'nodelay' | 'tick' | 'immediate'): Promise<Socket> {
  const socket = connect({ host, port, noDelay: true });
  await new Promise<void>((resolve, reject) => {
    socket.once('connect', resolve);
    socket.once('error', reject);
  });
  if (mode === 'nodelay') return socket;
  const write = socket.write.bind(socket) as (...args: unknown[]) => boolean;
  let corked = false;
  const uncork = () => {
    corked = false;
    socket.uncork();
  };
  socket.write = ((...args: unknown[]) => {
    if (!corked) {
      corked = true;
      socket.cork();
      if (mode === 'tick') process.nextTick(uncork);
      else setImmediate(uncork);
    }
    return write(...args);
  }) as typeof socket.write;
  return socket;
}
