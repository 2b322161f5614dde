/**
 * bench:wan — the tunnel over distance. Two network namespaces joined by a user-space packet delayer
 * (bench/wan-topology.ts, bench/wan_delay.py; this kernel has no sch_netem): the cluster (this
 * benchmark's session host, OpenSSH's `ssh -J -R`, the endpoints) and the site (login and node sshds).
 * Slurm and the pods' jobs stay in the machine's own namespace (the compute node's loopback, where the
 * prelude's relay listens); the namespaces reach slurmctld through a unix-socket bridge (socat), and
 * the forward sockets are files, reachable from every namespace.
 *
 * The process runs twice: the outer one (the machine's namespace) makes the WAN of each scenario,
 * starts this file again inside the cluster namespace, collects its JSON line and removes everything
 * (also on SIGINT/SIGTERM; a run killed outright leaves namespaces that the next run removes, and the
 * delayer and bridges die with their parent).
 *
 * Paths, alternated round by round:
 *   raw       TCP from the site namespace straight to the endpoint (what the WAN itself gives)
 *   openssh   OpenSSH `ssh -J bh-login -R sock:127.0.0.1:port` (cluster side) — the baseline
 *   backhaul  a shadow session as the fleet runs it (tunnel threads, KeepaliveInterval 2 s), the
 *             workload on the node socket
 *   relay     the same pod's relay address (what a workload dials), the client a step of the job
 *   bh-2MiB   backhaul with Backhaul.ChannelWindowMaxMiB 2 (ssh2's own window: the untuned figure)
 * Measures: 64 B round trip p50/p99 (latency_peer.py), BENCH_BYTES (256 MiB) up and down, 8 streams at
 * once (BENCH_BYTES/8 each), and setup: from "batch host known" to "forwards up" (backhaul) or from
 * start to the sockets (OpenSSH), in ms and in round trips of the WAN.
 *
 * Settings (environment): BENCH_WAN ("20,50,20/0.001": RTT ms[/loss fraction] per scenario),
 * BENCH_BYTES (256 MiB), BENCH_ROUNDS (3), BENCH_RTT_COUNT (500), BENCH_PATHS (all of the above),
 * BENCH_MEASURES (rtt,up,down,par8). Needs root, ip, chrt, socat, python3, Slurm (scripts/slurm-up.sh).
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { chmodSync, chownSync } from 'node:fs';
import { copyFile, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { autoTunnelThreads } from '../src/ssh/tunnel-threads.js';
import { startLoopbackSite } from '../tools/sandbox/loopback-site.js';
import { ensureSlurm, waitForState } from '../tools/sandbox/slurm.js';
import type { TestUser } from '../tools/sandbox/users.js';
import {
  benchName,
  type Child,
  cleanupAll,
  MiB,
  median,
  onCleanup,
  PYTHON,
  parseBytes,
  ROOT,
  say,
  start,
  waitForSocket,
  withTimeout,
} from './harness.js';
import { openShadowTunnel, type ShadowTunnel, srunInJob, startShadowHost } from './shadow-path.js';
import { openSshReverse, PINNED_CIPHER } from './site-paths.js';
import { CLUSTER_ADDRESS, createWan, SITE_ADDRESS, type Wan } from './wan-topology.js';

benchName('bench:wan');

const SELF = fileURLToPath(import.meta.url);
const SLURMCTLD_PORT = 6817;
const LOGIN_PORT = 22;
const NODE_PORT = 2222;

interface Scenario {
  rttMs: number;
  loss: number;
}

/** What the outer process hands the inner one. */
interface InnerSpec extends Scenario {
  cluster: string;
  site: string;
  measuredRttMs: number;
  /** The outer process: its network namespace is the machine's, where the jobs run. */
  outerPid: number;
}

const BYTES = parseBytes(process.env.BENCH_BYTES, 256 * MiB);
const ROUNDS = Math.max(1, Number(process.env.BENCH_ROUNDS ?? 3));
const RTT_COUNT = Math.max(50, Number(process.env.BENCH_RTT_COUNT ?? 500));
const PATHS = ['raw', 'openssh', 'backhaul', 'relay', 'bh-2MiB'] as const;
type PathName = (typeof PATHS)[number];
const CHOSEN = new Set((process.env.BENCH_PATHS ?? PATHS.join(',')).split(',').map((p) => p.trim()));
const MEASURES = ['rtt', 'up', 'down', 'par8'] as const;
type Measure = (typeof MEASURES)[number];
const CHOSEN_MEASURES = new Set((process.env.BENCH_MEASURES ?? MEASURES.join(',')).split(',').map((m) => m.trim()));
const PARALLEL = 8;

