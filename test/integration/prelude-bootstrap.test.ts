import { type ChildProcess, execFile } from 'node:child_process';
import { chmod, chown, lstat, mkdir, mkdtemp, readFile, rm, stat, writeFile } from 'node:fs/promises';
import net from 'node:net';
import { promisify } from 'node:util';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { socketDir } from '../../src/contract/derivations.js';
import { carrierCommands } from '../../src/render/carrier-command.js';
import { renderPrelude } from '../../src/render/prelude.js';
import { BOOTSTRAP_EXIT, type BootstrapInput, carrierPaths, renderBootstrap } from '../../src/render/userspace-sshd.js';
import { freePort } from '../../tools/sandbox/sshd.js';
import { ensureUser, JOB_USER, OTHER_USER, runAs, spawnAs, type TestUser } from '../../tools/sandbox/users.js';
import { KEYS, requestFor } from '../unit/render-fixtures.js';
import { eventually, gone, STATE_SNIPPET, startScript, uniqueUid } from './script-runner.js';

/**
 * The carrier bootstrap (ARCHITECTURE.md, "Carriers and shadow sessions") run for real as the job's user, the way the session host runs
 * it: `/bin/sh -s` with the script on stdin.
 */

const execFileAsync = promisify(execFile);
const SSHD = '/usr/sbin/sshd';

let job: TestUser;
let other: TestUser;
const cleanup: string[] = [];
const children: ChildProcess[] = [];

function input(dir: string, extra: Partial<BootstrapInput> = {}): BootstrapInput {
  return {
    socketDir: dir,
    sshdPath: SSHD,
    authorizedKey: KEYS.ed25519,
    clientAliveIntervalS: 5,
    ...extra,
  };
}

/** The dir the prelude would make: 0700, owned by the job's user. */
async function jobDir(label: string, mode = 0o700, owner?: TestUser): Promise<string> {
  const dir = socketDir('/tmp', uniqueUid(label));
  cleanup.push(dir);
  await mkdir(dir, { mode });
  await chmod(dir, mode);
  const user = owner ?? job;
  await chown(dir, user.uid, user.gid);
  return dir;
}

function bootstrap(script: string) {
  return runAs(job, '/bin/sh', ['-s'], { input: script });
}

beforeAll(async () => {
  job = await ensureUser(JOB_USER);
  other = await ensureUser(OTHER_USER);
}, 60_000);

afterEach(async () => {
  for (const child of children.splice(0)) {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
  }
});

afterAll(async () => {
  for (const path of cleanup) await rm(path, { recursive: true, force: true });
});

