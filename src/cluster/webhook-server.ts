import { createHash, X509Certificate } from 'node:crypto';
import { type FSWatcher, watch as watchFs } from 'node:fs';
import { readFile } from 'node:fs/promises';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { createServer, type Server } from 'node:https';
import type { AddressInfo } from 'node:net';
import { dirname } from 'node:path';
import { createSecureContext } from 'node:tls';
import type { SiteConfig } from '../contract/site-config.js';
import type { Logger } from '../log.js';
import { type AdmissionMode, admit, BadReviewError } from './admission.js';
import { BodyBudget } from './body-budget.js';

export interface WebhookServerOptions {
  config: SiteConfig;
  log: Logger;
  /** Defaults from Backhaul.Kubernetes.Webhook. */
  address?: string;
  port?: number;
  certFile?: string;
  keyFile?: string;
  reloadIntervalMs?: number;
}

/** AdmissionReviews are a pod and some metadata; the API server caps objects at about 1.5 MiB. */
const MAX_BODY = 4 * 1024 * 1024;
/** Bodies held at once, all connections together: well under the webhook pod's memory limit (320 Mi). */
export const MAX_BODIES_BYTES = 16 * 1024 * 1024;
/** Requests being read at once; the API server sends a few at a time. */
export const MAX_REQUESTS = 64;
/** Connections at once (each costs a TLS session); more are closed as they come. */
export const MAX_CONNECTIONS = 512;
const TOO_LARGE = `the body is over ${MAX_BODY} bytes; an AdmissionReview of one pod is far smaller (the API server caps objects at about 1.5 MiB)`;
/** A refused body is read and dropped, so that its client reads the answer; past this, the connection is cut. */
const MAX_DRAIN = 16 * 1024 * 1024;

const PATHS: Record<string, AdmissionMode> = {
  '/mutate': 'mutate',
  '/validate': 'validate',
  '/validate-not-enabled': 'not-enabled',
};

interface KeyPair {
  cert: Buffer;
  key: Buffer;
  digest: string;
}

async function readPair(certFile: string, keyFile: string): Promise<KeyPair> {
  const [cert, key] = await Promise.all([readFile(certFile), readFile(keyFile)]);
  // Throws for a key that does not match the certificate, or a file caught half-written.
  createSecureContext({ cert, key });
  const digest = createHash('sha256').update(cert).update('\0').update(key).digest('hex');
  return { cert, key, digest };
}

function describeCert(cert: Buffer): { subject: string; serial: string; notAfter: string } {
  try {
    const x = new X509Certificate(cert);
    return { subject: x.subject.replace(/\n/g, ', '), serial: x.serialNumber, notAfter: x.validTo };
  } catch {
    return { subject: '?', serial: '?', notAfter: '?' };
  }
}

/**
 * The admission webhook role: HTTPS with the certificate and key from files, served again as soon as
 * the files change (a Secret mounted as a volume is updated in place by the kubelet, cert-manager renews
 * before expiry). Changes are noticed through file-system notifications on the files' directories, and
 * by a periodic check as a backstop (notifications miss some volume updates). A new pair is only used
 * once it loads and matches; until then the old one keeps serving.
 *
 * POST /mutate and /validate take AdmissionReview v1; GET /healthz and /readyz are for the probes.
 */
export class WebhookServer {
  private pair: KeyPair;
  private readonly watchers: FSWatcher[] = [];
  private readonly budget = new BodyBudget(MAX_BODIES_BYTES, MAX_REQUESTS);
  private readonly timer: NodeJS.Timeout;
  private reloading: Promise<void> | undefined;
  private pendingReload = false;
  /** Times the served certificate was replaced (for tests and logs). */
  reloads = 0;