function scenarios(): Scenario[] {
  return (process.env.BENCH_WAN ?? '20,50,20/0.001').split(',').map((item) => {
    const [rtt, loss] = item.trim().split('/');
    const s = { rttMs: Number(rtt), loss: Number(loss ?? 0) };
    if (!(s.rttMs > 0 && s.rttMs <= 1000) || !(s.loss >= 0 && s.loss < 0.5)) {
      throw new Error(`BENCH_WAN: "${item}" is not RTT_MS[/LOSS] (RTT 0-1000 ms, loss a fraction below 0.5)`);
    }
    return s;
  });
}

// ------------------------------------------------------------------------------------------ outer

/** Slurm's controller, reached from inside NS through a unix socket (namespaces share files, not ports). */
function bridgeSlurmctld(ns: string, dir: string): Child[] {
  const sock = join(dir, `ctld-${ns}.sock`);
  const host = start(`slurmctld bridge (${ns})`, 'socat', [
    `UNIX-LISTEN:${sock},fork,mode=0666`,
    `TCP:127.0.0.1:${SLURMCTLD_PORT}`,
  ]);
  const inside = start(`slurmctld bridge in ${ns}`, 'ip', [
    'netns',
    'exec',
    ns,
    'socat',
    `TCP-LISTEN:${SLURMCTLD_PORT},bind=127.0.0.1,fork,reuseaddr`,
    `UNIX-CONNECT:${sock}`,
  ]);
  return [host, inside];
}

async function runScenario(scenario: Scenario): Promise<ScenarioResult> {
  const wan: Wan = await createWan(scenario);
  let inner: ChildProcess | undefined;
  const dir = await mkdtemp(join(tmpdir(), 'bh-wan-'));
  const bridges: Child[] = [];
  let stopped: Promise<Awaited<ReturnType<Wan['close']>>> | undefined;
  const stop = () => {
    stopped ??= stopNow();
    return stopped;
  };
  const stopNow = async () => {
    inner?.kill('SIGKILL');
    await Promise.all(bridges.map((b) => b.stop()));
    const counters = await wan.close();
    await rm(dir, { recursive: true, force: true });
    return counters;
  };
  // On SIGINT/SIGTERM the harness runs its cleanups before it exits: this one among them.
  onCleanup(`WAN ${wan.cluster}`, stop);
  try {
    say(`WAN ${scenario.rttMs} ms RTT, loss ${scenario.loss}: ping says ${wan.measuredRttMs.toFixed(2)} ms`);
    bridges.push(...bridgeSlurmctld(wan.cluster, dir), ...bridgeSlurmctld(wan.site, dir));
    await waitForSocket(join(dir, `ctld-${wan.site}.sock`), 10_000, () => true);
    const spec: InnerSpec = {
      ...scenario,
      cluster: wan.cluster,
      site: wan.site,
      measuredRttMs: wan.measuredRttMs,
      outerPid: process.pid,
    };
    inner = spawn(
      'ip',
      [
        'netns',
        'exec',
        wan.cluster,
        'setpriv',
        '--pdeathsig',
        'KILL',
        '--',
        process.execPath,
        ...process.execArgv,
        SELF,
      ],
      { env: { ...process.env, BH_WAN_INNER: JSON.stringify(spec) }, stdio: ['ignore', 'pipe', 'inherit'] },
    );
    let out = '';
    inner.stdout?.setEncoding('utf8').on('data', (s: string) => {
      out += s;
    });
    const code = await new Promise<number | null>((resolve) => inner?.once('close', (c) => resolve(c)));
    const last = out.trim().split('\n').pop() ?? '';
    if (code !== 0 || !last.startsWith('{')) throw new Error(`the run inside ${wan.cluster} failed (${code})`);
    const result = JSON.parse(last) as ScenarioResult;
    const counters = await stop();
    say(`delayer: ${JSON.stringify(counters)}`);
    return { ...result, delayer: counters };
  } finally {
    await stop();
  }
}

async function outer(): Promise<void> {
  await ensureSlurm();
  const results: ScenarioResult[] = [];
  for (const scenario of scenarios()) results.push(await runScenario(scenario));
  process.stdout.write(report(results));
}

// ------------------------------------------------------------------------------------------ inner

interface Sample {
  path: PathName;
  measure: Measure;
  /** MB/s for transfers; p50/p99 µs for round trips. */
  mbps?: number;
  p50?: number;
  p99?: number;
}

