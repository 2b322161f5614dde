import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';

const run = promisify(execFile);
const ROOT = new URL('../..', import.meta.url).pathname;

/**
 * What `npm pack` (and the fleet image, which copies the same dist/) carries: the product only. The
 * loopback site and the demo (tools/) create users, start sshds and Slurm and install packages; no fleet
 * member needs them. Run after the build (npm test builds first), without running it again.
 */
describe('the package', () => {
  it('holds the product only: no test site, no demo, no tests, no scripts', async () => {
    const { stdout } = await run('npm', ['pack', '--dry-run', '--json', '--ignore-scripts'], { cwd: ROOT });
    const [pack] = JSON.parse(stdout) as [{ files: { path: string }[] }];
    const paths = pack.files.map((f) => f.path);
    expect(paths).toContain('bin/backhaul.js');
    expect(paths).toContain('dist/cli/main.js');
    expect(paths).toContain('dist/job/relay.py');
    expect(paths).toContain('dist/job/relay-boot.py');
    expect(paths.some((p) => p.startsWith('redis/') && p.endsWith('.lua'))).toBe(true);
    const foreign = paths.filter((p) => /(^|\/)(sandbox|demo|tools|test|bench|scripts)(\/|$)/.test(p));
    expect(foreign).toEqual([]);
  }, 60_000);
});
