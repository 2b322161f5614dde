/**
 * Request/response through the tunnel, side by side in one run: `npm run bench:latency`.
 *
 * What database, cache and API clients feel is the round trip, not MB/s. On the loopback site (real
 * login sshd + node sshd `bhnode1`, both pinned to aes128-gcm@openssh.com) the same cluster-side
 * servers are reached by a client running as the job user through:
 *   direct  loopback TCP to the server (no tunnel);
 *   (b)     OpenSSH `ssh -J bh-login -N -R <sock>:127.0.0.1:<port> bhjob@bhnode1`;
 *   (b+r)   (b) behind src/job/relay.py on the pod's 127.x.y.z address (what a workload dials);
 *   (c)     backhaul as the fleet runs it: the pod's job starts with the real prelude (socket dir, relay), a
 *           shadow in a tunnel thread opens the node carrier (login jump -> node sshd) and binds the forwards;
 *   (c+r)   (c) behind the prelude's relay;
 *   (c1), (c1+r)  the same with the carrier on the session host's own thread (TunnelThreads 0);
 *   (cx), (cx+r)  (c) with write coalescing off (BACKHAUL_WRITE_COALESCING=off): what it buys, paired.
 * Measures, interleaved over BENCH_REPEAT rounds so that drifting load hits every path alike:
 *   seq     sequential 64-byte ping-pongs on one connection (µs per round trip, p50/p99);
 *   conc8, conc32  8 / 32 connections, one 64-byte request in flight each (requests/s, p50/p99);
 *   connect a new connection per 64-byte request, one after another (connections/s, µs each);
 *   pgbench `pgbench -S -c 8 -j 2` against a private PostgreSQL (tps);
 *   redis   `redis-benchmark -c 20 -t ping,set,get` against a private Redis (requests/s, p50).
 * The servers (an echo server, PostgreSQL, Redis) are started here on free loopback ports and stopped
 * at the end; nothing is left behind, also on SIGINT/SIGTERM.
 *
 * Environment: BENCH_REPEAT (3), BENCH_SEQ_COUNT (5000 round trips), BENCH_CONC_SECONDS (5),
 * BENCH_PG_SECONDS (10), BENCH_REDIS_REQUESTS (100000), BENCH_PATHS (direct,b,br,c,cr,c1,c1r; also cx,cxr),
 * BENCH_TUNNEL_THREADS (for (c); default as "auto"),
 * BENCH_KINDS (seq,conc8,conc32,connect,pgbench,redis), BENCH_CONNECT_COUNT (500), BENCH_JSON (write every sample to this file).
 * Results and their reading: docs/history/performance-notebook.md ("Round trips").
 */
