import type { Client } from 'ssh2';
import { type ExecResult, execCapture } from '../../ssh/remote-exec.js';
import { bounded } from './check-result.js';

/**
 * Runs a POSIX sh script on the far side of `client`, sent on stdin to `/bin/sh -s`: the HPC user's
 * login shell may be csh, so the command line stays two plain words.
 */
export function runScript(client: Client, script: string, timeoutMs: number, what: string): Promise<ExecResult> {
  return runCommand(client, '/bin/sh -s', timeoutMs, what, script);
}

/** A plain command line (words any login shell reads the same way), bounded in time. */
export function runCommand(
  client: Client,
  command: string,
  timeoutMs: number,
  what: string,
  stdin?: string,
): Promise<ExecResult> {
  const opts = stdin === undefined ? { timeoutMs } : { timeoutMs, stdin };
  // execCapture bounds the command once its channel is open; `bounded` also covers opening it.
  return bounded(what, timeoutMs, execCapture(client, command, opts));
}

/** A command the shell could not find: sh says "not found" (127), csh "Command not found." (1). */
export function notFound(result: ExecResult): boolean {
  return result.code === 127 || /command not found|: not found/i.test(result.stderr);
}
