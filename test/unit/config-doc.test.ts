import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { CONFIG_DOC, configDoc, configRows } from '../../tools/config-doc.js';

/** docs/CONFIG.md is the schema's own account of every key: regenerated here, it must not differ. */
describe('docs/CONFIG.md', () => {
  it('is what the schema generates (run `npm run docs:config` after changing the schema)', () => {
    expect(readFileSync(CONFIG_DOC, 'utf8') === configDoc(), 'docs/CONFIG.md is stale: run npm run docs:config').toBe(
      true,
    );
  });

  it('describes every key, with what it accepts and its default', () => {
    const rows = configRows();
    expect(rows.length).toBeGreaterThan(50);
    const undescribed = rows.filter((r) => r.description.trim() === '').map((r) => r.key);
    expect(undescribed, 'keys without .describe() in the schema').toEqual([]);
    for (const key of ['Network.SSH.LoginHost', 'Backhaul.ChannelWindowMaxMiB', 'Backhaul.EndpointPolicy.ClusterCIDRs'])
      expect(rows.map((r) => r.key)).toContain(key);
    expect(rows.find((r) => r.key === 'Network.SSH.ConnectTimeout')).toMatchObject({
      accepts: 'duration ≥ 1s',
      default: '`20s`',
    });
    expect(rows.find((r) => r.key === 'Network.SSH.LoginHost')?.default).toBe('required');
  });
});
