import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { ANNOTATION, REVERSE_ANNOTATIONS } from '../../src/contract/annotations.js';
import { InputError } from '../../src/contract/input-error.js';
import { parseReverseRequest, type ReverseRequest } from '../../src/contract/reverse-request.js';
import { renderPrelude } from '../../src/render/prelude.js';
import { contextWith, siteWith } from './contract-fixtures.js';

const RELAY = '# relay source stand-in\n';
const reverse = siteWith({ AllowSocks: true, AllowNodeExecOverride: true }).Network.SSH.Reverse;
const ctx = contextWith({ AllowSocks: true, AllowNodeExecOverride: true });

/** Pieces that make both valid entries and every kind of hostile one. */
const fragment = fc.oneof(
  fc.constantFrom(
    'minio',
    'minio.user.svc.cluster.local',
    'redis.user',
    '10.0.0.1',
    '6443',
    '9000',
    ':',
    '.',
    '-',
    '_',
    ' ',
    '\n',
    '\t',
    '/udp',
    '$(id)',
    '`id`',
    ';',
    "'",
    '"',
    '\\',
    '[::1]',
    '*',
    '&',
    '|',
    '>',
    '\0',
    'é',
  ),
  fc.string({ maxLength: 12 }),
  fc.integer({ min: -5, max: 70_000 }).map(String),
);
const noise = fc.array(fragment, { maxLength: 6 }).map((parts) => parts.join(''));
const host = fc.oneof(
  {
    weight: 4,
    arbitrary: fc.constantFrom('minio', 'minio.user.svc.cluster.local', 'redis.user.svc', 'db.example.org', '10.0.0.1'),
  },
  { weight: 1, arbitrary: noise },
);
const port = fc.oneof(
  { weight: 6, arbitrary: fc.integer({ min: 1024, max: 65535 }).map(String) },
  { weight: 1, arbitrary: noise },
);
/** Mostly well-formed entries with hostile pieces mixed in, so both outcomes are exercised. */
const entry = fc
  .tuple(
    fc.option(port, { freq: 2 }),
    host,
    port,
    fc.oneof({ weight: 8, arbitrary: fc.constant('') }, { weight: 1, arbitrary: noise }),
  )
  .map(([listen, h, p, tail]) => `${listen === null ? '' : `${listen}:`}${h}:${p}${tail}`);
const forwardsValue = fc.oneof(
  { weight: 4, arbitrary: fc.array(entry, { minLength: 1, maxLength: 5 }).map((e) => e.join(' ')) },
  { weight: 1, arbitrary: noise },
);
const socksValue = fc.oneof({ weight: 3, arbitrary: port }, { weight: 1, arbitrary: noise });
const nodeExecValue = fc.oneof(
  { weight: 3, arbitrary: fc.constantFrom('ssh', 'srun') },
  { weight: 1, arbitrary: noise },
);

/**
 * Occurrences of `token` (as a whole word) outside single quotes, comment lines aside. A crude quote
 * tracker is enough here: the prelude puts annotation values in single quotes only.
 */
function unquoted(script: string, token: string): number {
  const escaped = token.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
  const word = new RegExp(`(?<![A-Za-z0-9._-])${escaped}(?![A-Za-z0-9._-])`, 'g');
  let count = 0;
  for (const line of script.split('\n')) {
    if (line.trimStart().startsWith('#')) continue;
    for (const match of line.matchAll(word)) {
      const quotesBefore = (line.slice(0, match.index).match(/'/g) ?? []).length;
      if (quotesBefore % 2 === 0) count += 1;
    }
  }
  return count;
}

/** The prelude for an unrelated name: where a word occurs unquoted in any prelude (`fi`, `exit`, …). */
const BASELINE = renderPrelude(
  { forwards: [{ listenPort: 15999, dialHost: 'zz-baseline.example.org', names: ['zz-baseline.example.org'] }] },
  siteWith({}).Network.SSH.Reverse,
  RELAY,
);

describe('annotation grammar, properties', () => {
  it('any annotation values give a valid request or an InputError naming the annotation, never another exception', () => {
    let accepted = 0;
    fc.assert(
      fc.property(
        fc.record(
          {
            [ANNOTATION.forwards]: forwardsValue,
            [ANNOTATION.socksPort]: socksValue,
            [ANNOTATION.nodeExec]: nodeExecValue,
          },
          { requiredKeys: [] },
        ),
        (annotations) => {
          let request: ReverseRequest | undefined;
          try {
            request = parseReverseRequest(annotations, ctx);
          } catch (err) {
            expect(err).toBeInstanceOf(InputError);
            const field = (err as InputError).field;
            expect(REVERSE_ANNOTATIONS as readonly string[]).toContain(field);
            expect((err as InputError).message.startsWith(field)).toBe(true);
            return;
          }
          if (!request) return;
          accepted += 1;
          for (const f of request.forwards) {
            expect(f.host).toMatch(/^[a-z0-9.-]+$/);
            expect(f.listenPort).toBeGreaterThanOrEqual(1024);
            for (const name of f.names) expect(name).toMatch(/^[a-z0-9.-]+$/);
          }
          const script = renderPrelude(request, reverse, RELAY);
          for (const f of request.forwards) {
            for (const name of f.names)
              expect(unquoted(script, name), name).toBeLessThanOrEqual(unquoted(BASELINE, name));
          }
        },
      ),
      { numRuns: 3_000 },
    );
    // The generator must reach the accepting side too, or the rendering half checks nothing.
    expect(accepted).toBeGreaterThan(300);
  });

  it('well-formed entries are always accepted and read back exactly', () => {
    const label = fc.stringMatching(/^[a-z][a-z0-9]{0,10}$/);
    const entry = fc.record({
      name: label,
      ns: label,
      port: fc.integer({ min: 1, max: 65535 }),
      listen: fc.integer({ min: 1024, max: 65535 }),
    });
    fc.assert(
      fc.property(fc.uniqueArray(entry, { selector: (e) => e.listen, minLength: 1, maxLength: 64 }), (entries) => {
        const text = entries.map((e) => `${e.listen}:${e.name}.${e.ns}.svc.cluster.local:${e.port}`).join(' ');
        const request = parseReverseRequest({ [ANNOTATION.forwards]: text }, ctx);
        expect(request?.forwards.map((f) => [f.listenPort, f.host, f.port])).toEqual(
          entries.map((e) => [e.listen, `${e.name}.${e.ns}.svc.cluster.local`, e.port]),
        );
      }),
      { numRuns: 500 },
    );
  });
});
