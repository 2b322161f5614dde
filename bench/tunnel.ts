import { createHash, randomBytes } from 'node:crypto';
import { chmodSync, chownSync, readFileSync } from 'node:fs';
import { copyFile, mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseSiteConfig } from '../src/contract/site-config.js';
import { openSiteAccess, type SiteAccess } from '../src/ssh/site-access.js';
import { autoTunnelThreads } from '../src/ssh/tunnel-threads.js';
import {
  LOOPBACK_ENDPOINT_POLICY,
  type LoopbackSite,
  NO_CLUSTER_CHECKS,
  startLoopbackSite,
} from '../tools/sandbox/loopback-site.js';
import { sbatch, scancel, waitForState } from '../tools/sandbox/slurm.js';
import { isAlive } from '../tools/sandbox/sshd.js';
import type { TestUser } from '../tools/sandbox/users.js';
import {
  best,
  type Child,
  type CpuGroups,
  cleanupAll,
  commandExists,
  cpuDelta,
  lpad,
  MiB,
  median,
  onCleanup,
  PYTHON,
  pad,
  parseBytes,
  ROOT,
  safeReaddir,
  say,
  snapshot,
  start,
  treeOf,
  waitForSocket,
  withTimeout,
} from './harness.js';
import {
  openShadowTunnel,
  relayOf,
  type ShadowHost,
  type ShadowTunnel,
  srunInJob,
  startShadowHost,
} from './shadow-path.js';
import { CIPHER, openBackhaulForwards, openSshReverse, PINNED_CIPHER } from './site-paths.js';

const PEER_SOURCE = join(ROOT, 'bench', 'tunnel_peer.py');
const PIPE = join(ROOT, 'bench', 'tunnel-pipe.ts');
/**
 * Copies in the work dir, made at start: readable by the job user whatever the checkout's modes,
 * and immune to the checkout changing under a long run.
 */
let PEER = PEER_SOURCE;

// ------------------------------------------------------------------------------------------ settings

const BYTES = parseBytes(process.env.BENCH_BYTES, 1024 * MiB);
const SRUN_BYTES = parseBytes(process.env.BENCH_SRUN_BYTES, Math.min(128 * MiB, BYTES));
const WARMUP = parseBytes(process.env.BENCH_WARMUP, 16 * MiB);
const REPEAT = Math.max(1, Number(process.env.BENCH_REPEAT ?? 3));
const DIRECTIONS = (process.env.BENCH_DIRECTIONS ?? 'up,down').split(',').map((d) => d.trim()) as Direction[];
const PATHS = new Set((process.env.BENCH_PATHS ?? 'a,a2,b,c,c1,d,e,b8,c8').split(',').map((p) => p.trim()));

for (const d of DIRECTIONS) if (d !== 'up' && d !== 'down') throw new Error(`BENCH_DIRECTIONS: ${d}?`);

type Direction = 'up' | 'down';
/** Tunnels in (b8) and (c8). */
const PARALLEL = 8;
const TUNNEL_THREADS =
  process.env.BENCH_TUNNEL_THREADS === undefined || process.env.BENCH_TUNNEL_THREADS === 'auto'
    ? autoTunnelThreads()
    : Number(process.env.BENCH_TUNNEL_THREADS);
const fmtBytes = (n: number) => (n % MiB === 0 ? `${n / MiB} MiB` : `${n} bytes`);

/** slurmstepd processes of job J and everything under them (the steps' tasks: cat, user-space sshd). */
function stepdTree(jobId: string): number[] {
  const pids: number[] = [];
  for (const entry of safeReaddir('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const cmd = readFileSync(`/proc/${entry}/cmdline`, 'utf8');
      if (cmd.startsWith('slurmstepd') && cmd.includes(`[${jobId}.`)) pids.push(...treeOf(Number(entry)));
    } catch {
      // gone
    }
  }
  return pids;
}

// ------------------------------------------------------------------------------------------ data

interface Sample {
  round: number;
  mbps: number;
  seconds: number;
  bytes: number;
  verified: 'sha256' | 'count';
  cpu: Record<string, number>;
  /** read+write system calls per group. */
  sys: Record<string, number>;
  machineBusy: number;
  /** CPU used by processes outside this benchmark during the run, in cores (of 2). */
  otherCores: number;
}

