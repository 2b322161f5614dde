import { hostname } from 'node:os';

/** The roles a fleet member can run (ARCHITECTURE.md, "The command line"); kept apart from fleet.ts so the CLI can parse them cheaply. */
export const ROLES = ['control', 'session', 'watch', 'webhook'] as const;
export type Role = (typeof ROLES)[number];

export function defaultHostId(): string {
  return `${hostname()}-${process.pid}`;
}
