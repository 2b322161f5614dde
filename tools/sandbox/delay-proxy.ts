import { createConnection, createServer, type Server, type Socket } from 'node:net';

/**
 * A TCP proxy on loopback that holds every chunk for DELAY ms in each direction: a path with a round
 * trip of 2 × delay for what measures it (an SSH ping, a window sized to the RTT), in a test process
 * that cannot enter bench:wan's namespaces. Order is kept and it pushes back: a direction with more
 * than HIGH bytes waiting stops reading until its writer drains.
 */
export interface DelayProxy {
  readonly port: number;
  /** Connections it has taken so far. */
  readonly connections: number;
  close(): Promise<void>;
}

const HIGH = 4 * 1024 * 1024;

function delayed(from: Socket, to: Socket, delayMs: number): void {
  const queue: { at: number; data: Buffer }[] = [];
  let queued = 0;
  let scheduled = false;
  const schedule = (ms: number) => {
    if (scheduled) return;
    scheduled = true;
    setTimeout(flush, ms);
  };
  let ended = false;
  const flush = () => {
    scheduled = false;
    const now = performance.now();
    while (queue.length > 0 && (queue[0]?.at ?? 0) <= now) {
      const { data } = queue.shift() as { data: Buffer };
      queued -= data.length;
      to.write(data);
    }
    if (queue.length > 0) schedule(Math.max(0, (queue[0]?.at ?? now) - now));
    else if (ended) to.end();
    if (from.isPaused() && queued < HIGH / 4 && !to.writableNeedDrain) from.resume();
  };
  from.on('data', (data: Buffer) => {
    queue.push({ at: performance.now() + delayMs, data });
    queued += data.length;
    schedule(delayMs);
    if (queued > HIGH || to.writableNeedDrain) from.pause();
  });
  to.on('drain', () => {
    if (from.isPaused() && queued < HIGH / 4) from.resume();
  });
  from.on('end', () => {
    ended = true;
    schedule(delayMs);
  });
}

export async function startDelayProxy(target: { host: string; port: number }, delayMs: number): Promise<DelayProxy> {
  const sockets = new Set<Socket>();
  let connections = 0;
  const server: Server = createServer({ allowHalfOpen: true }, (client) => {
    connections += 1;
    const upstream = createConnection({ host: target.host, port: target.port, allowHalfOpen: true });
    for (const s of [client, upstream]) {
      sockets.add(s);
      s.setNoDelay(true);
      s.on('close', () => sockets.delete(s));
    }
    // One side gone: the other goes too (a reset is not delayed: tests cut, they do not measure it).
    client.on('error', () => upstream.destroy());
    upstream.on('error', () => client.destroy());
    client.on('close', () => upstream.destroy());
    upstream.on('close', () => client.destroy());
    delayed(client, upstream, delayMs);
    delayed(upstream, client, delayMs);
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, '127.0.0.1', resolve);
  });
  const address = server.address();
  if (!address || typeof address === 'string') throw new Error('delay proxy: no port');
  return {
    port: address.port,
    get connections() {
      return connections;
    },
    close: () =>
      new Promise<void>((resolve) => {
        for (const s of sockets) s.destroy();
        server.close(() => resolve());
      }),
  };
}