interface Row {
  key: string;
  label: string;
  dir: string;
  bytes: number;
  groups: CpuGroups;
  measure(bytes: number, id: string): Promise<{ seconds: number; verified: 'sha256' | 'count'; clientCpu: number }>;
}

let blockPath = '';
let block: Buffer = Buffer.alloc(0);
const shaCache = new Map<number, string>();
function expectedSha(bytes: number): string {
  const cached = shaCache.get(bytes);
  if (cached) return cached;
  const h = createHash('sha256');
  for (let left = bytes; left > 0; left -= block.length) h.update(block.subarray(0, Math.min(block.length, left)));
  const sha = h.digest('hex');
  shaCache.set(bytes, sha);
  return sha;
}

/** Generous: a stall fails the row instead of hanging the run. */
const timeoutFor = (bytes: number) => 120_000 + (bytes / (2 * 1e6)) * 1000;

interface PeerResult {
  id?: string;
  bytes: number;
  seconds: number;
  sha256?: string;
  cpu?: number;
}

/** Where a client runs as a step of a pod's job (`srun --overlap`): a pod's relay admits only its job. */
interface InJob {
  jobId: string;
  node: string;
}

async function runPeer(user: TestUser, args: string[], bytes: number, job?: InJob): Promise<PeerResult> {
  const child = job
    ? start('client', 'srun', [...srunInJob(job.jobId, job.node), PYTHON, PEER, ...args], user)
    : start('client', PYTHON, [PEER, ...args], user);
  let ended: { code: number | null; signal: NodeJS.Signals | null };
  try {
    ended = await withTimeout(child.exited, timeoutFor(bytes), 'client');
  } finally {
    await child.stop();
  }
  const last = child.stdout().trim().split('\n').pop() ?? '';
  if (ended.code !== 0 || !last.startsWith('{')) {
    throw new Error(
      `client failed (${ended.code ?? ended.signal}): ${child.stderr().trim().split('\n').slice(-3).join(' | ')}`,
    );
  }
  return JSON.parse(last) as PeerResult;
}

/** One transfer through a socket or TCP address, checked: count always, sha256 on upload. */
async function transfer(
  user: TestUser,
  target: { unix: string } | { tcp: string },
  dir: Direction,
  bytes: number,
  id: string,
  job?: InJob,
) {
  const where = 'unix' in target ? ['--unix', target.unix] : ['--tcp', target.tcp];
  const r = await runPeer(
    user,
    ['client', ...where, '--mode', dir, '--bytes', String(bytes), '--block', blockPath, '--id', id],
    bytes,
    job,
  );
  if (r.bytes !== bytes) throw new Error(`${id}: ${r.bytes} bytes arrived, ${bytes} sent`);
  if (dir === 'up' && r.sha256 !== expectedSha(bytes)) throw new Error(`${id}: sha256 mismatch`);
  return {
    seconds: r.seconds,
    verified: dir === 'up' ? ('sha256' as const) : ('count' as const),
    clientCpu: r.cpu ?? 0,
  };
}

// ------------------------------------------------------------------------------------------ paths

interface Context {
  site: LoopbackSite;
  user: TestUser;
  work: string;
  sinkPort: number;
  sink: Child;
  access?: SiteAccess;
  jobId?: string;
  /** The session host of (c), (d), (c8), and the pod whose tunnel (c) and (d) share. */
  threaded?: Promise<ShadowHost>;
  tunnel?: ShadowTunnel;
}

const common = (ctx: Context): CpuGroups => ({
  sink: () => treeOf(ctx.sink.pid),
  'login sshd': () => ctx.site.login.processes(),
  'node sshd': () => ctx.site.node.processes(),
});

function socketRows(
  ctx: Context,
  key: string,
  label: string,
  target: { unix: string } | { tcp: string },
  groups: CpuGroups,
  job?: InJob,
): Row[] {
  return DIRECTIONS.map((dir) => ({
    key,
    label,
    dir,
    bytes: BYTES,
    groups: { ...common(ctx), ...groups },
    measure: (bytes, id) => transfer(ctx.user, target, dir, bytes, id, job),
  }));
}

