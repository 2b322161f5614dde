import { randomUUID } from 'node:crypto';
import type { Command } from 'commander';
import { parseReverseRequest, requestContext } from '../../contract/reverse-request.js';
import { type PodEvent, type PodStateName, statesTagged } from '../../machines/pod-machine.js';
import { systemClock } from '../../pods/clock.js';
import type { FleetDeps } from '../../pods/fleet-deps.js';
import { loadPodRecord } from '../../pods/pod-reader.js';
import { sendEvent } from '../../pods/queues.js';
import { cliDuration } from '../cli-duration.js';
import { CliError, EXIT } from '../exit-codes.js';
import { type FleetOption, fleetOptions, resolvePod, withFleet, withPodReader } from '../fleet-connection.js';
import { fromFile, loadPod } from '../inputs.js';
import { PodFollower } from '../pod-follow.js';
import { type PodDetail, type PodStatus, podDetail, podStatuses } from '../pod-status.js';
import { formatAge, formatDetail, formatTable } from '../status-format.js';
import { type Frame, interruptSignal, watchFrames } from '../status-watch.js';

interface JsonOption {
  json?: boolean;
}
interface WatchFlags {
  watch?: boolean;
  interval?: string;
}
interface WaitOption {
  wait?: boolean;
  timeout?: string;
}

const SETTLED = statesTagged('settled');

function timeoutMs(opts: WaitOption, fallbackS: number): number {
  return seconds(opts.timeout, fallbackS, '--timeout');
}

/** FLAG's duration (a plain number is seconds) or the fallback, in ms; a usage error names the flag. */
function seconds(text: string | undefined, fallbackS: number, flag: string): number {
  try {
    return cliDuration(text, fallbackS * 1000, flag);
  } catch (err) {
    if (err instanceof RangeError) throw new CliError(err.message, EXIT.usage);
    throw err;
  }
}

/**
 * The pod an operator's command acts on, and its state. A pod whose stored snapshot this build cannot
 * read (another machine version) would only make the control worker fail the event: say so here.
 */
async function podToChange(deps: FleetDeps, pod: string): Promise<{ uid: string; state: PodStateName }> {
  const uid = await resolvePod(deps, pod);
  const record = await loadPodRecord(deps.store, uid);
  if (!record) throw new CliError(`no pod ${pod} is known to backhaul`, EXIT.failure);
  if (!record.ok) {
    throw new CliError(`${pod}: this build cannot act on the pod: ${record.error.message}`, EXIT.failure);
  }
  return { uid, state: record.state };
}

async function send(
  opts: FleetOption,
  pod: string,
  event: (deps: FleetDeps) => PodEvent,
  verb: string,
  refuse: (state: PodStateName) => string | undefined = () => undefined,
): Promise<void> {
  await withFleet(opts, async (deps) => {
    const { uid, state } = await podToChange(deps, pod);
    const refusal = refuse(state);
    if (refusal) throw new CliError(refusal, EXIT.failure);
    await sendEvent(deps.queues, uid, event(deps));
    process.stdout.write(`${verb} ${pod} (${uid})\n`);
  });
}

