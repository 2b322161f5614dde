import { readFileSync } from 'node:fs';
import { Command, CommanderError } from 'commander';
import { isInputError } from '../contract/input-error.js';
import { withoutCredentials } from '../log.js';
import { registerDoctor } from './commands/doctor.js';
import { registerPodCommands } from './commands/pods.js';
import { registerRender } from './commands/render.js';
import { registerWorker } from './commands/worker.js';
import { CliError, EXIT } from './exit-codes.js';

/** Registers one more command: the demo (tools/demo, not part of the package) adds itself this way. */
export type CommandRegistration = (program: Command) => void;

export function buildProgram(extra: readonly CommandRegistration[] = []): Command {
  const program = new Command('backhaul')
    .description(
      'Reverse SSH tunnels from interLink-offloaded Slurm jobs back into the Kubernetes cluster, ' +
        'run as durable per-pod workflows on Redis.',
    )
    .version(packageVersion(), '-V, --version', 'print the version of backhaul')
    .showHelpAfterError('(run with --help for usage)')
    .exitOverride();
  registerRender(program);
  registerDoctor(program);
  registerWorker(program);
  registerPodCommands(program);
  for (const register of extra) register(program);
  return program;
}

/** package.json's version: two levels up from src/cli and dist/cli alike. */
function packageVersion(): string {
  const pkg = JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8')) as { version?: string };
  return pkg.version ?? 'unknown';
}

/** Runs the command line; returns the exit code (ARCHITECTURE.md, "The command line": 0 ok, 1 failure, 2 bad usage or input). */
export async function main(argv: readonly string[], extra: readonly CommandRegistration[] = []): Promise<number> {
  const program = buildProgram(extra);
  try {
    await program.parseAsync([...argv], { from: 'user' });
    return EXIT.ok;
  } catch (err) {
    return report(err);
  }
}

function report(err: unknown): number {
  if (err instanceof CommanderError) {
    // Commander already printed the message (or the help text).
    return err.exitCode === 0 ? EXIT.ok : EXIT.usage;
  }
  if (err instanceof CliError) {
    process.stderr.write(`backhaul: ${err.message}\n`);
    return err.exitCode;
  }
  if (isInputError(err)) {
    process.stderr.write(`backhaul: ${err.message}\n`);
    return EXIT.usage;
  }
  const text = err instanceof Error ? (err.stack ?? err.message) : String(err);
  process.stderr.write(`backhaul: ${withoutCredentials(text)}\n`);
  return EXIT.failure;
}
