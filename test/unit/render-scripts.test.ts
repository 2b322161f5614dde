import { execFile } from 'node:child_process';
import { createHash } from 'node:crypto';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import fc from 'fast-check';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { CarrierMode } from '../../src/contract/carrier-mode.js';
import { socketDir } from '../../src/contract/derivations.js';
import { carrierCommands } from '../../src/render/carrier-command.js';
import {
  renderForwardsUp,
  renderPrepareSockets,
  renderRelayReady,
  renderRemoveDeadJobDir,
  renderRemoveOwnSockets,
  renderSocketInodes,
  renderSocketWatch,
} from '../../src/render/node-scripts.js';
import { renderPrelude } from '../../src/render/prelude.js';
import { renderDeliverRelay } from '../../src/render/relay-delivery.js';
import { relaySource } from '../../src/render/relay-source.js';
import { shellQuote, shellWord } from '../../src/render/shell-quote.js';
import { renderBootstrap } from '../../src/render/userspace-sshd.js';
import { FORWARDS, KEYS, requestFor, type TargetKind } from './render-fixtures.js';

const execFileAsync = promisify(execFile);

interface Outcome {
  code: number;
  stdout: string;
  stderr: string;
}

async function run(command: string, args: readonly string[]): Promise<Outcome> {
  try {
    const { stdout, stderr } = await execFileAsync(command, args, { maxBuffer: 64 * 1024 * 1024 });
    return { code: 0, stdout, stderr };
  } catch (error) {
    const e = error as { code?: number; stdout?: string; stderr?: string };
    return { code: typeof e.code === 'number' ? e.code : -1, stdout: e.stdout ?? '', stderr: e.stderr ?? '' };
  }
}

/** Runs jobs a few at a time: dozens of shells at once only slow each other down. */
async function pool<T, R>(items: readonly T[], width: number, job: (item: T) => Promise<R>): Promise<R[]> {
  const results: R[] = new Array(items.length);
  let next = 0;
  const worker = async (): Promise<void> => {
    while (next < items.length) {
      const index = next++;
      results[index] = await job(items[index] as T);
    }
  };
  await Promise.all(Array.from({ length: Math.min(width, items.length) }, worker));
  return results;
}

const MODES: CarrierMode[] = ['node', 'userspace', 'srun'];
const SOCKS: (number | undefined)[] = [undefined, 11080];
const COUNTS = ['one', 'many'] as const;
const KINDS: TargetKind[] = ['ipv4', 'bare', 'fqdn'];
const UID = '7c1b0f1e-3c4f-4a5e-9d2b-0123456789ab';

interface Script {
  name: string;
  text: string;
  path?: string;
}

