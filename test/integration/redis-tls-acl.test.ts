import { type ChildProcess, execFile, spawn } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createRedis } from '../../src/store/redis.js';
import { uid, waitFor } from '../../tools/sandbox/shadow-harness.js';
import { cancelSubmittedJobs } from '../../tools/sandbox/slurm.js';
import { freePort } from '../../tools/sandbox/sshd.js';
import {
  BIN,
  killWorkers,
  startWorker,
  type WorkerProcess,
  workerStarted,
} from '../../tools/sandbox/worker-process.js';
import { allActive } from '../fixtures/fault-probes.js';
import { type ProcessFleetSite, processFleetSite, submitPod } from '../fixtures/fleet-harness.js';
import { makeCa, makeServerCert, type PemPair } from '../fixtures/test-pki.js';

const run = promisify(execFile);

/**
 * A Redis as sites run it when it is not the bundled one: TLS with the site's own CA, and an ACL user of
 * its own for the fleet (the default user off). The fleet and the CLI reach it by `rediss://user@host`,
 * the password from REDIS_PASSWORD and the CA from NODE_EXTRA_CA_CERTS; the test's own reads go to the
 * same server's plain port as the same user.
 */
describe('Redis over TLS with an ACL user', () => {
  const USER = 'bhfleet';
  const PASSWORD = `acl-${Math.random().toString(36).slice(2)}`;
  let dir: string;
  let ca: PemPair;
  let server: ChildProcess;
  let tlsPort: number;
  let site: ProcessFleetSite;
  const workers: WorkerProcess[] = [];

  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'bh-redis-tls-'));
    ca = await makeCa(dir);
    const cert = await makeServerCert(dir, ca, { prefix: 'redis', cn: 'redis', ips: ['127.0.0.1'] });
    const plainPort = await freePort();
    tlsPort = await freePort();
    server = spawn(
      'redis-server',
      [
        '--port',
        String(plainPort),
        '--tls-port',
        String(tlsPort),
        '--bind',
        '127.0.0.1',
        '--tls-cert-file',
        cert.certFile,
        '--tls-key-file',
        cert.keyFile,
        '--tls-ca-cert-file',
        ca.certFile,
        '--tls-auth-clients',
        'no',
        '--save',
        '',
        '--appendonly',
        'no',
        '--dir',
        dir,
        // A config line each: the words are arguments of their own.
        '--user',
        'default',
        'off',
        '--user',
        USER,
        'on',
        `>${PASSWORD}`,
        '~*',
        '&*',
        '+@all',
      ],
      { stdio: 'ignore' },
    );
    const plainUrl = `redis://${USER}:${PASSWORD}@127.0.0.1:${plainPort}`;
    const probe = createRedis(plainUrl, { kind: 'command' });
    probe.on('error', () => undefined);
    await waitFor('redis up', async () => ((await probe.ping().catch(() => '')) === 'PONG' ? true : undefined), 10_000);
    probe.disconnect();
    site = await processFleetSite(plainUrl);
  }, 120_000);

  afterAll(async () => {
    await killWorkers(workers);
    await cancelSubmittedJobs();
    await site?.close();
    server?.kill('SIGKILL');
    if (dir) await rm(dir, { recursive: true, force: true });
  });

  const tlsUrl = () => `rediss://${USER}@127.0.0.1:${tlsPort}`;
  const env = (extra: Record<string, string> = {}) => ({
    ...process.env,
    REDIS_PASSWORD: PASSWORD,
    NODE_EXTRA_CA_CERTS: ca.certFile,
    ...extra,
  });

  it('the fleet runs on it (a pod active) and `status` reads it; without the CA, or with a wrong password, one clear line', async () => {
    const worker = startWorker(site.configPath, tlsUrl(), 'control,session', 'host-tls', undefined, {
      env: { REDIS_PASSWORD: PASSWORD, NODE_EXTRA_CA_CERTS: ca.certFile },
    });
    workers.push(worker);
    await workerStarted(worker);
    const podUid = uid();
    await submitPod(site, podUid, 'over-tls', `15700:127.0.0.1:${site.echo.port}`, 'sleep 600\n');
    await waitFor('the pod active', () => allActive(site.deps, [podUid]), 90_000).catch((err: Error) => {
      throw new Error(`${err.message}\nworker log: ${worker.log().slice(-3000)}`);
    });

    const status = await run('node', [BIN, 'status', podUid, '--redis', tlsUrl()], { env: env() });
    expect(status.stdout).toContain('over-tls');
    expect(status.stdout).toMatch(/active/);

    // The site's CA unknown to this process: refused, saying why, with no stack trace.
    const noCa = await run('node', [BIN, 'status', '--redis', tlsUrl()], {
      env: { ...env(), NODE_EXTRA_CA_CERTS: '' },
    }).catch((err: { code: number; stderr: string }) => err);
    expect('code' in noCa && noCa.code, JSON.stringify(noCa)).toBe(1);
    const noCaText = (noCa as { stderr: string }).stderr;
    expect(noCaText, noCaText).toMatch(/certificate/i);
    expect(noCaText.trim().split('\n'), noCaText).toHaveLength(1);

    const wrong = await run('node', [BIN, 'status', '--redis', tlsUrl()], {
      env: env({ REDIS_PASSWORD: 'not-it' }),
    }).catch((err: { code: number; stderr: string }) => err);
    expect('code' in wrong && wrong.code, JSON.stringify(wrong)).toBe(1);
    const wrongText = (wrong as { stderr: string }).stderr;
    expect(wrongText, wrongText).toMatch(/WRONGPASS|password/i);
    expect(wrongText).not.toContain('not-it');
    expect(wrongText.trim().split('\n'), wrongText).toHaveLength(1);
    expect(worker.log()).not.toContain(PASSWORD);
    console.log(`without the CA: ${noCaText.trim()}\nwrong password: ${wrongText.trim()}`);
  }, 180_000);
});
