import { setTimeout as sleep } from 'node:timers/promises';
import { systemClock } from '../pods/clock.js';

/** One look at what is watched: `key` changes only when what it shows does (not with the clock). */
export interface Frame {
  key: string;
  text: string;
}

export interface WatchOptions {
  /** The current frame; null when what is watched is gone (a forgotten pod): the watch ends. */
  look: () => Promise<Frame | null>;
  /** Said once when `look` gives null. */
  gone: string;
  intervalMs: number;
  out: NodeJS.WritableStream & { isTTY?: boolean };
  signal: AbortSignal;
}

/**
 * `status --watch`: on a terminal the screen is redrawn every interval (ages move on); to a pipe or a
 * file a frame is written only when it changes, each after a line with the time, so a log of it reads
 * as a timeline. Ends on the signal (Ctrl-C) or when what is watched is gone.
 */
export async function watchFrames(opts: WatchOptions): Promise<void> {
  let last: string | undefined;
  while (!opts.signal.aborted) {
    const frame = await opts.look();
    if (frame === null) {
      opts.out.write(`${opts.gone}\n`);
      return;
    }
    if (opts.out.isTTY) {
      opts.out.write(
        `\x1b[H\x1b[2J${new Date(systemClock()).toISOString()}  (every ${opts.intervalMs / 1000} s; Ctrl-C ends)\n\n${frame.text}`,
      );
    } else if (frame.key !== last) {
      opts.out.write(`--- ${new Date(systemClock()).toISOString()}\n${frame.text}`);
    }
    last = frame.key;
    await sleep(opts.intervalMs, undefined, { signal: opts.signal }).catch(() => undefined);
  }
}

/** An AbortSignal that SIGINT or SIGTERM aborts (the watch then ends with exit 0). */
export function interruptSignal(): AbortSignal {
  const controller = new AbortController();
  const stop = () => controller.abort();
  process.once('SIGINT', stop);
  process.once('SIGTERM', stop);
  return controller.signal;
}
