import { readFileSync } from 'node:fs';
import { redisUrlHasPassword, redisUrlProblem } from '../contract/redis-url.js';
import type { SiteConfig } from '../contract/site-config.js';
import { CliError, EXIT } from './exit-codes.js';

/** Where a command finds the fleet's Redis, and the password it gives it (never taken from argv alone). */
export interface RedisTarget {
  url: string;
  /** From a file or the environment, when the URL carries none. */
  password?: string;
  /** Where the URL came from, for the warning about a password on the command line. */
  urlFrom: 'flag' | 'env' | 'config';
}

export interface RedisTargetFlags {
  redis?: string;
  redisPasswordFile?: string;
}

/**
 * The URL from `--redis`, else REDIS_URL, else the site's `Backhaul.Redis.URL`; the password, when the
 * URL has none, from `--redis-password-file`, else REDIS_PASSWORD, else REDIS_PASSWORD_FILE, else the
 * site's `Backhaul.Redis.PasswordFile`. A password in a `--redis` URL works but is in `ps` for every
 * user of the machine: `passwordOnCommandLine` says so, and the commands warn.
 */
export function redisTarget(
  flags: RedisTargetFlags,
  config: Pick<SiteConfig, 'Backhaul'> | undefined,
  env: NodeJS.ProcessEnv = process.env,
): RedisTarget {
  // An empty REDIS_URL is unset, not "connect to the default".
  const fromFlag = flags.redis;
  const fromEnv = env.REDIS_URL || undefined;
  const url = fromFlag ?? fromEnv ?? config?.Backhaul.Redis.URL;
  if (url === undefined) {
    throw new CliError(
      'no Redis to read from: pass --redis URL, set REDIS_URL, or name the site configuration (--config FILE or BACKHAUL_CONFIG)',
      EXIT.usage,
    );
  }
  const urlFrom = fromFlag !== undefined ? 'flag' : fromEnv !== undefined ? 'env' : 'config';
  // The configuration's URL was checked when it was read; a flag's or the environment's is checked here.
  const problem = urlFrom === 'config' ? '' : redisUrlProblem(url);
  if (problem) throw new CliError(`${urlFrom === 'flag' ? '--redis' : 'REDIS_URL'}: ${problem}`, EXIT.usage);
  if (redisUrlHasPassword(url)) return { url, urlFrom };
  const password =
    readPasswordFile(flags.redisPasswordFile, '--redis-password-file') ??
    (env.REDIS_PASSWORD || undefined) ??
    readPasswordFile(env.REDIS_PASSWORD_FILE || undefined, 'REDIS_PASSWORD_FILE') ??
    readPasswordFile(config?.Backhaul.Redis.PasswordFile, 'Backhaul.Redis.PasswordFile');
  return { url, urlFrom, ...(password === undefined ? {} : { password }) };
}

/** The warning a command prints (or logs) when the password came in on its command line. */
export function passwordOnCommandLine(target: RedisTarget): string | undefined {
  if (target.urlFrom !== 'flag' || !redisUrlHasPassword(target.url)) return undefined;
  return 'the --redis URL carries a password, which every user of this machine can read in ps: use REDIS_PASSWORD, REDIS_PASSWORD_FILE, --redis-password-file or Backhaul.Redis.PasswordFile instead';
}

/** A password file's first line (a Secret mounted as a file often ends in a newline). */
function readPasswordFile(path: string | undefined, what: string): string | undefined {
  if (path === undefined) return undefined;
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code ?? 'error';
    throw new CliError(`${what}: cannot read the Redis password file ${path} (${code})`, EXIT.usage);
  }
  const password = text.split(/\r?\n/, 1)[0] ?? '';
  if (password === '') throw new CliError(`${what}: the Redis password file ${path} is empty`, EXIT.usage);
  return password;
}
