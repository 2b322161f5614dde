import { existsSync } from 'node:fs';
import { chmod, mkdtemp, readdir, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  buildContext,
  type ImageStage,
  inImage,
  missingSources,
  onImagePath,
  type Ran,
  type ReplayedImage,
  readDockerfile,
  replayImage,
  runCollecting,
} from '../../tools/sandbox/image-replay.js';

/**
 * deploy/Dockerfile as a container engine would build it, without one (none here, and no registry):
 * the build context filtered by deploy/Dockerfile.dockerignore (BuildKit reads `<Dockerfile>.dockerignore`
 * beside the Dockerfile), every COPY source found in it, and the stages replayed on exactly that context
 * in a clean directory; then the image's ENTRYPOINT runs as the image's USER. The image once failed at
 * `COPY patches` (the ignore file never let patches/ in) and nothing noticed.
 */

const ROOT = new URL('../..', import.meta.url).pathname;
const DOCKERFILE = join(ROOT, 'deploy', 'Dockerfile');
const IGNORE = join(ROOT, 'deploy', 'Dockerfile.dockerignore');

function runAs(user: string | undefined, argv: string[], cwd: string): Promise<Ran> {
  const [uid, gid] = (user ?? '0:0').split(':').map(Number);
  const [file, ...args] = argv;
  if (!file) throw new Error('empty argv');
  const env = { PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: '/nonexistent', NODE_ENV: 'production' };
  return runCollecting(file, args, { cwd, env, uid, gid: gid ?? uid });
}

let stages: ImageStage[];
let context: string[];
let workspace = '';
const log: string[] = [];
let image: ReplayedImage | undefined;
let replayError: Error | undefined;

beforeAll(async () => {
  stages = readDockerfile(await readFile(DOCKERFILE, 'utf8'));
  context = await buildContext(ROOT, await readFile(IGNORE, 'utf8'));
  workspace = await mkdtemp(join(tmpdir(), 'bh-image-'));
  await chmod(workspace, 0o755);
  if (missingSources(stages, context).length > 0) return;
  image = await replayImage(stages, { root: ROOT, context, workspace, log }).catch((err: Error) => {
    replayError = err;
    return undefined;
  });
}, 600_000);

afterAll(async () => {
  if (workspace) await rm(workspace, { recursive: true, force: true });
});

describe('the fleet image (deploy/Dockerfile)', () => {
  it('finds every COPY source in the build context its .dockerignore leaves', () => {
    expect(missingSources(stages, context), `context: ${context.length} files`).toEqual([]);
  });

  it('would have failed on the ignore file that left patches/ out', () => {
    const withoutPatches = context.filter((f) => !f.startsWith('patches/'));
    expect(missingSources(stages, withoutPatches)).toEqual([expect.stringMatching(/COPY patches$/)]);
  });

  it('is built on the Node LTS the tests run on, in every stage', () => {
    const major = process.versions.node.split('.')[0];
    for (const stage of stages) {
      expect(stage.image, 'run the tests on the Node the image runs (.ci/run installs it)').toMatch(
        new RegExp(`^node:${major}-bookworm-slim$`),
      );
    }
  });

  it('replays: install, patch and native binding checked, dev dependencies pruned', () => {
    expect(replayError?.message, log.join('\n')).toBeUndefined();
    expect(image, log.join('\n')).toBeDefined();
  });

  it('runs `backhaul --version` and `backhaul doctor --help` as its non-root user, through its entrypoint', async () => {
    if (!image) throw new Error(`not replayed: ${replayError?.message ?? 'COPY sources missing'}`);
    expect(image.user).toBe('10001:10001');
    expect(image.entrypoint.slice(0, 2)).toEqual(['node', '--single-threaded-gc']);
    const { version } = JSON.parse(await readFile(join(ROOT, 'package.json'), 'utf8')) as { version: string };
    const ran = await runAs(image.user, inImage(image, [...image.entrypoint, '--version']), image.workdir);
    expect(ran.code, `${ran.stderr}\n${log.join('\n')}`).toBe(0);
    expect(ran.stdout.trim()).toBe(version);
    const help = await runAs(image.user, inImage(image, [...image.entrypoint, 'doctor', '--help']), image.workdir);
    expect(help.code, help.stderr).toBe(0);
    expect(help.stdout).toMatch(/Usage: backhaul doctor/);
    // What CMD starts is a command the image knows (its help, not an unknown-command error).
    const cmd = await runAs(
      image.user,
      inImage(image, [...image.entrypoint, image.cmd[0] ?? '', '--help']),
      image.workdir,
    );
    expect(cmd.code, cmd.stderr).toBe(0);
  });

  it('has `backhaul` on its PATH, for `kubectl exec deploy/backhaul-fleet -- backhaul status`', async () => {
    if (!image) throw new Error(`not replayed: ${replayError?.message ?? 'COPY sources missing'}`);
    const command = onImagePath(image, 'backhaul');
    expect(command, `PATH=${image.env.PATH}`).toBeDefined();
    const ran = await runAs(image.user, [command ?? 'backhaul', 'status', '--help'], image.workdir);
    expect(ran.code, ran.stderr).toBe(0);
    expect(ran.stdout).toMatch(/Usage: backhaul status/);
  });

  it('carries no dev dependency and no test support', async () => {
    if (!image) throw new Error(`not replayed: ${replayError?.message ?? 'COPY sources missing'}`);
    // What the lock marks dev-only (a dev dependency that a runtime one also needs is not).
    const lock = JSON.parse(await readFile(join(image.workdir, 'package-lock.json'), 'utf8')) as {
      packages: Record<string, { dev?: boolean }>;
    };
    const devOnly = Object.entries(lock.packages)
      .filter(([path, meta]) => path !== '' && meta.dev === true)
      .map(([path]) => path);
    expect(devOnly.length, 'dev-only packages in the lock').toBeGreaterThan(10);
    const present = devOnly.filter((path) => existsSync(join(image?.workdir ?? '', path)));
    expect(present, 'dev-only packages in the image').toEqual([]);
    expect((await readdir(image.workdir)).sort()).toEqual([
      'LICENSE',
      'NOTICE',
      'bin',
      'dist',
      'node_modules',
      'package-lock.json',
      'package.json',
      'redis',
    ]);
  });
});
