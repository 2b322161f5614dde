import { describe, expect, it } from 'vitest';
import { cliDuration } from '../../src/cli/cli-duration.js';

describe('cliDuration (--timeout, --interval)', () => {
  it('takes a plain number as seconds, as the flags always did', () => {
    expect(cliDuration('600', 0, '--timeout')).toBe(600_000);
    expect(cliDuration('0.2', 0, '--interval')).toBe(200);
  });

  it('takes durations as the site configuration and kubectl wait do', () => {
    expect(cliDuration('30s', 0, '--timeout')).toBe(30_000);
    expect(cliDuration('10m', 0, '--timeout')).toBe(600_000);
    expect(cliDuration('1h30m', 0, '--timeout')).toBe(5_400_000);
    expect(cliDuration('500ms', 0, '--interval')).toBe(500);
  });

  it('gives the fallback when the flag is absent', () => {
    expect(cliDuration(undefined, 120_000, '--timeout')).toBe(120_000);
  });

  it.each([
    'soon',
    '',
    '-5',
    '10 m',
    '1e3',
    'm',
    '0',
    '0s',
    'Infinity',
  ])('refuses %j, naming the flag and what it accepts', (text) => {
    expect(() => cliDuration(text, 0, '--timeout')).toThrow(
      /^--timeout: expected seconds \("90", "0\.5"\) or a duration/,
    );
  });

  it('refuses values outside the limits, saying them', () => {
    expect(() => cliDuration('0.5', 0, '--timeout', { minMs: 1_000, maxMs: 600_000 })).toThrow(
      '--timeout: expected seconds ("90", "0.5") or a duration such as "500ms", "30s", "10m", "2h" or "1h30m" from 1 s to 10 min, got "0.5"',
    );
    expect(() => cliDuration('11m', 0, '--timeout', { minMs: 1_000, maxMs: 600_000 })).toThrow(/from 1 s to 10 min/);
    expect(() => cliDuration('30d', 0, '--timeout')).toThrow(/got "30d"/);
  });
});
