import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { ANNOTATION } from '../../src/contract/annotations.js';
import { displayText, QUOTE_MAX, quote } from '../../src/contract/display-text.js';
import { InputError } from '../../src/contract/input-error.js';
import { parseReverseRequest } from '../../src/contract/reverse-request.js';
import { contextWith } from './contract-fixtures.js';

/** What must never reach a reader raw, written out by hand (not by the implementation's own classes). */
const MUST_ESCAPE: ReadonlyArray<[number, number, string]> = [
  [0x00, 0x1f, 'C0 controls'],
  [0x7f, 0x9f, 'DEL and C1 controls'],
  [0xad, 0xad, 'soft hyphen'],
  [0x061c, 0x061c, 'Arabic letter mark'],
  [0x180e, 0x180e, 'Mongolian vowel separator'],
  [0x200b, 0x200f, 'zero-width characters, LRM, RLM'],
  [0x2028, 0x2029, 'line and paragraph separators'],
  [0x202a, 0x202e, 'bidi embeddings and overrides'],
  [0x2060, 0x2064, 'word joiner and invisible operators'],
  [0x2066, 0x2069, 'bidi isolates'],
  [0xd800, 0xdfff, 'lone surrogates'],
  [0xe000, 0xf8ff, 'private use'],
  [0xfeff, 0xfeff, 'byte order mark'],
  [0xfff9, 0xfffb, 'interlinear annotation'],
  [0xe0000, 0xe007f, 'tags'],
];

const RAW_UNSAFE = /[\p{Cc}\p{Cf}\p{Cs}\p{Co}\p{Cn}\p{Zl}\p{Zp}]/u;

/** The inverse of displayText, to show nothing is lost. */
function undisplay(text: string): string {
  return text.replace(/\\u\{([0-9A-F]+)\}|\\u([0-9A-F]{4})|\\(["\\])/g, (_, astral, bmp, plain) => {
    if (plain) return plain;
    return String.fromCodePoint(Number.parseInt(astral ?? bmp, 16));
  });
}

describe('displayText (issue 25, item 8)', () => {
  it('escapes every code point of the listed ranges, and writes each as \\u… that reads back', () => {
    const raw: string[] = [];
    for (const [from, to, what] of MUST_ESCAPE) {
      for (let cp = from; cp <= to; cp += 1) {
        const shown = displayText(String.fromCodePoint(cp));
        if (!/^\\u(?:[0-9A-F]{4}|\{[0-9A-F]+\})$/.test(shown)) raw.push(`U+${cp.toString(16)} (${what})`);
        else if (undisplay(shown).codePointAt(0) !== cp) raw.push(`U+${cp.toString(16)} reads back wrong`);
      }
    }
    expect(raw.slice(0, 20)).toEqual([]);
  });

  it('over all code points: the output holds no control, format, separator, surrogate or unassigned one', () => {
    const wrong: string[] = [];
    for (let cp = 0; cp <= 0x10ffff; cp += 1) {
      const input = String.fromCodePoint(cp);
      const shown = displayText(input);
      if (RAW_UNSAFE.test(shown) || /[\u00a0\u1680\u2000-\u200a\u202f\u205f\u3000]/.test(shown)) {
        wrong.push(`U+${cp.toString(16)} shown raw`);
      } else if (undisplay(shown) !== input) wrong.push(`U+${cp.toString(16)} does not read back`);
      if (wrong.length >= 20) break;
    }
    expect(wrong).toEqual([]);
  });

  it('keeps letters, digits, punctuation and the plain space as they are', () => {
    for (const text of ['minio.user.svc.cluster.local:9000', 'é ü ß ø', '漢字 日本語', 'a b', '😀', "it's"]) {
      expect(displayText(text)).toBe(text);
    }
  });

  it('reads back any string, surrogate halves included, and quote() never splits a pair', () => {
    fc.assert(
      fc.property(fc.string({ unit: 'binary', maxLength: 300 }), (text) => {
        expect(undisplay(displayText(text))).toBe(text);
        expect(RAW_UNSAFE.test(quote(text))).toBe(false);
      }),
      { numRuns: 2_000 },
    );
    const pairs = '😀'.repeat(QUOTE_MAX + 5);
    expect(quote(pairs)).toBe(`"${'😀'.repeat(QUOTE_MAX)}"… (${QUOTE_MAX + 5} characters)`);
  });

  it('no annotation, however hostile, gets a raw control or bidi character into a refusal', () => {
    const ctx = contextWith({ AllowSocks: true, AllowNodeExecOverride: true });
    const hostile = fc.string({ unit: 'binary', maxLength: 40 });
    const mixed = fc
      .tuple(fc.constantFrom('', '8080:', 'minio', ':9000', '\u202E', '\u2028', '\u0085', '\u061C'), hostile)
      .map(([a, b]) => `${a}${b}`);
    let refused = 0;
    fc.assert(
      fc.property(
        fc.record(
          { [ANNOTATION.forwards]: mixed, [ANNOTATION.socksPort]: mixed, [ANNOTATION.nodeExec]: mixed },
          {
            requiredKeys: [],
          },
        ),
        (annotations) => {
          try {
            parseReverseRequest(annotations, ctx);
          } catch (err) {
            expect(err).toBeInstanceOf(InputError);
            refused += 1;
            const message = (err as InputError).message;
            expect(RAW_UNSAFE.test(message), message).toBe(false);
          }
        },
      ),
      { numRuns: 3_000 },
    );
    expect(refused).toBeGreaterThan(1_000);
  });
});
