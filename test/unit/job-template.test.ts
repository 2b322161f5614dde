import { execFile } from 'node:child_process';
import { readdirSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';
import { fillJobTemplate } from '../../src/render/job-template.js';

const execFileAsync = promisify(execFile);
const JOB_DIR = fileURLToPath(new URL('../../src/job/', import.meta.url));
const SHELL_FILES = readdirSync(JOB_DIR).filter((f) => f.endsWith('.sh'));
const PYTHON_FILES = readdirSync(JOB_DIR).filter((f) => f.endsWith('.py'));

async function run(command: string, args: readonly string[]): Promise<{ code: number; output: string }> {
  try {
    const { stdout, stderr } = await execFileAsync(command, args, { maxBuffer: 16 * 1024 * 1024 });
    return { code: 0, output: stdout + stderr };
  } catch (error) {
    const e = error as { code?: number | string; stdout?: string; stderr?: string; message: string };
    return { code: typeof e.code === 'number' ? e.code : -1, output: `${e.stdout ?? ''}${e.stderr ?? ''}${e.message}` };
  }
}

describe('the job template rule', () => {
  it('quotes each value as one word and each list entry as one word each', async () => {
    const hostile = ["a'b", '$(id)', '`id`', 'a b', '*', '', 'x\ny', '#c'];
    const text = fillJobTemplate('v=@V@\nset -- @L@\nprintf \'%s|\' "$v" "$@"\n', 't.sh', {
      values: { V: "it's $(id)", L: hostile },
    });
    for (const shell of ['sh', 'dash', 'bash']) {
      const { code, output } = await run(shell, ['-c', text]);
      expect({ shell, code, output }).toEqual({ shell, code: 0, output: `it's $(id)|${hostile.join('|')}|` });
    }
    expect(fillJobTemplate('set -- @L@\n', 't.sh', { values: { L: [] } })).toBe('set -- \n');
  });

  it('keeps or drops branches by flag, nested, and drops comments and blank lines unless asked', () => {
    const text =
      '#!/bin/sh\n# why\n\n#@if A\na\n#@if B\nab\n#@else\na-not-b\n#@end\n#@else\nnot-a\n#@end\n# shellcheck disable=SC2016\nend # kept\n';
    expect(fillJobTemplate(text, 't.sh', { flags: { A: true, B: false } })).toBe(
      '#!/bin/sh\na\na-not-b\n# shellcheck disable=SC2016\nend # kept\n',
    );
    expect(fillJobTemplate(text, 't.sh', { flags: { A: false, B: true } })).toBe(
      '#!/bin/sh\nnot-a\n# shellcheck disable=SC2016\nend # kept\n',
    );
    expect(fillJobTemplate(text, 't.sh', { flags: { A: true, B: true }, keepComments: true })).toBe(
      '#!/bin/sh\n# why\n\na\nab\n# shellcheck disable=SC2016\nend # kept\n',
    );
  });

  it('names the file and line of a missing value, an unknown flag and a broken branch', () => {
    expect(() => fillJobTemplate('a\nx=@X@\n', 'f.sh')).toThrow('src/job/f.sh:2: no value for @X@');
    expect(() => fillJobTemplate('#@if A\n#@end\n', 'f.sh')).toThrow('src/job/f.sh:1: no value for the flag A');
    expect(() => fillJobTemplate('#@if A\n', 'f.sh', { flags: { A: true } })).toThrow(
      'src/job/f.sh:1: #@if without #@end',
    );
    expect(() => fillJobTemplate('#@end\n', 'f.sh')).toThrow('src/job/f.sh:1: #@end without #@if');
    expect(() => fillJobTemplate('#@if A\n#@else\n#@else\n#@end\n', 'f.sh', { flags: { A: true } })).toThrow(
      'src/job/f.sh:3: a second #@else for the #@if of line 1',
    );
    expect(() => fillJobTemplate('#@if a\n#@end\n', 'f.sh')).toThrow('src/job/f.sh:1: #@if needs one FLAG name');
  });

  it('refuses a value or flag the file does not use (a renamed placeholder fails here, not on a node)', () => {
    expect(() => fillJobTemplate('x=@X@\n', 'f.sh', { values: { X: 1, Y: 2 } })).toThrow(
      'src/job/f.sh: the value Y is not used',
    );
    expect(() => fillJobTemplate('x\n', 'f.sh', { flags: { A: true } })).toThrow(
      'src/job/f.sh: the flag A is not used',
    );
    // A value used only in the branch not taken counts as used: it belongs to the other branch.
    expect(fillJobTemplate('#@if A\nx=@X@\n#@end\n', 'f.sh', { values: { X: 1 }, flags: { A: false } })).toBe('\n');
  });
});

describe('the job files as files', () => {
  it('holds the shell and the Python the job runs', () => {
    expect(SHELL_FILES.sort()).toEqual(
      [
        'bootstrap.sh',
        'deliver-relay.sh',
        'epilog.sh',
        'forwards-up.sh',
        'prelude.sh',
        'prepare-sockets.sh',
        'relay-alive.sh',
        'relay-ready.sh',
        'remove-dead-job-dir.sh',
        'remove-own-sockets.sh',
        'remove-sockets.sh',
        'socket-inodes.sh',
        'socket-watch.sh',
      ].sort(),
    );
    expect(PYTHON_FILES.sort()).toEqual(['relay-boot.py', 'relay.py']);
  });

  it.each(['sh', 'dash', 'bash'])('%s -n accepts every shell file', async (shell) => {
    const failures: string[] = [];
    for (const file of SHELL_FILES) {
      const { code, output } = await run(shell, ['-n', join(JOB_DIR, file)]);
      if (code !== 0) failures.push(`${file}: ${output}`);
    }
    expect(failures).toEqual([]);
  });

  it('shellcheck -S style finds nothing in them, as sh and as bash', async () => {
    const files = SHELL_FILES.map((f) => join(JOB_DIR, f));
    const results = await Promise.all(
      ['sh', 'bash'].map(async (dialect) => ({
        dialect,
        ...(await run('shellcheck', ['-S', 'style', '-s', dialect, '-f', 'gcc', ...files])),
      })),
    );
    for (const result of results)
      expect(result, `shellcheck -s ${result.dialect}`).toMatchObject({ code: 0, output: '' });
  });

  it('pyflakes and the compiler find nothing in the Python', async () => {
    const files = PYTHON_FILES.map((f) => join(JOB_DIR, f));
    expect(await run('pyflakes3', files)).toEqual({ code: 0, output: '' });
    const parse = 'import ast,sys\nfor f in sys.argv[1:]: ast.parse(open(f).read(), f)';
    expect(await run('python3', ['-c', parse, ...files])).toEqual({ code: 0, output: '' });
  });
});
