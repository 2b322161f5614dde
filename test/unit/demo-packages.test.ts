import { describe, expect, it } from 'vitest';
import { installCommand, missingPackages } from '../../tools/demo/packages.js';

describe('the demo’s package check', () => {
  it('reports the packages dpkg does not have installed, and the one command that installs them', async () => {
    expect(await missingPackages(['python3', 'bh-no-such-package'])).toEqual(['bh-no-such-package']);
    expect(installCommand(['munge', 'slurmd'])).toBe('apt-get install -y --no-install-recommends munge slurmd');
  });
});
