import { shellQuote } from '../../render/shell-quote.js';
import { type CheckResult, fail, lastLines, pass } from './check-result.js';
import type { DoctorContext } from './doctor-context.js';
import { notFound, runScript } from './remote-run.js';

/** The relay (src/job/relay.py) needs this much Python. */
export const MIN_PYTHON: readonly [number, number] = [3, 6];

/** Check 8: PythonPath runs on the node and is Python 3.6 or later (the relay is plain Python 3). */
export async function checkPython(ctx: DoctorContext): Promise<CheckResult> {
  const node = ctx.node;
  if (!node) throw new Error('no node connection');
  const python = ctx.config.Network.SSH.Reverse.PythonPath;
  const setting = `Network.SSH.Reverse.PythonPath (now ${python})`;
  const result = await runScript(
    node.client,
    `exec ${shellQuote(python)} -c 'import sys; print(sys.version_info[:2])' </dev/null\n`,
    ctx.timeoutMs,
    `${python} -c ...`,
  );
  if (result.code !== 0) {
    return fail(
      'python',
      `${python} on ${ctx.nodeName}: ${notFound(result) ? 'not found' : lastLines(result.stderr) || `exit status ${result.code}`}`,
      `install Python ${MIN_PYTHON.join('.')} or later on the compute nodes, or set ${setting} to its path there`,
    );
  }
  const match = /\(\s*(\d+)\s*,\s*(\d+)\s*\)/.exec(result.stdout);
  if (!match) {
    return fail(
      'python',
      `${python} on ${ctx.nodeName} printed ${JSON.stringify(result.stdout.trim().slice(0, 80))}, not a version`,
      `set ${setting} to a Python ${MIN_PYTHON.join('.')} or later interpreter`,
    );
  }
  const version: [number, number] = [Number(match[1]), Number(match[2])];
  const shown = version.join('.');
  if (version[0] !== 3 || version[1] < MIN_PYTHON[1]) {
    return fail(
      'python',
      `${python} on ${ctx.nodeName} is Python ${shown}; the relay needs ${MIN_PYTHON.join('.')} or later`,
      `set ${setting} to a Python ${MIN_PYTHON.join('.')} or later interpreter on the compute nodes`,
    );
  }
  return pass('python', `${python} on ${ctx.nodeName} is Python ${shown}`);
}
