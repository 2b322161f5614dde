import { describe, expect, it } from 'vitest';
import { validateBatchHost } from '../../src/render/carrier-command.js';
import { currentJob, jobPhase, parseSqueue, slurmStateName, squeueCommand } from '../../src/ssh/slurm-job.js';

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

  it.each([
    ['OOM', 'OUT_OF_MEMORY'],
    ['CA', 'CANCELLED'],
    ['CG', 'COMPLETING'],
    ['NF', 'NODE_FAIL'],
    ['GONE', 'GONE'],
    ['XX', 'XX'],
  ])('state %s is called %s (as sacct does)', (state, name) => expect(slurmStateName(state)).toBe(name));

  it("reads id, state, batch host, name and the prelude's note in the comment, and ignores junk lines", () => {
    const jobs = parseSqueue(
      '12|R|bhnode1|a|(null)\n13|PD|n/a|b|\nwarning: something\n14_3|R|cn042.cluster|c|x|y\n15|R|$(id)|e\n16|R|gpu_node-07|f\n17|F|bhnode1|g|backhaul: relay could not start: 0.0.0.0:15400 is held by uid 1001 (bhother)|x\n',
    );
    expect(jobs).toEqual([
      { jobId: '12', name: 'a', state: 'R', phase: 'running', batchHost: 'bhnode1' },
      { jobId: '13', name: 'b', state: 'PD', phase: 'pending', batchHost: undefined },
      // The comment is the last field: a separator in it stays part of it; only `backhaul: …` is a note.
      { jobId: '14_3', name: 'c', state: 'R', phase: 'running', batchHost: 'cn042.cluster' },
      { jobId: '15', name: 'e', state: 'R', phase: 'running', batchHost: undefined },
      // Slurm node names may hold "_": the carrier dials them (validateBatchHost), so squeue must read them.
      { jobId: '16', name: 'f', state: 'R', phase: 'running', batchHost: 'gpu_node-07' },
      {
        jobId: '17',
        name: 'g',
        state: 'F',
        phase: 'ended',
        batchHost: 'bhnode1',
        note: 'relay could not start: 0.0.0.0:15400 is held by uid 1001 (bhother)|x',
      },
    ]);
    expect(validateBatchHost('gpu_node-07')).toBe('gpu_node-07');
  });

  it('picks the newest live job of the pod, else the newest', () => {
    const jobs = parseSqueue('9|CA|n1|p\n11|R|n2|p\n10|PD|n/a|p\n');
    expect(currentJob(jobs)?.jobId).toBe('11');
    expect(currentJob(parseSqueue('9|CA|n1|p\n12|CD|n1|p\n'))?.jobId).toBe('12');
    expect(currentJob([])).toBeUndefined();
  });

  it('asks for several names in one command, quoted, and refuses names squeue would split', () => {
    expect(squeueCommand('hpc', ["a'b"])).toContain(`--name='a'\\''b'`);
    expect(squeueCommand('hpc', ['u1', 'u2', 'u3'])).toContain(' --name=u1,u2,u3 ');
    expect(squeueCommand('hpc', ['u1'])).toContain(`--format='%i|%t|%B|%j|%k'`);
    expect(() => squeueCommand('hpc', ['a,b'])).toThrow(/bad job name "a,b"/);
    expect(() => squeueCommand('hpc', [])).toThrow(/no job name/);
  });
});
