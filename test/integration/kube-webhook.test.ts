import { copyFile, mkdir, mkdtemp, rename, rm, symlink, writeFile } from 'node:fs/promises';
import { request } from 'node:https';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { TLSSocket } from 'node:tls';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { WebhookServer } from '../../src/cluster/webhook-server.js';
import { ANNOTATION } from '../../src/contract/annotations.js';
import { startFleet } from '../../src/fleet/fleet.js';
import { silentLogger } from '../../src/log.js';
import { PRELUDE_BEGIN } from '../../src/render/prelude.js';
import { createRedis } from '../../src/store/redis.js';
import { patchedAnnotations, podReview } from '../fixtures/admission-reviews.js';
import { jsonPatch } from '../fixtures/fake-apiserver.js';
import { kubeSite, waitFor } from '../fixtures/kube-harness.js';
import { makeCa, makeServerCert, type PemPair } from '../fixtures/test-pki.js';

const FWD = ANNOTATION.forwards;
const PRE = ANNOTATION.preExec;
const MINIO = 'minio.storage.svc.cluster.local:9000';

interface Reply {
  status: number;
  body: unknown;
  serial: string;
}

/** One HTTPS request with its own connection, verifying the server against `ca` (never rejectUnauthorized: false). */
function call(port: number, ca: string, method: string, path: string, body?: unknown): Promise<Reply> {
  return new Promise((resolve, reject) => {
    const payload = body === undefined ? undefined : typeof body === 'string' ? body : JSON.stringify(body);
    const req = request(
      {
        host: '127.0.0.1',
        port,
        method,
        path,
        ca,
        agent: false,
        headers: payload ? { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(payload) } : {},
      },
      (res) => {
        const serial = (res.socket as TLSSocket).getPeerCertificate().serialNumber;
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () => {
          const text = Buffer.concat(chunks).toString('utf8');
          resolve({ status: res.statusCode ?? 0, body: text ? JSON.parse(text) : undefined, serial });
        });
      },
    );
    req.on('error', reject);
    req.end(payload);
  });
}

/** A POST whose body goes out in 64 KiB chunks without a Content-Length (chunked encoding). */
function callChunked(port: number, ca: string, path: string, body: string): Promise<{ status: number; body: unknown }> {
  return new Promise((resolve, reject) => {
    const req = request({ host: '127.0.0.1', port, method: 'POST', path, ca, agent: false }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => {
        const text = Buffer.concat(chunks).toString('utf8');
        resolve({ status: res.statusCode ?? 0, body: text ? JSON.parse(text) : undefined });
      });
    });
    // The server drops the rest of the body and closes a second after its answer: the answer comes first.
    req.on('error', reject);
    let at = 0;
    const pump = () => {
      while (at < body.length) {
        const more = req.write(body.slice(at, at + 65_536));
        at += 65_536;
        if (!more) return void req.once('drain', pump);
      }
      req.end();
    };
    pump();
  });
}

type ReviewResponse = {
  apiVersion: string;
  kind: string;
  response: {
    uid: string;
    allowed: boolean;
    patch?: string;
    patchType?: string;
    warnings?: string[];
    status?: { code: number; message: string };
  };
};

