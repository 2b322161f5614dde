import { execFile } from 'node:child_process';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { sendEvent } from '../../src/pods/queues.js';
import { createRedis } from '../../src/store/redis.js';
import { type RedisServer, startRedisServer } from '../../tools/demo/redis.js';
import { uid, waitFor } from '../../tools/sandbox/shadow-harness.js';
import { freePort } from '../../tools/sandbox/sshd.js';
import { BIN, startWorker, type WorkerProcess, workerStarted } from '../../tools/sandbox/worker-process.js';
import { type ProcessFleetSite, processFleetSite } from '../fixtures/fleet-harness.js';

const run = promisify(execFile);

/**
 * Issue 25, item 3: no secret in any log, metric, status output or argv. The fleet runs against a Redis
 * with a password given only through the environment, logs in to the site with a key the login node
 * does not accept, and then has its Redis password rotated under it (ioredis' AUTH errors carry the
 * command with the password). Everything it wrote is searched for the passwords and the key.
 */
describe('secrets never reach the output', () => {
  const FIRST = `first-${Math.random().toString(36).slice(2)}-pw`;
  const ROTATED = `rotated-${Math.random().toString(36).slice(2)}-pw`;
  let dir: string;
  let server: RedisServer;
  let site: ProcessFleetSite;
  let keyBody: string[];
  let worker: WorkerProcess | undefined;

  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'bh-secrets-'));
    server = await startRedisServer(dir, FIRST);
    // A key the login node has never seen: every login is refused.
    const keyFile = join(dir, 'stranger_ed25519');
    await run('ssh-keygen', ['-q', '-t', 'ed25519', '-N', '', '-f', keyFile]);
    const pem = await readFile(keyFile, 'utf8');
    // Lines of the key's body: none of them may appear anywhere.
    keyBody = pem.split('\n').filter((line) => line.length > 20 && !line.startsWith('-----'));
    const withPassword = server.url.replace('redis://', `redis://:${FIRST}@`);
    site = await processFleetSite(withPassword, {}, { RetryLimit: 1 }, { KeyFile: keyFile });
  }, 120_000);

  afterAll(async () => {
    worker?.kill('SIGKILL');
    await worker?.exited;
    await site?.close();
    await server?.stop();
    await rm(dir, { recursive: true, force: true });
  });

  function leaks(text: string): string[] {
    const found = [FIRST, ROTATED, ...keyBody].filter((secret) => text.includes(secret));
    return found.map((secret) => (secret === FIRST || secret === ROTATED ? `password ${secret}` : 'a line of the key'));
  }

  it('says why AUTH and the SSH login failed, and shows neither password nor key', async () => {
    const healthPort = await freePort();
    worker = startWorker(site.configPath, server.url, 'control,session', 'host-secrets', undefined, {
      env: { REDIS_PASSWORD: FIRST },
      args: ['--health-port', String(healthPort), '--health-address', '127.0.0.1'],
    });
    await workerStarted(worker);
    const cmdline = await readFile(`/proc/${worker.child.pid}/cmdline`, 'utf8');
    expect(leaks(cmdline), `argv: ${cmdline}`).toEqual([]);

    // A login the site refuses: the pod fails, saying so.
    const podUid = uid();
    await sendEvent(site.deps.queues, podUid, {
      type: 'POD_UPSERT',
      namespace: 'user',
      name: 'refused-login',
      annotations: { 'interlink.eu/reverse-forwards': '15990:127.0.0.1:9' },
      at: Date.now(),
    });
    const failed = await waitFor(
      'the pod failed on the refused login',
      async () => {
        const pod = await site.deps.store.load(podUid);
        return pod?.state === 'failed' ? pod : undefined;
      },
      60_000,
    );
    expect(JSON.stringify(failed)).toContain('auth-refused');

    // The password is rotated and the fleet's connections dropped: every reconnect's AUTH fails.
    const admin = createRedis(server.url, { kind: 'command', password: FIRST });
    await admin.config('SET', 'requirepass', ROTATED);
    await admin.auth(ROTATED);
    await admin.call('CLIENT', 'KILL', 'TYPE', 'normal', 'SKIPME', 'yes');
    await waitFor(
      'AUTH failures in the log',
      async () => ((worker?.log().match(/WRONGPASS/g) ?? []).length >= 3 ? true : undefined),
      30_000,
    );
    const metrics = await (await fetch(`http://127.0.0.1:${healthPort}/metrics`)).text();
    const env: NodeJS.ProcessEnv = { ...process.env, REDIS_PASSWORD: ROTATED };
    delete env.REDIS_URL;
    delete env.BACKHAUL_CONFIG;
    const status = await run(process.execPath, [BIN, 'status', podUid, '--json', '--redis', server.url], { env });
    const statusText = status.stdout + status.stderr;
    expect(statusText).toContain('auth-refused');
    const log = worker.log();
    expect(
      { log: leaks(log), metrics: leaks(metrics), status: leaks(statusText) },
      `what the worker logged:\n${log}`,
    ).toEqual({ log: [], metrics: [], status: [] });
    admin.disconnect();
  }, 120_000);

  it('warns when a password is put on the command line, and reads one from a file', async () => {
    const env = { ...process.env };
    delete env.REDIS_URL;
    delete env.REDIS_PASSWORD;
    delete env.BACKHAUL_CONFIG;
    const inUrl = server.url.replace('redis://', `redis://:${ROTATED}@`);
    const flagged = await run(process.execPath, [BIN, 'list', '--redis', inUrl], { env });
    expect(flagged.stderr).toContain(
      'the --redis URL carries a password, which every user of this machine can read in ps',
    );
    expect(leaks(flagged.stderr)).toEqual([]);

    const file = join(dir, 'redis-password');
    await writeFile(file, `${ROTATED}\n`, { mode: 0o600 });
    const fromFile = await run(process.execPath, [BIN, 'list', '--redis', server.url, '--redis-password-file', file], {
      env,
    });
    expect(fromFile.stderr).toBe('');
    const wrong = await run(process.execPath, [BIN, 'list', '--redis', server.url], {
      env: { ...env, REDIS_PASSWORD: FIRST },
    }).catch((err: { stderr: string; code: number }) => err);
    expect('code' in wrong ? wrong.code : 0).toBe(1);
    expect(wrong.stderr).toContain('WRONGPASS');
    expect(leaks(wrong.stderr)).toEqual([]);
  }, 60_000);
});