async function pathA(ctx: Context): Promise<Row[]> {
  const sock = join(ctx.work, 'a.sock');
  const pipe = start('node pipe', process.execPath, [
    ...process.execArgv,
    PIPE,
    sock,
    String(ctx.sinkPort),
    String(ctx.user.uid),
    String(ctx.user.gid),
  ]);
  await pipe.line(/^ready$/, 30_000);
  return socketRows(
    ctx,
    'a',
    '(a) unix->TCP copy, Node pipe',
    { unix: sock },
    { 'copy process': () => treeOf(pipe.pid) },
  );
}

async function pathA2(ctx: Context): Promise<Row[]> {
  const sock = join(ctx.work, 'a2.sock');
  const socat = start('socat', 'socat', [
    '-b',
    String(128 * 1024),
    '-t',
    '30',
    `UNIX-LISTEN:${sock},fork,mode=600,user=${ctx.user.uid},group=${ctx.user.gid}`,
    `TCP:127.0.0.1:${ctx.sinkPort},nodelay`,
  ]);
  await waitForSocket(sock, 10_000, () => isAlive(socat.pid));
  return socketRows(
    ctx,
    'a2',
    "(a') unix->TCP copy, socat -b 128K",
    { unix: sock },
    { 'copy process': () => treeOf(socat.pid) },
  );
}

async function pathB(ctx: Context): Promise<Row[]> {
  const socket = join(ctx.work, 'b.sock');
  const ssh = await openSshReverse(ctx.site, ctx.work, ctx.user, [{ socket, port: ctx.sinkPort }]);
  return socketRows(ctx, 'b', '(b) OpenSSH ssh -J -R', { unix: socket }, { 'ssh client(s)': () => treeOf(ssh.pid) });
}

/** The session host of (c), (d) and (c8): tunnel threads as configured (BENCH_TUNNEL_THREADS or "auto"). */
async function threadedHost(ctx: Context): Promise<ShadowHost> {
  ctx.threaded ??= startShadowHost(ctx.site, TUNNEL_THREADS);
  return ctx.threaded;
}

async function pathC(ctx: Context): Promise<Row[]> {
  const host = await threadedHost(ctx);
  ctx.tunnel ??= await openShadowTunnel(host, [ctx.sinkPort]);
  const socket = ctx.tunnel.sockets[0] as string;
  return socketRows(ctx, 'c', `(c) backhaul, tunnel thread (${TUNNEL_THREADS})`, { unix: socket }, {});
}

async function pathC1(ctx: Context): Promise<Row[]> {
  const host = await startShadowHost(ctx.site, 0);
  const tunnel = await openShadowTunnel(host, [ctx.sinkPort]);
  const socket = tunnel.sockets[0] as string;
  return socketRows(ctx, 'c1', '(c1) backhaul, one thread', { unix: socket }, {});
}

async function pathD(ctx: Context): Promise<Row[]> {
  const host = await threadedHost(ctx);
  ctx.tunnel ??= await openShadowTunnel(host, [ctx.sinkPort]);
  const { address, ports, jobId, node } = ctx.tunnel;
  // The client is a step of the pod's job: its relay admits no other process.
  return socketRows(
    ctx,
    'd',
    '(d) (c) + relay.py',
    { tcp: `${address}:${ports[0]}` },
    {
      relay: () => relayOf(ctx.user.uid, ctx.tunnel?.uid ?? ''),
    },
    { jobId, node },
  );
}

/** Eight tunnels of one kind, each moving BYTES/8 at the same time: aggregate MB/s. */
function parallelRows(ctx: Context, key: string, label: string, sockets: string[], groups: CpuGroups): Row[] {
  const each = Math.floor(BYTES / sockets.length);
  return DIRECTIONS.map((dir) => ({
    key,
    label,
    dir,
    bytes: each * sockets.length,
    groups: { ...common(ctx), ...groups },
    measure: async (bytes, id) => {
      const share = Math.floor(bytes / sockets.length);
      const runs = await Promise.all(sockets.map((unix, i) => transfer(ctx.user, { unix }, dir, share, `${id}-${i}`)));
      return {
        seconds: Math.max(...runs.map((r) => r.seconds)),
        verified: runs[0]?.verified ?? 'count',
        clientCpu: runs.reduce((a, r) => a + r.clientCpu, 0),
      };
    },
  }));
}