import { chmodSync, chownSync, readFileSync } from 'node:fs';
import { copyFile, mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { sshCryptoPath } from '../src/ssh/crypto-path.js';
import { autoTunnelThreads } from '../src/ssh/tunnel-threads.js';
import { startLoopbackSite } from '../tools/sandbox/loopback-site.js';
import { freePort } from '../tools/sandbox/sshd.js';
import { lookupUser, type TestUser } from '../tools/sandbox/users.js';
import {
  benchName,
  type CpuGroups,
  cleanupAll,
  cpuDelta,
  lpad,
  median,
  onCleanup,
  PYTHON,
  pad,
  ROOT,
  say,
  snapshot,
  start,
  treeOf,
  withTimeout,
} from './harness.js';
import { openShadowTunnel, relayOf, srunInJob, startShadowHost } from './shadow-path.js';
import { type Forward, openSshReverse, PINNED_CIPHER, startRelay } from './site-paths.js';

benchName('bench:latency');

const REPEAT = Math.max(1, Number(process.env.BENCH_REPEAT ?? 3));
const SEQ_COUNT = Math.max(100, Number(process.env.BENCH_SEQ_COUNT ?? 5000));
const CONC_SECONDS = Math.max(1, Number(process.env.BENCH_CONC_SECONDS ?? 5));
const PG_SECONDS = Math.max(2, Number(process.env.BENCH_PG_SECONDS ?? 10));
const REDIS_REQUESTS = Math.max(1000, Number(process.env.BENCH_REDIS_REQUESTS ?? 100_000));
const PATHS = new Set((process.env.BENCH_PATHS ?? 'direct,b,br,c,cr,c1,c1r').split(',').map((p) => p.trim()));
const KINDS = new Set(
  (process.env.BENCH_KINDS ?? 'seq,conc8,conc32,connect,pgbench,redis').split(',').map((k) => k.trim()),
);
const CONNECT_COUNT = Math.max(50, Number(process.env.BENCH_CONNECT_COUNT ?? 500));
const PG_BIN = '/usr/lib/postgresql/15/bin';
const TUNNEL_THREADS =
  process.env.BENCH_TUNNEL_THREADS === undefined || process.env.BENCH_TUNNEL_THREADS === 'auto'
    ? autoTunnelThreads()
    : Number(process.env.BENCH_TUNNEL_THREADS);

type Kind = 'seq' | 'conc8' | 'conc32' | 'connect' | 'pgbench' | 'redis';
type Service = 'echo' | 'pg' | 'redis';
const SERVICES: readonly Service[] = ['echo', 'pg', 'redis'];

/** Where a client finds each service on one path. */
type Endpoints = Record<Service, { unix: string } | { host: string; port: number }>;

interface PathDef {
  key: string;
  label: string;
  endpoints: Endpoints;
  /** The processes of this path whose CPU is counted per request (the sshds and the server are added). */
  groups: CpuGroups;
  /**
   * Clients of this path run as a step of this job (`srun --overlap`): the relay of a pod admits only
   * the processes of its job.
   */
  job?: { jobId: string; node: string };
}

/** COMMAND ARGS as the path's clients run it: in the pod's job where the path is its relay. */
function client(path: PathDef, command: string, args: readonly string[]): [string, string[]] {
  if (!path.job) return [command, [...args]];
  const { jobId, node } = path.job;
  return ['srun', [...srunInJob(jobId, node), command, ...args]];
}

/** One measurement: the headline figure and what else the client said. */
interface Figures {
  /** Requests (or transactions) per second. */
  rps: number;
  p50us: number;
  p99us: number;
  /** Requests (round trips, transactions) in the run. */
  requests: number;
}

// ------------------------------------------------------------------------------------------ servers

/** A PostgreSQL of our own (initdb in a temp dir, fsync off), with pgbench's tables in database `bench`. */
async function startPostgres(): Promise<{ port: number; pid: number }> {
  const pgUser = await lookupUser('postgres');
  if (!pgUser) throw new Error('no postgres user: install postgresql (apt-get install postgresql)');
  const dir = await mkdtemp(join(tmpdir(), 'bh-bench-pg-'));
  onCleanup('postgres dir', () => rm(dir, { recursive: true, force: true }));
  chownSync(dir, pgUser.uid, pgUser.gid);
  const data = join(dir, 'data');
  const init = start(
    'initdb',
    `${PG_BIN}/initdb`,
    ['-D', data, '-A', 'trust', '-U', 'postgres', '--no-sync', '-E', 'UTF8'],
    pgUser,
  );
  const inited = await withTimeout(init.exited, 120_000, 'initdb');
  if (inited.code !== 0) throw new Error(`initdb failed: ${init.stderr().trim().split('\n').slice(-3).join(' | ')}`);
  const port = await freePort();
  const server = start(
    'postgres',
    `${PG_BIN}/postgres`,
    [
      '-D',
      data,
      '-p',
      String(port),
      '-k',
      dir,
      '-c',
      'listen_addresses=127.0.0.1',
      '-c',
      'fsync=off',
      '-c',
      'synchronous_commit=off',
      '-c',
      'max_connections=100',
    ],
    pgUser,
  );
  for (let i = 0; ; i++) {
    const ready = start('pg_isready', 'pg_isready', ['-h', '127.0.0.1', '-p', String(port), '-U', 'postgres']);
    if ((await ready.exited).code === 0) break;
    if (server.proc.exitCode !== null || i > 100)
      throw new Error(`postgres did not start: ${server.stderr().slice(-500)}`);
    await new Promise((r) => setTimeout(r, 200));
  }
  const pgArgs = ['-h', '127.0.0.1', '-p', String(port), '-U', 'postgres'];
  await mustRun('createdb', 'createdb', [...pgArgs, 'bench']);
  await mustRun('pgbench -i', 'pgbench', ['-i', '-q', '-s', '4', ...pgArgs, 'bench']);
  say(`postgres on 127.0.0.1:${port} (private, pgbench scale 4)`);
  return { port, pid: server.pid };
}

async function startRedis(): Promise<{ port: number; pid: number }> {
  const port = await freePort();
  const redis = start('redis-server', 'redis-server', [
    '--port',
    String(port),
    '--bind',
    '127.0.0.1',
    '--save',
    '',
    '--appendonly',
    'no',
  ]);
  await redis.line(/Ready to accept connections/, 15_000);
  say(`redis on 127.0.0.1:${port} (private)`);
  return { port, pid: redis.pid };
}

async function mustRun(name: string, command: string, args: readonly string[], user?: TestUser): Promise<string> {
  const child = start(name, command, args, user);
  const ended = await withTimeout(child.exited, 300_000, name);
  if (ended.code !== 0) {
    throw new Error(
      `${name} failed (${ended.code ?? ended.signal}): ${child.stderr().trim().split('\n').slice(-3).join(' | ')}`,
    );
  }
  return child.stdout();
}

// ------------------------------------------------------------------------------------------ clients

let PEER = join(ROOT, 'bench', 'latency_peer.py');

function where(endpoint: Endpoints[Service]): string[] {
  return 'unix' in endpoint ? ['--unix', endpoint.unix] : ['--tcp', `${endpoint.host}:${endpoint.port}`];
}

async function pingPong(user: TestUser, path: PathDef, kind: 'seq' | 'conc8' | 'conc32' | 'connect'): Promise<Figures> {
  const args =
    kind === 'seq'
      ? ['--conns', '1', '--count', String(SEQ_COUNT), '--warmup', '200']
      : kind === 'connect'
        ? ['--connect', '--count', String(CONNECT_COUNT), '--warmup', '20']
        : ['--conns', kind === 'conc8' ? '8' : '32', '--seconds', String(CONC_SECONDS), '--warmup', '20'];
  const out = await mustRun(
    'client',
    ...client(path, PYTHON, [PEER, 'client', ...where(path.endpoints.echo), '--size', '64', ...args]),
    user,
  );
  const r = JSON.parse(out.trim().split('\n').pop() ?? '{}') as {
    rps: number;
    p50_us: number;
    p99_us: number;
    rtts: number;
  };
  return { rps: r.rps, p50us: r.p50_us, p99us: r.p99_us, requests: r.rtts };
}

async function pgbench(user: TestUser, path: PathDef): Promise<Figures> {
  const ep = path.endpoints.pg;
  if ('unix' in ep) throw new Error('pgbench runs through TCP paths only');
  const out = await mustRun(
    'pgbench',
    ...client(path, 'pgbench', [
      '-S',
      '-n',
      '-c',
      '8',
      '-j',
      '2',
      '-T',
      String(PG_SECONDS),
      '-h',
      ep.host,
      '-p',
      String(ep.port),
      '-U',
      'postgres',
      'bench',
    ]),
    user,
  );
  const tps = /tps = ([\d.]+) \(without initial connection time\)/.exec(out);
  const latency = /latency average = ([\d.]+) ms/.exec(out);
  if (!tps) throw new Error(`pgbench printed no tps: ${out.slice(-300)}`);
  const avgUs = Number(latency?.[1] ?? Number.NaN) * 1000;
  const done = /number of transactions actually processed: (\d+)/.exec(out);
  return { rps: Number(tps[1]), p50us: avgUs, p99us: Number.NaN, requests: Number(done?.[1] ?? Number.NaN) };
}

async function redisBenchmark(user: TestUser, path: PathDef): Promise<Figures> {
  const ep = path.endpoints.redis;
  if ('unix' in ep) throw new Error('redis-benchmark runs through TCP paths only');
  const out = await mustRun(
    'redis-benchmark',
    ...client(path, 'redis-benchmark', [
      '-h',
      ep.host,
      '-p',
      String(ep.port),
      '-c',
      '20',
      '-n',
      String(REDIS_REQUESTS),
      '-t',
      'ping,set,get',
      '--csv',
    ]),
    user,
  );
  // "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"
  const rows = out
    .trim()
    .split('\n')
    .filter((l) => /^"[A-Z_]+"/.test(l))
    .map((l) => l.split(',').map((f) => f.replace(/"/g, '')));
  if (rows.length === 0) throw new Error(`redis-benchmark printed no results: ${out.slice(-300)}`);
  const mean = (i: number) => rows.reduce((a, r) => a + Number(r[i]), 0) / rows.length;
  return { rps: mean(1), p50us: mean(4) * 1000, p99us: mean(6) * 1000, requests: rows.length * REDIS_REQUESTS };
}

// ------------------------------------------------------------------------------------------ main

interface Sample extends Figures {
  round: number;
  /** CPU µs per request of each process group (sshds, ours, relay, server). */
  cpuUs: Record<string, number>;
  /** The part of cpuUs spent in the kernel (system time). */
  kernelUs: Record<string, number>;
  /** Busy CPU µs per request of the whole machine: clients, kernel threads and softirqs included. */
  machineUs: number;
  /** Fraction of the machine's cores busy while the measure ran (near 1: CPU-bound). */
  busy: number;
  /**
   * TCP segments sent on the machine per request (/proc/net/snmp OutSegs; everything on loopback, so a
   * quiet machine is assumed): a path that splits messages or sends bare ACKs shows more.
   */
  segments: number;
}

function tcpOutSegments(): number {
  const lines = readFileSync('/proc/net/snmp', 'utf8')
    .split('\n')
    .filter((l) => l.startsWith('Tcp:'));
  const [names, values] = lines.map((l) => l.split(/\s+/));
  const at = names?.indexOf('OutSegs') ?? -1;
  return at < 0 ? Number.NaN : Number(values?.[at]);
}

interface Row {
  kind: Kind;
  path: PathDef;
  samples: Sample[];
  error?: string;
}

async function main(): Promise<void> {
  const t0 = Date.now();
  const crypto = sshCryptoPath();
  say(`ssh2 crypto: ${crypto.description}`);
  if (!crypto.native && process.env.BENCH_ALLOW_JS_CRYPTO !== '1') {
    throw new Error(
      `ssh2 runs its JavaScript crypto fallback: ${crypto.fix} (BENCH_ALLOW_JS_CRYPTO=1 measures it anyway)`,
    );
  }
  const site = await startLoopbackSite({ loginExtra: PINNED_CIPHER, nodeExtra: PINNED_CIPHER });
  onCleanup('loopback site', () => site.stop());
  const user = site.user;

  const work = await mkdtemp(join(tmpdir(), 'bh-bench-'));
  onCleanup('work dir', () => rm(work, { recursive: true, force: true }));
  chownSync(work, user.uid, user.gid);
  chmodSync(work, 0o700);
  const relayPath = join(work, 'relay.py');
  PEER = join(work, 'latency_peer.py');
  await copyFile(join(ROOT, 'bench', 'latency_peer.py'), PEER);
  await copyFile(join(ROOT, 'src', 'job', 'relay.py'), relayPath);
  chmodSync(PEER, 0o644);
  chmodSync(relayPath, 0o644);

  const echo = start('echo', PYTHON, [PEER, 'echo']);
  const echoPort = (JSON.parse(await echo.line(/"listening"/, 15_000)) as { listening: number }).listening;
  const pg = KINDS.has('pgbench') ? await startPostgres() : undefined;
  const redis = KINDS.has('redis') ? await startRedis() : undefined;
  const ports: Record<Service, number> = { echo: echoPort, pg: pg?.port ?? 0, redis: redis?.port ?? 0 };
  const serverPids = () => [echo.pid, ...(pg ? treeOf(pg.pid) : []), ...(redis ? [redis.pid] : [])];
  const services = SERVICES.filter((s) => ports[s] > 0);

  const paths: PathDef[] = [];
  const tcp = (host: string, port: (s: Service) => number): Endpoints =>
    Object.fromEntries(SERVICES.map((s) => [s, { host, port: port(s) }])) as Endpoints;
  const unix = (socket: (s: Service) => string): Endpoints =>
    Object.fromEntries(SERVICES.map((s) => [s, { unix: socket(s) }])) as Endpoints;
  if (PATHS.has('direct'))
    paths.push({
      key: 'direct',
      label: 'direct loopback TCP',
      endpoints: tcp('127.0.0.1', (s) => ports[s]),
      groups: {},
    });

  const sshTunnel = async () => {
    const dir = join(work, 'b');
    await mkdir(dir, { mode: 0o700 });
    chownSync(dir, user.uid, user.gid);
    const forwards: Forward[] = services.map((s) => ({ socket: join(dir, `${s}.sock`), port: ports[s] }));
    const ssh = await openSshReverse(site, work, user, forwards);
    const name = '(b) OpenSSH ssh -J -R';
    const clients: CpuGroups = { 'ssh -J (ours)': () => treeOf(ssh.pid) };
    if (PATHS.has('b'))
      paths.push({ key: 'b', label: name, endpoints: unix((s) => join(dir, `${s}.sock`)), groups: clients });
    if (PATHS.has('br')) {
      const relay = await startRelay(user, relayPath, dir, forwards);
      const relayPort = (s: Service) => relay.ports[services.indexOf(s)] ?? 0;
      paths.push({
        key: 'br',
        label: `${name} + relay`,
        endpoints: tcp(relay.address, relayPort),
        groups: { ...clients, relay: () => treeOf(relay.child.pid) },
      });
    }
  };
  /** A pod as the fleet runs it: its job's prelude starts the relay, a shadow binds the forwards. */
  const backhaulTunnel = async (key: 'c' | 'c1' | 'cx', threads: number, name: string, uncoalesced = false) => {
    // Read when a connection is made, in this thread and in tunnel threads (which copy the environment
    // when they start): set for this path's setup only.
    if (uncoalesced) process.env.BACKHAUL_WRITE_COALESCING = 'off';
    let host: Awaited<ReturnType<typeof startShadowHost>>;
    let tunnel: Awaited<ReturnType<typeof openShadowTunnel>>;
    try {
      host = await startShadowHost(site, threads);
      tunnel = await openShadowTunnel(
        host,
        services.map((s) => ports[s]),
      );
    } finally {
      if (uncoalesced) delete process.env.BACKHAUL_WRITE_COALESCING;
    }
    const at = (s: Service) => services.indexOf(s);
    // The benchmark's own process holds the shadow hosts: its CPU is the fleet's for the path measured.
    const ours: CpuGroups = { 'backhaul (ours)': () => [process.pid] };
    if (PATHS.has(key))
      paths.push({ key, label: name, endpoints: unix((s) => tunnel.sockets[at(s)] ?? ''), groups: ours });
    if (PATHS.has(`${key}r`)) {
      paths.push({
        key: `${key}r`,
        label: `${name} + relay`,
        endpoints: tcp(tunnel.address, (s) => tunnel.ports[at(s)] ?? 0),
        groups: { ...ours, relay: () => relayOf(user.uid, tunnel.uid) },
        job: { jobId: tunnel.jobId, node: tunnel.node },
      });
    }
  };
  if (PATHS.has('b') || PATHS.has('br')) await sshTunnel();
  if (PATHS.has('c') || PATHS.has('cr'))
    await backhaulTunnel('c', TUNNEL_THREADS, `(c) backhaul, tunnel thread (${TUNNEL_THREADS})`);
  if (PATHS.has('c1') || PATHS.has('c1r')) await backhaulTunnel('c1', 0, '(c1) backhaul, one thread');
  if (PATHS.has('cx') || PATHS.has('cxr'))
    await backhaulTunnel(
      'cx',
      TUNNEL_THREADS,
      `(cx) backhaul, tunnel thread (${TUNNEL_THREADS}), writes not coalesced`,
      true,
    );
  say(`set up in ${((Date.now() - t0) / 1000).toFixed(1)} s`);

  const kinds = (['seq', 'conc8', 'conc32', 'connect', 'pgbench', 'redis'] as const).filter((k) => KINDS.has(k));
  const rows: Row[] = [];
  for (const kind of kinds) {
    for (const path of paths) {
      // Real clients speak TCP: the unix-socket rows only serve to show what the relay costs.
      if ((kind === 'pgbench' || kind === 'redis') && ['b', 'c', 'c1', 'cx'].includes(path.key)) continue;
      rows.push({ kind, path, samples: [] });
    }
  }
  const common: CpuGroups = {
    'login sshd': () => site.login.processes(),
    'node sshd': () => site.node.processes(),
    server: () => serverPids(),
  };
  const run = (row: Row): Promise<Figures> => {
    if (row.kind === 'pgbench') return pgbench(user, row.path);
    if (row.kind === 'redis') return redisBenchmark(user, row.path);
    return pingPong(user, row.path, row.kind);
  };
  for (let round = 1; round <= REPEAT; round++) {
    for (const row of rows) {
      if (row.error) continue;
      try {
        const groups = { ...common, ...row.path.groups };
        const before = snapshot(groups);
        const segsBefore = tcpOutSegments();
        const f = await run(row);
        const segments = (tcpOutSegments() - segsBefore) / f.requests;
        const { cpu, kernel, machineBusy, machineBusySeconds } = cpuDelta(before, groups);
        // The benchmark's own process is counted by cpuDelta as 'bench process (ssh2)': it is ours only when
        // the path is backhaul's (its shadows live here).
        for (const record of [cpu, kernel]) {
          const own = record['bench process (ssh2)'] ?? 0;
          delete record['bench process (ssh2)'];
          if ('backhaul (ours)' in groups) record['backhaul (ours)'] = own;
        }
        const perRequest = (record: Record<string, number>) =>
          Object.fromEntries(Object.entries(record).map(([k, v]) => [k, (v * 1e6) / f.requests]));
        row.samples.push({
          round,
          ...f,
          cpuUs: perRequest(cpu),
          kernelUs: perRequest(kernel),
          machineUs: (machineBusySeconds * 1e6) / f.requests,
          busy: machineBusy,
          segments,
        });
        say(
          `round ${round}/${REPEAT} ${pad(row.kind, 8)} ${pad(row.path.label, 36)} ${lpad(f.rps.toFixed(0), 7)}/s  p50 ${lpad(f.p50us.toFixed(0), 6)} µs  p99 ${lpad(Number.isNaN(f.p99us) ? '-' : f.p99us.toFixed(0), 6)} µs  ${segments.toFixed(1)} TCP segments/request`,
        );
      } catch (err) {
        row.error = (err as Error).message;
        say(`round ${round} ${row.kind} ${row.path.label} FAILED: ${row.error}`);
      }
    }
  }

  process.stdout.write(
    `# bench:latency, ${new Date().toISOString()}, node ${process.version}, ssh2 crypto: ${crypto.description}\n\n${report(rows)}\n`,
  );
  if (process.env.BENCH_JSON) {
    const dump = rows.map((r) => ({
      kind: r.kind,
      path: r.path.key,
      label: r.path.label,
      error: r.error,
      samples: r.samples,
    }));
    await writeFile(process.env.BENCH_JSON, `${JSON.stringify(dump, null, 2)}\n`);
  }
  say(`done in ${((Date.now() - t0) / 1000).toFixed(0)} s`);
  if (rows.some((r) => r.error)) process.exitCode = 1;
}

// ------------------------------------------------------------------------------------------ report

/**
 * What an aim that is missed would need, from this run's CPU figures. When a measure is CPU-bound (the
 * machine's cores busy), requests/s is the machine's CPU over the CPU one request costs, so a part's cost
 * taken away would give rps × machine / (machine - part). Computed per round and paired like the ratios:
 * whether the aim could be met by making that part cheaper, down to nothing.
 */
function bounds(rows: Row[]): string[] {
  const find = (kind: Kind, key: string) => rows.find((r) => r.kind === kind && r.path.key === key);
  const out = [
    '## Bounds: the ratio if a part cost no CPU at all (CPU-bound measures; paired, median over rounds)',
    '',
    '| ratio | measure | if this cost nothing | CPU µs per request it took | busy | ratio as measured | bound | aim | reachable |',
    '|---|---|---|---:|---:|---:|---:|---|---|',
  ];
  const bound = (
    name: string,
    kind: Kind,
    num: string,
    den: string,
    part: string,
    cost: (s: Sample) => number,
    aim: number,
  ) => {
    const a = find(kind, num);
    const b = find(kind, den);
    if (!a?.samples.length || !b?.samples.length) return;
    const pairs = a.samples.flatMap((x) => {
      const y = b.samples.find((z) => z.round === x.round);
      if (!y) return [];
      const freed = Math.min(cost(x), x.machineUs * 0.99);
      return [
        {
          as: x.rps / y.rps,
          bound: (x.rps * x.machineUs) / (x.machineUs - freed) / y.rps,
          cost: cost(x),
          busy: x.busy,
        },
      ];
    });
    if (!pairs.length) return;
    const m = (f: (p: (typeof pairs)[number]) => number) => median(pairs.map(f));
    out.push(
      `| ${name} | ${kind} | ${part} | ${fmt(
        m((p) => p.cost),
        1,
      )} | ${fmt(100 * m((p) => p.busy))} % | ${fmt(
        m((p) => p.as),
        2,
      )} | ${fmt(
        m((p) => p.bound),
        2,
      )} | >= ${aim.toFixed(2)} | ${m((p) => p.bound) >= aim ? 'yes' : '**no**'} |`,
    );
  };
  bound(
    '(c+r) / direct',
    'pgbench',
    'cr',
    'direct',
    "backhaul's own process",
    (s) => s.cpuUs['backhaul (ours)'] ?? 0,
    0.3,
  );
  for (const kind of ['conc8', 'conc32'] as const) {
    bound(
      'relay: (c+r) / (c)',
      kind,
      'cr',
      'c',
      "the relay's user-space part (a relay making the same system calls)",
      (s) => (s.cpuUs.relay ?? 0) - (s.kernelUs.relay ?? 0),
      0.85,
    );
    bound('relay: (c+r) / (c)', kind, 'cr', 'c', 'the relay process, whole', (s) => s.cpuUs.relay ?? 0, 0.85);
  }
  out.push('');
  out.push(
    '(A bound holds only when the measure is CPU-bound: "busy" near 100 %. It takes the CPU away and nothing else: the wake-ups and hops stay.)',
  );
  return out;
}

const fmt = (v: number, digits = 0) => (Number.isFinite(v) ? v.toFixed(digits) : '-');

function report(rows: Row[]): string {
  const out: string[] = [];
  out.push(`## Figures (median of ${REPEAT} rounds)`);
  out.push('');
  out.push('| measure | path | requests/s | p50 µs | p99 µs | rounds |');
  out.push('|---|---|---:|---:|---:|---:|');
  const med = (row: Row | undefined, f: (s: Sample) => number) =>
    row?.samples.length ? median(row.samples.map(f)) : Number.NaN;
  for (const row of rows) {
    out.push(
      `| ${row.kind} | ${row.path.label} | ${fmt(med(row, (s) => s.rps))} | ${fmt(med(row, (s) => s.p50us))} | ${fmt(med(row, (s) => s.p99us))} | ${row.samples.length}${row.error ? ` FAILED: ${row.error}` : ''} |`,
    );
  }
  out.push('');
  out.push('(pgbench: p50 is its "latency average"; redis: the mean over ping, set and get of its p50 and p99.)');
  out.push('');
  out.push(
    '## CPU µs per request (medians; the clients are not counted, "server" is the echo server, PostgreSQL or Redis)',
  );
  out.push('');
  const names = [...new Set(rows.flatMap((r) => r.samples.flatMap((x) => Object.keys(x.cpuUs))))];
  out.push(`| measure | path | ${names.join(' | ')} | all counted | machine | busy |`);
  out.push(`|---|---|${names.map(() => '---:').join('|')}|---:|---:|---:|`);
  for (const row of rows) {
    if (!row.samples.length) continue;
    const per = (k: string) => {
      const cpu = med(row, (x) => x.cpuUs[k] ?? 0);
      const kernel = med(row, (x) => x.kernelUs[k] ?? 0);
      return cpu > 0 ? `${fmt(cpu, 1)} (${fmt((100 * kernel) / cpu)} %)` : fmt(cpu, 1);
    };
    const all = med(row, (x) => Object.values(x.cpuUs).reduce((a, b) => a + b, 0));
    out.push(
      `| ${row.kind} | ${row.path.label} | ${names.map(per).join(' | ')} | ${fmt(all, 1)} | ${fmt(
        med(row, (x) => x.machineUs),
        1,
      )} | ${fmt(100 * med(row, (x) => x.busy))} % |`,
    );
  }
  out.push('');
  out.push(
    '(In parentheses: the share spent in the kernel. "machine": busy CPU µs per request of the whole machine, clients, kernel threads and softirqs included; "busy": the share of all cores busy meanwhile.)',
  );
  out.push('');
  out.push('## Ratios against the aims (paired: median over rounds of the ratio within a round)');
  out.push('');
  out.push('| ratio | measure | by | median | paired | aim | met |');
  out.push('|---|---|---|---:|---:|---|---|');
  const find = (kind: Kind, key: string) => rows.find((r) => r.kind === kind && r.path.key === key);
  const ratio = (
    name: string,
    kind: Kind,
    num: string,
    den: string,
    by: 'p50' | 'rps',
    aim: { op: '<=' | '>='; value: number } | undefined,
  ) => {
    const a = find(kind, num);
    const b = find(kind, den);
    if (!a?.samples.length || !b?.samples.length) return;
    const f = (s: Sample) => (by === 'p50' ? s.p50us : s.rps);
    const m = med(a, f) / med(b, f);
    const pairs = a.samples.flatMap((x) => {
      const y = b.samples.find((z) => z.round === x.round);
      return y ? [f(x) / f(y)] : [];
    });
    const paired = pairs.length ? median(pairs) : Number.NaN;
    const met = aim ? ((aim.op === '<=' ? paired <= aim.value : paired >= aim.value) ? 'yes' : '**no**') : '-';
    out.push(
      `| ${name} | ${kind} | ${by === 'p50' ? 'p50 round trip' : 'requests/s'} | ${fmt(m, 2)} | ${fmt(paired, 2)} | ${aim ? `${aim.op} ${aim.value.toFixed(2)}` : '-'} | ${met} |`,
    );
  };
  ratio('(c+r) / (b+r)', 'seq', 'cr', 'br', 'p50', { op: '<=', value: 1 });
  ratio('(c) / (b)', 'seq', 'c', 'b', 'p50', { op: '<=', value: 1 });
  ratio('(c+r) / (b+r)', 'conc8', 'cr', 'br', 'rps', { op: '>=', value: 1 });
  ratio('(c+r) / (b+r)', 'connect', 'cr', 'br', 'p50', undefined);
  ratio('(c) / (b)', 'connect', 'c', 'b', 'p50', undefined);
  ratio('relay: (c+r) / (c)', 'connect', 'cr', 'c', 'p50', undefined);
  ratio('(c+r) / (b+r)', 'conc32', 'cr', 'br', 'rps', { op: '>=', value: 1 });
  ratio('(c+r) / (b+r)', 'pgbench', 'cr', 'br', 'rps', { op: '>=', value: 1 });
  ratio('(c+r) / direct', 'pgbench', 'cr', 'direct', 'rps', { op: '>=', value: 0.3 });
  ratio('(c+r) / (b+r)', 'redis', 'cr', 'br', 'rps', { op: '>=', value: 1 });
  ratio('(c+r) / direct', 'redis', 'cr', 'direct', 'rps', undefined);
  ratio('relay: (c+r) / (c)', 'seq', 'cr', 'c', 'p50', { op: '<=', value: 1.15 });
  ratio('relay: (b+r) / (b)', 'seq', 'br', 'b', 'p50', { op: '<=', value: 1.15 });
  ratio('relay: (c+r) / (c)', 'conc8', 'cr', 'c', 'rps', { op: '>=', value: 0.85 });
  ratio('relay: (c+r) / (c)', 'conc32', 'cr', 'c', 'rps', { op: '>=', value: 0.85 });
  ratio('tunnel thread / one thread: (c+r) / (c1+r)', 'seq', 'cr', 'c1r', 'p50', undefined);
  ratio('tunnel thread / one thread: (c+r) / (c1+r)', 'conc32', 'cr', 'c1r', 'rps', undefined);
  ratio('tunnel thread / one thread: (c+r) / (c1+r)', 'pgbench', 'cr', 'c1r', 'rps', undefined);
  ratio('coalesced / not: (c) / (cx)', 'seq', 'c', 'cx', 'p50', undefined);
  ratio('coalesced / not: (c+r) / (cx+r)', 'seq', 'cr', 'cxr', 'p50', undefined);
  for (const kind of ['conc8', 'conc32', 'pgbench', 'redis'] as const)
    ratio('coalesced / not: (c+r) / (cx+r)', kind, 'cr', 'cxr', 'rps', undefined);
  out.push('');
  out.push(bounds(rows).join('\n'));
  return out.join('\n');
}

try {
  await main();
} catch (err) {
  say(`failed: ${(err as Error).stack ?? err}`);
  process.exitCode = 1;
} finally {
  await cleanupAll();
}
process.exit(process.exitCode ?? 0);
