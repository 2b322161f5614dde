import { existsSync, readFileSync } from 'node:fs';
import { join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { sourceFiles } from '../fixtures/source-files.js';
import { ALONE, LANE_B, LANE_B_DATABASES } from '../lanes.js';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));

/** Databases of 127.0.0.1:6379 a test file names: `const DB = N`, `privateRedis(N)`, `…:6379/N`. */
function databasesOf(file: string): number[] {
  const text = readFileSync(join(ROOT, file), 'utf8');
  const found = [
    ...text.matchAll(/const DB = (\d+)/g),
    ...text.matchAll(/privateRedis\((\d+)\)/g),
    ...text.matchAll(/127\.0\.0\.1:6379\/(\d+)/g),
  ].map((m) => Number(m[1]));
  // What the file runs names its database elsewhere: the demo's (tools/demo/redis.ts DEMO_DB), bench:control's.
  if (text.includes('tools/demo/main.ts')) found.push(15);
  if (text.includes("'bench:control'")) found.push(9);
  return [...new Set(found)].sort((a, b) => a - b);
}

describe('the test lanes (test/lanes.ts)', () => {
  const all = sourceFiles(join(ROOT, 'test'), '.test.ts')
    .map((f) => relative(ROOT, f))
    .filter((f) => f !== 'test/unit/test-lanes.test.ts');

  it('name only files that exist, each in one lane', () => {
    expect([...ALONE, ...LANE_B].filter((f) => !existsSync(join(ROOT, f)))).toEqual([]);
    expect(ALONE.filter((f) => LANE_B.includes(f))).toEqual([]);
    expect(all.length).toBeGreaterThan(90);
    expect(all).toEqual(expect.arrayContaining([...ALONE, ...LANE_B]));
  });

  it('give lane B databases no file of lane A uses (they run at the same time)', () => {
    const laneA = all.filter((f) => !ALONE.includes(f) && !LANE_B.includes(f));
    const clashes = laneA.flatMap((f) =>
      databasesOf(f)
        .filter((db) => LANE_B_DATABASES.includes(db))
        .map((db) => `${f} uses database ${db}, which lane B uses`),
    );
    const unlisted = LANE_B.flatMap((f) =>
      databasesOf(f)
        .filter((db) => !LANE_B_DATABASES.includes(db))
        .map((db) => `${f} (lane B) uses database ${db}, not in LANE_B_DATABASES`),
    );
    expect([...clashes, ...unlisted]).toEqual([]);
    // The reading above finds what it must: the files of both lanes that name a database.
    expect(laneA.filter((f) => databasesOf(f).length > 0).length).toBeGreaterThan(10);
    expect(databasesOf('test/e2e/bench-control-smoke.test.ts')).toEqual([9]);
    expect(databasesOf('test/e2e/demo-command.test.ts')).toEqual([15]);
  });
});
