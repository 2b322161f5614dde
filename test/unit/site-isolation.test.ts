import { describe, expect, it } from 'vitest';
import { siteIsolation, slurmSettings } from '../../src/site/doctor/isolation-check.js';

const CONFIG = (proctrack: string, container: string) =>
  `Configuration data as of 2026-12-06T05:00:00\nJobContainerType        = ${container}\nProctrackType           = ${proctrack}\n`;

describe('the isolation a site gives two pods of one site user (docs/SECURITY.md)', () => {
  it('sockets per job only with job_container/tmpfs, the srun carrier and SocketRoot on the private /tmp', () => {
    const tmpfs = slurmSettings(CONFIG('proctrack/cgroup', 'job_container/tmpfs'));
    expect(siteIsolation('srun', '/tmp/backhaul-hpc', tmpfs)).toMatchObject({ relay: 'job', sockets: 'job' });
    expect(siteIsolation('node', '/tmp/backhaul-hpc', tmpfs).sockets).toBe('user');
    expect(siteIsolation('userspace', '/tmp/backhaul-hpc', tmpfs).sockets).toBe('user');
    expect(siteIsolation('srun', '/var/tmp/backhaul-hpc', tmpfs).detail).toContain(
      'SocketRoot /var/tmp/backhaul-hpc is not under the job',
    );
    const none = slurmSettings(CONFIG('proctrack/linuxproc', 'job_container/none'));
    expect(siteIsolation('srun', '/tmp/backhaul-hpc', none).detail).toContain(
      "relay per job (the job's processes, by the descendants of its shell and its steps (proctrack/linuxproc))",
    );
    expect(siteIsolation('srun', '/tmp/backhaul-hpc', tmpfs).detail).toContain('by its cgroup (proctrack/cgroup)');
    // Without scontrol's answer: said so, and never per job.
    expect(siteIsolation('srun', '/tmp/x', undefined).sockets).toBe('user');
  });
});
