import { setTimeout as sleep } from 'node:timers/promises';
import type { PodReadDeps } from '../pods/fleet-deps.js';
import type { HistoryEntry } from '../store/snapshot-store.js';
import { CliError, EXIT } from './exit-codes.js';

/** What a pod that stays in STATE is most likely waiting for, said so an operator knows where to look. */
export function waitHint(state: string | null, uid: string): string | undefined {
  switch (state) {
    case 'validating':
    case 'rendering':
    case 'tearingDown':
      return 'no control worker took its step: is a `backhaul worker --roles control` running against this Redis?';
    case 'launchingShadow':
      return `no session host has taken its shadow, or the site cannot be reached: is a \`backhaul worker --roles session\` running? \`backhaul status ${uid}\` shows the last error`;
    case 'waitingBatchHost':
      return `its Slurm job is not running: the job must be named after the pod UID (squeue --name=${uid}) and run as Network.SSH.User`;
    case 'openingCarrier':
    case 'establishingForwards':
      return `the carrier to the batch host is not up yet; \`backhaul status ${uid}\` shows the last error`;
    default:
      return undefined;
  }
}

/** One line per transition: `<ISO time>  <EVENT>  <from> → <to>  (<detail>)`. */
export function formatTransition(h: HistoryEntry): string {
  const detail = h.detail ? `  (${h.detail})` : '';
  return `${new Date(h.at).toISOString()}  ${h.event.padEnd(16)} ${h.from || '·'} → ${h.to}${detail}\n`;
}

export interface FollowOptions {
  /** Where the lines go (default stdout). */
  write?: (text: string) => void;
  format?: (entry: HistoryEntry) => string;
  pollMs?: number;
}

/**
 * Prints a pod's transitions live, as they are appended to its history, each once: `until` can be
 * called again (the demo follows one pod through several phases) without repeating a line.
 */
export class PodFollower {
  private shown = 0;
  private readonly write: (text: string) => void;
  private readonly format: (entry: HistoryEntry) => string;

  constructor(
    private readonly deps: PodReadDeps,
    readonly uid: string,
    private readonly opts: FollowOptions = {},
  ) {
    this.write = opts.write ?? ((text) => process.stdout.write(text));
    this.format = opts.format ?? formatTransition;
  }

  /** Prints the transitions not shown yet; returns the whole history. */
  async flush(): Promise<HistoryEntry[]> {
    const history = await this.deps.store.history(this.uid);
    for (const h of history.slice(this.shown)) this.write(this.format(h));
    this.shown = Math.max(this.shown, history.length);
    return history;
  }

  /** Follows until `done(state)` (null: the pod is forgotten); a CliError after MS. */
  async until(done: (state: string | null) => boolean, ms: number): Promise<string | null> {
    const deadline = performance.now() + ms;
    for (;;) {
      await this.flush();
      const state = (await this.deps.store.load(this.uid))?.state ?? null;
      if (done(state)) {
        await this.flush();
        return state;
      }
      if (performance.now() > deadline) {
        const hint = waitHint(state, this.uid);
        throw new CliError(
          `timed out after ${ms / 1000} s; the pod is ${state ?? 'gone'}${hint ? `: ${hint}` : ''}`,
          EXIT.failure,
        );
      }
      await sleep(this.opts.pollMs ?? 200);
    }
  }
}
