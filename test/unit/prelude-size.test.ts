import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { MAX_FORWARDS } from '../../src/contract/annotations.js';
import { MAX_PRELUDE_BYTES, renderPrelude } from '../../src/render/prelude.js';
import { bootSource } from '../../src/render/relay-source.js';
import { requestFor } from './render-fixtures.js';

/** The longest SocketRoot whose socket paths still fit (`<root>/bh-<16 hex>/socks.sock` ≤ 107 bytes). */
const LONGEST_ROOT = `/${'r'.repeat(107 - '/bh-0123456789abcdef/65535.sock'.length - 1)}`;

describe('the pre-exec annotation (issue 28: ≤ 8 KiB for any pod)', () => {
  it('stays under 8 KiB for the largest pod: 64 Services on 5-digit ports, SOCKS, the API, long site paths', () => {
    const forwards = Array.from({ length: MAX_FORWARDS - 1 }, (_, i) => `${65534 - i}:svc-${i}:80`);
    const { site, request } = requestFor(
      'node',
      [...forwards, '65535:kubernetes.default.svc.cluster.local:443'].join(' '),
      64999,
    );
    const reverse = site.Network.SSH.Reverse;
    const text = renderPrelude(request, {
      ...reverse,
      SocketRoot: LONGEST_ROOT,
      PrivateSocketRoot: true,
      PythonPath: `/cvmfs/sft.example.org/lcg/releases/Python/3.11.9-abcdef/x86_64-el9-gcc13-opt/bin/${'p'.repeat(20)}/python3`,
      WaitForForwards: 86_400_000,
    });
    const bytes = Buffer.byteLength(text);
    console.log(`largest prelude: ${bytes} bytes (${request.forwards.length} forwards + SOCKS)`);
    expect(request.forwards).toHaveLength(MAX_FORWARDS);
    expect(bytes).toBeLessThanOrEqual(MAX_PRELUDE_BYTES);
    expect(text).toContain("KUBERNETES_SERVICE_HOST='kubernetes.default.svc'");
  });

  it('is about 7 KiB for a one-Service pod (most of it the boot, the same in every pod)', () => {
    const { site, request } = requestFor('node', 'redis:6379', undefined);
    const bytes = Buffer.byteLength(renderPrelude(request, site.Network.SSH.Reverse));
    console.log(`one-Service prelude: ${bytes} bytes`);
    expect(bytes).toBeLessThan(7_200);
  });

  it('refuses site paths that would make it larger, naming the setting', () => {
    const { site, request } = requestFor('node', 'redis:6379', undefined);
    expect(() =>
      renderPrelude(request, { ...site.Network.SSH.Reverse, PythonPath: `/${'p'.repeat(2_000)}/python3` }),
    ).toThrow(/Network\.SSH\.Reverse\.PythonPath: the prelude would be \d+ bytes, over the 8192/);
  });

  it('carries a boot that Python reads exactly as the file (comments and indentation are all it drops)', () => {
    const dump = (source: string) =>
      execFileSync('python3', ['-c', 'import ast,sys; print(ast.dump(ast.parse(sys.stdin.read())))'], {
        input: source,
      }).toString();
    const file = new URL('../../src/job/relay-boot.py', import.meta.url);
    expect(dump(bootSource())).toBe(dump(readFileSync(file, 'utf8')));
  });
});
