/**
 * The pod machine as the rest of the fleet uses it: the chart (pod-chart.ts), its topology
 * (pod-topology.ts), the transition engine (pod-transition.ts), persistence (pod-persistence.ts), and
 * the vocabulary and checks they share (pod-types.ts, pod-schema.ts).
 */
export * from './pod-chart.js';
export * from './pod-persistence.js';
export { parsePodEvent, podActionsSchema, podEventSchema, RestoreError, type RestoreErrorKind } from './pod-schema.js';
export * from './pod-topology.js';
export * from './pod-transition.js';
export * from './pod-types.js';
