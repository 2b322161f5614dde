import { bindAddress } from '../contract/derivations.js';
import { systemClock } from '../pods/clock.js';
import type { PodDetail, PodStatus } from './pod-status.js';

export function formatAge(ms: number): string {
  const s = Math.max(0, Math.round(ms / 1000));
  if (s < 120) return `${s}s`;
  const m = Math.round(s / 60);
  if (m < 120) return `${m}m`;
  const h = Math.round(m / 60);
  return h < 48 ? `${h}h` : `${Math.round(h / 24)}d`;
}

/** Columns padded to their widest cell; the last column is not padded (it may be long). */
export function formatTable(header: string[], rows: string[][]): string {
  const all = [header, ...rows];
  const widths = header.map((_, i) => Math.max(...all.map((r) => (r[i] ?? '').length)));
  return `${all.map((r) => r.map((cell, i) => (i === r.length - 1 ? cell : cell.padEnd(widths[i] ?? 0))).join('  ')).join('\n')}\n`;
}

/** `runStep launch (generation 1), stopShadow (generation 0)`: the outbox as an operator reads it. */
function describeEffects(effects: unknown): string {
  if (!Array.isArray(effects)) return 'unreadable';
  return effects
    .map((e: { type?: unknown; params?: { step?: unknown; generation?: unknown } }) =>
      [
        String(e?.type),
        e?.params?.step === undefined ? '' : ` ${String(e.params.step)}`,
        ` (generation ${String(e?.params?.generation)})`,
      ].join(''),
    )
    .join(', ');
}

/**
 * The relay's addresses, and where one is not the derived address of its group (it was taken on the
 * node when the job started), which: the workload's names still lead to the right one (hosts file).
 */
export function formatAddresses(uid: string, addresses: readonly string[] | null): string {
  if (!addresses || addresses.length === 0) return '-';
  const moved = addresses.flatMap((a, group) => {
    const derived = bindAddress(uid, group);
    return a === derived ? [] : [`${a} in place of ${derived}`];
  });
  return `${addresses.join(', ')}${moved.length > 0 ? ` (${moved.join(', ')}: taken on the node when the job started)` : ''}`;
}

export function formatDetail(p: PodDetail): string {
  const now = systemClock();
  const lines = [
    `pod         ${p.namespace}/${p.name}`,
    `uid         ${p.uid}`,
    `state       ${p.state}${p.since === null ? '' : ` for ${formatAge(now - p.since)}`}`,
  ];
  if (p.snapshotError) lines.push(`snapshot    unreadable by this build: ${p.snapshotError}`);
  lines.push(
    `generation  ${p.generation ?? '-'} (attempts ${p.attempts ?? '-'})`,
    `job         ${p.jobId ? `${p.jobId} on ${p.batchHost ?? '?'}` : '-'}`,
    `host        ${p.host ?? '-'}`,
    `addresses   ${formatAddresses(p.uid, p.relayAddresses)}`,
    `isolation   ${formatIsolation(p.isolation)}`,
    `lease       ${p.lease ? `${p.lease.holder}, generation ${p.lease.generation}, expires in ${formatAge(p.lease.expiresAt - now)}` : '-'}`,
    `deadline    ${p.deadline ? `${p.deadline.name} ${p.deadline.at >= now ? `in ${formatAge(p.deadline.at - now)}` : `due ${formatAge(now - p.deadline.at)} ago`}` : '-'}`,
    `effects     ${p.pendingEffects ? `${describeEffects(p.pendingEffects.effects)}, not run for ${formatAge(now - p.pendingEffects.since)}` : '-'}`,
    `last error  ${p.lastError ? `${p.lastError.kind}: ${p.lastError.message}` : '-'}`,
    '',
    ...formatTraffic(p.traffic, now),
    'jobs',
    ...(p.steps.length === 0
      ? ['  -']
      : p.steps.map(
          (s) =>
            `  ${s.id}  ${s.state}${s.attempts ? ` (attempts ${s.attempts})` : ''}${s.failedReason ? `: ${s.failedReason}` : ''}`,
        )),
    ...(p.deadEvents.length === 0
      ? []
      : [
          'events not applied',
          ...p.deadEvents.map(
            (d) => `  ${new Date(d.at).toISOString()}  ${d.type.padEnd(16)} delivery ${d.delivery}: ${d.reason}`,
          ),
        ]),
    '',
    'timeline',
    ...p.history.map(
      (h) =>
        `  ${new Date(h.at).toISOString()}  ${h.event.padEnd(16)} ${h.from || '·'} → ${h.to}${h.detail ? `  (${h.detail})` : ''}`,
    ),
  );
  return `${lines.join('\n')}\n`;
}

/** The pod's forwards: connections and bytes each, and the carrier's round trip ("the tunnel, or the service?"). */
function formatTraffic(traffic: PodDetail['traffic'], now: number): string[] {
  if (!traffic) return ['forwards    -', ''];
  const rtt = traffic.rttMs === undefined ? '' : `, carrier round trip ${formatMs(traffic.rttMs)}`;
  const width = Math.max(...traffic.forwards.map((f) => f.forward.length), 0);
  return [
    `forwards    as of ${formatAge(Math.max(0, now - traffic.at))} ago, on ${traffic.host}${rtt}`,
    ...(traffic.forwards.length === 0
      ? ['  - (no connection yet)']
      : traffic.forwards.map(
          (f) =>
            `  ${f.forward.padEnd(width)}  ${f.open} open, ${f.opened} opened, ${f.failed} failed; ${formatBytes(f.toService)} to it, ${formatBytes(f.fromService)} from it`,
        )),
    '',
  ];
}

function formatMs(ms: number): string {
  return ms < 10 ? `${ms.toFixed(2)} ms` : `${Math.round(ms)} ms`;
}

/** Bytes as B, KiB, MiB or GiB. */
export function formatBytes(n: number): string {
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let value = n;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return unit === 0 ? `${n} B` : `${value.toFixed(1)} ${units[unit]}`;
}

/** `per job` or `per user`, for the relay and the sockets (docs/SECURITY.md). */
function formatIsolation(isolation: PodStatus['isolation']): string {
  if (!isolation) return '-';
  const word = (level: 'job' | 'user') => (level === 'job' ? 'per job' : 'per user');
  return `relay ${word(isolation.relay)}, sockets ${word(isolation.sockets)}`;
}