interface ScenarioResult {
  scenario: Scenario;
  measuredRttMs: number;
  samples: Sample[];
  setup: { path: PathName; ms: number; rtts: number; submitToUpMs?: number }[];
  delayer?: { passed: number; dropped: number; max_queue: number } | undefined;
}

/** Where a client runs: the site namespace (raw TCP to the cluster), or as a step of the pod's job. */
type Place = { kind: 'site'; ns: string } | { kind: 'job'; jobId: string; node: string; netOf: number };

function clientArgv(place: Place, user: TestUser, argv: string[]): [string, string[]] {
  const ids = [`--reuid=${user.uid}`, `--regid=${user.gid}`, '--init-groups'];
  if (place.kind === 'site') return ['ip', ['netns', 'exec', place.ns, 'setpriv', ...ids, '--', PYTHON, ...argv]];
  // srun reaches slurmd (and slurmd reaches srun) in the machine's own namespace: the job's.
  const srun = ['srun', ...srunInJob(place.jobId, place.node)];
  return ['nsenter', [`--net=/proc/${place.netOf}/ns/net`, 'setpriv', ...ids, '--', ...srun, PYTHON, ...argv]];
}

async function runClient(place: Place, user: TestUser, argv: string[], timeoutMs: number): Promise<string> {
  const [command, args] = clientArgv(place, user, argv);
  const child = start('client', command, args);
  let ended: { code: number | null; signal: NodeJS.Signals | null };
  try {
    ended = await withTimeout(child.exited, timeoutMs, 'client');
  } finally {
    await child.stop();
  }
  const last = child.stdout().trim().split('\n').pop() ?? '';
  if (ended.code !== 0 || !last.startsWith('{')) {
    throw new Error(
      `client failed (${ended.code ?? ended.signal}): ${child.stderr().trim().split('\n').slice(-3).join(' | ')}`,
    );
  }
  return last;
}

interface Target {
  place: Place;
  /** ['--unix', path] or ['--tcp', 'host:port'], to the sink and to the echo server. */
  sink: string[];
  echo: string[];
}

