import { execFile } from 'node:child_process';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { formatAddresses } from '../../src/cli/status-format.js';
import { bindAddress } from '../../src/contract/derivations.js';
import {
  parseForwardsUp,
  parseRelayIsolation,
  parseRelayReady,
  renderForwardsUp,
  renderRelayReady,
} from '../../src/render/node-scripts.js';

const run = promisify(execFile);
const UID = '6f1c2b7e-0000-4000-8000-000000000001';

/** Runs the script as the session host does (`/bin/sh -s`, script on stdin). */
async function sh(script: string): Promise<{ code: number; stdout: string }> {
  return new Promise((resolve) => {
    const child = execFile('/bin/sh', ['-s'], (err, stdout) =>
      resolve({ code: (err as { code?: number } | null)?.code ?? 0, stdout }),
    );
    child.stdin?.end(script);
  });
}

describe("the relay's addresses, read from its ready file on the node", () => {
  let dir: string;
  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), "bh-ready-it's dir "));
  });
  afterAll(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  it('renderRelayReady prints the ready line, in a dir whose name needs quoting', async () => {
    await writeFile(join(dir, 'relay.ready'), 'ready 127.9.8.7 127.200.1.2\nlater lines\n');
    const { code, stdout } = await sh(renderRelayReady(dir));
    expect(code).toBe(0);
    expect(parseRelayReady(stdout)).toEqual(['127.9.8.7', '127.200.1.2']);
    await run('/bin/sh', ['-n', '-c', renderRelayReady(dir)]);
  });

  it("renderForwardsUp reads the bound sockets' inodes and the relay's lines in one script", async () => {
    const { createServer } = await import('node:net');
    const socket = join(dir, '5432.sock');
    const server = createServer();
    await new Promise<void>((resolve) => server.listen(socket, resolve));
    try {
      await writeFile(join(dir, 'relay.ready'), 'ready 127.9.8.7\nisolation relay=job sockets=user via=process-tree\n');
      const missing = join(dir, '6379.sock');
      const { code, stdout } = await sh(renderForwardsUp([socket, missing], dir));
      expect(code, stdout).toBe(0);
      const { inodes, relay } = parseForwardsUp(stdout, [socket, missing]);
      const { stdout: ls } = await run('ls', ['-di', '--', socket]);
      expect([...inodes]).toEqual([[socket, ls.trim().split(' ')[0]]]);
      expect(parseRelayReady(relay ?? '')).toEqual(['127.9.8.7']);
      expect(parseRelayIsolation(relay ?? '')).toEqual({ relay: 'job', sockets: 'user' });
      // A SOCKS-only pod has no relay to wait for: the inodes alone.
      const alone = await sh(renderForwardsUp([socket], undefined));
      expect(parseForwardsUp(alone.stdout, [socket]).relay).toBeUndefined();
      expect(parseForwardsUp(alone.stdout, [socket]).inodes.size).toBe(1);
    } finally {
      server.close();
    }
  });

  it('prints nothing, and exits 0, when the relay has not written it (an older prelude)', async () => {
    const { code, stdout } = await sh(renderRelayReady(join(dir, 'missing')));
    expect(code).toBe(0);
    expect(stdout).toBe('');
    expect(parseRelayReady(stdout)).toBeUndefined();
  });

  it.each([
    ['not a ready line', 'error: bind failed'],
    ['no address', 'ready'],
    ['not loopback', 'ready 10.0.0.1'],
    ['IPv6', 'ready ::1'],
    ['an octet out of range', 'ready 127.0.0.256'],
    ['a name', 'ready localhost'],
    ['shell text', 'ready 127.0.0.1;rm'],
    ['more than 64', `ready ${Array.from({ length: 65 }, (_, i) => `127.0.1.${i + 1}`).join(' ')}`],
  ])('believes nothing from the job-written file when it holds %s', (_why, line) => {
    expect(parseRelayReady(`${line}\n`)).toBeUndefined();
  });
});

describe('formatAddresses (status)', () => {
  it('lists the addresses, and says which one is not the derived address of its group', () => {
    const derived = [bindAddress(UID, 0), bindAddress(UID, 1)];
    expect(formatAddresses(UID, null)).toBe('-');
    expect(formatAddresses(UID, derived)).toBe(derived.join(', '));
    expect(formatAddresses(UID, [derived[0] ?? '', '127.250.3.4'])).toBe(
      `${derived[0]}, 127.250.3.4 (127.250.3.4 in place of ${derived[1]}: taken on the node when the job started)`,
    );
  });
});
