import { describe, expect, it } from 'vitest';
import { currentJob, jobPhase, parseSqueue, squeueCommand } from '../../src/site/slurm-job.js';

describe('squeue parsing', () => {
  it.each([
    ['PD', 'pending'],
    ['CF', 'pending'],
    ['R', 'running'],
    ['S', 'suspended'],
    ['ST', 'suspended'],
    ['CG', 'ending'],
    ['CD', 'ended'],
    ['CA', 'ended'],
    ['F', 'ended'],
    ['OOM', 'ended'],
    ['PR', 'ended'],
    ['TO', 'ended'],
    ['NF', 'ended'],
    ['XX', 'pending'],
  ])('state %s is %s', (state, phase) => expect(jobPhase(state)).toBe(phase));

  it('reads id, state and batch host, and ignores junk lines', () => {
    const jobs = parseSqueue('12|R|bhnode1\n13|PD|n/a\nwarning: something\n14_3|R|cn042.cluster\n15|R|$(id)\n');
    expect(jobs).toEqual([
      { jobId: '12', state: 'R', phase: 'running', batchHost: 'bhnode1' },
      { jobId: '13', state: 'PD', phase: 'pending', batchHost: undefined },
      { jobId: '14_3', state: 'R', phase: 'running', batchHost: 'cn042.cluster' },
      { jobId: '15', state: 'R', phase: 'running', batchHost: undefined },
    ]);
  });

  it('picks the newest live job of the pod, else the newest', () => {
    const jobs = parseSqueue('9|CA|n1\n11|R|n2\n10|PD|n/a\n');
    expect(currentJob(jobs)?.jobId).toBe('11');
    expect(currentJob(parseSqueue('9|CA|n1\n12|CD|n1\n'))?.jobId).toBe('12');
    expect(currentJob([])).toBeUndefined();
  });

  it('quotes the user and job name', () => {
    expect(squeueCommand('hpc', "a'b")).toContain(`--name='a'\\''b'`);
  });
});
