import { Registry } from 'prom-client';

/**
 * The fleet member's Prometheus registry (`GET /metrics` on `--health-port`). One per process: a process
 * runs one fleet member, and the pieces that count are reached from places that share nothing else.
 */
export const registry = new Registry();