/** Every script for every combination, each distinct text once (the prelude ignores the carrier mode). */
function allScripts(): Script[] {
  const byContent = new Map<string, Script>();
  const add = (name: string, text: string): void => {
    const digest = createHash('sha256').update(text).digest('hex');
    if (!byContent.has(digest)) byContent.set(digest, { name, text });
  };
  for (const mode of MODES) {
    for (const socks of SOCKS) {
      for (const count of COUNTS) {
        for (const kind of KINDS) {
          const label = `${mode}-${socks ?? 'nosocks'}-${count}-${kind}`;
          const { site, request } = requestFor(mode, FORWARDS[kind][count], socks);
          const reverse = site.Network.SSH.Reverse;
          add(`prelude-${label}`, `#!/bin/sh\n${renderPrelude(request, reverse)}`);
          const dir = socketDir(reverse.SocketRoot, UID);
          add(
            `bootstrap-${label}`,
            renderBootstrap({
              socketDir: dir,
              sshdPath: reverse.SshdPath,
              authorizedKey: KEYS.ed25519,
              clientAliveIntervalS: 15,
            }),
          );
          for (const jobId of ['4242', '4242_7']) {
            const commands = carrierCommands(
              mode,
              { sshdPath: reverse.SshdPath, socketDir: dir, nodeSshPort: reverse.NodeSshPort },
              { jobId, batchHost: 'node-001.cluster.example' },
            );
            if (commands.mode !== 'node') {
              add(`bootstrap-command-${label}-${jobId}`, `#!/bin/sh\n${commands.bootstrapCommand}\n`);
              add(`sshd-command-${label}-${jobId}`, `#!/bin/sh\n${commands.sshdCommand}\n`);
            }
          }
        }
      }
    }
  }
  // The largest request the annotation grammar allows: 64 Services with long names.
  const many = Array.from({ length: 64 }, (_, i) => `${20000 + i}:service-${'x'.repeat(40)}-${i}:80`).join(' ');
  const { site, request } = requestFor('node', many, undefined);
  add('prelude-64-forwards', `#!/bin/sh\n${renderPrelude(request, site.Network.SSH.Reverse)}`);
  // A SOCKS-only request: a relay for the SOCKS port alone, and the wait for its socket.
  const socksOnly = requestFor('userspace', '', 11080);
  add('prelude-socks-only', `#!/bin/sh\n${renderPrelude(socksOnly.request, socksOnly.site.Network.SSH.Reverse)}`);
  // What the session host runs on the node through the carrier.
  const dir = socketDir('/tmp/backhaul-$USER', UID);
  const sockets = [`${dir}/5432.sock`, `${dir}/6379.sock`];
  add('relay-ready', `#!/bin/sh\n${renderRelayReady(dir)}`);
  add('prepare-sockets', `#!/bin/sh\n${renderPrepareSockets(dir, sockets)}`);
  add('socket-inodes', `#!/bin/sh\n${renderSocketInodes(sockets)}`);
  add('forwards-up', `#!/bin/sh\n${renderForwardsUp(sockets, dir)}`);
  add('socket-watch', `#!/bin/sh\n${renderSocketWatch(dir, sockets, 3)}`);
  add(
    'remove-own-sockets',
    `#!/bin/sh\n${renderRemoveOwnSockets(new Map(sockets.map((p, i) => [p, String(1000 + i)])))}`,
  );
  add('remove-dead-job-dir', `#!/bin/sh\n${renderRemoveDeadJobDir(dir)}`);
  for (const [label, forwards] of [
    ['one', 'redis:6379'],
    ['shared-port', 'pg-a:5432 pg-b:5432 10.0.0.1:8080'],
    ['64', many],
  ] as const) {
    const delivered = requestFor('node', forwards, undefined).request.forwards;
    add(
      `deliver-relay-${label}`,
      `#!/bin/sh\n${renderDeliverRelay({ socketDir: dir, uid: UID, forwards: delivered, relay: relaySource() })}`,
    );
  }
  add(
    'remove-own-sockets-and-dead-job-dir',
    `#!/bin/sh\n${renderRemoveOwnSockets(new Map([[sockets[0] ?? '', '1000']]), dir)}`,
  );
  return [...byContent.values()];
}

describe('generated scripts pass sh -n, bash -n and shellcheck', () => {
  let dir = '';
  const scripts = allScripts();

  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'bh-render-scripts-'));
    await Promise.all(
      scripts.map(async (script) => {
        script.path = join(dir, `${script.name}.sh`);
        await writeFile(script.path, script.text);
      }),
    );
  });

  afterAll(async () => {
    if (dir) await rm(dir, { recursive: true, force: true });
  });

  it('covers every combination', () => {
    const names = scripts.map((s) => s.name);
    // One bootstrap for every combination: SOCKS no longer changes the user-space sshd (no TCP listener).
    expect(names.filter((n) => n.startsWith('bootstrap-') && !n.startsWith('bootstrap-command')).length).toBe(1);
    expect(names.some((n) => n.startsWith('sshd-command-srun'))).toBe(true);
    expect(names.some((n) => n.startsWith('sshd-command-userspace'))).toBe(true);
    expect(names.some((n) => n.startsWith('prelude-'))).toBe(true);
  });

  it.each(['sh', 'bash'])('%s -n accepts every script', async (shell) => {
    const results = await pool(scripts, 8, async (script) => ({
      name: script.name,
      ...(await run(shell, ['-n', script.path ?? ''])),
    }));
    const failures = results.filter((r) => r.code !== 0).map((r) => `${r.name}: ${r.stderr}`);
    expect(failures).toEqual([]);
  });

  it('shellcheck -S warning finds nothing, as sh and as bash', async () => {
    const files = scripts.map((s) => s.path ?? '');
    // The two dialects at once: shellcheck is single-threaded and takes seconds on the preludes.
    const results = await Promise.all(
      ['sh', 'bash'].map(async (dialect) => ({
        dialect,
        ...(await run('shellcheck', ['-S', 'warning', '-s', dialect, '-f', 'gcc', ...files])),
      })),
    );
    for (const result of results) {
      expect(result.stdout + result.stderr, `shellcheck -s ${result.dialect}`).toBe('');
      expect(result.code, `shellcheck -s ${result.dialect}`).toBe(0);
    }
  });
});

