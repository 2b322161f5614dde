import type { Logger } from 'pino';
import { destination, pino } from 'pino';

export type { Logger } from 'pino';

/**
 * Structured logs on stderr (JSON lines, one per event) so operators can ship them as they are.
 * Keys and secrets never reach a log line: anything under these paths is replaced.
 */
export function createLogger(name: string, level = process.env.BACKHAUL_LOG_LEVEL ?? 'info'): Logger {
  return pino(
    {
      name,
      level,
      base: { pid: process.pid },
      redact: { paths: ['privateKey', '*.privateKey', 'key', '*.key', 'password', '*.password'], censor: '[secret]' },
    },
    destination({ dest: 2, sync: false }),
  );
}

/** A logger that drops everything (tests and one-shot commands that report through their own output). */
export function silentLogger(): Logger {
  return pino({ level: 'silent' });
}
