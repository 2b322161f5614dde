import { execFile } from 'node:child_process';
import { createHash } from 'node:crypto';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { bindAddress, socketDir } from '../../src/contract/derivations.js';

const BIN = new URL('../../bin/backhaul.js', import.meta.url).pathname;
const EXAMPLES = new URL('../../examples/', import.meta.url).pathname;

interface Run {
  code: number;
  stdout: string;
  stderr: string;
}

/** The installed command (`npm test` builds dist/ first), as a user would run it. */
function backhaul(args: string[], env: NodeJS.ProcessEnv = {}): Promise<Run> {
  return new Promise((resolve) => {
    execFile(
      'node',
      [BIN, ...args],
      { env: { ...process.env, BACKHAUL_CONFIG: '', ...env } },
      (err, stdout, stderr) => {
        const code = err ? (typeof err.code === 'number' ? err.code : 1) : 0;
        resolve({ code, stdout, stderr });
      },
    );
  });
}

function shellcheck(script: string): Promise<Run> {
  return new Promise((resolve) => {
    const child = execFile('shellcheck', ['-S', 'warning', '-s', 'sh', '-'], (err, stdout, stderr) =>
      resolve({ code: err ? Number(err.code ?? 1) : 0, stdout, stderr }),
    );
    child.stdin?.end(script);
  });
}

let dir: string;
beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'bh-cli-'));
});
afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
});

async function file(name: string, text: string): Promise<string> {
  const path = join(dir, name);
  await writeFile(path, text);
  return path;
}

