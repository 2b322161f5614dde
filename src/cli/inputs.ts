import { readFile } from 'node:fs/promises';
import { isInputError } from '../contract/input-error.js';
import { type PodRef, parsePodYaml } from '../contract/pod.js';
import { parseSiteConfigYaml, type SiteConfig } from '../contract/site-config.js';
import { CliError, EXIT } from './exit-codes.js';

export interface ConfigOption {
  config?: string;
}

/** What a failed read means, in words (the code stays, for searching). */
const READ_ERRORS: Readonly<Record<string, string>> = {
  ENOENT: 'no such file',
  EACCES: 'permission denied',
  EISDIR: 'it is a directory',
  ENOTDIR: 'a part of the path is not a directory',
  ELOOP: 'too many symbolic links',
};

async function readInput(path: string, what: string): Promise<string> {
  try {
    return await readFile(path, 'utf8');
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    const why = code && READ_ERRORS[code] ? `${READ_ERRORS[code]} (${code})` : (code ?? (err as Error).message);
    throw new CliError(`cannot read ${what} ${path}: ${why}`, EXIT.usage);
  }
}

/** Bad input in a file: exit 2 with the file's name before the field's. */
function fromFile<T>(path: string, parse: () => T): T {
  try {
    return parse();
  } catch (err) {
    if (isInputError(err)) throw new CliError(`${path}: ${err.message}`, EXIT.usage);
    throw err;
  }
}

export function configPath(opts: ConfigOption): string {
  const path = opts.config ?? process.env.BACKHAUL_CONFIG;
  if (!path) throw new CliError('no site configuration: pass --config FILE or set BACKHAUL_CONFIG', EXIT.usage);
  return path;
}

/** The site configuration from --config or BACKHAUL_CONFIG (ARCHITECTURE.md, "The command line"). */
export async function loadSiteConfig(opts: ConfigOption): Promise<SiteConfig> {
  const path = configPath(opts);
  const text = await readInput(path, 'site configuration');
  return fromFile(path, () => parseSiteConfigYaml(text, path));
}

export async function loadPod(path: string): Promise<PodRef> {
  const text = await readInput(path, 'pod manifest');
  return fromFile(path, () => parsePodYaml(text, path));
}

export { fromFile };
