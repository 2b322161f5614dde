/**
 * A WAN between a cluster and a site on this one machine, for bench:wan (and its smoke test): two
 * network namespaces, `bhwan-<pid>-c` (the cluster: session host, `ssh -J -R`, the endpoints) and
 * `bhwan-<pid>-s` (the site: login and node sshds, the job's side), each with a tun device, joined by
 * bench/wan_delay.py, which passes every packet on after half the round trip (and drops a fraction if
 * asked). The addresses exist only inside the namespaces: 10.251.0.1 (cluster) and 10.251.0.2 (site).
 *
 * Made by `createWan`, removed by `close()`; a bench killed outright leaves its namespaces, which the
 * next createWan removes (their pid is gone), and its delayer, which exits by itself once the bench's
 * pid is gone.
 */
import { type ChildProcess, execFile, spawn } from 'node:child_process';
import { once } from 'node:events';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';

const run = promisify(execFile);

export const CLUSTER_ADDRESS = '10.251.0.1';
export const SITE_ADDRESS = '10.251.0.2';
const DEVICE = 'bhw0';
const MTU = 65000;
/** TCP buffers inside the namespaces only: up to 32 MiB, so the WAN hop itself never caps a stream. */
const TCP_MEM = ['net.ipv4.tcp_rmem=4096 131072 33554432', 'net.ipv4.tcp_wmem=4096 65536 33554432'];
const NAME = /^bhwan-(\d+)-[cs]$/;
const DELAYER = fileURLToPath(new URL('./wan_delay.py', import.meta.url));

export interface WanOptions {
  rttMs: number;
  /** Fraction of packets dropped each way (0.001: 0.1 %). */
  loss?: number;
}

export interface Wan {
  cluster: string;
  site: string;
  rttMs: number;
  loss: number;
  /** The round trip `ping` measured across it once made (ms, average of 5). */
  measuredRttMs: number;
  /** Stops the delayer, then removes both namespaces (whatever still runs in them is killed first). */
  close(): Promise<{ passed: number; dropped: number; max_queue: number } | undefined>;
}

async function ip(args: readonly string[]): Promise<string> {
  try {
    const { stdout } = await run('ip', [...args], { timeout: 20_000 });
    return stdout;
  } catch (error) {
    const e = error as { stderr?: string; message: string };
    throw new Error(`ip ${args.join(' ')}: ${e.stderr?.trim() || e.message}`);
  }
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}

/** Kills every process still in namespace NS (`ip netns pids`), so that deleting it frees it at once. */
async function emptyNamespace(ns: string): Promise<void> {
  const pids = (await ip(['netns', 'pids', ns]).catch(() => ''))
    .split('\n')
    .map(Number)
    .filter((p) => Number.isInteger(p) && p > 1);
  for (const pid of pids) {
    try {
      process.kill(pid, 'SIGKILL');
    } catch {
      // already gone
    }
  }
}

/** Namespaces of benches that are gone (killed before their cleanup ran). */
export async function removeStaleWans(): Promise<string[]> {
  const names = (await ip(['netns', 'list']))
    .split('\n')
    .map((line) => line.split(' ')[0] ?? '')
    .filter((name) => NAME.test(name));
  const stale = names.filter((name) => !alive(Number(NAME.exec(name)?.[1])));
  for (const ns of stale) {
    await emptyNamespace(ns);
    await ip(['netns', 'del', ns]);
  }
  return stale;
}

/** Names of this process's namespaces that exist now (for the smoke test's "nothing left behind"). */
export async function wanNamespaces(pid = process.pid): Promise<string[]> {
  return (await ip(['netns', 'list']))
    .split('\n')
    .map((line) => line.split(' ')[0] ?? '')
    .filter((name) => name === `bhwan-${pid}-c` || name === `bhwan-${pid}-s`);
}