describe('the carrier bootstrap', () => {
  it('writes a fresh host key, the restricted key and a config sshd accepts, and prints the host key', async () => {
    const dir = await jobDir('boot');
    const paths = carrierPaths(dir);
    const result = await bootstrap(renderBootstrap(input(dir)));
    expect(result.code, result.stderr).toBe(0);
    expect(result.stdout).toMatch(/^backhaul-hostkey ssh-ed25519 [A-Za-z0-9+/]+=*\n$/);

    const modes: [string, number][] = [
      [paths.dir, 0o700],
      [paths.hostKey, 0o600],
      [paths.hostPublicKey, 0o600],
      [paths.authorizedKeys, 0o600],
      [paths.config, 0o600],
    ];
    for (const [path, mode] of modes) {
      const s = await lstat(path);
      expect(s.mode & 0o777, path).toBe(mode);
      expect(s.uid, path).toBe(job.uid);
    }
    const [type, blob] = (await readFile(paths.hostPublicKey, 'utf8')).split(' ');
    expect(result.stdout).toBe(`backhaul-hostkey ${type} ${blob}\n`);
    expect(await readFile(paths.authorizedKeys, 'utf8')).toBe(
      `restrict,port-forwarding ${KEYS.ed25519.replace(/ test$/, '')}\n`,
    );
    const check = await runAs(job, SSHD, ['-t', '-f', paths.config]);
    expect(check.code, check.stderr).toBe(0);

    // Another attempt gets another host key.
    const again = await bootstrap(renderBootstrap(input(dir)));
    expect(again.code, again.stderr).toBe(0);
    expect(again.stdout).not.toBe(result.stdout);
    expect(await readFile(paths.config, 'utf8')).toMatch(/^PermitListen none$/m);
  }, 30_000);

  it('works in the dir a running prelude made, which goes away with the job', async () => {
    const uid = uniqueUid('boot-prelude');
    const dir = socketDir('/tmp', uid);
    cleanup.push(dir);
    const { request } = requestFor('userspace', '', 11080);
    const text = renderPrelude(request, { SocketRoot: '/tmp', PythonPath: '/usr/bin/python3', WaitForForwards: 1000 });
    const script = await startScript(job, 'bash', text + STATE_SNIPPET, { SLURM_JOB_NAME: uid });
    children.push(script.child);
    await script.state();
    const result = await bootstrap(renderBootstrap(input(dir)));
    expect(result.code, result.stderr).toBe(0);
    expect(result.stdout).toMatch(/^backhaul-hostkey ssh-ed25519 /);
    expect((await script.finish()).code).toBe(0);
    expect(gone(carrierPaths(dir).dir)).toBe(true);
  }, 30_000);

  it('refuses a missing dir, a file, a symlink, another user’s dir and a dir that is not 0700', async () => {
    const missing = socketDir('/tmp', uniqueUid('boot-missing'));
    let result = await bootstrap(renderBootstrap(input(missing)));
    expect(result.code).toBe(BOOTSTRAP_EXIT.dirMissing);
    expect(result.stderr).toBe(
      `backhaul-bootstrap: socket dir ${missing} missing: job not started or prelude not run\n`,
    );
    expect(result.stdout).toBe('');

    const file = socketDir('/tmp', uniqueUid('boot-file'));
    cleanup.push(file);
    await writeFile(file, '');
    await chown(file, job.uid, job.gid);
    result = await bootstrap(renderBootstrap(input(file)));
    expect(result.code).toBe(BOOTSTRAP_EXIT.dirNotDirectory);
    expect(result.stderr).toMatch(/is not a directory/);

    const target = await jobDir('boot-target');
    const link = socketDir('/tmp', uniqueUid('boot-link'));
    cleanup.push(link);
    await execFileAsync('ln', ['-s', target, link]);
    result = await bootstrap(renderBootstrap(input(link)));
    expect(result.code).toBe(BOOTSTRAP_EXIT.dirNotDirectory);

    const foreign = await jobDir('boot-foreign', 0o700, other);
    result = await bootstrap(renderBootstrap(input(foreign)));
    expect(result.code).toBe(BOOTSTRAP_EXIT.dirNotOwned);
    expect(result.stderr).toMatch(/is not owned by bhjob/);

    const open = await jobDir('boot-open', 0o755);
    result = await bootstrap(renderBootstrap(input(open)));
    expect(result.code).toBe(BOOTSTRAP_EXIT.dirBadMode);
    expect(result.stderr).toMatch(/does not have mode 0700/);
    expect(gone(carrierPaths(open).dir)).toBe(true);
  }, 30_000);

  it('gives an sshd -i that takes unix-socket reverse forwards and refuses TCP ones', async () => {
    // The client side, as the job's user: a key pair and a known_hosts entry for the pinned host key.
    const home = await mkdtemp('/tmp/bh-client-');
    cleanup.push(home);
    await chown(home, job.uid, job.gid);
    const keyFile = `${home}/id_ed25519`;
    const keygen = await runAs(job, 'ssh-keygen', ['-q', '-t', 'ed25519', '-N', '', '-f', keyFile]);
    expect(keygen.code, keygen.stderr).toBe(0);
    const publicKey = (await readFile(`${keyFile}.pub`, 'utf8')).trim();

    const dir = await jobDir('boot-e2e');
    // Ports the kernel just gave out: a random pick could be an ephemeral port in use.
    const refusedPort = await freePort();
    const result = await bootstrap(renderBootstrap(input(dir, { authorizedKey: publicKey })));
    expect(result.code, result.stderr).toBe(0);
    const hostKey = result.stdout.trim().replace(/^backhaul-hostkey /, '');
    await writeFile(`${home}/known_hosts`, `backhaul-carrier ${hostKey}\n`);
    await chown(`${home}/known_hosts`, job.uid, job.gid);

    // The same command line the session host execs, minus the transport.
    const commands = carrierCommands(
      'userspace',
      { sshdPath: SSHD, socketDir: dir, nodeSshPort: 22 },
      {
        jobId: '1',
        batchHost: 'localhost',
      },
    );
    if (commands.mode !== 'userspace') throw new Error('unexpected mode');
    const proxy = commands.sshdCommand.replace(/^exec /, '');
    const ssh = (forward: string): ChildProcess => {
      const child = spawnAs(job, 'ssh', [
        '-F',
        '/dev/null',
        '-o',
        `ProxyCommand=${proxy}`,
        '-o',
        'HostKeyAlias=backhaul-carrier',
        '-o',
        `UserKnownHostsFile=${home}/known_hosts`,
        '-o',
        'GlobalKnownHostsFile=/dev/null',
        '-o',
        'StrictHostKeyChecking=yes',
        '-o',
        'BatchMode=yes',
        '-o',
        'IdentitiesOnly=yes',
        '-o',
        'ExitOnForwardFailure=yes',
        '-i',
        keyFile,
        '-N',
        '-R',
        forward,
        `${job.name}@carrier`,
      ]);
      children.push(child);
      return child;
    };

    const echo = net.createServer((c) => c.pipe(c));
    await new Promise<void>((resolve) => echo.listen(0, '127.0.0.1', resolve));
    const echoPort = (echo.address() as net.AddressInfo).port;
    try {
      // A unix-socket forward: the socket appears, private to the user, and carries bytes.
      const socket = `${dir}/9000.sock`;
      const unixForward = ssh(`${socket}:127.0.0.1:${echoPort}`);
      let stderr = '';
      unixForward.stderr?.on('data', (chunk: Buffer) => {
        stderr += chunk.toString();
      });
      const appeared = await eventually(
        async () => (await stat(socket).catch(() => undefined))?.isSocket() ?? false,
        10_000,
      );
      expect(appeared, stderr).toBe(true);
      expect((await stat(socket)).mode & 0o777).toBe(0o600);
      const reply = await new Promise<string>((resolve, reject) => {
        const c = net.connect(socket, () => c.end('ping'));
        let data = '';
        c.on('data', (d) => {
          data += d.toString();
        });
        c.on('end', () => resolve(data));
        c.on('error', reject);
      });
      expect(reply).toBe('ping');
      unixForward.kill('SIGTERM');

      // Every TCP listener is refused (PermitListen none: SOCKS is a unix socket behind the relay).
      const tcpForward = ssh(`127.0.0.1:${refusedPort}:127.0.0.1:${echoPort}`);
      let tcpStderr = '';
      tcpForward.stderr?.on('data', (chunk: Buffer) => {
        tcpStderr += chunk.toString();
      });
      const code = await new Promise<number | null>((resolve) => tcpForward.on('close', resolve));
      expect(code, tcpStderr).toBe(255);
      expect(tcpStderr).toMatch(/remote port forwarding failed/);
    } finally {
      await new Promise((resolve) => echo.close(resolve));
    }
  }, 60_000);
});