async function pathB8(ctx: Context): Promise<Row[]> {
  const sockets: string[] = [];
  const pids: number[] = [];
  for (let i = 0; i < PARALLEL; i++) {
    const socket = join(ctx.work, `b8-${i}.sock`);
    const ssh = await openSshReverse(ctx.site, ctx.work, ctx.user, [{ socket, port: ctx.sinkPort }]);
    sockets.push(socket);
    pids.push(ssh.pid);
  }
  return parallelRows(ctx, 'b8', `(b8) ${PARALLEL} x OpenSSH ssh -J -R`, sockets, {
    'ssh client(s)': () => pids.flatMap(treeOf),
  });
}

async function pathC8(ctx: Context): Promise<Row[]> {
  const host = await threadedHost(ctx);
  const sockets: string[] = [];
  for (let i = 0; i < PARALLEL; i++) sockets.push(...(await openShadowTunnel(host, [ctx.sinkPort])).sockets);
  return parallelRows(ctx, 'c8', `(c8) ${PARALLEL} x backhaul, tunnel threads (${TUNNEL_THREADS})`, sockets, {});
}

async function pathE(ctx: Context): Promise<Row[]> {
  const jobId = ctx.jobId;
  if (!jobId) throw new Error('no job');
  // The prelude's socket dir: the job user's own, mode 0700 (the carrier bootstrap checks both).
  const dir = join(ctx.work, 'srun');
  await mkdir(dir, { mode: 0o700 });
  chownSync(dir, ctx.user.uid, ctx.user.gid);
  const sock = join(dir, '15000.sock');
  if (!ctx.access) throw new Error('no site access');
  await openBackhaulForwards(ctx.access, ctx.site, {
    mode: 'srun',
    ...(ctx.jobId ? { jobId: ctx.jobId } : {}),
    socketDir: dir,
    forwards: [{ socket: sock, port: ctx.sinkPort }],
  });
  await waitForSocket(sock, 10_000, () => true);
  const srun = ['srun', ...srunInJob(jobId, ctx.site.nodeHost)];
  const groups: CpuGroups = { ...common(ctx), 'slurmstepd + step': () => stepdTree(jobId) };
  const raw = (how: 'cat' | 'out' | 'in', label: string): Row => ({
    key: `e-raw-${how}`,
    label,
    dir: { cat: 'both', out: 'up', in: 'down' }[how],
    bytes: SRUN_BYTES,
    groups,
    measure: async (bytes) => {
      const r = await runPeer(
        ctx.user,
        ['srun-raw', '--how', how, '--bytes', String(bytes), '--block', blockPath, '--', ...srun],
        bytes,
      );
      if (r.bytes !== bytes) throw new Error(`srun ${how}: ${r.bytes} of ${bytes} bytes`);
      if (how === 'cat' && r.sha256 !== expectedSha(bytes)) throw new Error('srun cat: sha256 mismatch');
      return { seconds: r.seconds, verified: how === 'cat' ? 'sha256' : 'count', clientCpu: r.cpu ?? 0 };
    },
  });
  return [
    raw('cat', '(e) raw srun -u cat (stdin->stdout)'),
    raw('out', '(e) raw srun, step->client only'),
    raw('in', '(e) raw srun, client->step only'),
    ...DIRECTIONS.map((dir) => ({
      key: 'e',
      label: '(e) backhaul srun carrier',
      dir,
      bytes: SRUN_BYTES,
      groups,
      measure: (bytes: number, id: string) => transfer(ctx.user, { unix: sock }, dir, bytes, id),
    })),
  ];
}

// ------------------------------------------------------------------------------------------ report