function readyLine(child: ChildProcess, timeoutMs: number): Promise<void> {
  return new Promise((resolve, reject) => {
    let stderr = '';
    child.stderr?.on('data', (d: Buffer) => {
      stderr += d.toString();
    });
    const lines = createInterface({ input: child.stdout as NodeJS.ReadableStream });
    const timer = setTimeout(
      () => reject(new Error(`the delayer did not start in ${timeoutMs} ms: ${stderr}`)),
      timeoutMs,
    );
    lines.once('line', (line) => {
      clearTimeout(timer);
      if (line.includes('"ready"')) resolve();
      else reject(new Error(`the delayer said ${line}: ${stderr}`));
    });
    child.once('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`the delayer exited (${code}) before it was ready: ${stderr}`));
    });
  });
}

export async function createWan(options: WanOptions): Promise<Wan> {
  if (process.getuid?.() !== 0) throw new Error('bench:wan needs root (network namespaces, tun devices)');
  const loss = options.loss ?? 0;
  await removeStaleWans();
  const cluster = `bhwan-${process.pid}-c`;
  const site = `bhwan-${process.pid}-s`;
  let delayer: ChildProcess | undefined;
  let closing: Promise<{ passed: number; dropped: number; max_queue: number } | undefined> | undefined;
  const close = () => {
    closing ??= (async () => {
      let counters: { passed: number; dropped: number; max_queue: number } | undefined;
      if (delayer && delayer.exitCode === null && delayer.signalCode === null) {
        let out = '';
        delayer.stdout?.on('data', (d: Buffer) => {
          out += d.toString();
        });
        const exited = once(delayer, 'exit');
        delayer.kill('SIGTERM');
        await exited;
        try {
          counters = JSON.parse(out.trim().split('\n').pop() ?? '') as typeof counters;
        } catch {
          counters = undefined;
        }
      }
      for (const ns of [cluster, site]) {
        await emptyNamespace(ns);
        await ip(['netns', 'del', ns]).catch(() => undefined);
      }
      return counters;
    })();
    return closing;
  };
  try {
    for (const ns of [cluster, site]) {
      await ip(['netns', 'add', ns]);
      await ip(['-n', ns, 'link', 'set', 'lo', 'up']);
      await ip(['-n', ns, 'tuntap', 'add', 'dev', DEVICE, 'mode', 'tun']);
      await run('ip', ['netns', 'exec', ns, 'sysctl', '-q', '-w', ...TCP_MEM]);
    }
    // A real-time priority: the delay must be the one asked for, not the scheduler's on a busy machine.
    delayer = spawn(
      'chrt',
      [
        '-f',
        '5',
        'python3',
        DELAYER,
        '--ns-a',
        cluster,
        '--tun-a',
        DEVICE,
        '--ns-b',
        site,
        '--tun-b',
        DEVICE,
        '--delay-ms',
        String(options.rttMs / 2),
        '--loss',
        String(loss),
        '--parent',
        String(process.pid),
      ],
      { stdio: ['ignore', 'pipe', 'pipe'] },
    );
    await readyLine(delayer, 10_000);
    for (const [ns, local, peer] of [
      [cluster, CLUSTER_ADDRESS, SITE_ADDRESS],
      [site, SITE_ADDRESS, CLUSTER_ADDRESS],
    ] as const) {
      await ip(['-n', ns, 'addr', 'add', local, 'peer', peer, 'dev', DEVICE]);
      await ip(['-n', ns, 'link', 'set', DEVICE, 'mtu', String(MTU), 'up']);
    }
    const { stdout } = await run(
      'ip',
      ['netns', 'exec', cluster, 'ping', '-q', '-c', '5', '-i', '0.05', SITE_ADDRESS],
      {
        timeout: 20_000,
      },
    );
    const avg = /= [\d.]+\/([\d.]+)\//.exec(stdout)?.[1];
    if (avg === undefined) throw new Error(`no ping answer across the WAN: ${stdout}`);
    return { cluster, site, rttMs: options.rttMs, loss, measuredRttMs: Number(avg), close };
  } catch (error) {
    await close();
    throw error;
  }
}
