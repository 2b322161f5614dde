import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { connect, type TLSSocket } from 'node:tls';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { freePort } from '../../tools/sandbox/sshd.js';
import { startWorker, type WorkerProcess, writeConfig } from '../../tools/sandbox/worker-process.js';
import { podReview } from '../fixtures/admission-reviews.js';
import { containerOf, renderOverlay, SITE_ADDRESSES } from '../fixtures/kustomize.js';
import { makeCa, makeServerCert, type PemPair } from '../fixtures/test-pki.js';

const webhookContainer = containerOf(renderOverlay('bundled-redis', SITE_ADDRESSES), 'backhaul-webhook');

/** The webhook pod's memory limit, as deploy/base/webhook.yaml sets it. */
const POD_LIMIT_MIB = Number(/^(\d+)Mi$/.exec(String(webhookContainer.resources?.limits?.memory))?.[1]);

function webhookNodeOptions(): string {
  return webhookContainer.env?.find((e) => e.name === 'NODE_OPTIONS')?.value ?? '';
}
const MiB = 1024 * 1024;

/**
 * Issue 25, item 4: the webhook holds under abuse. It runs as `backhaul worker --roles webhook` (its own
 * process, whose RSS is read from /proc), while 60 connections each declare a body of almost 4 MiB, send
 * all of it but the last byte and wait: the attack that once took it from 90 to 325 MiB.
 */
describe('the webhook under a flood of unfinished bodies', () => {
  let dir: string;
  let ca: PemPair;
  let port: number;
  let worker: WorkerProcess;
  const sockets: TLSSocket[] = [];

  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'bh-webhook-abuse-'));
    ca = await makeCa(dir);
    const cert = await makeServerCert(dir, ca, { prefix: 'webhook', dns: ['localhost'] });
    port = await freePort();
    const config = await writeConfig(dir, 'site.yaml', {
      Network: {
        SSH: {
          LoginHost: 'login.example.org',
          User: 'hpc',
          KeyFile: '/unused',
          InsecureAcceptAnyHostKey: true,
          Reverse: { Enabled: true },
        },
      },
      Backhaul: {
        Kubernetes: {
          NamespaceLabel: '',
          NetworkPolicies: false,
          Webhook: { Address: '127.0.0.1', Port: port, CertFile: cert.certFile, KeyFile: cert.keyFile },
        },
      },
    });
    // A webhook-only member never connects to Redis: the URL is never used. It runs with the Node options
    // its Deployment gives it (the heap sizes decide how much garbage it holds at its peak).
    worker = startWorker(config, 'redis://127.0.0.1:1', 'webhook', 'webhook-abuse', undefined, {
      env: { NODE_OPTIONS: webhookNodeOptions() },
    });
    await waitForLog(worker, 'admission webhook listening');
  }, 60_000);

  afterAll(async () => {
    for (const s of sockets) s.destroy();
    worker?.kill('SIGKILL');
    await worker?.exited;
    if (dir) await rm(dir, { recursive: true, force: true });
  });

  async function waitForLog(w: WorkerProcess, text: string): Promise<void> {
    const deadline = Date.now() + 30_000;
    while (!w.log().includes(text)) {
      if (w.child.exitCode !== null || Date.now() > deadline) throw new Error(`no "${text}": ${w.log()}`);
      await new Promise((r) => setTimeout(r, 100));
    }
  }

  async function rssMiB(): Promise<number> {
    const status = await readFile(`/proc/${worker.child.pid}/status`, 'utf8');
    return Number(/VmRSS:\s+(\d+) kB/.exec(status)?.[1] ?? 0) / 1024;
  }

  function open(): Promise<TLSSocket> {
    return new Promise((resolve, reject) => {
      const socket = connect({ host: '127.0.0.1', port, ca: ca.cert, servername: 'localhost' }, () => resolve(socket));
      socket.once('error', reject);
      sockets.push(socket);
    });
  }

  /** Sends a POST with BODY (and its length) and reads the whole answer; `status` 0 if the connection broke. */
  async function post(body: Buffer, path = '/mutate'): Promise<{ status: number; text: string; error?: string }> {
    const socket = await open();
    return new Promise((resolve) => {
      let answer = '';
      socket.on('data', (d: Buffer) => {
        answer += d.toString('latin1');
      });
      const done = (error?: string) =>
        resolve({
          status: Number(/^HTTP\/1\.1 (\d+)/.exec(answer)?.[1] ?? 0),
          text: answer,
          ...(error ? { error } : {}),
        });
      socket.once('end', () => done());
      socket.once('close', () => done());
      socket.once('error', (err) => done(err.message));
      socket.write(
        `POST ${path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\nConnection: close\r\n\r\n`,
      );
      socket.write(body);
    });
  }

  it('stays under the pod limit and still answers a valid review; a 10 MB body gets its 413', async () => {
    const before = await rssMiB();
    const body = Buffer.alloc(4 * MiB - 1024, 'x');
    for (let i = 0; i < 60; i += 1) {
      const socket = await open();
      socket.write(
        `POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: ${body.length + 1}\r\n\r\n`,
      );
      socket.write(body); // all but the last byte: the request never ends
    }
    // Let the webhook read what was sent.
    let peak = 0;
    for (let i = 0; i < 20; i += 1) {
      await new Promise((r) => setTimeout(r, 150));
      peak = Math.max(peak, await rssMiB());
    }
    const review = podReview({ 'interlink.eu/reverse-forwards': 'minio:9000' });
    const valid = await post(Buffer.from(JSON.stringify(review)));
    peak = Math.max(peak, await rssMiB());
    console.log(
      `webhook RSS: ${before.toFixed(0)} MiB before, ${peak.toFixed(0)} MiB at most under 60 unfinished 4 MiB bodies`,
    );
    expect(peak, `RSS ${peak} MiB`).toBeLessThan(POD_LIMIT_MIB);
    expect(valid.status, valid.text.slice(0, 300)).toBe(200);
    expect(valid.text).toContain('"allowed":true');

    const huge = await post(Buffer.alloc(10 * 1000 * 1000, 'y'));
    expect(huge.error, huge.text.slice(0, 300)).toBeUndefined();
    expect(huge.status, huge.text.slice(0, 300)).toBe(413);
    expect(huge.text).toContain('over 4194304 bytes');
  }, 60_000);
});