function report(rows: Row[], samples: Map<Row, Sample[]>, errors: Map<Row, string>): string {
  const out: string[] = [];
  const GiB = 1024 * MiB;
  out.push(
    `## Throughput (MB/s = 10^6 bytes/s; median and best of ${REPEAT}; ${fmtBytes(BYTES)} per run, srun rows ${fmtBytes(SRUN_BYTES)})`,
  );
  out.push('');
  out.push('| path | direction | volume | MB/s median | MB/s best | runs | checked |');
  out.push('|---|---|---|---:|---:|---:|---|');
  for (const row of rows) {
    const s = samples.get(row) ?? [];
    const err = errors.get(row);
    const mbps = s.map((x) => x.mbps);
    out.push(
      `| ${row.label} | ${row.dir} | ${fmtBytes(row.bytes)} | ${s.length ? median(mbps).toFixed(0) : '-'} | ${s.length ? best(mbps).toFixed(0) : '-'} | ${s.length} | ${s[0]?.verified ?? ''}${err ? ` FAILED: ${err}` : ''} |`,
    );
  }
  out.push('');
  const find = (key: string, dir: string) => rows.find((r) => r.key === key && r.dir === dir);
  const stats = (row: Row | undefined) => {
    const s = row ? (samples.get(row) ?? []) : [];
    return s.length ? { med: median(s.map((x) => x.mbps)), best: best(s.map((x) => x.mbps)) } : undefined;
  };
  out.push('## Ratios against the aims of ARCHITECTURE.md, "Aims (what good looks like)"');
  out.push('');
  out.push(
    'median = median/median, best = best/best, paired = median over the rounds of the ratio of the two runs of one round ' +
      '(taken a few seconds apart, so they saw about the same load from others), CPU = the inverse ratio of "all ours" ' +
      'CPU per GiB (what the ratio would be if every run were bound by the same amount of free CPU).',
  );
  out.push('');
  out.push('| ratio | direction | median | best | paired | CPU | aim | met (median / paired) |');
  out.push('|---|---|---:|---:|---:|---:|---:|---|');
  const ours = (x: Sample) => (Object.values(x.cpu).reduce((a, b) => a + b, 0) * GiB) / x.bytes;
  const ratio = (name: string, num: Row | undefined, den: Row | undefined, aim: number, dir: string) => {
    const a = stats(num);
    const b = stats(den);
    if (!a || !b || !num || !den) return;
    const med = a.med / b.med;
    const sa = samples.get(num) ?? [];
    const sb = samples.get(den) ?? [];
    const pairs = sa.flatMap((x) => {
      const y = sb.find((z) => z.round === x.round);
      return y ? [x.mbps / y.mbps] : [];
    });
    const paired = pairs.length ? median(pairs) : Number.NaN;
    const cpu = median(sb.map(ours)) / median(sa.map(ours));
    const met = (v: number) => (Number.isNaN(v) ? '-' : v >= aim ? 'yes' : 'NO');
    out.push(
      `| ${name} | ${dir} | ${med.toFixed(2)} | ${(a.best / b.best).toFixed(2)} | ${paired.toFixed(2)} | ${cpu.toFixed(2)} | ${aim > 0 ? `>= ${aim.toFixed(2)}` : '-'} | ${aim > 0 ? `${met(med)} / ${met(paired)}` : '-'} |`,
    );
  };
  for (const dir of DIRECTIONS) {
    ratio('(c) backhaul / (b) OpenSSH', find('c', dir), find('b', dir), 1, dir);
    ratio('(d) with relay / (c)', find('d', dir), find('c', dir), 0.85, dir);
    ratio('(e) srun carrier / raw srun cat', find('e', dir), find('e-raw-cat', 'both'), 0.9, dir);
    ratio(
      `(e) srun carrier / raw srun one-way`,
      find('e', dir),
      find(dir === 'up' ? 'e-raw-out' : 'e-raw-in', dir),
      0.9,
      dir,
    );
    ratio('(c) / (a) Node pipe (copy cost of SSH)', find('c', dir), find('a', dir), 0, dir);
    ratio('(c) tunnel thread / (c1) one thread', find('c', dir), find('c1', dir), 0, dir);
    ratio(`(c8) / (b8) OpenSSH, ${PARALLEL} tunnels`, find('c8', dir), find('b8', dir), 1.1, dir);
  }
  out.push('');
  out.push('## CPU seconds per GiB moved (medians; processes that exit during a run are not counted)');
  out.push('');
  const names = new Set<string>();
  for (const s of samples.values())
    for (const x of s) for (const [k, v] of Object.entries(x.cpu)) if (v > 0.005) names.add(k);
  const cols = [...names];
  out.push(`| path | dir | ${cols.join(' | ')} | all ours | machine busy | others (cores) |`);
  out.push(`|---|---|${cols.map(() => '---:').join('|')}|---:|---:|---:|`);
  for (const row of rows) {
    const s = samples.get(row) ?? [];
    if (!s.length) continue;
    const per = (k: string) => median(s.map((x) => ((x.cpu[k] ?? 0) * GiB) / x.bytes));
    const ours = median(s.map((x) => (Object.values(x.cpu).reduce((a, b) => a + b, 0) * GiB) / x.bytes));
    out.push(
      `| ${row.label} | ${row.dir} | ${cols.map((k) => per(k).toFixed(2)).join(' | ')} | ${ours.toFixed(2)} | ${(median(s.map((x) => x.machineBusy)) * 100).toFixed(0)}% | ${median(s.map((x) => x.otherCores)).toFixed(2)} |`,
    );
  }
  out.push('');
  out.push('## read + write system calls per MiB moved (medians; the client and exited processes are not counted)');
  out.push('');
  const sysNames = new Set<string>();
  for (const s of samples.values())
    for (const x of s) for (const [k, v] of Object.entries(x.sys)) if (v > 0) sysNames.add(k);
  const sysCols = [...sysNames];
  out.push(`| path | dir | ${sysCols.join(' | ')} |`);
  out.push(`|---|---|${sysCols.map(() => '---:').join('|')}|`);
  for (const row of rows) {
    const s = samples.get(row) ?? [];
    if (!s.length) continue;
    const per = (k: string) => median(s.map((x) => ((x.sys[k] ?? 0) * MiB) / x.bytes));
    out.push(`| ${row.label} | ${row.dir} | ${sysCols.map((k) => per(k).toFixed(0)).join(' | ')} |`);
  }
  return out.join('\n');
}

