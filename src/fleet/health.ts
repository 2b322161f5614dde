import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';

export interface HealthCheck {
  name: string;
  /** Resolves true when healthy; a rejection or a timeout counts as unhealthy. */
  check: () => Promise<boolean> | boolean;
}

export interface HealthServer {
  port: number;
  close(): Promise<void>;
}

const CHECK_TIMEOUT_MS = 2_000;

async function run(check: HealthCheck): Promise<boolean> {
  let timer: NodeJS.Timeout | undefined;
  try {
    return await Promise.race([
      Promise.resolve().then(() => check.check()),
      new Promise<boolean>((resolve) => {
        timer = setTimeout(() => resolve(false), CHECK_TIMEOUT_MS);
      }),
    ]);
  } catch {
    return false;
  } finally {
    if (timer) clearTimeout(timer);
  }
}

/**
 * Plain-HTTP probes for the fleet's pods (`backhaul worker --health-port`): GET /livez runs the liveness
 * checks (none fail while the process can still do its work: a process that cannot is restarted) and
 * GET /readyz the readiness checks (Redis reachable, the pod watcher synced); each answers 503 with the
 * failing ones. /healthz is /readyz. GET /metrics: Prometheus exposition of the member's metrics
 * (src/metrics/fleet-metrics.ts).
 */
export async function startHealthServer(
  port: number,
  address: string,
  checks: { ready: HealthCheck[]; live?: HealthCheck[] },
  metrics?: () => Promise<{ contentType: string; body: string }>,
): Promise<HealthServer> {
  const answer = (list: HealthCheck[], failedStatus: string, reply: (status: number, body: unknown) => void) => {
    void Promise.all(list.map(async (c) => [c.name, await run(c)] as const)).then((results) => {
      const failing = results.filter(([, ok]) => !ok).map(([name]) => name);
      reply(failing.length === 0 ? 200 : 503, { status: failing.length === 0 ? 'ok' : failedStatus, failing });
    });
  };
  const server: Server = createServer((req, res) => {
    const path = (req.url ?? '/').split('?')[0];
    const reply = (status: number, body: unknown) => {
      const text = JSON.stringify(body);
      res.writeHead(status, { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(text) });
      res.end(text);
    };
    if (req.method !== 'GET' && req.method !== 'HEAD') return reply(405, { error: 'use GET' });
    if (path === '/livez') return answer(checks.live ?? [], 'not live', reply);
    if (path === '/readyz' || path === '/healthz') return answer(checks.ready, 'not ready', reply);
    if (path === '/metrics' && metrics) {
      void metrics().then(
        ({ contentType, body }) => {
          res.writeHead(200, { 'Content-Type': contentType, 'Content-Length': Buffer.byteLength(body) });
          res.end(body);
        },
        (err: unknown) => reply(500, { error: err instanceof Error ? err.message : String(err) }),
      );
      return;
    }
    reply(404, { error: `GET /livez, /readyz${metrics ? ' or /metrics' : ''}` });
  });
  server.requestTimeout = 10_000;
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, address, () => {
      server.off('error', reject);
      resolve();
    });
  });
  return {
    port: (server.address() as AddressInfo).port,
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      }),
  };
}
