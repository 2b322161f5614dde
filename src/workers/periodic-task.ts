import type { Logger } from '../log.js';

/**
 * Runs `tick` every `everyMs`, one run at a time (a slow run delays the next instead of overlapping it);
 * a failed run is logged and the next one tries again. Does not keep the process alive.
 */
export class PeriodicTask {
  private timer: NodeJS.Timeout | undefined;
  private running: Promise<unknown> = Promise.resolve();

  constructor(
    private readonly name: string,
    private readonly everyMs: number,
    private readonly tick: () => Promise<unknown>,
    private readonly log: Logger,
  ) {}

  start(): void {
    if (this.timer) return;
    this.timer = setInterval(() => {
      this.running = this.running.then(() =>
        this.tick().catch((err: unknown) => this.log.warn({ err }, `${this.name} failed`)),
      );
    }, this.everyMs);
    this.timer.unref();
  }

  /** Stops the timer and waits for a run in progress. */
  async stop(): Promise<void> {
    clearInterval(this.timer);
    this.timer = undefined;
    await this.running;
  }
}
