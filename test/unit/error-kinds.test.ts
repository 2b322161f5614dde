import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { ERROR_KIND_NAMES, ERROR_KINDS, isSiteWide, podError } from '../../src/machines/error-kinds.js';
import { SESSION_ERROR_KINDS, SessionError } from '../../src/ssh/session-error.js';
import { sourceFiles } from '../fixtures/source-files.js';

/** One vocabulary of errors (issue 29): every kind in one table with its class, read by everything else. */
const SRC = fileURLToPath(new URL('../../src/', import.meta.url));

describe('the error kinds', () => {
  it('classifies every kind as permanent, site-wide or transient', () => {
    for (const kind of ERROR_KIND_NAMES)
      expect(['permanent', 'site-wide', 'transient'], kind).toContain(ERROR_KINDS[kind]);
    expect(ERROR_KIND_NAMES.length).toBeGreaterThan(15);
  });

  it('a session error is permanent exactly when its kind is, and every session kind is in the table', () => {
    for (const kind of SESSION_ERROR_KINDS) {
      expect(ERROR_KINDS[kind], kind).toBeDefined();
      expect(new SessionError(kind, 'x').permanent, kind).toBe(ERROR_KINDS[kind] === 'permanent');
    }
  });

  it('podError carries its kind’s class; only site-wide kinds spare a launch, and not when reported permanent', () => {
    for (const kind of ERROR_KIND_NAMES) {
      const error = podError(kind, 'm');
      expect(error.permanent, kind).toBe(ERROR_KINDS[kind] === 'permanent');
      expect(isSiteWide(error), kind).toBe(ERROR_KINDS[kind] === 'site-wide');
      expect(isSiteWide({ ...error, permanent: true }), kind).toBe(false);
    }
    expect(ERROR_KIND_NAMES.filter((k) => ERROR_KINDS[k] === 'site-wide').sort()).toEqual([
      'login-unreachable',
      'slurm-unreachable',
    ]);
  });

  it('no error is made in src/ with a kind outside the table', () => {
    const made: string[] = [];
    for (const file of sourceFiles(SRC)) {
      const text = readFileSync(file, 'utf8');
      for (const m of text.matchAll(/(?:podError|new SessionError)\(\s*'([a-z-]+)'/g)) made.push(m[1] as string);
    }
    expect(made.length).toBeGreaterThan(20);
    expect([...new Set(made)].filter((kind) => !(kind in ERROR_KINDS))).toEqual([]);
  });
});
