import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';

/**
 * backhaul is Apache-2.0 (LICENSE, NOTICE); what it ships with it (the package's dependencies, the image's
 * node_modules) must be under licenses that allow that: permissive ones only, no copyleft and no
 * package without a license. A new dependency under another license fails here until someone decides.
 */

const ROOT = new URL('../..', import.meta.url).pathname;
const ACCEPTED = new Set([
  'Apache-2.0',
  'MIT',
  'ISC',
  'BSD-2-Clause',
  'BSD-3-Clause',
  '0BSD',
  'BlueOak-1.0.0',
  'Unlicense',
  'Python-2.0',
  'CC0-1.0',
  'Public Domain',
]);

/** The license a package declares: the lock's copy, else its package.json's old `licenses` array (ssh2's). */
function licenseOf(path: string, meta: LockEntry): string {
  if (meta.license) return meta.license;
  const pkg = JSON.parse(readFileSync(`${ROOT}/${path}/package.json`, 'utf8')) as { licenses?: { type?: string }[] };
  return (pkg.licenses ?? []).map((l) => l.type ?? '').join(' OR ');
}

interface LockEntry {
  dev?: boolean;
  license?: string;
}

describe('licenses', () => {
  it('the project is Apache-2.0, with its LICENSE and NOTICE', () => {
    const pkg = JSON.parse(readFileSync(`${ROOT}/package.json`, 'utf8')) as { license?: string; files?: string[] };
    expect(pkg.license).toBe('Apache-2.0');
    expect(readFileSync(`${ROOT}/LICENSE`, 'utf8')).toMatch(/Apache License\s+Version 2\.0, January 2004/);
    expect(readFileSync(`${ROOT}/NOTICE`, 'utf8')).toContain('Apache License, Version 2.0');
  });

  it('every runtime dependency is under an accepted license', () => {
    const lock = JSON.parse(readFileSync(`${ROOT}/package-lock.json`, 'utf8')) as {
      packages: Record<string, LockEntry>;
    };
    const runtime = Object.entries(lock.packages).filter(([path, meta]) => path !== '' && meta.dev !== true);
    expect(runtime.length).toBeGreaterThan(50);
    const refused = runtime
      .filter(([path, meta]) => {
        // An SPDX expression: "(MIT OR Apache-2.0)" is fine when one of its terms is accepted.
        const terms = licenseOf(path, meta)
          .replace(/[()]/g, '')
          .split(/\s+OR\s+/);
        return !terms.some((t) => ACCEPTED.has(t.trim()));
      })
      .map(([path, meta]) => `${path}: ${licenseOf(path, meta) || 'no license'}`);
    expect(refused).toEqual([]);
  });
});
