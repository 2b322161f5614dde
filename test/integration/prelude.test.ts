import { execFile } from 'node:child_process';
import {
  chmod,
  chown,
  lstat,
  mkdir,
  mkdtemp,
  readdir,
  readFile,
  readlink,
  rm,
  stat,
  symlink,
  writeFile,
} from 'node:fs/promises';
import net from 'node:net';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { bindAddress, socketDir } from '../../src/contract/derivations.js';
import { type PreludeRequest, type PreludeSettings, renderPrelude } from '../../src/render/prelude.js';
import { ensureUser, JOB_USER, OTHER_USER, runAs, type TestUser } from '../../tools/sandbox/users.js';
import { FakeApiServer } from '../fixtures/fake-apiserver.js';
import { makeCa, makeServerCert } from '../fixtures/test-pki.js';
import { requestFor } from '../unit/render-fixtures.js';
import {
  deliverRelay,
  eventually,
  findProcesses,
  gone,
  HOLD_LINE,
  processInfo,
  type RunningScript,
  STATE_SNIPPET,
  startScript,
  uniqueUid,
} from './script-runner.js';

const execFileAsync = promisify(execFile);

/** The client library as the job's user imports it (the project's own copy, readable by everyone). */
const CLIENT_NODE = new URL('../../node_modules/@kubernetes/client-node/dist/index.js', import.meta.url).href;

/** TEXT as one single-quoted shell word. */
const shellSingleQuoted = (text: string) => `'${text.replaceAll("'", "'\\''")}'`;

const SETTINGS: PreludeSettings = { SocketRoot: '/tmp', PythonPath: '/usr/bin/python3', WaitForForwards: 2000 };
const FORWARDS = 'redis:6379 minio.storage.svc.cluster.local:9000 8080:10.0.0.1:80';
const REDIS_NAMES = 'redis.user.svc.cluster.local redis.user.svc redis.user redis';
const MINIO_NAMES = 'minio.storage.svc.cluster.local minio.storage.svc minio.storage';

/** What each rendered prelude needs from the fleet: its forwards, and where its socket dirs are. */
const rendered = new Map<string, { forwards: PreludeRequest['forwards']; socketRoot: string }>();

function prelude(forwards: string, settings: Partial<PreludeSettings> = {}): string {
  const { request } = requestFor('node', forwards, forwards === '' ? 11080 : undefined);
  const all = { ...SETTINGS, ...settings };
  const text = renderPrelude(request, all);
  rendered.set(text, { forwards: request.forwards, socketRoot: all.SocketRoot });
  return text;
}

/**
 * What the session host does once it reaches the job (ShadowSession.deliverRelay): the same script, as
 * the job's user, as soon as the boot asks (relay.want). A script whose prelude is in `rendered` gets it.
 */
async function deliverWhenAsked(script: RunningScript, text: string, env: Record<string, string>): Promise<void> {
  const match = [...rendered.entries()].find(([prelude]) => text.includes(prelude))?.[1];
  const uid = env.BACKHAUL_POD_UID ?? env.SLURM_JOB_NAME;
  if (!match || !uid) return;
  const dir = socketDir(match.socketRoot, uid);
  while (script.child.exitCode === null && script.child.signalCode === null) {
    if (await stat(`${dir}/relay.want`).catch(() => undefined)) {
      script.deliveries.push(await deliverRelay(job, { socketDir: dir, uid, forwards: match.forwards }));
      return;
    }
    await new Promise((resolve) => setTimeout(resolve, 25));
  }
}

/** The umask the scripts inherit, as `umask` prints it: the prelude must hand it back unchanged. */
const INHERITED_UMASK = (() => {
  const mask = process.umask();
  return mask.toString(8).padStart(4, '0');
})();

let job: TestUser;
let other: TestUser;
const uids: string[] = [];
const scripts: RunningScript[] = [];
const extraPaths: string[] = [];

function newUid(label: string): string {
  const uid = uniqueUid(label);
  uids.push(uid);
  return uid;
}

async function start(
  shell: string,
  text: string,
  env: Record<string, string>,
  options: { deliver?: boolean } = {},
): Promise<RunningScript> {
  const script = await startScript(job, shell, text, env);
  scripts.push(script);
  if (options.deliver !== false) void deliverWhenAsked(script, text, env);
  return script;
}

/** The relay's processes (the boot it was until the fleet delivered it included). */
async function relayOf(dir: string): Promise<number[]> {
  return [
    ...(await findProcesses('relay.py', `--socket-dir=${dir}`)),
    ...(await findProcesses('relay-boot.py', `--socket-dir=${dir}`)),
  ];
}

beforeAll(async () => {
  job = await ensureUser(JOB_USER);
  other = await ensureUser(OTHER_USER);
}, 60_000);

afterEach(async () => {
  for (const script of scripts.splice(0)) {
    if (script.child.exitCode === null && script.child.signalCode === null) script.child.kill('SIGKILL');
    await script.exited.catch(() => undefined);
  }
});

