/**
 * What the demo (or a test) started, undone in reverse order: each step runs once, and a step that
 * fails is reported and does not stop the ones after it. Safe to call from a signal handler while the
 * demo is still running.
 */
export class Cleanup {
  private readonly steps: { name: string; undo: () => Promise<void> | void }[] = [];
  private running: Promise<string[]> | undefined;

  /** Steps not run yet. */
  get pending(): number {
    return this.steps.length;
  }

  /** Registers UNDO to run at cleanup, before everything registered earlier. */
  add(name: string, undo: () => Promise<void> | void): void {
    this.steps.push({ name, undo });
  }

  /**
   * Runs every step (last added first), telling ONSTEP how each went; resolves with one line per step
   * that failed.
   */
  run(onStep?: (name: string, error?: string) => void): Promise<string[]> {
    this.running ??= (async () => {
      const failures: string[] = [];
      for (let step = this.steps.pop(); step; step = this.steps.pop()) {
        try {
          await step.undo();
          onStep?.(step.name);
        } catch (err) {
          const message = err instanceof Error ? err.message : String(err);
          failures.push(`${step.name}: ${message}`);
          onStep?.(step.name, message);
        }
      }
      return failures;
    })();
    return this.running;
  }
}