// Each test runs the installed command in a process of its own and shares nothing: run them side by side.
describe.concurrent('backhaul render', () => {
  it('prints help and exits 0', async () => {
    const run = await backhaul(['--help']);
    expect(run.code).toBe(0);
    expect(run.stdout).toContain('render');
  });

  it.each(['node', 'userspace', 'srun'])('prints a prelude shellcheck accepts for the %s site', async (mode) => {
    const run = await backhaul([
      'render',
      'prelude',
      `${EXAMPLES}pod-forwards.yaml`,
      '--config',
      `${EXAMPLES}site-${mode}.yaml`,
    ]);
    expect(run.stderr).toBe('');
    expect(run.code).toBe(0);
    expect(run.stdout).toMatch(/^# >>> backhaul prelude v1/);
    const check = await shellcheck(run.stdout);
    expect(check.stdout).toBe('');
    expect(check.code).toBe(0);
  });

  it('prints the boot the prelude carries: the text whose sha256 the prelude names, which Python reads', async () => {
    const [boot, prelude] = await Promise.all([
      backhaul(['render', 'boot']),
      backhaul(['render', 'prelude', `${EXAMPLES}pod-forwards.yaml`, '--config', `${EXAMPLES}site-node.yaml`]),
    ]);
    expect(boot.code, boot.stderr).toBe(0);
    const digest = createHash('sha256').update(boot.stdout.replace(/\n$/, '')).digest('hex').slice(0, 16);
    expect(prelude.stdout).toContain(`(sha256 ${digest}…)`);
    expect(boot.stdout).toContain('def serve(o):');
  });

  it('prints the Slurm epilog for the site: its user and socket root, %u replaced', async () => {
    const run = await backhaul(['render', 'epilog', '--config', `${EXAMPLES}site-srun.yaml`]);
    expect(run.code, run.stderr).toBe(0);
    expect(run.stdout).toMatch(/^#!\/bin\/sh\n/);
    expect(run.stdout).toContain("\nuser='interlink'\n");
    expect(run.stdout).toContain("\nroot='/tmp/backhaul-interlink'\n");
    const check = await shellcheck(run.stdout);
    expect(check.stdout).toBe('');
  });

  it.each([
    ['node', 'node'],
    ['userspace', 'userspace'],
    ['srun', 'srun'],
  ])('prints the session plan for the %s site', async (site, mode) => {
    const run = await backhaul(['render', 'plan', `${EXAMPLES}pod-forwards.yaml`], {
      BACKHAUL_CONFIG: `${EXAMPLES}site-${site}.yaml`,
    });
    expect(run.code).toBe(0);
    const plan = JSON.parse(run.stdout);
    const uid = '7c1b0f1e-3c4f-4a5e-9d2b-0123456789ab';
    expect(plan.bindAddress).toBe(bindAddress(uid));
    // site-node.yaml names a shared /tmp; the others take the default, the user's own root.
    expect(plan.socketDir).toBe(socketDir(site === 'node' ? '/tmp' : '/tmp/backhaul-interlink', uid));
    expect(plan.carrier.mode).toBe(mode);
    expect(plan.forwards.map((f: { socketPath: string }) => f.socketPath)).toEqual([
      `${plan.socketDir}/9000.sock`,
      `${plan.socketDir}/6379.sock`,
      `${plan.socketDir}/6443.sock`,
    ]);
    expect(plan.forwards[1]).toMatchObject({ host: 'redis', dialHost: 'redis.user.svc.cluster.local' });
  });

  it('refuses a bad annotation with exit 2 and a message naming the annotation, the entry and what is accepted', async () => {
    const pod = await file(
      'bad.yaml',
      'metadata:\n  name: p\n  annotations:\n    interlink.eu/reverse-forwards: "kubernetes.default.svc.cluster.local:443"\n',
    );
    const run = await backhaul(['render', 'prelude', pod, '--config', `${EXAMPLES}site-node.yaml`]);
    expect(run.code).toBe(2);
    expect(run.stdout).toBe('');
    expect(run.stderr).toContain('interlink.eu/reverse-forwards entry "kubernetes.default.svc.cluster.local:443"');
    expect(run.stderr).toContain(':kubernetes.default.svc.cluster.local:443');
  });

  it('refuses SOCKS on a site that does not allow it, and accepts it where allowed', async () => {
    const refused = await backhaul([
      'render',
      'prelude',
      `${EXAMPLES}pod-socks.yaml`,
      '--config',
      `${EXAMPLES}site-node.yaml`,
    ]);
    expect(refused.code).toBe(2);
    expect(refused.stderr).toContain('SOCKS is not allowed on this site');
    const allowed = await backhaul([
      'render',
      'plan',
      `${EXAMPLES}pod-socks.yaml`,
      '--config',
      `${EXAMPLES}site-srun.yaml`,
    ]);
    expect(allowed.code).toBe(0);
    expect(JSON.parse(allowed.stdout).socks).toBe(11080);
  });

  it('refuses a site configuration with an unknown key, naming its path', async () => {
    const site = await file(
      'site.yaml',
      'Network:\n  SSH:\n    LoginHost: l\n    User: u\n    KeyFile: /k\n    KnownHostsFile: /kh\n    Reverse: { Enabled: true, SocketDir: /tmp }\n',
    );
    const run = await backhaul(['render', 'prelude', `${EXAMPLES}pod-forwards.yaml`, '--config', site]);
    expect(run.code).toBe(2);
    expect(run.stderr).toContain(`${site}: Network.SSH.Reverse.SocketDir: unknown key; accepted: Enabled`);
  });

  it('needs a pod UID for a plan', async () => {
    const pod = await file(
      'nouid.yaml',
      'metadata:\n  name: p\n  annotations:\n    interlink.eu/reverse-forwards: "minio:9000"\n',
    );
    const run = await backhaul(['render', 'plan', pod, '--config', `${EXAMPLES}site-node.yaml`]);
    expect(run.code).toBe(2);
    expect(run.stderr).toContain('metadata.uid');
  });

  it.each([
    [['render', 'prelude', `${EXAMPLES}pod-forwards.yaml`], 'no site configuration'],
    [['render', 'prelude', '/nonexistent.yaml', '--config', `${EXAMPLES}site-node.yaml`], 'cannot read pod manifest'],
    [['render', 'nothing'], 'unknown command'],
    [['render', 'prelude'], 'missing required argument'],
  ])('exits 2 on bad usage: %j', async (args, message) => {
    const run = await backhaul(args);
    expect(run.code).toBe(2);
    expect(run.stderr).toContain(message);
  });
});

describe.concurrent('backhaul, as a new user meets it', () => {
  it('--version prints the version of the package and exits 0', async () => {
    const pkg = JSON.parse(await readFile(new URL('../../package.json', import.meta.url), 'utf8')) as {
      version: string;
    };
    for (const flag of ['--version', '-V']) {
      const run = await backhaul([flag]);
      expect({ code: run.code, stdout: run.stdout, stderr: run.stderr }).toEqual({
        code: 0,
        stdout: `${pkg.version}\n`,
        stderr: '',
      });
    }
  });

  it('says in words why a file cannot be read, naming it, and exits 2', async () => {
    const missing = await backhaul(['render', 'plan', '/nonexistent/pod.yaml'], {
      BACKHAUL_CONFIG: `${EXAMPLES}site-node.yaml`,
    });
    expect(missing.code).toBe(2);
    expect(missing.stderr).toBe('backhaul: cannot read pod manifest /nonexistent/pod.yaml: no such file (ENOENT)\n');
    const directory = await backhaul(['render', 'plan', `${EXAMPLES}pod-forwards.yaml`], { BACKHAUL_CONFIG: EXAMPLES });
    expect(directory.code).toBe(2);
    expect(directory.stderr).toContain(`cannot read site configuration ${EXAMPLES}: it is a directory (EISDIR)`);
  });
});
