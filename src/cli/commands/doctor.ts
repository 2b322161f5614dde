import { type Command, InvalidArgumentError } from 'commander';
import { isInputError } from '../../contract/input-error.js';
import { validateBatchHost } from '../../render/carrier-command.js';
import { DEFAULT_CHECK_TIMEOUT_MS, runDoctor } from '../../site/doctor/run-doctor.js';
import { cliDuration } from '../cli-duration.js';
import { renderDoctorTable } from '../doctor-table.js';
import { CliError, EXIT } from '../exit-codes.js';
import { type ConfigOption, configPath, loadSiteConfig } from '../inputs.js';

interface DoctorFlags extends ConfigOption {
  node?: string;
  json?: boolean;
  timeout?: number;
}

function seconds(value: string): number {
  try {
    return cliDuration(value, DEFAULT_CHECK_TIMEOUT_MS, '--timeout', { minMs: 1_000, maxMs: 600_000 });
  } catch (err) {
    if (err instanceof RangeError) throw new InvalidArgumentError(err.message.replace(/^--timeout: /, ''));
    throw err;
  }
}

function nodeName(value: string): string {
  try {
    return validateBatchHost(value);
  } catch (err) {
    if (isInputError(err)) throw new InvalidArgumentError('expected a host name');
    throw err;
  }
}

/**
 * `backhaul doctor` (ARCHITECTURE.md, "The command line"): checks a site before going live and says what to change.
 * Exit 0 when every check passes (or is skipped), 1 when one fails, 2 for bad usage or configuration.
 */
export function registerDoctor(program: Command): void {
  program
    .command('doctor')
    .description(
      'check a site: key, host keys, login, Slurm, ssh to a compute node, forwarding on its sshd, python, socket root',
    )
    .option('-c, --config <file>', 'site configuration (default: $BACKHAUL_CONFIG)')
    .option('--node <host>', 'the compute node to test (default: the first usable node sinfo lists)', nodeName)
    .option('--json', 'print a JSON array of {check, status, detail, fix}')
    .option(
      '--timeout <duration>',
      `time limit of each check: seconds or 10s, 2m (default ${DEFAULT_CHECK_TIMEOUT_MS / 1000}s)`,
      seconds,
    )
    .action(async (flags: DoctorFlags) => {
      const site = await loadSiteConfig(flags);
      const results = await runDoctor(site, configPath(flags), {
        node: flags.node,
        timeoutMs: flags.timeout ?? DEFAULT_CHECK_TIMEOUT_MS,
      });
      if (flags.json) {
        process.stdout.write(`${JSON.stringify(results, null, 2)}\n`);
      } else {
        const tty = process.stdout.isTTY === true;
        process.stdout.write(
          renderDoctorTable(results, {
            colour: tty && !process.env.NO_COLOR,
            width: tty ? process.stdout.columns : undefined,
          }),
        );
      }
      const failed = results.filter((r) => r.status === 'FAIL').length;
      if (failed > 0) {
        throw new CliError(`doctor: ${failed} of ${results.length} checks failed`, EXIT.failure);
      }
    });
}