  private constructor(
    private readonly server: Server,
    private readonly opts: Required<Omit<WebhookServerOptions, 'config' | 'log'>> & WebhookServerOptions,
    pair: KeyPair,
  ) {
    this.pair = pair;
    const dirs = new Set([dirname(opts.certFile), dirname(opts.keyFile)]);
    for (const dir of dirs) {
      try {
        const watcher = watchFs(dir, { persistent: false }, () => this.reload());
        watcher.on('error', () => undefined);
        this.watchers.push(watcher);
      } catch (err) {
        opts.log.warn({ dir, err: (err as Error).message }, 'cannot watch the certificate directory; polling only');
      }
    }
    this.timer = setInterval(() => this.reload(), opts.reloadIntervalMs);
    this.timer.unref();
  }

  static async start(options: WebhookServerOptions): Promise<WebhookServer> {
    const w = options.config.Backhaul.Kubernetes.Webhook;
    const opts = {
      ...options,
      address: options.address ?? w.Address,
      port: options.port ?? w.Port,
      certFile: options.certFile ?? w.CertFile,
      keyFile: options.keyFile ?? w.KeyFile,
      reloadIntervalMs: options.reloadIntervalMs ?? w.ReloadInterval,
    };
    let pair: KeyPair;
    try {
      pair = await readPair(opts.certFile, opts.keyFile);
    } catch (err) {
      throw new Error(
        `webhook: cannot load the certificate ${opts.certFile} and key ${opts.keyFile} (Backhaul.Kubernetes.Webhook.CertFile/KeyFile): ${(err as Error).message}`,
      );
    }
    const server = createServer({ cert: pair.cert, key: pair.key, minVersion: 'TLSv1.2' });
    server.maxConnections = MAX_CONNECTIONS;
    const webhook = new WebhookServer(server, opts, pair);
    server.on('request', (req, res) => webhook.handle(req, res));
    server.on('tlsClientError', (err) => opts.log.debug({ err: err.message }, 'webhook TLS handshake failed'));
    // The API server keeps connections open; requests are small and quick.
    server.requestTimeout = 30_000;
    server.headersTimeout = 10_000;
    server.keepAliveTimeout = 60_000;
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(opts.port, opts.address, () => {
        server.off('error', reject);
        resolve();
      });
    });
    opts.log.info(
      { address: opts.address, port: webhook.port, cert: describeCert(pair.cert) },
      'admission webhook listening',
    );
    return webhook;
  }

  get port(): number {
    return (this.server.address() as AddressInfo).port;
  }

  /** Checks the files now and serves the new pair if they changed (and load). */
  reload(): Promise<void> {
    if (this.reloading) {
      this.pendingReload = true;
      return this.reloading;
    }
    this.reloading = (async () => {
      do {
        this.pendingReload = false;
        // Let a writer finish replacing both files before reading them.
        await new Promise((r) => setTimeout(r, 50));
        try {
          const pair = await readPair(this.opts.certFile, this.opts.keyFile);
          if (pair.digest === this.pair.digest) continue;
          this.server.setSecureContext({ cert: pair.cert, key: pair.key, minVersion: 'TLSv1.2' });
          this.pair = pair;
          this.reloads += 1;
          this.opts.log.info({ cert: describeCert(pair.cert) }, 'webhook certificate reloaded');
        } catch (err) {
          this.opts.log.warn(
            { err: (err as Error).message },
            'webhook certificate files changed but do not load (yet): still serving the previous pair',
          );
        }
      } while (this.pendingReload);
    })().finally(() => {
      this.reloading = undefined;
    });
    return this.reloading;
  }

  async close(): Promise<void> {
    clearInterval(this.timer);
    for (const watcher of this.watchers) watcher.close();
    await new Promise<void>((resolve) => {
      this.server.close(() => resolve());
      this.server.closeIdleConnections();
    });
  }

  private handle(req: IncomingMessage, res: ServerResponse): void {
    const path = (req.url ?? '/').split('?')[0] ?? '/';
    if (req.method === 'GET' && (path === '/healthz' || path === '/readyz' || path === '/livez')) {
      send(res, 200, { status: 'ok' });
      return;
    }
    const mode = PATHS[path];
    if (!mode) {
      send(res, 404, {
        error: `no such path ${path}; the webhook serves POST /mutate, /validate and /validate-not-enabled`,
      });
      return;
    }
    if (req.method !== 'POST') {
      res.setHeader('Allow', 'POST');
      send(res, 405, { error: 'use POST' });
      return;
    }
    const chunks: Buffer[] = [];
    let size = 0;
    let taken = 0;
    let refusal: { status: number; error: string } | undefined;
    let drained = 0;
    const refuse = (status: number, error: string) => {
      refusal = { status, error };
      chunks.length = 0;
      this.budget.give(taken);
      taken = 0;
    };
    const declared = Number(req.headers['content-length']);
    if (!this.budget.begin()) {
      refuse(503, `the webhook is reading ${MAX_REQUESTS} requests already; try again`);
    } else {
      res.once('close', () => {
        this.budget.end();
        this.budget.give(taken);
        taken = 0;
      });
      if (Number.isFinite(declared) && declared > MAX_BODY) {
        refuse(413, TOO_LARGE);
      } else if (Number.isFinite(declared) && declared > 0) {
        if (this.budget.take(declared)) taken = declared;
        else refuse(503, 'the webhook holds as many request bodies as it may; try again');
      }
    }
    req.on('data', (chunk: Buffer) => {
      if (refusal) {
        // Read and dropped, so that the client, still writing, gets to read the answer.
        drained += chunk.length;
        if (drained > MAX_DRAIN) req.socket.destroy();
        return;
      }
      size += chunk.length;
      if (size > MAX_BODY) {
        refuse(413, TOO_LARGE);
        return;
      }
      if (size > taken) {
        // No Content-Length (chunked), or more than it said: take the rest as it comes.
        if (!this.budget.take(size - taken)) {
          refuse(503, 'the webhook holds as many request bodies as it may; try again');
          return;
        }
        taken = size;
      }
      chunks.push(chunk);
    });
    req.on('error', () => undefined);
    req.on('end', () => {
      if (refusal) {
        res.setHeader('Connection', 'close');
        if (refusal.status === 503) res.setHeader('Retry-After', '1');
        send(res, refusal.status, { error: refusal.error });
        return;
      }
      let review: unknown;
      try {
        review = JSON.parse(Buffer.concat(chunks).toString('utf8'));
      } catch {
        send(res, 400, { error: 'the body is not JSON' });
        return;
      }
      try {
        const answer = admit(review, mode, this.opts.config);
        const r = answer.response;
        const request = (review as { request?: { namespace?: string; name?: string; object?: unknown } }).request;
        this.opts.log.info(
          {
            mode,
            uid: r.uid,
            pod: `${request?.namespace ?? '?'}/${podName(request?.object) ?? request?.name ?? '?'}`,
            allowed: r.allowed,
            patched: r.patch !== undefined,
            ...(r.status ? { reason: r.status.message } : {}),
            ...(r.warnings ? { warnings: r.warnings } : {}),
          },
          r.allowed ? 'pod admitted' : 'pod refused',
        );
        send(res, 200, answer);
      } catch (err) {
        if (err instanceof BadReviewError) {
          send(res, 400, { error: err.message });
          return;
        }
        this.opts.log.error({ err }, 'admission failed');
        send(res, 500, { error: 'internal error' });
      }
    });
  }
}

function podName(object: unknown): string | undefined {
  const meta = (object as { metadata?: { name?: string; generateName?: string } } | undefined)?.metadata;
  return meta?.name || (meta?.generateName ? `${meta.generateName}*` : undefined);
}

function send(res: ServerResponse, status: number, body: unknown): void {
  const text = JSON.stringify(body);
  res.writeHead(status, { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(text) });
  res.end(text);
}