/** Strings a shell would otherwise expand, split, glob or end early on. */
const HOSTILE = [
  '$(id)',
  '`id`',
  'a;b',
  "a'b",
  "'",
  "''",
  'a\nb',
  '\n',
  '"$HOME"',
  // biome-ignore lint/suspicious/noTemplateCurlyInString: a shell expansion the quoting must keep literal
  '${PATH}',
  '\\',
  '\\n',
  '*',
  '~',
  '!',
  '-n',
  '--',
  ' leading and trailing ',
  '\t',
  '',
  'a|b&c>d<e',
  '#comment',
  'ünïcödé ✓',
  '%s%d',
];

describe('shellQuote', () => {
  it.each(['sh', 'bash'])('round-trips hostile strings through %s', async (shell) => {
    for (const value of HOSTILE) {
      const result = await run(shell, ['-c', `printf %s ${shellQuote(value)}`]);
      expect(result.code).toBe(0);
      expect(result.stdout).toBe(value);
    }
  });

  it.each(['sh', 'bash'])('round-trips arbitrary strings through %s', async (shell) => {
    const samples = fc.sample(
      fc.string({ unit: 'binary', maxLength: 40 }).filter((s) => !s.includes('\0') && Buffer.from(s).toString() === s),
      300,
    );
    // One shell for all samples: each printed value is followed by a NUL, which no sample contains.
    const result = await run(shell, ['-c', `printf '%s\\0' ${samples.map(shellQuote).join(' ')}`]);
    expect(result.code).toBe(0);
    expect(result.stdout.split('\0').slice(0, -1)).toEqual(samples);
  });

  it('quotes every value, even plain ones, and refuses NUL', () => {
    expect(shellQuote('abc')).toBe("'abc'");
    expect(shellQuote(9000)).toBe("'9000'");
    expect(shellQuote("a'b")).toBe("'a'\\''b'");
    expect(() => shellQuote('a\0b')).toThrow(/NUL/);
  });

  it('shellWord leaves only csh-safe words bare', () => {
    expect(shellWord('/usr/sbin/sshd')).toBe('/usr/sbin/sshd');
    expect(shellWord('--jobid=12_3')).toBe('--jobid=12_3');
    expect(shellWord('a b')).toBe("'a b'");
    expect(shellWord('~x')).toBe("'~x'");
    expect(shellWord('$(id)')).toBe("'$(id)'");
  });
});

describe('no value reaches the prelude unquoted', () => {
  it('quotes hostile site settings', () => {
    const { site, request } = requestFor('node', 'redis:6379', undefined);
    const text = renderPrelude(request, {
      ...site.Network.SSH.Reverse,
      PythonPath: "python3'; touch /tmp/pwned; '",
      SocketRoot: '/tmp/$(id)',
    });
    expect(text).toContain(`bh_py=${shellQuote("python3'; touch /tmp/pwned; '")}`);
    expect(text).toContain("--socket-root='/tmp/$(id)'");
  });

  it('quotes ports and names', () => {
    const { site, request } = requestFor('node', 'redis:6379 pg:5432 10.0.0.1:8080', undefined);
    const text = renderPrelude(request, site.Network.SSH.Reverse);
    expect(text).toContain("bh_fw='6379 1:5432 8080'");
    expect(text).toContain('--forward="$bh_fw"');
    // The names travel with the relay, in the script the session host runs: each group's on its address.
    const delivery = renderDeliverRelay({
      socketDir: '/tmp/bh-x',
      uid: UID,
      forwards: request.forwards,
      relay: 'pass\n',
    });
    // Group number, then that group's names: the script puts them on the group's address.
    expect(delivery).toContain(
      `set -- '1' 'redis.user.svc.cluster.local redis.user.svc redis.user redis' '2' 'pg.user.svc.cluster.local pg.user.svc pg.user pg'`,
    );
  });

  it('refuses names that are not host names instead of quoting them into the hosts file', () => {
    const { site } = requestFor('node', 'redis:6379', undefined);
    expect(() =>
      renderPrelude(
        { forwards: [{ listenPort: 9000, dialHost: 'x.example.org', names: ['$(id)'] }] },
        site.Network.SSH.Reverse,
      ),
    ).toThrow(/not a host name/);
    expect(() =>
      renderPrelude(
        { forwards: [{ listenPort: 9000, dialHost: 'x.example.org', names: ['a b'] }] },
        site.Network.SSH.Reverse,
      ),
    ).toThrow(/not a host name/);
  });
});