// ------------------------------------------------------------------------------------------ main

async function main(): Promise<void> {
  const t0 = Date.now();
  say(
    `${fmtBytes(BYTES)} per run (srun ${fmtBytes(SRUN_BYTES)}), ${REPEAT} runs, directions ${DIRECTIONS.join(',')}, paths ${[...PATHS].join(',')}`,
  );
  const site = await startLoopbackSite({ loginExtra: PINNED_CIPHER, nodeExtra: PINNED_CIPHER });
  onCleanup('loopback site', () => site.stop());
  const user = site.user;

  const work = await mkdtemp(join(tmpdir(), 'bh-bench-'));
  onCleanup('work dir', () => rm(work, { recursive: true, force: true }));
  chownSync(work, user.uid, user.gid);
  chmodSync(work, 0o700);
  blockPath = join(work, 'block');
  block = randomBytes(MiB);
  await writeFile(blockPath, block, { mode: 0o644 });
  PEER = join(work, 'tunnel_peer.py');
  await copyFile(PEER_SOURCE, PEER);
  chmodSync(PEER, 0o644);

  const sink = start('sink', PYTHON, [PEER, 'sink', '--block', blockPath]);
  const sinkPort = (JSON.parse(await sink.line(/"listening"/, 15_000)) as { listening: number }).listening;
  const ctx: Context = { site, user, work, sinkPort, sink };

  if (PATHS.has('e')) {
    const config = parseSiteConfig({
      Network: { SSH: { ...site.siteConfig.Network.SSH } },
      Backhaul: {
        EndpointPolicy: LOOPBACK_ENDPOINT_POLICY,
        Kubernetes: NO_CLUSTER_CHECKS,
        KeepaliveInterval: '2s',
      },
    });
    ctx.access = await openSiteAccess(config);
    const pool = ctx.access.pool;
    onCleanup('login pool', () => pool.close());
  }
  if (PATHS.has('e')) {
    const jobId = await sbatch(user, '#!/bin/bash\nsleep 7200\n', { jobName: 'bh-bench-tunnel' });
    onCleanup(`job ${jobId}`, () => scancel(jobId));
    await waitForState(jobId, ['RUNNING'], 60_000);
    ctx.jobId = jobId;
    say(`job ${jobId} running`);
  }

  const rows: Row[] = [];
  const errors = new Map<Row, string>();
  const setups: [string, (c: Context) => Promise<Row[]>][] = [
    ['a', pathA],
    ['a2', pathA2],
    ['b', pathB],
    ['c', pathC],
    ['c1', pathC1],
    ['d', pathD],
    ['e', pathE],
    ['b8', pathB8],
    ['c8', pathC8],
  ];
  for (const [key, setup] of setups) {
    if (!PATHS.has(key)) continue;
    if (key === 'a2' && !(await commandExists('socat'))) {
      say("socat not installed: skipping (a')");
      continue;
    }
    try {
      rows.push(...(await setup(ctx)));
    } catch (err) {
      say(`setting up (${key}) failed: ${(err as Error).message}`);
      const failed: Row = {
        key,
        label: `(${key})`,
        dir: '-',
        bytes: 0,
        groups: {},
        measure: () => Promise.reject(err),
      };
      errors.set(failed, `setup: ${(err as Error).message}`);
      rows.push(failed);
    }
  }
  say(`set up in ${((Date.now() - t0) / 1000).toFixed(1)} s`);

  // The expected hashes, before any timing (they cost about 1 s of CPU per GiB).
  for (const n of new Set(rows.map((r) => r.bytes))) if (n > 0) expectedSha(n);
  const samples = new Map<Row, Sample[]>();
  const live = rows.filter((r) => !errors.has(r));
  // Warm-up (JIT, page cache, first-connection costs): not counted.
  for (const row of live) {
    try {
      await row.measure(Math.min(WARMUP, row.bytes), `warm-${row.key}-${row.dir}`);
    } catch (err) {
      errors.set(row, `warm-up: ${(err as Error).message}`);
    }
  }
  // Interleaved: each round visits every path once, so the load of the shared machine drifts over all of them alike.
  for (let round = 1; round <= REPEAT; round++) {
    for (const row of live) {
      if (errors.has(row)) continue;
      const id = `${row.key}-${row.dir}-${round}`;
      const before = snapshot(row.groups);
      const startedAt = performance.now();
      try {
        const r = await row.measure(row.bytes, id);
        const { cpu, sys, machineBusy, machineBusySeconds } = cpuDelta(before, row.groups);
        cpu.client = r.clientCpu;
        const ours = Object.values(cpu).reduce((a, b) => a + b, 0);
        // Whatever else ran meanwhile (other engineers' tests), in cores on average.
        // (over the whole window, client start-up included; srun steps' own processes count as others).
        const windowSeconds = (performance.now() - startedAt) / 1000;
        const otherCores = Math.max(0, machineBusySeconds - ours) / windowSeconds;
        const sample: Sample = {
          round,
          mbps: row.bytes / r.seconds / 1e6,
          seconds: r.seconds,
          bytes: row.bytes,
          verified: r.verified,
          cpu,
          sys,
          machineBusy,
          otherCores,
        };
        samples.set(row, [...(samples.get(row) ?? []), sample]);
        say(
          `round ${round}/${REPEAT} ${pad(row.label, 42)} ${pad(row.dir, 5)} ${lpad(sample.mbps.toFixed(0), 5)} MB/s (${r.seconds.toFixed(2)} s, ${r.verified} ok, machine ${(machineBusy * 100).toFixed(0)}% busy, others ${otherCores.toFixed(2)} cores)`,
        );
      } catch (err) {
        errors.set(row, (err as Error).message);
        say(`round ${round} ${row.label} ${row.dir} FAILED: ${(err as Error).message}`);
      }
    }
  }

  const text = report(rows, samples, errors);
  process.stdout.write(
    `# bench:tunnel, ${new Date().toISOString()}, cipher ${CIPHER}, ${fmtBytes(BYTES)} per run, node ${process.version}\n\n${text}\n`,
  );
  if (process.env.BENCH_JSON) {
    const dump = rows.map((r) => ({
      key: r.key,
      label: r.label,
      dir: r.dir,
      bytes: r.bytes,
      error: errors.get(r),
      samples: samples.get(r) ?? [],
    }));
    await writeFile(process.env.BENCH_JSON, `${JSON.stringify(dump, null, 2)}\n`);
  }
  say(`done in ${((Date.now() - t0) / 1000).toFixed(0)} s`);
  if (errors.size > 0) process.exitCode = 1;
}

try {
  await main();
} catch (err) {
  say(`failed: ${(err as Error).stack ?? err}`);
  process.exitCode = 1;
} finally {
  await cleanupAll();
}
// ssh2's keepalive timers or a forgotten handle must not keep the process alive after the report.
process.exit(process.exitCode ?? 0);
