/** The demo's choices, kept apart from its code so the CLI can offer them without loading it. */
export const DEMO_MODES = ['node', 'userspace', 'srun'] as const;
export type DemoMode = (typeof DEMO_MODES)[number];
export const DEMO_USER = 'bhdemo';
export const DEFAULT_DEMO_BYTES = 8 * 1024 * 1024;