afterAll(async () => {
  for (const uid of uids) {
    const dir = socketDir('/tmp', uid);
    for (const pid of await relayOf(dir)) process.kill(pid, 'SIGKILL');
    await rm(dir, { recursive: true, force: true });
  }
  for (const path of extraPaths) await rm(path, { recursive: true, force: true });
});

describe.each(['bash', 'dash'])('the prelude run by %s as the job user', (shell) => {
  it('sets up the socket dir, hosts file, binds and relay, waits a bounded time, and cleans up', async () => {
    const uid = newUid('main');
    const dir = socketDir('/tmp', uid);
    const address = bindAddress(uid);
    // Under set -eu, as some batch scripts have it.
    const script = await start(shell, `set -eu\n${prelude(FORWARDS)}${STATE_SNIPPET}`, { SLURM_JOB_NAME: uid });
    const state = await script.state();
    const elapsed = Date.now() - script.startedAt;

    expect(state.dir).toBe(dir);
    expect(state.addr).toBe(address);
    expect(state.umask).toBe(INHERITED_UMASK);

    const dirStat = await lstat(dir);
    expect(dirStat.isDirectory()).toBe(true);
    expect(dirStat.mode & 0o777).toBe(0o700);
    expect(dirStat.uid).toBe(job.uid);

    expect(state.hosts).toBe(`${dir}/hosts`);
    const hosts = await readFile(`${dir}/hosts`, 'utf8');
    expect(hosts.startsWith(await readFile('/etc/hosts', 'utf8'))).toBe(true);
    // One address per Service: redis (and the IPv4 endpoint) on the first, minio on its own.
    const minioAddress = bindAddress(uid, 1);
    expect(hosts.split('\n')).toContain(`${address} ${REDIS_NAMES}`);
    expect(hosts.split('\n')).toContain(`${minioAddress} ${MINIO_NAMES}`);
    expect(((await stat(`${dir}/hosts`)).mode & 0o777).toString(8)).toBe('600');

    expect(state.apptainer).toBe(`${dir}/hosts:/etc/hosts`);
    expect(state.singularity).toBe(`${dir}/hosts:/etc/hosts`);

    // A plain child of the batch script, the boot until the fleet delivered the relay and the relay's
    // holder since, holds the listeners; its own child relays.
    expect(script.deliveries, script.stderr).toEqual(['0 backhaul-relay-delivered ']);
    const relays = await relayOf(dir);
    expect(relays).toHaveLength(2);
    const parents = await Promise.all(relays.map(async (pid) => (await processInfo(pid))?.ppid));
    const relay = relays.find((_, i) => parents[i] === Number(state.pid)) ?? -1;
    const relaying = relays.find((pid) => pid !== relay) ?? -1;
    expect((await processInfo(relaying))?.ppid, `relay processes ${relays} with parents ${parents}`).toBe(relay);
    expect((await processInfo(relay))?.cmdline).toContain(`relay.py serve --socket-dir=${dir} --shell=${state.pid}`);
    expect((await readFile(`${dir}/relay.pids`, 'utf8')).trim()).toBe(`${relay} ${relaying}`);
    for (const [host, port] of [
      [address, 6379],
      [minioAddress, 9000],
      [address, 8080],
    ] as const) {
      await new Promise<void>((resolve, reject) => {
        const socket = net.connect({ host, port }, () => {
          socket.destroy();
          resolve();
        });
        socket.on('error', reject);
      });
    }

    // Nothing forwards into the dir: the wait ends after WaitForForwards with a warning.
    expect(script.stderr).toMatch(/waiting up to 2 s for the forwards of ports 6379 9000 8080/);
    expect(script.stderr).toMatch(/warning: forwards not ready after 2 s, missing ports: 6379 9000 8080;/);
    expect(elapsed).toBeGreaterThanOrEqual(1900);
    expect(elapsed).toBeLessThan(15_000);

    const exit = await script.finish();
    expect(exit.code).toBe(0);
    expect(script.stdout).toMatch(/^workload-done$/m);
    expect(gone(dir)).toBe(true);
    expect(await eventually(async () => (await processInfo(relay)) === undefined)).toBe(true);
    expect(await eventually(async () => (await processInfo(relaying)) === undefined)).toBe(true);
  }, 60_000);

  it('gives two Services on one port their own addresses, names and sockets', async () => {
    const uid = newUid('shared-port');
    const dir = socketDir('/tmp', uid);
    const script = await start(
      shell,
      `set -eu\n${prelude('pg-a:5432 pg-b.user.svc.cluster.local:5432', { WaitForForwards: 60_000 })}${STATE_SNIPPET}`,
      { SLURM_JOB_NAME: uid },
    );
    await script.waitFor(
      /waiting up to 60 s for the forwards of ports 5432 \(5432\.sock\) 5432 \(5432\.2\.sock\)/,
      'stderr',
    );
    // What the session host's sshd does: each forward's socket, as the session plan names it.
    const servers = await Promise.all(
      ['5432.sock', '5432.2.sock'].map(
        (name) =>
          new Promise<net.Server>((resolve, reject) => {
            const server = net.createServer((c) => c.end(`${name}\n`));
            server.on('error', reject);
            // Owned by root: the relay, as the job's user, needs write permission to connect.
            server.listen(`${dir}/${name}`, () => void chmod(`${dir}/${name}`, 0o666).then(() => resolve(server)));
          }),
      ),
    );
    try {
      const state = await script.state();
      const hosts = (await readFile(`${dir}/hosts`, 'utf8')).split('\n');
      const [a, b] = [bindAddress(uid), bindAddress(uid, 1)];
      expect(state.addr).toBe(a);
      expect(hosts, script.stderr).toContain(`${a} pg-a.user.svc.cluster.local pg-a.user.svc pg-a.user pg-a`);
      expect(hosts).toContain(`${b} pg-b.user.svc.cluster.local pg-b.user.svc pg-b.user pg-b`);
      // Each name's address and the unchanged port reach that Service's socket, from the job itself.
      const read = async (host: string) =>
        (
          await script.inJob(
            `/usr/bin/python3 -c 'import socket,sys; s=socket.create_connection((sys.argv[1], 5432)); print(s.recv(64).decode().strip())' ${host} 2>&1`,
          )
        ).trim();
      expect(await read(a)).toBe('5432.sock');
      expect(await read(b)).toBe('5432.2.sock');
      // The job's user from outside the job (another job, a login shell): refused, and the relay says why.
      const outside = await runAs(job, '/usr/bin/python3', [
        '-c',
        'import socket,sys; s=socket.create_connection((sys.argv[1], 5432)); print(repr(s.recv(64)))',
        a,
      ]);
      expect(outside.stdout.trim(), outside.stderr).toBe("b''");
      expect(
        await eventually(() =>
          /refused 127\.[\d.]+:\d+ -> 127\.[\d.]+:5432: pid \d+ \(python3\) is not a process of job \? \(process tree\)/.test(
            script.stderr,
          ),
        ),
        script.stderr,
      ).toBe(true);
    } finally {
      await Promise.all(servers.map((s) => new Promise((resolve) => s.close(resolve))));
    }
    expect((await script.finish()).code).toBe(0);
    expect(gone(dir)).toBe(true);
  }, 60_000);

  it('holds 64 Services on one port: 64 addresses, 64 hosts lines, 64 sockets within the path limit', async () => {
    const uid = newUid('sixty-four');
    const dir = socketDir('/tmp', uid);
    const forwards = Array.from({ length: 64 }, (_, i) => `db-${i}:5432`).join(' ');
    const text = prelude(forwards, { WaitForForwards: 1000 });
    // The 64th Service's socket, the longest name a pod can have (renderPrelude checks 107 bytes).
    expect(text).toContain(" 63:5432'");
    const script = await start(shell, `set -eu\n${text}${STATE_SNIPPET}`, { SLURM_JOB_NAME: uid });
    const state = await script.state();
    const added = (await readFile(`${dir}/hosts`, 'utf8')).split('# backhaul: Services forwarded')[1] ?? '';
    const lines = added.split('\n').filter((line) => line.startsWith('127.'));
    expect(lines, script.stderr).toHaveLength(64);
    const addresses = lines.map((line) => line.split(' ')[0]);
    expect(new Set(addresses).size).toBe(64);
    expect(addresses[0]).toBe(state.addr);
    lines.forEach((line, i) => {
      expect(line).toMatch(new RegExp(` db-${i}\\.user\\.svc\\.cluster\\.local .* db-${i}$`));
    });
    // Every address listens on 5432, for the job's user only; the wait named the last socket's Service.
    for (const address of [addresses[0], addresses[63]]) {
      await new Promise<void>((resolve, reject) => {
        const socket = net.connect({ host: address ?? '', port: 5432 }, () => {
          socket.destroy();
          resolve();
        });
        socket.on('error', reject);
      });
    }
    expect(script.stderr).toContain('5432 (5432.64.sock);');
    expect((await script.finish()).code).toBe(0);
    expect(gone(dir)).toBe(true);
  }, 60_000);

  it('says the fleet has not reached the job when no relay came, and its boot holds the address meanwhile', async () => {
    const uid = newUid('no-fleet');
    const address = bindAddress(uid);
    const script = await start(
      shell,
      prelude('redis:6379', { WaitForForwards: 1000 }) + STATE_SNIPPET,
      {
        SLURM_JOB_NAME: uid,
      },
      { deliver: false },
    );
    const state = await script.state();
    expect(state.addr).toBe(address);
    expect(script.stderr).toMatch(
      /missing ports: 6379; starting the workload anyway .*; the fleet has not reached this job yet/,
    );
    // Held (nobody else can take it) and closed at once: the workload sees no forward yet.
    const answer = await script.inJob(
      `/usr/bin/python3 -c 'import socket,sys; s=socket.create_connection((sys.argv[1], 6379)); print(repr(s.recv(8)))' ${address} 2>&1`,
    );
    expect(answer.trim()).toBe("b''");
    expect((await script.finish()).code).toBe(0);
  }, 60_000);

  it('goes on as soon as every socket is there, and keeps the exit status', async () => {
    const uid = newUid('early');
    const dir = socketDir('/tmp', uid);
    const script = await start(
      shell,
      `set -eu\n${prelude(FORWARDS, { WaitForForwards: 60_000 })}${STATE_SNIPPET}exit 7\n`,
      {
        SLURM_JOB_NAME: uid,
      },
    );
    await script.waitFor(/waiting up to 60 s/, 'stderr');
    // What the session host's sshd does: a unix socket per listen port, in the job's dir.
    const servers = await Promise.all(
      [6379, 9000, 8080].map(
        (port) =>
          new Promise<net.Server>((resolve, reject) => {
            const server = net.createServer((c) => c.destroy());
            server.on('error', reject);
            server.listen(`${dir}/${port}.sock`, () => resolve(server));
          }),
      ),
    );
    const created = Date.now();
    try {
      await script.state();
      expect(Date.now() - created).toBeLessThan(5_000);
      expect(script.stderr).toMatch(/forwards ready after \d+ s/);
      expect(script.stderr).not.toMatch(/warning/);
    } finally {
      await Promise.all(servers.map((s) => new Promise((resolve) => s.close(resolve))));
    }
    const exit = await script.finish();
    expect(exit.code).toBe(7);
    expect(gone(dir)).toBe(true);
  }, 60_000);

  it('cleans up when Slurm sends TERM (scancel)', async () => {
    const uid = newUid('term');
    const dir = socketDir('/tmp', uid);
    const snippet = STATE_SNIPPET.replace(HOLD_LINE, 'sleep 600');
    const script = await start(shell, prelude('redis:6379', { WaitForForwards: 1000 }) + snippet, {
      SLURM_JOB_NAME: uid,
    });
    await script.state();
    const relays = await relayOf(dir);
    expect(relays).toHaveLength(2);
    // scancel signals every process of the job; the relay is left out to see that the trap ends it.
    const workloads: number[] = [];
    for (const pid of await findProcesses('sleep', '600')) {
      if ((await processInfo(pid))?.ppid === script.pid) workloads.push(pid);
    }
    expect(workloads).toHaveLength(1);
    process.kill(script.pid, 'SIGTERM');
    for (const pid of workloads) process.kill(pid, 'SIGTERM');
    const exit = await script.exited;
    expect(exit.code).toBe(143);
    expect(gone(dir)).toBe(true);
    for (const pid of relays) expect(await eventually(async () => (await processInfo(pid)) === undefined)).toBe(true);
  }, 60_000);

  it('cleans up after a TERM that lands while it makes the socket dir (scancel at the job start)', async () => {
    const uid = newUid('term-mkdir');
    const dir = socketDir('/tmp', uid);
    // A Python that takes its time after the boot has made the dir, so that the TERM lands while it runs.
    const bin = await mkdtemp('/tmp/bh-slow-python-');
    extraPaths.push(bin);
    await writeFile(
      join(bin, 'python3'),
      '#!/bin/sh\n/usr/bin/python3 "$@"; rc=$?\necho made >&2\nsleep 1\nexit $rc\n',
      {
        mode: 0o755,
      },
    );
    await chmod(bin, 0o755);
    const text = prelude('redis:6379', { WaitForForwards: 1000, PythonPath: join(bin, 'python3') }) + STATE_SNIPPET;
    const script = await start(shell, text, { SLURM_JOB_NAME: uid });
    await script.waitFor(/made/, 'stderr');
    expect(gone(dir), 'the dir made').toBe(false);
    process.kill(script.pid, 'SIGTERM');
    const exit = await script.exited;
    expect(exit.code, script.stderr).toBe(143);
    expect(gone(dir), `left behind: ${gone(dir) ? '' : JSON.stringify(await readdir(dir))}`).toBe(true);
  }, 60_000);

  it('finishes its cleanup when TERM comes again and again meanwhile (Slurm, a second scancel)', async () => {
    const uid = newUid('term-again');
    const dir = socketDir('/tmp', uid);
    const snippet = STATE_SNIPPET.replace(HOLD_LINE, 'sleep 600');
    const script = await start(shell, prelude('redis:6379', { WaitForForwards: 1000 }) + snippet, {
      SLURM_JOB_NAME: uid,
    });
    await script.state();
    // Enough files that the trap's rm takes a while, so that the TERMs below reach it.
    await execFileAsync('sh', ['-c', 'cd "$1" && seq 20000 | sed s/^/f/ | xargs touch', 'sh', dir]);
    let signalled = 0;
    const storm = setInterval(() => {
      // The shell and every child of it, as a TERM to the whole job does.
      void execFileAsync('pkill', ['-TERM', '-P', String(script.pid)]).catch(() => undefined);
      try {
        process.kill(script.pid, 'SIGTERM');
        signalled += 1;
      } catch {
        // ended
      }
    }, 2);
    const exit = await script.exited.finally(() => clearInterval(storm));
    const left = gone(dir) ? [] : await readdir(dir);
    expect(exit.code, `${signalled} TERMs; left in the dir: ${left.length} entries`).toBe(143);
    expect(left.length, `${signalled} TERMs; stderr ${script.stderr}`).toBe(0);
    expect(gone(dir)).toBe(true);
  }, 60_000);

  it('appends the hosts file to APPTAINER_BIND and SINGULARITY_BIND, keeping existing binds', async () => {
    const cases: { env: Record<string, string>; apptainer: string; singularity: string }[] = [
      { env: {}, apptainer: 'H', singularity: 'H' },
      { env: { APPTAINER_BIND: '/data:/data' }, apptainer: '/data:/data,H', singularity: 'H' },
      { env: { SINGULARITY_BIND: '/scratch' }, apptainer: '/scratch,H', singularity: '/scratch,H' },
      { env: { APPTAINER_BIND: '/a:/b:ro', SINGULARITY_BIND: '/s' }, apptainer: '/a:/b:ro,H', singularity: '/s,H' },
    ];
    await Promise.all(
      cases.map(async (c) => {
        const uid = newUid('binds');
        const hosts = `${socketDir('/tmp', uid)}/hosts:/etc/hosts`;
        const script = await start(shell, prelude('') + STATE_SNIPPET, { SLURM_JOB_NAME: uid, ...c.env });
        const state = await script.state();
        expect(state.apptainer).toBe(c.apptainer.replace('H', hosts));
        expect(state.singularity).toBe(c.singularity.replace('H', hosts));
        expect((await script.finish()).code).toBe(0);
      }),
    );
  }, 60_000);

  it('takes BACKHAUL_POD_UID over SLURM_JOB_NAME', async () => {
    const uid = newUid('override');
    const script = await start(shell, prelude('') + STATE_SNIPPET, {
      BACKHAUL_POD_UID: uid,
      SLURM_JOB_NAME: 'some-other-job-name',
    });
    expect((await script.state()).dir).toBe(socketDir('/tmp', uid));
    expect((await script.finish()).code).toBe(0);
  }, 30_000);

  it('stops without a pod UID, or with one that is not a UID', async () => {
    const none = await start(shell, prelude('redis:6379') + STATE_SNIPPET, {});
    expect((await none.exited).code).toBe(1);
    expect(none.stderr).toMatch(/'' is not a pod UID \(BACKHAUL_POD_UID, else SLURM_JOB_NAME/);
    expect(none.stdout).not.toMatch(/checkpoint/);

    const bad = await start(shell, prelude('redis:6379') + STATE_SNIPPET, { SLURM_JOB_NAME: '../etc' });
    expect((await bad.exited).code).toBe(1);
    expect(bad.stderr).toMatch(/'\.\.\/etc' is not a pod UID/);
  }, 30_000);

  it('refuses a socket dir that another user made first', async () => {
    const uid = newUid('squat');
    const dir = socketDir('/tmp', uid);
    await mkdir(dir, { mode: 0o700 });
    await chown(dir, other.uid, other.gid);
    const script = await start(shell, prelude('redis:6379') + STATE_SNIPPET, { SLURM_JOB_NAME: uid });
    expect((await script.exited).code).toBe(1);
    expect(script.stderr).toMatch(
      /refusing the socket dir .*: it is another user's, who may intercept the forwards: remove it/,
    );
    expect(script.stdout).not.toMatch(/checkpoint/);
    // Not the job's to remove.
    expect((await lstat(dir)).uid).toBe(other.uid);
    expect(await relayOf(dir)).toEqual([]);
  }, 30_000);

  it('refuses a symbolic link at the socket dir path', async () => {
    const uid = newUid('link');
    const dir = socketDir('/tmp', uid);
    const target = await mkdtemp('/tmp/bh-link-target-');
    extraPaths.push(target);
    await chown(target, job.uid, job.gid);
    await symlink(target, dir);
    const script = await start(shell, prelude('redis:6379') + STATE_SNIPPET, { SLURM_JOB_NAME: uid });
    expect((await script.exited).code).toBe(1);
    expect(script.stderr).toMatch(/refusing the socket dir .*: it is a symbolic link/);
    expect(await readlink(dir)).toBe(target);
    expect(await readdir(target)).toEqual([]);
  }, 30_000);

  it('reuses its own leftover dir: made private again, stale sockets removed', async () => {
    const uid = newUid('leftover');
    const dir = socketDir('/tmp', uid);
    await mkdir(dir, { mode: 0o755 });
    await chown(dir, job.uid, job.gid);
    // A socket left by a killed run: bound, never unlinked.
    await execFileAsync('/usr/bin/python3', [
      '-c',
      'import socket, sys; socket.socket(socket.AF_UNIX).bind(sys.argv[1])',
      `${dir}/6379.sock`,
    ]);
    const script = await start(shell, prelude('redis:6379', { WaitForForwards: 1000 }) + STATE_SNIPPET, {
      SLURM_JOB_NAME: uid,
    });
    await script.state();
    expect((await lstat(dir)).mode & 0o777).toBe(0o700);
    expect(script.stderr).toMatch(/missing ports: 6379;/);
    expect((await script.finish()).code).toBe(0);
    expect(gone(dir)).toBe(true);
  }, 30_000);

  it('gives a container the names through a hosts file bound over /etc/hosts (as Apptainer does)', async () => {
    const uid = newUid('bwrap');
    const address = bindAddress(uid);
    const workload = [
      'for name in redis redis.user minio.storage.svc.cluster.local; do',
      '  bwrap --dev-bind / / --bind "$BACKHAUL_HOSTS_FILE" /etc/hosts getent hosts "$name" | sed "s/^/resolved $name /"',
      'done',
      '',
    ].join('\n');
    const script = await start(shell, prelude(FORWARDS, { WaitForForwards: 1000 }) + workload, { SLURM_JOB_NAME: uid });
    const exit = await script.exited;
    expect(exit.code, script.stderr).toBe(0);
    for (const [name, at] of [
      ['redis', address],
      ['redis.user', address],
      ['minio.storage.svc.cluster.local', bindAddress(uid, 1)],
    ] as const) {
      expect(script.stdout).toMatch(
        new RegExp(`^resolved ${name.replaceAll('.', '\\.')} ${at.replaceAll('.', '\\.')}\\s`, 'm'),
      );
    }
  }, 30_000);
});

/** Binds ADDRESS:PORT as often as it can for SECONDS, as another user would, and says how it went. */
const SQUATTER = `
import socket, sys, time
address, port, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
end = time.time() + seconds
tries = bound = received = 0
while time.time() < end:
    tries += 1
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind((address, port))
        s.listen(8)
        bound += 1
        s.settimeout(0.05)
        try:
            c, _ = s.accept()
            received += len(c.recv(4096))
            c.close()
        except socket.timeout:
            pass
    except OSError:
        pass
    s.close()
    time.sleep(0.001)
print("tries=%d bound=%d received=%d" % (tries, bound, received))
`;

describe('the Kubernetes API for in-cluster clients (bash)', () => {
  it('a forward to the API exports KUBERNETES_SERVICE_HOST/PORT, by a name the hosts file maps to the relay', async () => {
    const uid = newUid('kapi');
    // The API is the pod's second Service: its own address.
    const address = bindAddress(uid, 1);
    const workload = [
      'echo "env $KUBERNETES_SERVICE_HOST $KUBERNETES_SERVICE_PORT $KUBERNETES_SERVICE_PORT_HTTPS"',
      'bwrap --dev-bind / / --bind "$BACKHAUL_HOSTS_FILE" /etc/hosts getent hosts "$KUBERNETES_SERVICE_HOST" | sed "s/^/resolved /"',
      '',
    ].join('\n');
    const script = await start(
      'bash',
      prelude(`redis:6379 6443:kubernetes.default.svc.cluster.local:443`, { WaitForForwards: 1000 }) + workload,
      { SLURM_JOB_NAME: uid },
    );
    const exit = await script.exited;
    expect(exit.code, script.stderr).toBe(0);
    expect(script.stdout).toContain('env kubernetes.default.svc 6443 6443');
    expect(script.stdout).toMatch(
      new RegExp(
        // getent prints the address, then the canonical name and the aliases, in the hosts file's order.
        `^resolved ${address.replaceAll('.', '\\.')}(\\s+\\S+)*\\s+kubernetes\\.default\\.svc(\\s|$)`,
        'm',
      ),
    );
  }, 30_000);

  it('an in-cluster client (client-node loadFromCluster) reaches the API through the relay and verifies its certificate', async () => {
    const uid = newUid('incluster');
    const dir = socketDir('/tmp', uid);
    const work = await mkdtemp('/tmp/bh-incluster-');
    extraPaths.push(work);
    const ca = await makeCa(work);
    // The API server's certificate names the Service (and not the relay's 127.x address).
    const cert = await makeServerCert(work, ca, {
      prefix: 'apiserver',
      dns: ['kubernetes', 'kubernetes.default', 'kubernetes.default.svc', 'kubernetes.default.svc.cluster.local'],
      ips: ['10.96.0.1'],
    });
    const api = await FakeApiServer.start({ tls: { cert: cert.cert, key: cert.key }, token: 'in-cluster-token' });
    const sa = `${work}/serviceaccount`;
    await mkdir(sa, { mode: 0o755 });
    await writeFile(`${sa}/token`, 'in-cluster-token');
    await writeFile(`${sa}/ca.crt`, ca.cert);
    await writeFile(`${sa}/namespace`, 'user');
    await chmod(work, 0o755);
    api.createPod({ metadata: { name: 'seen-from-the-job', namespace: 'user' } });
    // What the session host's reverse forward is to the job: a socket in the socket dir, to the API.
    const forward = net.createServer((client) => {
      const upstream = net.connect(api.port, '127.0.0.1');
      client.pipe(upstream).pipe(client);
      client.on('error', () => upstream.destroy());
      upstream.on('error', () => client.destroy());
    });
    try {
      const client = `
        const k = await import(${JSON.stringify(CLIENT_NODE)});
        const kc = new k.KubeConfig();
        kc.loadFromCluster();
        const pods = await kc.makeApiClient(k.CoreV1Api).listNamespacedPod({ namespace: 'user' });
        console.log('server ' + kc.getCurrentCluster().server);
        console.log('pods ' + pods.items.map((p) => p.metadata.name).join(','));`;
      const workload = [
        // As the pod's container would see them: the names, and the service account where clients look
        // (/var/run is /run here; a tmpfs over it lets bwrap make the mount point as the job's user).
        `bwrap --dev-bind / / --bind "$BACKHAUL_HOSTS_FILE" /etc/hosts --tmpfs /run --bind ${sa} /run/secrets/kubernetes.io/serviceaccount \\`,
        `  ${process.execPath} --input-type=module -e ${shellSingleQuoted(client)}`,
        '',
      ].join('\n');
      const script = await start(
        'bash',
        prelude('6443:kubernetes.default.svc.cluster.local:443', { WaitForForwards: 20_000 }) + workload,
        { SLURM_JOB_NAME: uid },
      );
      await eventually(async () => (await stat(dir).catch(() => undefined))?.isDirectory() ?? false, 10_000);
      const socket = `${dir}/6443.sock`;
      await new Promise<void>((resolve) => forward.listen(socket, resolve));
      await chown(socket, job.uid, job.gid);
      const exit = await script.exited;
      expect(exit.code, `${script.stdout}\n${script.stderr}`).toBe(0);
      expect(script.stdout).toContain('server https://kubernetes.default.svc:6443');
      expect(script.stdout).toContain('pods seen-from-the-job');
      expect(api.usedAccess()).toContain('pods.list');
    } finally {
      forward.close();
      await api.close();
    }
  }, 60_000);

  it('leaves them alone without such a forward', async () => {
    const uid = newUid('noapi');
    const script = await start(
      'bash',
      `${prelude('redis:6379', { WaitForForwards: 1000 })}echo "env [\${KUBERNETES_SERVICE_HOST:-unset}]"\n`,
      { SLURM_JOB_NAME: uid, KUBERNETES_SERVICE_HOST: '10.96.0.1' },
    );
    expect((await script.exited).code, script.stderr).toBe(0);
    expect(script.stdout).toContain('env [10.96.0.1]');
  }, 30_000);
});

describe('the relay under attack from other users of the node (bash)', () => {
  it('takes another address when the derived one is held by someone else, and the hosts file names that one', async () => {
    const uid = newUid('taken');
    const dir = socketDir('/tmp', uid);
    const derived = bindAddress(uid);
    const squatted: string[] = [];
    const squatter = net.createServer((socket) => {
      squatted.push(socket.remoteAddress ?? '?');
      socket.destroy();
    });
    squatter.listen({ host: derived, port: 6379 });
    await new Promise((resolve) => squatter.once('listening', resolve));
    try {
      const script = await start('bash', prelude('redis:6379', { WaitForForwards: 1000 }) + STATE_SNIPPET, {
        SLURM_JOB_NAME: uid,
      });
      const state = await script.state();
      expect(state.addr, script.stderr).not.toBe(derived);
      expect(state.addr).toMatch(/^127\.\d+\.\d+\.\d+$/);
      expect(script.stderr).toMatch(
        new RegExp(
          `cannot listen on ${derived.replaceAll('.', '\\.')}:6379 \\(port 6379\\): Address already in use; trying another address`,
        ),
      );
      const hosts = await readFile(`${dir}/hosts`, 'utf8');
      expect(hosts).toContain(`${state.addr} redis.user.svc.cluster.local`);
      expect(hosts).not.toContain(`${derived} `);
      // The names lead to the relay: it answers (and refuses this root-owned client) instead of the squatter.
      await new Promise<void>((resolve) => {
        const socket = net.connect({ host: state.addr, port: 6379 }, () => socket.end());
        socket.on('close', () => resolve());
        socket.on('error', () => resolve());
      });
      expect(await eventually(() => script.stderr.includes(`-> ${state.addr}:6379: uid 0 is not the job's uid`))).toBe(
        true,
      );
      expect(squatted).toEqual([]);
      await script.finish();
    } finally {
      await new Promise((resolve) => squatter.close(resolve));
    }
  }, 30_000);

  it("moves only the Service whose address is held, and the hosts file names each Service's own", async () => {
    const uid = newUid('taken-second');
    const dir = socketDir('/tmp', uid);
    const [first, second] = [bindAddress(uid), bindAddress(uid, 1)];
    const squatter = net.createServer((socket) => socket.destroy());
    squatter.listen({ host: second, port: 6379 });
    await new Promise((resolve) => squatter.once('listening', resolve));
    try {
      const script = await start('bash', prelude('redis:6379 cache:6379', { WaitForForwards: 1000 }) + STATE_SNIPPET, {
        SLURM_JOB_NAME: uid,
      });
      const state = await script.state();
      expect(state.addr, script.stderr).toBe(first);
      const lines = (await readFile(`${dir}/hosts`, 'utf8')).split('\n');
      expect(lines).toContain(`${first} redis.user.svc.cluster.local redis.user.svc redis.user redis`);
      const cache = lines.find((line) =>
        line.endsWith(' cache.user.svc.cluster.local cache.user.svc cache.user cache'),
      );
      const moved = cache?.split(' ')[0];
      expect(moved, lines.join('\n')).toMatch(/^127\.\d+\.\d+\.\d+$/);
      expect([first, second]).not.toContain(moved);
      expect(script.stderr).toContain(`cannot listen on ${second}:6379`);
      await script.finish();
    } finally {
      await new Promise((resolve) => squatter.close(resolve));
    }
  }, 30_000);

  it('starts a killed relaying process again on the same listeners: another user never gets the address', async () => {
    const uid = newUid('kill9');
    const dir = socketDir('/tmp', uid);
    const script = await start('bash', prelude('redis:6379', { WaitForForwards: 1000 }) + STATE_SNIPPET, {
      SLURM_JOB_NAME: uid,
    });
    const state = await script.state();
    const [holder, relaying] = (await readFile(`${dir}/relay.pids`, 'utf8')).trim().split(' ').map(Number);
    expect(holder, 'relay.pids').toBeGreaterThan(0);
    const squatter = runAs(other, '/usr/bin/python3', ['-c', SQUATTER, state.addr ?? '', '6379', '3']);
    await new Promise((resolve) => setTimeout(resolve, 300));
    for (let kill = 0; kill < 3; kill += 1) {
      const victim = Number((await readFile(`${dir}/relay.pids`, 'utf8')).trim().split(' ')[1]);
      process.kill(victim, 'SIGKILL');
      expect(
        await eventually(async () => {
          const now = (await readFile(`${dir}/relay.pids`, 'utf8')).trim().split(' ').map(Number);
          return now[0] === holder && now[1] !== victim && (await processInfo(now[1] ?? -1)) !== undefined;
        }),
        `relay.pids after killing ${victim}; stderr:\n${script.stderr}`,
      ).toBe(true);
    }
    const seen = await squatter;
    expect(seen.stdout, seen.stderr).toMatch(/tries=\d+ bound=0 received=0/);
    expect(Number(/tries=(\d+)/.exec(seen.stdout)?.[1])).toBeGreaterThan(100);
    expect(script.stderr).toMatch(
      new RegExp(`the relay process ${relaying} was killed by SIGKILL; starting another on the same listeners`),
    );
    // Still relaying: a client of the job is passed on (to a socket that is not there: closed, logged).
    const probe = await script.inJob(
      `/usr/bin/python3 -c 'import socket,sys; s=socket.create_connection((sys.argv[1], 6379)); print(s.recv(1) == b"")' ${state.addr ?? ''} 2>&1`,
    );
    expect(probe.trim()).toBe('True');
    expect(await eventually(() => script.stderr.includes(`cannot connect ${dir}/6379.sock`))).toBe(true);
    expect((await script.finish()).code).toBe(0);
  }, 30_000);

  it('makes a per-user socket root private, and refuses one another user made first', async () => {
    const root = `/tmp/bh-root-${process.pid}-${Date.now()}`;
    extraPaths.push(root);
    const uid = newUid('own');
    const script = await start(
      'bash',
      prelude('redis:6379', { SocketRoot: root, PrivateSocketRoot: true, WaitForForwards: 1000 }) + STATE_SNIPPET,
      { SLURM_JOB_NAME: uid },
    );
    const state = await script.state();
    expect(state.dir).toBe(socketDir(root, uid));
    const made = await lstat(root);
    expect({ mode: (made.mode & 0o777).toString(8), uid: made.uid }).toEqual({ mode: '700', uid: job.uid });
    expect((await script.finish()).code).toBe(0);
    // The root stays for the user's next jobs; the pod's dir inside it is gone.
    expect(gone(socketDir(root, uid))).toBe(true);
    expect((await lstat(root)).isDirectory()).toBe(true);

    await chown(root, other.uid, other.gid);
    const refused = await start(
      'bash',
      prelude('redis:6379', { SocketRoot: root, PrivateSocketRoot: true, WaitForForwards: 1000 }) + STATE_SNIPPET,
      { SLURM_JOB_NAME: newUid('own2') },
    );
    expect((await refused.exited).code).toBe(1);
    expect(refused.stderr).toMatch(
      /refusing the socket root .*: it is another user's, who may intercept the forwards: remove it/,
    );
    expect(refused.stdout).not.toMatch(/checkpoint/);
  }, 30_000);
});