async function inner(spec: InnerSpec): Promise<void> {
  say(`inside ${spec.cluster}: ${spec.rttMs} ms, loss ${spec.loss}`);
  const site = await startLoopbackSite({
    slurm: false,
    loginExtra: PINNED_CIPHER,
    nodeExtra: PINNED_CIPHER,
    netns: { name: spec.site, loginListen: SITE_ADDRESS, loginPort: LOGIN_PORT, nodePort: NODE_PORT },
  });
  onCleanup('loopback site', () => site.stop());
  const user = site.user;
  const work = await mkdtemp(join(tmpdir(), 'bh-wan-work-'));
  onCleanup('work dir', () => rm(work, { recursive: true, force: true }));
  chownSync(work, user.uid, user.gid);
  chmodSync(work, 0o755);
  const blockPath = join(work, 'block');
  const block = randomBytes(MiB);
  await writeFile(blockPath, block, { mode: 0o644 });
  const tunnelPeer = join(work, 'tunnel_peer.py');
  const latencyPeer = join(work, 'latency_peer.py');
  await copyFile(join(ROOT, 'bench', 'tunnel_peer.py'), tunnelPeer);
  await copyFile(join(ROOT, 'bench', 'latency_peer.py'), latencyPeer);
  chmodSync(tunnelPeer, 0o644);
  chmodSync(latencyPeer, 0o644);
  const shaOf = new Map<number, string>();
  const expectedSha = (bytes: number) => {
    let sha = shaOf.get(bytes);
    if (!sha) {
      const h = createHash('sha256');
      for (let left = bytes; left > 0; left -= block.length) h.update(block.subarray(0, Math.min(block.length, left)));
      sha = h.digest('hex');
      shaOf.set(bytes, sha);
    }
    return sha;
  };

  // The endpoints, on every address of the cluster namespace: its 127.0.0.1 for the tunnels, its WAN
  // address for the raw path.
  const sink = start('sink', PYTHON, [tunnelPeer, 'sink', '--host', '0.0.0.0', '--block', blockPath]);
  const echo = start('echo', PYTHON, [latencyPeer, 'echo', '--host', '0.0.0.0']);
  const sinkPort = (JSON.parse(await sink.line(/"listening"/, 15_000)) as { listening: number }).listening;
  const echoPort = (JSON.parse(await echo.line(/"listening"/, 15_000)) as { listening: number }).listening;
  const sitePlace: Place = { kind: 'site', ns: spec.site };
  const targets = new Map<PathName, Target>();
  const setup: ScenarioResult['setup'] = [];
  const rtts = (ms: number) => ms / spec.measuredRttMs;

  if (CHOSEN.has('raw')) {
    targets.set('raw', {
      place: sitePlace,
      sink: ['--tcp', `${CLUSTER_ADDRESS}:${sinkPort}`],
      echo: ['--tcp', `${CLUSTER_ADDRESS}:${echoPort}`],
    });
  }
  if (CHOSEN.has('openssh')) {
    const sinkSock = join(work, 'ossh-sink.sock');
    const echoSock = join(work, 'ossh-echo.sock');
    const t0 = performance.now();
    await openSshReverse(site, work, user, [
      { socket: sinkSock, port: sinkPort },
      { socket: echoSock, port: echoPort },
    ]);
    const ms = performance.now() - t0;
    setup.push({ path: 'openssh', ms, rtts: rtts(ms) });
    say(`openssh: sockets after ${ms.toFixed(0)} ms (${rtts(ms).toFixed(1)} RTT, from the ssh command)`);
    targets.set('openssh', { place: sitePlace, sink: ['--unix', sinkSock], echo: ['--unix', echoSock] });
  }
  const shadowPath = async (name: PathName, backhaul: Record<string, unknown>): Promise<ShadowTunnel> => {
    const host = await startShadowHost(site, autoTunnelThreads(), backhaul);
    const tunnel = await openShadowTunnel(host, [sinkPort, echoPort]);
    const { submitted, batchHost, forwardsReady } = tunnel.times;
    const ms = forwardsReady - batchHost;
    setup.push({ path: name, ms, rtts: rtts(ms), submitToUpMs: forwardsReady - submitted });
    say(
      `${name}: batch host known -> forwards up ${ms.toFixed(0)} ms (${rtts(ms).toFixed(1)} RTT); submit -> up ${(forwardsReady - submitted).toFixed(0)} ms`,
    );
    return tunnel;
  };
  if (CHOSEN.has('backhaul') || CHOSEN.has('relay')) {
    const tunnel = await shadowPath('backhaul', {});
    const [sinkSock = '', echoSock = ''] = tunnel.sockets;
    targets.set('backhaul', { place: sitePlace, sink: ['--unix', sinkSock], echo: ['--unix', echoSock] });
    if (CHOSEN.has('relay')) {
      await waitForState(tunnel.jobId, ['RUNNING'], 60_000);
      const [sinkListen, echoListen] = tunnel.ports;
      targets.set('relay', {
        place: { kind: 'job', jobId: tunnel.jobId, node: site.nodeHost, netOf: spec.outerPid },
        sink: ['--tcp', `${tunnel.address}:${sinkListen}`],
        echo: ['--tcp', `${tunnel.address}:${echoListen}`],
      });
    }
    if (!CHOSEN.has('backhaul')) targets.delete('backhaul');
  }
  if (CHOSEN.has('bh-2MiB')) {
    const tunnel = await shadowPath('bh-2MiB', { ChannelWindowMaxMiB: 2 });
    const [sinkSock = '', echoSock = ''] = tunnel.sockets;
    targets.set('bh-2MiB', { place: sitePlace, sink: ['--unix', sinkSock], echo: ['--unix', echoSock] });
  }

  const transferTimeout = (bytes: number) => 120_000 + (bytes / 1e6) * 1000;
  const transfer = async (t: Target, mode: 'up' | 'down', bytes: number, id: string): Promise<number> => {
    const line = await runClient(
      t.place,
      user,
      [tunnelPeer, 'client', ...t.sink, '--mode', mode, '--bytes', String(bytes), '--block', blockPath, '--id', id],
      transferTimeout(bytes),
    );
    const r = JSON.parse(line) as { bytes: number; seconds: number; sha256?: string };
    if (r.bytes !== bytes) throw new Error(`${id}: ${r.bytes} bytes arrived, ${bytes} sent`);
    if (mode === 'up' && r.sha256 !== expectedSha(bytes)) throw new Error(`${id}: sha256 mismatch`);
    return r.seconds;
  };
  const measureOnce = async (path: PathName, t: Target, measure: Measure, round: number): Promise<Sample> => {
    const id = `${path}-${measure}-${round}`;
    switch (measure) {
      case 'rtt': {
        const line = await runClient(
          t.place,
          user,
          [latencyPeer, 'client', ...t.echo, '--size', '64', '--count', String(RTT_COUNT), '--warmup', '20'],
          120_000 + RTT_COUNT * spec.rttMs * 4,
        );
        const r = JSON.parse(line) as { p50_us: number; p99_us: number };
        return { path, measure, p50: r.p50_us, p99: r.p99_us };
      }
      case 'up':
      case 'down':
        return { path, measure, mbps: BYTES / 1e6 / (await transfer(t, measure, BYTES, id)) };
      case 'par8': {
        const share = Math.floor(BYTES / PARALLEL);
        const seconds = await Promise.all(
          Array.from({ length: PARALLEL }, (_, i) => transfer(t, i % 2 === 0 ? 'up' : 'down', share, `${id}-${i}`)),
        );
        return { path, measure, mbps: (share * PARALLEL) / 1e6 / Math.max(...seconds) };
      }
    }
  };

  const samples: Sample[] = [];
  for (let round = 1; round <= ROUNDS; round++) {
    for (const measure of MEASURES) {
      if (!CHOSEN_MEASURES.has(measure)) continue;
      for (const path of PATHS) {
        const t = targets.get(path);
        if (!t) continue;
        try {
          const s = await measureOnce(path, t, measure, round);
          samples.push(s);
          say(
            `round ${round} ${measure} ${path}: ${s.mbps !== undefined ? `${s.mbps.toFixed(1)} MB/s` : `p50 ${((s.p50 ?? 0) / 1000).toFixed(2)} ms, p99 ${((s.p99 ?? 0) / 1000).toFixed(2)} ms`}`,
          );
        } catch (error) {
          say(`round ${round} ${measure} ${path}: FAILED ${(error as Error).message}`);
        }
      }
    }
  }
  const result: ScenarioResult = {
    scenario: { rttMs: spec.rttMs, loss: spec.loss },
    measuredRttMs: spec.measuredRttMs,
    samples,
    setup,
  };
  process.stdout.write(`${JSON.stringify(result)}\n`);
}

