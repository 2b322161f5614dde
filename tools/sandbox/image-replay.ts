import { execFile, spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { chmod, cp, mkdir } from 'node:fs/promises';
import { createRequire } from 'node:module';
import { dirname, join, posix } from 'node:path';
import { promisify } from 'node:util';
import type { Ignore } from '@balena/dockerignore';
import { type Copy, DockerfileParser, type From, type Instruction, type JSONInstruction } from 'dockerfile-ast';

/**
 * An image build without a container engine or a registry (none here): the Dockerfile read by a parser,
 * the build context filtered by the Dockerfile's own .dockerignore as BuildKit filters it, and every step
 * replayed on exactly that context in a clean directory per stage (a container path P is STAGE_ROOT/P).
 * The base image's OS is this machine's: `apt-get install` steps are checked against the installed
 * packages instead of run; every other RUN runs with `sh -c` in its WORKDIR.
 */

const run = promisify(execFile);
// A CommonJS module whose types declare an ES default export: required as what it is.
const ignore = createRequire(import.meta.url)('@balena/dockerignore') as () => Ignore;

export type ImageStep =
  | { kind: 'workdir'; path: string }
  | { kind: 'env'; vars: Record<string, string> }
  | { kind: 'copy'; from: string | undefined; sources: string[]; dest: string; line: number }
  | { kind: 'run'; command: string; line: number }
  | { kind: 'user'; user: string }
  | { kind: 'entrypoint'; argv: string[] }
  | { kind: 'cmd'; argv: string[] };

export interface ImageStage {
  image: string;
  name: string | undefined;
  steps: ImageStep[];
}

function argv(instruction: Instruction): string[] {
  const strings = (instruction as JSONInstruction).getJSONStrings?.() ?? [];
  if (strings.length > 0) return strings.map((s) => s.getJSONValue());
  return ['/bin/sh', '-c', instruction.getRawArgumentsContent() ?? ''];
}

export function readDockerfile(text: string): ImageStage[] {
  const stages: ImageStage[] = [];
  for (const instruction of DockerfileParser.parse(text).getInstructions()) {
    const keyword = instruction.getKeyword();
    const line = instruction.getRange().start.line + 1;
    const args = instruction.getArguments().map((a) => a.getValue());
    if (keyword === 'FROM') {
      const from = instruction as From;
      stages.push({ image: from.getImage() ?? '', name: from.getBuildStage() ?? undefined, steps: [] });
      continue;
    }
    const stage = stages.at(-1);
    if (!stage) throw new Error(`line ${line}: ${keyword} before any FROM`);
    switch (keyword) {
      case 'WORKDIR':
        stage.steps.push({ kind: 'workdir', path: args[0] ?? '/' });
        break;
      case 'ENV': {
        const vars: Record<string, string> = {};
        for (const arg of args) {
          const eq = arg.indexOf('=');
          if (eq > 0) vars[arg.slice(0, eq)] = arg.slice(eq + 1);
        }
        stage.steps.push({ kind: 'env', vars });
        break;
      }
      case 'COPY': {
        const from = (instruction as Copy).getFromFlag()?.getValue() ?? undefined;
        const paths = args.filter((a) => !a.startsWith('--'));
        stage.steps.push({ kind: 'copy', from, sources: paths.slice(0, -1), dest: paths.at(-1) ?? '.', line });
        break;
      }
      case 'RUN':
        stage.steps.push({ kind: 'run', command: instruction.getRawArgumentsContent() ?? '', line });
        break;
      case 'USER':
        stage.steps.push({ kind: 'user', user: args[0] ?? 'root' });
        break;
      case 'ENTRYPOINT':
        stage.steps.push({ kind: 'entrypoint', argv: argv(instruction) });
        break;
      case 'CMD':
        stage.steps.push({ kind: 'cmd', argv: argv(instruction) });
        break;
      default:
        throw new Error(`line ${line}: ${keyword} is not replayed here (add it to tools/sandbox/image-replay.ts)`);
    }
  }
  return stages;
}

/**
 * The files of the build context: what a checkout holds (tracked and untracked, not git-ignored), less
 * what the .dockerignore excludes.
 */
export async function buildContext(root: string, dockerignore: string): Promise<string[]> {
  const { stdout } = await run('git', ['ls-files', '--cached', '--others', '--exclude-standard', '-z'], {
    cwd: root,
    maxBuffer: 64 << 20,
  });
  const files = stdout.split('\0').filter(Boolean);
  const rules = dockerignore.split('\n').filter((l) => l.trim() !== '' && !l.trim().startsWith('#'));
  return ignore().add(rules).filter(files);
}

function underSource(file: string, source: string): boolean {
  const src = posix.normalize(source).replace(/\/+$/, '');
  return src === '.' || file === src || file.startsWith(`${src}/`);
}

/** Every COPY source (from the context) that no file of the context is or lies under: `line: source`. */
export function missingSources(stages: ImageStage[], context: string[]): string[] {
  const missing: string[] = [];
  for (const stage of stages) {
    for (const step of stage.steps) {
      if (step.kind !== 'copy' || step.from !== undefined) continue;
      for (const source of step.sources) {
        if (!context.some((file) => underSource(file, source))) missing.push(`line ${step.line}: COPY ${source}`);
      }
    }
  }
  return missing;
}

/** The packages an `apt-get install` names (its flags left out). */
export function aptPackages(command: string): string[] {
  const installs = command.split(/&&|;|\\\n/).filter((part) => /\bapt-get\s+install\b/.test(part));
  return installs.flatMap((part) =>
    part
      .replace(/^[\s\S]*?\bapt-get\s+install\b/, '')
      .trim()
      .split(/\s+/)
      .filter((w) => w !== '' && !w.startsWith('-')),
  );
}

export interface ReplayOptions {
  /** The build context's root (the repository). */
  root: string;
  context: string[];
  /** A clean directory: each stage gets WORKSPACE/stage-N as its /. */
  workspace: string;
  /** Lines of what was done, for a failure message. */
  log: string[];
}

export interface ReplayedImage {
  /** The last stage's /. */
  root: string;
  user: string | undefined;
  /** ENTRYPOINT + CMD as the image would run them, container paths mapped into `root`. */
  entrypoint: string[];
  cmd: string[];
  workdir: string;
  /** The image's ENV (container paths, as written). */
  env: Record<string, string>;
}

/** Where COMMAND is on the image's PATH, mapped into `root`; undefined when no entry has it. */
export function onImagePath(image: ReplayedImage, command: string): string | undefined {
  for (const dir of (image.env.PATH ?? '').split(':')) {
    if (!posix.isAbsolute(dir)) continue;
    const path = join(image.root, dir, command);
    if (existsSync(path)) return path;
  }
  return undefined;
}

function inStage(stageRoot: string, cwd: string, path: string): string {
  return join(stageRoot, posix.isAbsolute(path) ? path : posix.join(cwd, path));
}

export interface Ran {
  code: number | null;
  stdout: string;
  stderr: string;
}

/** Runs FILE ARGS to its end (as UID:GID when given) and collects what it printed. */
export function runCollecting(
  file: string,
  args: readonly string[],
  options: { cwd: string; env: NodeJS.ProcessEnv; uid?: number; gid?: number },
): Promise<Ran> {
  return new Promise((resolve, reject) => {
    const child = spawn(file, args, { ...options, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d: Buffer) => {
      stdout += d.toString();
    });
    child.stderr.on('data', (d: Buffer) => {
      stderr += d.toString();
    });
    child.once('error', reject);
    child.once('close', (code) => resolve({ code, stdout, stderr }));
  });
}

async function shell(command: string, cwd: string, env: Record<string, string>, log: string[]): Promise<void> {
  const ran = await runCollecting('/bin/sh', ['-c', command], { cwd, env: { ...process.env, ...env } });
  const out = `${ran.stdout}${ran.stderr}`.trim();
  log.push(`  exit ${ran.code}${out ? `: ${out.split('\n').slice(-15).join('\n    ')}` : ''}`);
  if (ran.code !== 0) throw new Error(`RUN ${command.split('\n')[0]} exited ${ran.code}:\n${out.slice(-4000)}`);
}

/** Replays every stage in order; the last one is the image. */
export async function replayImage(stages: ImageStage[], options: ReplayOptions): Promise<ReplayedImage> {
  const { root, context, workspace, log } = options;
  const roots = new Map<string, string>();
  let image: ReplayedImage | undefined;
  for (const [index, stage] of stages.entries()) {
    const stageRoot = join(workspace, `stage-${index}`);
    await mkdir(stageRoot, { recursive: true, mode: 0o755 });
    await chmod(stageRoot, 0o755);
    roots.set(String(index), stageRoot);
    if (stage.name) roots.set(stage.name, stageRoot);
    let cwd = '/';
    const env: Record<string, string> = {};
    let user: string | undefined;
    let entrypoint: string[] = [];
    let cmd: string[] = [];
    log.push(`FROM ${stage.image}${stage.name ? ` AS ${stage.name}` : ''} -> ${stageRoot}`);
    for (const step of stage.steps) {
      switch (step.kind) {
        case 'workdir':
          cwd = posix.resolve(cwd, step.path);
          await mkdir(join(stageRoot, cwd), { recursive: true, mode: 0o755 });
          break;
        case 'env':
          Object.assign(env, step.vars);
          break;
        case 'copy': {
          const dest = inStage(stageRoot, cwd, step.dest);
          const into = step.dest.endsWith('/') || step.sources.length > 1;
          for (const source of step.sources) {
            if (step.from !== undefined) {
              const from = roots.get(step.from);
              if (!from) throw new Error(`line ${step.line}: COPY --from=${step.from}: no such stage`);
              const src = join(from, source);
              await cp(src, into ? join(dest, posix.basename(source)) : dest, {
                recursive: true,
                verbatimSymlinks: true,
              });
              continue;
            }
            const files = context.filter((file) => underSource(file, source));
            const src = posix.normalize(source).replace(/\/+$/, '');
            for (const file of files) {
              // A file source lands at DEST (or DEST/name); a directory's contents land under DEST.
              const target =
                file === src
                  ? into
                    ? join(dest, posix.basename(file))
                    : dest
                  : join(dest, src === '.' ? file : file.slice(src.length + 1));
              await mkdir(dirname(target), { recursive: true, mode: 0o755 });
              await cp(join(root, file), target);
            }
          }
          log.push(`COPY ${step.from ? `--from=${step.from} ` : ''}${step.sources.join(' ')} ${step.dest}`);
          break;
        }
        case 'run': {
          const packages = aptPackages(step.command);
          if (/\bapt-get\b/.test(step.command)) {
            // The base image's packages: this machine's OS stands in for it; they must be installed here.
            const absent: string[] = [];
            for (const pkg of packages) {
              const status = await run('dpkg-query', ['--status', pkg]).then(
                (r) => r.stdout,
                () => '',
              );
              if (!status.includes('install ok installed')) absent.push(pkg);
            }
            log.push(`RUN (line ${step.line}) apt-get: ${packages.join(' ')} checked on this machine`);
            if (absent.length > 0)
              throw new Error(`line ${step.line}: packages the image installs are missing here: ${absent.join(' ')}`);
            break;
          }
          log.push(`RUN (line ${step.line}) ${step.command.split('\n')[0]}`);
          await shell(step.command, join(stageRoot, cwd), env, log);
          break;
        }
        case 'user':
          user = step.user;
          break;
        case 'entrypoint':
          entrypoint = step.argv;
          break;
        case 'cmd':
          cmd = step.argv;
          break;
      }
    }
    image = { root: stageRoot, user, entrypoint, cmd, workdir: join(stageRoot, cwd), env: { ...env } };
  }
  if (!image) throw new Error('the Dockerfile has no FROM');
  return image;
}

/** ARGV as the image runs it: `node` is this machine's, and absolute paths are the image's. */
export function inImage(image: ReplayedImage, args: string[]): string[] {
  return args.map((arg, i) =>
    i === 0 && arg === 'node' ? process.execPath : posix.isAbsolute(arg) ? join(image.root, arg) : arg,
  );
}
