/** ARCHITECTURE.md, "The command line": 0 ok, 1 failure, 2 bad usage or bad input. */
export const EXIT = { ok: 0, failure: 1, usage: 2 } as const;

/** A failure to report as one line and an exit code, without a stack trace. */
export class CliError extends Error {
  override readonly name = 'CliError';
  constructor(
    message: string,
    readonly exitCode: number = EXIT.failure,
  ) {
    super(message);
  }
}
