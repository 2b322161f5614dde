import { readFileSync } from 'node:fs';

/**
 * The relay's Python source, embedded into every prelude (compute nodes get no other copy). It is read
 * from next to this module, so the build must copy relay.py into dist/render as well.
 */
let cached: string | undefined;

export function relaySource(): string {
  cached ??= readFileSync(new URL('./relay.py', import.meta.url), 'utf8');
  return cached;
}
