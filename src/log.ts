import type { Logger } from 'pino';
import { destination, pino } from 'pino';

export type { Logger } from 'pino';

/**
 * Structured logs on stderr (JSON lines, one per event) so operators can ship them as they are.
 * Keys and secrets never reach a log line: anything under the redacted paths is replaced, and errors
 * are written field by field from an allow-list (`errorForLog`), never whole.
 */
export function createLogger(name: string, level = process.env.BACKHAUL_LOG_LEVEL ?? 'info'): Logger {
  return pino(
    {
      name,
      level,
      base: { pid: process.pid },
      serializers: ERROR_SERIALIZERS,
      redact: { paths: REDACTED_PATHS, censor: '[secret]' },
    },
    destination({ dest: 2, sync: false }),
  );
}

/** A logger that drops everything (tests and one-shot commands that report through their own output). */
export function silentLogger(): Logger {
  return pino({ level: 'silent' });
}

const REDACTED_PATHS = [
  'privateKey',
  '*.privateKey',
  'key',
  '*.key',
  'password',
  '*.password',
  'passphrase',
  '*.passphrase',
  'token',
  '*.token',
];

/**
 * The fields of an error worth a log line. Everything else is left out: ioredis puts the failed
 * command on its errors (`command.args` of `HELLO 3 AUTH default <password>` when a password is
 * rotated), ssh2 and the Kubernetes client put whole requests and responses on theirs.
 */
const ERROR_FIELDS = [
  'code',
  'errno',
  'syscall',
  'address',
  'port',
  'level',
  'kind',
  'reason',
  'permanent',
  'statusCode',
] as const;

type LoggedError = { type: string; message: string; stack?: string; cause?: unknown } & Partial<
  Record<(typeof ERROR_FIELDS)[number], string | number | boolean>
>;

/** Userinfo in URLs (`redis://user:password@host`) and the argument of an AUTH in a message. */
const URL_CREDENTIALS = /(\b[a-z][a-z0-9+.-]*:\/\/)[^\s/@]*@/gi;
const AUTH_ARGUMENT = /\b(AUTH)(\s+\S+){1,2}/g;

/** A message with credentials taken out; for every text that may carry a URL or a command. */
export function withoutCredentials(text: string): string {
  return text.replace(URL_CREDENTIALS, '$1***@').replace(AUTH_ARGUMENT, '$1 ***');
}

/** An error as a log line may show it: its type, message, stack and a few plain fields, its causes. */
export function errorForLog(value: unknown, depth = 0): unknown {
  if (typeof value === 'string') return withoutCredentials(value);
  if (!(value instanceof Error)) return value;
  const out: LoggedError = { type: value.name, message: withoutCredentials(value.message) };
  if (value.stack) out.stack = withoutCredentials(value.stack);
  const fields = value as unknown as Record<string, unknown>;
  for (const field of ERROR_FIELDS) {
    const v = fields[field];
    if (typeof v === 'number' || typeof v === 'boolean') out[field] = v;
    else if (typeof v === 'string') out[field] = withoutCredentials(v);
  }
  if (value.cause !== undefined && depth < 3) out.cause = errorForLog(value.cause, depth + 1);
  return out;
}

/** Keys under which the fleet logs errors: each is written through errorForLog. */
const ERROR_SERIALIZERS = Object.fromEntries(
  ['err', 'error', 'cause', 'sendErr'].map((key) => [key, (value: unknown) => errorForLog(value)]),
);
