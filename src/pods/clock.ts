/**
 * The fleet's one clock: wall time in epoch ms, for what is stored, sent or shown (events' `at`,
 * deadlines, leases, ages in `status`). A role reads it as `FleetDeps.now`, so a test can move it.
 * Timeouts and intervals measure elapsed time with `performance.now()` instead, which no change of the
 * wall clock (NTP, an operator) moves.
 */
export type Clock = () => number;

export const systemClock: Clock = () => Date.now();
