import type { Client } from 'ssh2';
import { shellQuote } from '../../render/shell-quote.js';
import { errorMessage, lastLines } from './check-result.js';
import { runScript } from './remote-run.js';

/** Every scratch dir doctor makes on a node starts with this, under SocketRoot. */
export const TEMP_DIR_PREFIX = 'bh-doctor.';

/**
 * Makes `<root>/bh-doctor.XXXXXXXX` (mode 0700, `mktemp -d`) on the node; returns the path or why it
 * could not. The script travels on stdin to `/bin/sh -s` (the login shell may be csh).
 */
export async function makeTempDir(
  node: Client,
  root: string,
  timeoutMs: number,
  perUserRoot = false,
): Promise<{ dir: string } | { error: string }> {
  const template = `${root}/${TEMP_DIR_PREFIX}XXXXXXXX`;
  // A per-user root is made by the user's first job; doctor makes it the same way when it is not there yet.
  const makeRoot = perUserRoot ? `mkdir -m 700 ${shellQuote(root)} 2>/dev/null || :\n` : '';
  const result = await runScript(
    node,
    `umask 077\n${makeRoot}exec mktemp -d ${shellQuote(template)}\n`,
    timeoutMs,
    'mktemp -d',
  );
  const dir = result.stdout.trim();
  const expected = new RegExp(`^${escapeRegExp(root)}/${escapeRegExp(TEMP_DIR_PREFIX)}[A-Za-z0-9]+$`);
  if (result.code !== 0 || !expected.test(dir)) {
    return { error: `mktemp -d ${template} failed: ${lastLines(result.stderr) || `exit status ${result.code}`}` };
  }
  return { dir };
}

/** Removes the scratch dir with everything in it; returns undefined when it is gone, else why not. */
export async function removeTempDir(node: Client, dir: string, timeoutMs: number): Promise<string | undefined> {
  const script = [
    `d=${shellQuote(dir)}`,
    'rm -rf -- "$d"',
    'if [ -e "$d" ] || [ -L "$d" ]; then echo "$d is still there" >&2; exit 1; fi',
    '',
  ].join('\n');
  try {
    const result = await runScript(node, script, timeoutMs, `rm -rf ${dir}`);
    return result.code === 0 ? undefined : lastLines(result.stderr) || `exit status ${result.code}`;
  } catch (err) {
    return errorMessage(err);
  }
}

function escapeRegExp(text: string): string {
  return text.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
}