export function registerPodCommands(program: Command): void {
  fleetOptions(
    program
      .command('submit')
      .description('feed a pod to the fleet without a cluster (as the pod watcher would)')
      .argument('<pod.yaml>', 'pod manifest; a UID is made up when it has none')
      .option('--wait', 'follow the pod until its forwards are up (or it fails)')
      .option('--timeout <duration>', 'with --wait: give up after this long: seconds or 30s, 10m, 1h30m (default 10m)'),
  ).action(async (podFile: string, opts: FleetOption & WaitOption) => {
    const pod = await loadPod(podFile);
    await withFleet(opts, async (deps) => {
      // Refuse bad input here, with the field named, before anything is stored.
      const request = fromFile(podFile, () =>
        parseReverseRequest(pod.annotations, requestContext(deps.config, pod.namespace)),
      );
      if (!request) throw new CliError(`${podFile}: the pod has no interlink.eu/reverse-* annotations`, EXIT.usage);
      const uid = pod.uid ?? randomUUID();
      await sendEvent(deps.queues, uid, {
        type: 'POD_UPSERT',
        namespace: pod.namespace,
        name: pod.name,
        annotations: pod.annotations,
        at: deps.now(),
      });
      process.stdout.write(`submitted ${pod.namespace}/${pod.name} ${uid}\n`);
      if (!opts.wait) return;
      const state = await new PodFollower(deps, uid).until(
        (s) => s !== null && SETTLED.has(s as PodStateName),
        timeoutMs(opts, 600),
      );
      if (state !== 'active') throw new CliError(`the pod ended ${state}`, EXIT.failure);
    });
  });

  fleetOptions(
    program
      .command('delete')
      .description('the pod is gone: tear down its tunnel and forget it (as the pod watcher would)')
      .argument('<pod>', 'namespace/name or UID')
      .option('--wait', 'follow the teardown until the pod is forgotten')
      .option('--timeout <duration>', 'with --wait: give up after this long: seconds or 30s, 2m (default 2m)'),
  ).action(async (pod: string, opts: FleetOption & WaitOption) => {
    await withFleet(opts, async (deps) => {
      const { uid } = await podToChange(deps, pod);
      await sendEvent(deps.queues, uid, { type: 'POD_DELETED', at: deps.now() });
      process.stdout.write(`deleting ${pod} (${uid})\n`);
      if (opts.wait) await new PodFollower(deps, uid).until((s) => s === null, timeoutMs(opts, 120));
    });
  });

  fleetOptions(
    program.command('retry').description('start a failed pod over').argument('<pod>', 'namespace/name or UID'),
  ).action(async (pod: string, opts: FleetOption) => {
    // The machine ignores RETRY in any other state: saying "retrying" would be a lie.
    await send(
      opts,
      pod,
      (deps) => ({ type: 'RETRY', at: deps.now() }),
      'retrying',
      (state) => (state === 'failed' ? undefined : `${pod} is ${state}: only a failed pod can be retried`),
    );
  });

  fleetOptions(
    program
      .command('teardown')
      .description("tear down a pod's tunnel now (the pod itself stays)")
      .argument('<pod>', 'namespace/name or UID')
      .option('--reason <text>', 'recorded in the history', 'operator'),
  ).action(async (pod: string, opts: FleetOption & { reason: string }) => {
    await send(opts, pod, (deps) => ({ type: 'TEARDOWN', reason: opts.reason, at: deps.now() }), 'tearing down');
  });

  fleetOptions(
    program
      .command('status')
      .description('every pod (a table), or one pod in detail: its timeline, lease and jobs')
      .argument('[pod]', 'namespace/name or UID')
      .option('--json', 'print JSON')
      .option('-w, --watch', 'look again every --interval until Ctrl-C (to a pipe: only when something changed)')
      .option('--interval <duration>', 'with --watch: how often: seconds or 500ms, 5s (default 2s)'),
  ).action(async (pod: string | undefined, opts: FleetOption & JsonOption & WatchFlags) => {
    const intervalMs = seconds(opts.interval, 2, '--interval');
    await withPodReader(opts, async (deps) => {
      const uid = pod === undefined ? undefined : await resolvePod(deps, pod);
      const look = async (): Promise<Frame | null> => {
        if (uid === undefined) {
          const all = await podStatuses(deps);
          return { key: JSON.stringify(all), text: opts.json ? `${JSON.stringify(all, null, 2)}\n` : statusTable(all) };
        }
        const detail: PodDetail | null = await podDetail(deps, uid);
        if (!detail) return null;
        return {
          key: JSON.stringify(detail),
          text: opts.json ? `${JSON.stringify(detail, null, 2)}\n` : formatDetail(detail),
        };
      };
      if (!opts.watch) {
        const frame = await look();
        if (!frame) throw new CliError(`no pod ${pod} is known to backhaul`, EXIT.failure);
        process.stdout.write(frame.text);
        return;
      }
      await watchFrames({
        look,
        gone: `${pod}: forgotten (its teardown is done; \`status\` no longer knows it)`,
        intervalMs,
        out: process.stdout,
        signal: interruptSignal(),
      });
    });
  });

  fleetOptions(
    program.command('list').description('the pods backhaul knows, one per line').option('--json', 'print JSON'),
  ).action(async (opts: FleetOption & JsonOption) => {
    await withPodReader(opts, async (deps) => {
      const all = await podStatuses(deps, 1);
      if (opts.json) {
        const rows = all.map(({ uid, namespace, name, state }) => ({ uid, namespace, name, state }));
        process.stdout.write(`${JSON.stringify(rows, null, 2)}\n`);
      } else {
        for (const p of all) process.stdout.write(`${p.namespace}/${p.name}\t${p.uid}\t${p.state}\n`);
      }
    });
  });
}

function statusTable(all: PodStatus[]): string {
  if (all.length === 0) return 'no pods\n';
  const now = systemClock();
  // Two pods of one name (deleted and created again, or submitted twice without a UID): show which is which.
  const seen = new Map<string, number>();
  for (const p of all) seen.set(`${p.namespace}/${p.name}`, (seen.get(`${p.namespace}/${p.name}`) ?? 0) + 1);
  const shared = [...seen.values()].filter((n) => n > 1).length;
  const table = formatTable(
    ['POD', 'STATE', 'AGE', 'ATTEMPTS', 'HOST', 'LAST ERROR'],
    all.map((p) => [
      (seen.get(`${p.namespace}/${p.name}`) ?? 0) > 1
        ? `${p.namespace}/${p.name} (uid ${p.uid})`
        : `${p.namespace}/${p.name}`,
      p.snapshotError ? `${p.state} (unreadable)` : p.state,
      p.since === null ? '-' : formatAge(now - p.since),
      p.attempts === null ? '-' : String(p.attempts),
      p.host ?? '-',
      p.snapshotError ?? (p.lastError ? `${p.lastError.kind}: ${p.lastError.message}` : '-'),
    ]),
  );
  return shared === 0
    ? table
    : `${table}${shared} name(s) belong to more than one pod: give those pods' UIDs to status, retry, teardown and delete\n`;
}