describe('admission webhook over HTTPS', () => {
  let dir: string;
  let ca: PemPair;
  let cert: PemPair & { serial: string };
  let certDir: string;
  let webhook: WebhookServer;
  const site = kubeSite('redis://127.0.0.1:6379/11', '/unused', { NamespaceLabel: 'interlink.eu/backhaul=enabled' });

  const review = async (doc: unknown, path = '/mutate') => {
    const reply = await call(webhook.port, ca.cert, 'POST', path, doc);
    expect(reply.status).toBe(200);
    return reply.body as ReviewResponse;
  };

  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'bh-webhook-'));
    ca = await makeCa(dir);
    cert = await makeServerCert(dir, ca, { prefix: 'webhook-1', dns: ['backhaul-webhook.backhaul.svc', 'localhost'] });
    // Laid out as the kubelet mounts a Secret: files behind a "..data" symlink that is swapped on update.
    certDir = join(dir, 'tls');
    await mkdir(join(certDir, '..v1'), { recursive: true });
    await copyFile(cert.certFile, join(certDir, '..v1', 'tls.crt'));
    await copyFile(cert.keyFile, join(certDir, '..v1', 'tls.key'));
    await symlink('..v1', join(certDir, '..data'));
    await symlink('..data/tls.crt', join(certDir, 'tls.crt'));
    await symlink('..data/tls.key', join(certDir, 'tls.key'));
    webhook = await WebhookServer.start({
      config: site,
      log: silentLogger(),
      address: '127.0.0.1',
      port: 0,
      certFile: join(certDir, 'tls.crt'),
      keyFile: join(certDir, 'tls.key'),
      reloadIntervalMs: 500,
    });
  });

  afterAll(async () => {
    await webhook?.close();
    if (dir) await rm(dir, { recursive: true, force: true });
  });

  it('serves a certificate the client verifies against the CA (and a client without the CA refuses it)', async () => {
    const reply = await call(webhook.port, ca.cert, 'GET', '/healthz');
    expect(reply.status).toBe(200);
    expect(reply.serial).toBe(cert.serial);
    const other = await makeCa(dir, 'unrelated-ca');
    await expect(call(webhook.port, other.cert, 'GET', '/healthz')).rejects.toThrow(/certificate/i);
  });

  it('accepts a pod without reverse annotations untouched', async () => {
    const doc = podReview({ 'example.org/team': 'ml' });
    const answer = await review(doc);
    expect(answer).toEqual({
      apiVersion: 'admission.k8s.io/v1',
      kind: 'AdmissionReview',
      response: { uid: doc.request.uid, allowed: true },
    });
  });

  it('mutates: prepends the prelude to the pre-exec, keeps what was there, and is idempotent', async () => {
    for (const own of [undefined, 'module load cuda\n']) {
      const doc = podReview({ [FWD]: MINIO, ...(own ? { [PRE]: own } : {}) });
      const answer = await review(doc);
      expect(answer.response.allowed).toBe(true);
      expect(answer.response.patchType).toBe('JSONPatch');
      const stored = patchedAnnotations(doc, answer.response, jsonPatch);
      expect(stored[PRE]?.startsWith(PRELUDE_BEGIN)).toBe(true);
      if (own) expect(stored[PRE]?.endsWith(`\n${own}`)).toBe(true);
      // Admitted again (a re-submission, a reinvocation): no patch, one prelude.
      const again = await review(podReview(stored));
      expect(again.response).toEqual({ uid: expect.any(String), allowed: true });
      expect(stored[PRE]?.split(PRELUDE_BEGIN)).toHaveLength(2);
      // The validating webhook admits what the mutating one produced.
      expect((await review(podReview(stored), '/validate')).response.allowed).toBe(true);
    }
  });

  it('refuses a bad pod with a message naming the annotation, the entry and what is accepted', async () => {
    const answer = await review(podReview({ [FWD]: 'kubernetes.default.svc.cluster.local:443' }));
    expect(answer.response.allowed).toBe(false);
    expect(answer.response.patch).toBeUndefined();
    expect(answer.response.status?.code).toBe(403);
    expect(answer.response.status?.message).toBe(
      'interlink.eu/reverse-forwards entry "kubernetes.default.svc.cluster.local:443": listen port 443 is below 1024 (the relay runs unprivileged); accepted: a listen port of 1024 or more, e.g. 8443:kubernetes.default.svc.cluster.local:443',
    );
    const validate = await review(podReview({ [FWD]: MINIO }), '/validate');
    expect(validate.response.allowed).toBe(false);
    expect(validate.response.status?.message).toContain('no backhaul prelude');
  });

  it('refuses reverse forwards on /validate-not-enabled (namespaces without the opt-in label)', async () => {
    const refused = await review(podReview({ [FWD]: MINIO }, { namespace: 'quiet' }), '/validate-not-enabled');
    expect(refused.response.allowed).toBe(false);
    expect(refused.response.status?.message).toContain('namespace quiet has not opted in');
    const plain = await review(podReview({}, { namespace: 'quiet' }), '/validate-not-enabled');
    expect(plain.response.allowed).toBe(true);
  });

  it('admits SOCKS with a warning', async () => {
    const answer = await review(podReview({ [FWD]: MINIO, [ANNOTATION.socksPort]: '11080' }));
    expect(answer.response.allowed).toBe(true);
    expect(answer.response.warnings?.[0]).toContain('11080');
  });

  it('answers bad requests with HTTP errors, not reviews', async () => {
    expect((await call(webhook.port, ca.cert, 'POST', '/mutate', '{not json')).status).toBe(400);
    expect((await call(webhook.port, ca.cert, 'POST', '/mutate', { kind: 'Pod' })).status).toBe(400);
    expect((await call(webhook.port, ca.cert, 'GET', '/mutate')).status).toBe(405);
    expect((await call(webhook.port, ca.cert, 'POST', '/elsewhere', {})).status).toBe(404);
  });

  it('answers a body over 4 MiB with 413, declared or streamed, and goes on serving', async () => {
    const big = `{"pad":"${'x'.repeat(5 * 1024 * 1024)}"}`;
    const declared = await call(webhook.port, ca.cert, 'POST', '/validate', big);
    expect(declared.status).toBe(413);
    expect(JSON.stringify(declared.body)).toContain('over 4194304 bytes');
    const streamed = await callChunked(webhook.port, ca.cert, '/validate', big);
    expect(streamed.status).toBe(413);
    expect((await review(podReview({ [FWD]: MINIO }))).response.allowed).toBe(true);
  });

  it('serves a new certificate when the files change, and keeps the old one while the new pair is broken', async () => {
    // A renewal from a new CA, swapped in the way the kubelet updates a Secret volume.
    const ca2 = await makeCa(dir, 'rotated-ca');
    const cert2 = await makeServerCert(dir, ca2, { prefix: 'webhook-2' });
    await mkdir(join(certDir, '..v2'));
    await copyFile(cert2.certFile, join(certDir, '..v2', 'tls.crt'));
    await copyFile(cert2.keyFile, join(certDir, '..v2', 'tls.key'));
    await symlink('..v2', join(certDir, '..data_tmp'));
    await rename(join(certDir, '..data_tmp'), join(certDir, '..data'));
    await waitFor('the reload', () => webhook.reloads === 1, 10_000);
    const reply = await call(webhook.port, ca2.cert, 'GET', '/healthz');
    expect(reply.serial).toBe(cert2.serial);
    await expect(call(webhook.port, ca.cert, 'GET', '/healthz')).rejects.toThrow(/certificate/i);

    // A half-written update (a key that does not match): still the previous pair.
    const cert3 = await makeServerCert(dir, ca2, { prefix: 'webhook-3' });
    await writeFile(join(certDir, '..v2', 'tls.crt'), cert3.cert);
    await new Promise((r) => setTimeout(r, 1_500));
    expect(webhook.reloads).toBe(1);
    expect((await call(webhook.port, ca2.cert, 'GET', '/healthz')).serial).toBe(cert2.serial);
    // …until the key arrives too (written in place this time).
    await writeFile(join(certDir, '..v2', 'tls.key'), cert3.key);
    await waitFor('the second reload', () => webhook.reloads === 2, 10_000);
    const after = await call(webhook.port, ca2.cert, 'POST', '/mutate', podReview({ [FWD]: MINIO }));
    expect(after.serial).toBe(cert3.serial);
    expect((after.body as ReviewResponse).response.allowed).toBe(true);
  });
});

describe('the webhook role in the fleet', () => {
  it('starts with startFleet without touching Redis', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'bh-webhook-role-'));
    // Nothing listens there: a webhook-only member must not need Redis.
    const redis = createRedis('redis://127.0.0.1:1/0', { options: { lazyConnect: true } });
    try {
      const ca = await makeCa(dir);
      const cert = await makeServerCert(dir, ca);
      const config = kubeSite('redis://127.0.0.1:1/0', '/unused', {
        Webhook: { Address: '127.0.0.1', CertFile: cert.certFile, KeyFile: cert.keyFile },
      });
      const fleet = await startFleet(config, redis, silentLogger(), {
        roles: ['webhook'],
        cluster: { webhook: { port: 0 } },
      });
      try {
        const port = fleet.cluster.webhook?.port ?? 0;
        const answer = await call(port, ca.cert, 'POST', '/mutate', podReview({ [FWD]: MINIO }));
        expect((answer.body as ReviewResponse).response.allowed).toBe(true);
      } finally {
        await fleet.stop();
      }
    } finally {
      redis.disconnect();
      await rm(dir, { recursive: true, force: true });
    }
  });
});
