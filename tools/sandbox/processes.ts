import * as fs from 'node:fs';

/**
 * The process table from /proc (no procps needed): who is alive, whose child it is, which user runs it
 * and with what command line. Synchronous and cheap; used by the loopback site to find what its sshds
 * forked and by the demo to prove nothing of a pod is left running.
 */

export interface ProcessInfo {
  pid: number;
  ppid: number;
  /** Real uid. */
  uid: number;
  /** The kernel's short name (`/proc/PID/comm`). */
  comm: string;
  /** The command line, arguments joined by spaces ('' for kernel threads and zombies). */
  cmdline: string;
}

function readProc(pid: string, file: string): string | undefined {
  try {
    return fs.readFileSync(`/proc/${pid}/${file}`, 'utf8');
  } catch {
    return undefined; // gone meanwhile
  }
}

/** pid (comm) state ppid ...: comm may hold spaces and parentheses, so split after the last ')'. */
function parseStat(stat: string): { comm: string; state: string; ppid: number } {
  const close = stat.lastIndexOf(')');
  const rest = stat.slice(close + 2).split(' ');
  return { comm: stat.slice(stat.indexOf('(') + 1, close), state: rest[0] ?? '', ppid: Number(rest[1]) };
}

function pids(): string[] {
  try {
    return fs.readdirSync('/proc').filter((entry) => /^\d+$/.test(entry));
  } catch {
    return [];
  }
}

/** Every live process (zombies left out). */
export function processTable(): ProcessInfo[] {
  const out: ProcessInfo[] = [];
  for (const pid of pids()) {
    const stat = readProc(pid, 'stat');
    const status = readProc(pid, 'status');
    if (stat === undefined || status === undefined) continue;
    const { comm, state, ppid } = parseStat(stat);
    if (state === 'Z') continue;
    const uid = Number(/^Uid:\s+(\d+)/m.exec(status)?.[1] ?? -1);
    const cmdline = (readProc(pid, 'cmdline') ?? '').split('\0').filter(Boolean).join(' ');
    out.push({ pid: Number(pid), ppid, uid, comm, cmdline });
  }
  return out;
}

/** Pids of all live descendants of PID (from /proc; children reparented away are not found). */
export function descendantsOf(pid: number): number[] {
  const children = new Map<number, number[]>();
  for (const entry of pids()) {
    const stat = readProc(entry, 'stat');
    if (stat === undefined) continue;
    const { ppid } = parseStat(stat);
    const list = children.get(ppid) ?? [];
    list.push(Number(entry));
    children.set(ppid, list);
  }
  const out: number[] = [];
  const queue = [pid];
  while (queue.length > 0) {
    const p = queue.shift() as number;
    for (const c of children.get(p) ?? []) {
      out.push(c);
      queue.push(c);
    }
  }
  return out;
}

export function isAlive(pid: number): boolean {
  // A zombie still answers kill(0): look at the state instead.
  const stat = readProc(String(pid), 'stat');
  return stat !== undefined && parseStat(stat).state !== 'Z';
}
