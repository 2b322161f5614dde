import { execFile } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

/**
 * The package as a site installs it (README "Install"): `npm pack` in the project, then
 * `npm install -g` of the tarball into a fresh prefix, and the command run from outside the project,
 * so nothing resolves to the project's own node_modules. The install once failed in its postinstall
 * (patch-package was only a devDependency); npx's cache once held a half-installed copy.
 */

const execFileAsync = promisify(execFile);
const PROJECT = new URL('../..', import.meta.url).pathname;
/** The one command README.md's "Install" tells a site to run (this test adds --prefix and the tarball's path). */
const INSTALL = (() => {
  const readme = readFileSync(join(PROJECT, 'README.md'), 'utf8');
  const line = /^npm install -g (--allow-scripts=\S+) (backhaul-\S+\.tgz)/m.exec(readme);
  if (!line?.[1] || !line[2])
    throw new Error('README.md has no `npm install -g --allow-scripts=… backhaul-<version>.tgz` line');
  return { allowScripts: line[1], tarball: line[2] };
})();
const ALLOW_SCRIPTS = INSTALL.allowScripts;

interface Ran {
  code: number;
  stdout: string;
  stderr: string;
}

async function run(file: string, args: string[], cwd: string, timeoutMs = 120_000): Promise<Ran> {
  try {
    const { stdout, stderr } = await execFileAsync(file, args, { cwd, timeout: timeoutMs, maxBuffer: 16 << 20 });
    return { code: 0, stdout, stderr };
  } catch (error) {
    const e = error as { code?: number; stdout?: string; stderr?: string; message: string };
    return { code: typeof e.code === 'number' ? e.code : -1, stdout: e.stdout ?? '', stderr: e.stderr ?? e.message };
  }
}

let dir = '';
let prefix = '';
let installed: Ran;

beforeAll(async () => {
  dir = await mkdtemp('/tmp/bh-package-');
  prefix = join(dir, 'prefix');
  // --ignore-scripts: `npm test` has just built dist/; prepare would rebuild it under the other tests.
  const packed = await run('npm', ['pack', '--ignore-scripts', '--pack-destination', dir], PROJECT);
  expect(packed.code, packed.stderr).toBe(0);
  const tarball = packed.stdout.trim().split('\n').pop() ?? '';
  // The name README.md shows is the one npm pack makes of this version.
  expect(tarball).toBe(INSTALL.tarball);
  installed = await run(
    'npm',
    [
      'install',
      '-g',
      '--prefix',
      prefix,
      ALLOW_SCRIPTS,
      '--prefer-offline',
      '--no-audit',
      '--no-fund',
      join(dir, tarball),
    ],
    dir,
    240_000,
  );
}, 300_000);

afterAll(async () => {
  if (dir) await rm(dir, { recursive: true, force: true });
});

describe('the packed package, installed with npm install -g', () => {
  it('installs, and its backhaul command says its version and explains doctor', async () => {
    expect(installed.code, `${installed.stdout}\n${installed.stderr}`).toBe(0);
    const { version } = JSON.parse(await readFile(join(PROJECT, 'package.json'), 'utf8')) as { version: string };
    const ran = await run(join(prefix, 'bin', 'backhaul'), ['--version'], dir);
    expect(ran.code, ran.stderr).toBe(0);
    expect(ran.stdout.trim()).toBe(version);
    const help = await run(join(prefix, 'bin', 'backhaul'), ['doctor', '--help'], dir);
    expect(help.code, help.stderr).toBe(0);
    expect(help.stdout).toMatch(/Usage: backhaul doctor/);
  });

  it("runs ssh2 with its native binding and the project's patch applied (the path the figures were measured on)", async () => {
    const module = join(prefix, 'lib', 'node_modules', 'backhaul', 'dist', 'ssh', 'crypto-path.js');
    const ran = await run(
      process.execPath,
      [
        '--input-type=module',
        '-e',
        `const m = await import(${JSON.stringify(module)}); console.log(JSON.stringify(m.sshCryptoPath()))`,
      ],
      dir,
    );
    expect(ran.code, ran.stderr).toBe(0);
    expect(JSON.parse(ran.stdout), `${installed.stdout}\n${installed.stderr}`).toMatchObject({
      native: true,
      patched: true,
    });
  });

  it('renders a prelude with the relay boot in it (relay-boot.py and relay.py ship in dist)', async () => {
    const ran = await run(
      join(prefix, 'bin', 'backhaul'),
      [
        'render',
        'prelude',
        join(PROJECT, 'examples', 'pod-forwards.yaml'),
        '-c',
        join(PROJECT, 'examples', 'site-node.yaml'),
      ],
      dir,
    );
    expect(ran.code, ran.stderr).toBe(0);
    expect(ran.stdout).toMatch(/^# >>> backhaul prelude v1/);
    // The boot travels compressed; the session host delivers relay.py itself over the carrier.
    expect(ran.stdout).toContain('b85decode');
    expect(ran.stdout).toContain('relay-boot.py serve');
    const syntax = await execFileAsync('sh', ['-n', '-c', ran.stdout]).then(
      () => '',
      (error: Error) => error.message,
    );
    expect(syntax).toBe('');
  });
});
