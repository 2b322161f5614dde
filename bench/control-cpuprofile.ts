/**
 * Reads a V8 .cpuprofile (node --cpu-prof) and says where the time went: self time by package (bullmq,
 * ioredis, xstate, zod, backhaul's own code, V8 builtins such as JSON, the garbage collector, idle) and
 * inclusive time of a few functions of interest (applyPodEvent, applyEvent, transition, restorePod …).
 */
import { readFileSync } from 'node:fs';

interface CallFrame {
  functionName: string;
  url: string;
  lineNumber: number;
}
interface ProfileNode {
  id: number;
  callFrame: CallFrame;
  hitCount?: number;
  children?: number[];
}
interface Profile {
  nodes: ProfileNode[];
  startTime: number;
  endTime: number;
  samples: number[];
  timeDeltas: number[];
}

export interface ProfileSummary {
  /** Profiled wall time, ms. */
  totalMs: number;
  /** Self time by category, ms (idle included). */
  byCategory: Map<string, number>;
  /** Inclusive time of functions of interest, ms. */
  inclusive: Map<string, number>;
  /** Top self-time functions outside idle, ms. */
  topSelf: { name: string; ms: number }[];
}

function category(frame: CallFrame): string {
  const { url, functionName } = frame;
  if (functionName === '(idle)') return 'idle';
  if (functionName === '(garbage collector)') return 'GC';
  if (functionName === '(program)') return 'V8/native (program)';
  if (functionName === 'writeUtf8String' || functionName === 'writeBuffer' || functionName === 'writev') {
    return 'socket writes (libuv)';
  }
  const pkg = /node_modules\/((?:@[^/]+\/)?[^/]+)\//.exec(url)?.[1];
  if (pkg) {
    if (
      ['ioredis', 'redis-parser', 'denque', 'standard-as-callback', 'cluster-key-slot', '@ioredis/commands'].includes(
        pkg,
      )
    )
      return 'ioredis';
    if (pkg === 'msgpackr' || pkg === 'cron-parser' || pkg === 'semver' || pkg === 'uuid' || pkg === 'bullmq')
      return 'bullmq';
    return pkg;
  }
  if (/\/(dist|src)\/(machines)\//.test(url)) return 'backhaul machine';
  if (/\/(dist|src)\//.test(url)) return 'backhaul other';
  if (url.startsWith('node:internal/modules')) return 'node module loading (start-up)';
  if (url.startsWith('node:')) return 'node core';
  if (url === '') return 'V8 builtins (JSON, RegExp …)';
  return 'other';
}

const INTEREST = [
  'applyPodEvent',
  'applyWithRetry',
  'onEvent',
  'onStep',
  'runEffects',
  'runStep',
  'applyEvent',
  'startPod',
  'transition',
  'createInertActorScope',
  'restorePod',
  'persistPod',
  'parsePodEvent',
  'reap',
  'moveToActive',
  'moveToFinished',
  'addJob',
  'processJob',
];

export function summarizeProfile(path: string): ProfileSummary {
  const profile = JSON.parse(readFileSync(path, 'utf8')) as Profile;
  const byId = new Map(profile.nodes.map((n) => [n.id, n]));
  // Self time from samples and their time deltas (more exact than hitCount × mean interval).
  const self = new Map<number, number>();
  for (let i = 0; i < profile.samples.length; i += 1) {
    const id = profile.samples[i] as number;
    const dt = (profile.timeDeltas[i + 1] ?? profile.timeDeltas[i] ?? 0) / 1000;
    self.set(id, (self.get(id) ?? 0) + dt);
  }
  const byCategory = new Map<string, number>();
  const byFunction = new Map<string, number>();
  for (const node of profile.nodes) {
    const ms = self.get(node.id) ?? 0;
    if (ms === 0) continue;
    const cat = category(node.callFrame);
    byCategory.set(cat, (byCategory.get(cat) ?? 0) + ms);
    if (cat !== 'idle') {
      const file = node.callFrame.url.replace(/^.*node_modules\//, '').replace(/^.*\/work\/main\//, '');
      const name = `${node.callFrame.functionName || '(anonymous)'} ${file}:${node.callFrame.lineNumber + 1}`;
      byFunction.set(name, (byFunction.get(name) ?? 0) + ms);
    }
  }
  // Inclusive time: a subtree counted once per function name on a path (recursion not double counted).
  const totals = new Map<number, number>();
  const total = (id: number): number => {
    const cached = totals.get(id);
    if (cached !== undefined) return cached;
    const node = byId.get(id);
    let sum = self.get(id) ?? 0;
    for (const child of node?.children ?? []) sum += total(child);
    totals.set(id, sum);
    return sum;
  };
  const inclusive = new Map<string, number>();
  const walk = (id: number, onPath: Set<string>) => {
    const node = byId.get(id);
    if (!node) return;
    const name = node.callFrame.functionName;
    const interesting = INTEREST.includes(name) && !onPath.has(name);
    if (interesting) {
      inclusive.set(name, (inclusive.get(name) ?? 0) + total(id));
      onPath.add(name);
    }
    for (const child of node.children ?? []) walk(child, onPath);
    if (interesting) onPath.delete(name);
  };
  const root = profile.nodes[0];
  if (root) walk(root.id, new Set());
  const topSelf = [...byFunction.entries()]
    .sort((a, b) => b[1] - a[1])
    .slice(0, 15)
    .map(([name, ms]) => ({ name, ms }));
  return { totalMs: (profile.endTime - profile.startTime) / 1000, byCategory, inclusive, topSelf };
}