// ------------------------------------------------------------------------------------------ report

function report(results: ScenarioResult[]): string {
  const lines: string[] = [];
  const fmt = (v: number | undefined, digits: number) =>
    v === undefined || !Number.isFinite(v) ? '-' : v.toFixed(digits);
  const spread = (xs: number[], digits: number) =>
    xs.length === 0
      ? '-'
      : `${fmt(median(xs), digits)} (${fmt(Math.min(...xs), digits)}–${fmt(Math.max(...xs), digits)})`;
  for (const r of results) {
    lines.push(
      '',
      `### RTT ${r.scenario.rttMs} ms (ping ${r.measuredRttMs.toFixed(1)} ms), loss ${(r.scenario.loss * 100).toFixed(2)} %, ${ROUNDS} rounds, ${BYTES / MiB} MiB`,
      '',
      '| path | 64 B RTT p50 ms | p99 ms | upload MB/s | download MB/s | 8 streams MB/s | up / OpenSSH | setup ms (RTTs) |',
      '|---|---:|---:|---:|---:|---:|---:|---:|',
    );
    const of = (path: PathName, m: Measure) => r.samples.filter((s) => s.path === path && s.measure === m);
    const up = (path: PathName) => median(of(path, 'up').map((s) => s.mbps ?? 0));
    for (const path of PATHS) {
      if (!r.samples.some((s) => s.path === path)) continue;
      const rtt = of(path, 'rtt');
      const st = r.setup.find((s) => s.path === path);
      lines.push(
        `| ${path} | ${spread(
          rtt.map((s) => (s.p50 ?? 0) / 1000),
          1,
        )} | ${spread(
          rtt.map((s) => (s.p99 ?? 0) / 1000),
          1,
        )} | ${spread(
          of(path, 'up').map((s) => s.mbps ?? 0),
          1,
        )} | ${spread(
          of(path, 'down').map((s) => s.mbps ?? 0),
          1,
        )} | ${spread(
          of(path, 'par8').map((s) => s.mbps ?? 0),
          1,
        )} | ${of('openssh', 'up').length ? fmt(up(path) / up('openssh'), 2) : '-'} | ${
          st ? `${fmt(st.ms, 0)} (${fmt(st.rtts, 1)})` : '-'
        } |`,
      );
    }
    if (r.delayer) lines.push('', `delayer: ${r.delayer.passed} packets passed, ${r.delayer.dropped} dropped`);
  }
  return `${lines.join('\n')}\n`;
}

// ------------------------------------------------------------------------------------------ main

const innerSpec = process.env.BH_WAN_INNER;
const main = innerSpec ? () => inner(JSON.parse(innerSpec) as InnerSpec) : outer;
main()
  .catch((error: Error) => {
    say(`failed: ${error.stack ?? error.message}`);
    process.exitCode = 1;
  })
  .finally(async () => {
    await cleanupAll();
  });
