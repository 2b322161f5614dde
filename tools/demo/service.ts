import { createHash } from 'node:crypto';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { createServer as createTcpServer, type Server as NetServer, type Socket } from 'node:net';

/**
 * The in-cluster service of the demo: a small S3-like HTTP server answering as the Service
 * `minio.demo.svc.cluster.local:9000`. That name resolves nowhere on this machine: the fleet reaches it
 * through `Backhaul.HostAliases` (name → the loopback address it listens on), as a fleet inside a
 * cluster would through the cluster's DNS. It counts every byte its clients move.
 */
export const SERVICE_NAME = 'minio';
export const SERVICE_NAMESPACE = 'demo';
export const SERVICE_PORT = 9000;

export function serviceFqdn(clusterDomain = 'cluster.local'): string {
  return `${SERVICE_NAME}.${SERVICE_NAMESPACE}.svc.${clusterDomain}`;
}

export interface ServiceTraffic {
  requests: number;
  /** Bytes received from clients (request lines, headers and bodies). */
  bytesIn: number;
  bytesOut: number;
}

export interface DemoService {
  fqdn: string;
  port: number;
  /** The loopback address it listens on (127.0.0.0/24, where no pod's bind address ever falls). */
  address: string;
  /** The greeting it answers `GET /` with. */
  greeting: string;
  traffic(): ServiceTraffic;
  close(): Promise<void>;
}

function sha256(data: Buffer): string {
  return createHash('sha256').update(data).digest('hex');
}

async function listenOnFreeAddress(server: Server | NetServer, port: number): Promise<string> {
  let lastError: Error | undefined;
  for (let attempt = 0; attempt < 20; attempt += 1) {
    const address = `127.0.0.${2 + Math.floor(Math.random() * 252)}`;
    try {
      await new Promise<void>((resolve, reject) => {
        server.once('error', reject);
        server.listen(port, address, () => {
          server.removeListener('error', reject);
          resolve();
        });
      });
      return address;
    } catch (error) {
      lastError = error as Error;
      if ((error as NodeJS.ErrnoException).code !== 'EADDRINUSE') break;
    }
  }
  throw new Error(`cannot listen on port ${port} of a 127.0.0.x address: ${lastError?.message}`);
}

export async function startService(clusterDomain = 'cluster.local'): Promise<DemoService> {
  const fqdn = serviceFqdn(clusterDomain);
  const greeting = `Hello from ${fqdn}:${SERVICE_PORT}, a service inside the cluster`;
  const objects = new Map<string, Buffer>();
  const traffic: ServiceTraffic = { requests: 0, bytesIn: 0, bytesOut: 0 };
  const open = new Set<Socket>();

  const handle = (req: IncomingMessage, res: ServerResponse, body: Buffer) => {
    traffic.requests += 1;
    const path = new URL(req.url ?? '/', 'http://x').pathname;
    const reply = (status: number, text: string, data?: Buffer) => {
      res.writeHead(status, { 'content-type': data ? 'application/octet-stream' : 'text/plain' });
      res.end(data ?? `${text}\n`);
    };
    if (req.method === 'GET' && path === '/') return reply(200, greeting);
    if (req.method === 'PUT' && path.length > 1) {
      objects.set(path, body);
      return reply(200, `stored ${body.length} bytes as ${path}, sha256 ${sha256(body).slice(0, 16)}`);
    }
    if (req.method === 'GET' && objects.has(path)) return reply(200, '', objects.get(path));
    return reply(404, `no ${path} here`);
  };

  const server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (chunk: Buffer) => chunks.push(chunk));
    req.on('end', () => handle(req, res, Buffer.concat(chunks)));
  });
  server.on('connection', (socket) => {
    open.add(socket);
    socket.once('close', () => {
      open.delete(socket);
      traffic.bytesIn += socket.bytesRead;
      traffic.bytesOut += socket.bytesWritten;
    });
  });
  const address = await listenOnFreeAddress(server, SERVICE_PORT);
  return {
    fqdn,
    port: SERVICE_PORT,
    address,
    greeting,
    traffic: () => {
      const now = { ...traffic };
      for (const s of open) {
        now.bytesIn += s.bytesRead;
        now.bytesOut += s.bytesWritten;
      }
      return now;
    },
    close: async () => {
      for (const s of open) s.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

/**
 * Two database Services on one port, as a pod may need them: `pg-a` and `pg-b` of the demo namespace,
 * both on 5432. Each is a stand-in (a PostgreSQL server is more than the demo should install) that
 * answers every line with `<its name>: <the line>`, so the workload can tell which one it reached. Each
 * listens on its own 127.0.0.x address, as each would have its own ClusterIP.
 */
export const DATABASE_NAMES = ['pg-a', 'pg-b'] as const;
export const DATABASE_PORT = 5432;

export interface DemoDatabase {
  name: string;
  fqdn: string;
  port: number;
  address: string;
  /** Lines answered so far. */
  answered(): number;
  close(): Promise<void>;
}

export async function startDatabases(clusterDomain = 'cluster.local'): Promise<DemoDatabase[]> {
  const started: DemoDatabase[] = [];
  try {
    for (const name of DATABASE_NAMES) started.push(await startDatabase(name, clusterDomain));
  } catch (error) {
    await Promise.all(started.map((db) => db.close()));
    throw error;
  }
  return started;
}

async function startDatabase(name: string, clusterDomain: string): Promise<DemoDatabase> {
  let answered = 0;
  const open = new Set<Socket>();
  const server = createTcpServer((socket) => {
    open.add(socket);
    socket.once('close', () => open.delete(socket));
    socket.on('error', () => undefined);
    let pending = '';
    socket.setEncoding('utf8').on('data', (chunk: string) => {
      pending += chunk;
      for (let end = pending.indexOf('\n'); end >= 0; end = pending.indexOf('\n')) {
        answered += 1;
        socket.write(`${name}: ${pending.slice(0, end)}\n`);
        pending = pending.slice(end + 1);
      }
    });
  });
  const address = await listenOnFreeAddress(server, DATABASE_PORT);
  return {
    name,
    fqdn: `${name}.${SERVICE_NAMESPACE}.svc.${clusterDomain}`,
    port: DATABASE_PORT,
    address,
    answered: () => answered,
    close: async () => {
      for (const s of open) s.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}
