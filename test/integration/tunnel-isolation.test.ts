import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ANNOTATION } from '../../src/contract/annotations.js';
import { restorePod } from '../../src/machines/pod-machine.js';
import { NO_CLUSTER_CHECKS } from '../../tools/sandbox/loopback-site.js';
import { PYTHON, planFor, uid, waitFor } from '../../tools/sandbox/shadow-harness.js';
import {
  cancelSubmittedJobs,
  privateNodeTracking,
  SLURM_PRIVATE_NODE,
  SLURM_PRIVATE_PARTITION,
} from '../../tools/sandbox/slurm.js';
import { ensureUser, OTHER_USER, spawnAs } from '../../tools/sandbox/users.js';
import { killWorkers, type WorkerProcess } from '../../tools/sandbox/worker-process.js';
import {
  controlAndSession,
  type ProcessFleetSite,
  privateRedis,
  processFleetSite,
  submitPod,
} from '../fixtures/fleet-harness.js';
import { type KubeHarness, kubeHarness } from '../fixtures/kube-harness.js';

const DB = 11;
const DB_PER_JOB = 9;

/** Pod B's workload: connects to pod A's relay address and to A's socket path, and says what happened. */
function intruder(aAddress: string, aSocket: string): string {
  return `${PYTHON} - <<'PYEOF'
import socket
def attempt(kind, target):
    s = socket.socket(socket.AF_UNIX if kind == 'socket' else socket.AF_INET)
    s.settimeout(5)
    try:
        s.connect(target)
        s.sendall(b'theirs'); s.shutdown(socket.SHUT_WR)
        got = s.recv(16)
        print(kind, 'reached' if got == b'theirs' else 'closed', flush=True)
    except OSError as exc:
        print(kind, 'closed', exc.__class__.__name__, flush=True)
attempt('relay', ('${aAddress}', 15701))
attempt('socket', '${aSocket}')
PYEOF
sleep 300
`;
}

/** Pod A's workload: uses its own tunnel once (admitted), then waits. */
const OWN_USE = `${PYTHON} - <<'PYEOF'
import os, socket
s = socket.create_connection((os.environ['BACKHAUL_BIND_ADDRESS'], 15701), timeout=5)
s.sendall(b'mine'); s.shutdown(socket.SHUT_WR)
print('own', s.recv(16).decode(), flush=True)
PYEOF
sleep 300
`;

/**
 * A fleet (control worker and session host processes) on the loopback site, with the fake API server
 * so that Events can be read back. SSH: site keys under Network.SSH (Reverse merged); SBATCHARGS: how
 * the pods' jobs are submitted (a partition).
 */
function isolationFleet(db: number, label: string, ssh: Record<string, unknown> = {}, sbatchArgs: string[] = []) {
  const fleet = {} as { kube: KubeHarness; redis: Awaited<ReturnType<typeof privateRedis>>; site: ProcessFleetSite };
  const workers: WorkerProcess[] = [];

  beforeAll(async () => {
    fleet.kube = await kubeHarness();
    fleet.redis = await privateRedis(db);
    fleet.site = await processFleetSite(
      fleet.redis.url,
      {},
      { Kubernetes: { Kubeconfig: fleet.kube.kubeconfigFile, ...NO_CLUSTER_CHECKS, PodCondition: false } },
      ssh,
    );
    workers.push(...(await controlAndSession(fleet.site, fleet.redis.url, label)));
  }, 120_000);

  afterAll(async () => {
    await killWorkers(workers);
    await cancelSubmittedJobs();
    await fleet.site?.close();
    await fleet.redis?.close();
    await fleet.kube?.close();
  });

  /** The pod's machine context once it is active. */
  async function active(podUid: string) {
    return waitFor(
      `pod ${podUid} active`,
      async () => {
        const stored = await fleet.site.deps.store.load(podUid);
        if (stored?.state !== 'active') return undefined;
        const restored = restorePod(stored.snapshot);
        return restored.ok ? restored.snapshot.context : undefined;
      },
      90_000,
    );
  }

  async function submit(podUid: string, namespace: string, name: string, forwards: string, body: string, out: string) {
    fleet.kube.api.createPod({ metadata: { name, namespace, annotations: { [ANNOTATION.forwards]: forwards } } });
    await submitPod(fleet.site, podUid, name, forwards, body, out, sbatchArgs, namespace);
  }

  function sharedUserWarnings(namespace: string, name: string) {
    return fleet.kube.api
      .listEvents(namespace)
      .filter((e) => e.reason === 'ReverseTunnelSharedUser' && (e.involvedObject as { name?: string }).name === name);
  }

  /** Pod A (team-a) uses its tunnel; then pod B (team-b), same user and node, tries A's. Resolves with both. */
  async function aThenB() {
    const { h, echo } = fleet.site;
    const a = uid();
    const b = uid();
    const aForwards = `15701:127.0.0.1:${echo.port}`;
    const aPlan = planFor(h, a, aForwards);
    const aAddress = aPlan.forwards[0]?.bindAddress ?? '';
    const aSocket = aPlan.forwards[0]?.socketPath ?? '';
    const aOut = join(h.workdir, `${a}.out`);
    const bOut = join(h.workdir, `${b}.out`);
    const jobOutput = async () =>
      `A's job output:\n${await readFile(aOut, 'utf8').catch(() => '')}\nB's job output:\n${await readFile(bOut, 'utf8').catch(() => '')}`;
    await submit(a, 'team-a', 'pod-a', aForwards, OWN_USE, aOut);
    const aContext = await active(a);
    await waitFor('A reached its own endpoint', async () =>
      (await readFile(aOut, 'utf8').catch(() => '')).includes('own mine') ? true : undefined,
    ).catch(async (err: Error) => {
      throw new Error(`${err.message}\n${await jobOutput()}`);
    });
    await submit(b, 'team-b', 'pod-b', `15702:127.0.0.1:${echo.port}`, intruder(aAddress, aSocket), bOut);
    await active(b);
    const said = await waitFor('B tried both', async () => {
      const text = await readFile(bOut, 'utf8').catch(() => '');
      return text.includes('socket ') ? text : undefined;
    });
    return { aContext, said, aLog: await readFile(aOut, 'utf8'), jobOutput };
  }

  return { fleet, aThenB, submit, sharedUserWarnings };
}

/** The relay's refusal of B's workload, naming the rule that judged it (the job's cgroup or its process tree). */
function refusedAtRelay(rule: 'cgroup' | 'process tree'): RegExp {
  return new RegExp(
    `backhaul-relay: refused .* -> 127\\.[\\d.]+:15701: pid \\d+ \\(python3\\) is not a process of job \\d+ \\(${rule}\\)`,
  );
}

/**
 * Issue 25, item 2: two pods whose jobs run as the one site user, on one node (interLink submits every
 * pod's job as the same user). Pod B's workload tries pod A's tunnel both ways: A's relay address
 * (refused: the relay admits only A's job's processes, not every process of the user) and A's socket
 * path (reached: on this site the sockets are the user's, which A's relay reports, and the fleet warns
 * A and B, pods of two namespaces, once each).
 */
describe('two pods of one site user on one node', () => {
  const { fleet, aThenB, submit, sharedUserWarnings } = isolationFleet(DB, 'iso');

  it("B's workload is refused at A's relay address; A's socket path is the user's, and both pods are warned", async () => {
    const { aContext, said, aLog } = await aThenB();
    expect(aContext.isolation).toEqual({ relay: 'job', sockets: 'user' });
    expect(said, said).toMatch(/^relay closed/m);
    // The level the site gets: per job at the relay, per user for the sockets (node mode, no job_container).
    expect(said, said).toMatch(/^socket reached$/m);
    expect(aLog, aLog).toMatch(refusedAtRelay('process tree'));

    // The Warning: B's pod comes up while pods of team-a run as the same user.
    const warnings = await waitFor('the shared-user Warning on pod-b', async () => {
      const events = sharedUserWarnings('team-b', 'pod-b');
      return events.length > 0 ? events : undefined;
    });
    expect(warnings[0]?.type).toBe('Warning');
    expect(String(warnings[0]?.message)).toContain(
      "its relay admits only this pod's job, but its forward sockets can be opened by every process of that user",
    );
    expect(String(warnings[0]?.message)).toContain('pods of other namespaces (team-a)');
  }, 240_000);

  it('a listen port another user holds on every address stops the job, and the pod gets an Event naming that user', async () => {
    const { site, kube } = fleet;
    const { h, echo } = site;
    const other = await ensureUser(OTHER_USER);
    const port = 15703;
    const holder = spawnAs(
      other,
      PYTHON,
      [
        '-c',
        `import socket,time\ns=socket.socket(); s.bind(('0.0.0.0', ${port})); s.listen(1); print('held', flush=True); time.sleep(120)`,
      ],
      { stdio: ['ignore', 'pipe', 'pipe'] },
    );
    try {
      await new Promise<void>((resolve) => holder.stdout?.once('data', () => resolve()));
      const c = uid();
      await submit(c, 'team-c', 'pod-c', `${port}:127.0.0.1:${echo.port}`, 'sleep 300\n', join(h.workdir, 'c.out'));
      const events = await waitFor(
        'the ReversePreludeFailed Warning on pod-c',
        async () => {
          const found = kube.api
            .listEvents('team-c')
            .filter(
              (e) => e.reason === 'ReversePreludeFailed' && (e.involvedObject as { name?: string }).name === 'pod-c',
            );
          return found.length > 0 ? found : undefined;
        },
        90_000,
      ).catch(async (err: Error) => {
        throw new Error(
          `${err.message}\njob output:\n${await readFile(join(h.workdir, 'c.out'), 'utf8').catch(() => '')}`,
        );
      });
      expect(String(events[0]?.message)).toMatch(
        new RegExp(
          `^(Slurm job \\d+ on node bhnode1|the pod's Slurm job): relay could not start: cannot listen on 127\\.[\\d.]+:${port} \\(port ${port}\\): .*: 0\\.0\\.0\\.0:${port} is held by uid ${other.uid} \\(${OTHER_USER}\\), a process of another user`,
        ),
      );
      // The pod is torn down and forgotten, as for any job that ended.
      await waitFor(
        'pod-c forgotten',
        async () => ((await site.deps.store.load(c)) === null ? true : undefined),
        60_000,
      );
    } finally {
      holder.kill('SIGKILL');
    }
  }, 180_000);
});

/**
 * The same two pods where the site keeps one user's jobs apart: Slurm's job_container/tmpfs (node
 * bhnode2, partition jobtmp: a private /tmp per job) and the srun carrier (the user-space sshd is a step
 * of the job, so the forward sockets are bound in the job's own /tmp). B is refused at A's relay address
 * and finds no socket at A's socket path; nobody is warned.
 */
describe('two pods of one site user on one node, per-job site (job_container/tmpfs, srun carrier)', () => {
  const { aThenB, sharedUserWarnings } = isolationFleet(
    DB_PER_JOB,
    'iso-job',
    { Reverse: { Sshd: 'userspace', NodeExec: 'srun' } },
    ['-p', SLURM_PRIVATE_PARTITION],
  );

  it("B's workload is refused at A's relay address and A's socket path is not there for it; no Warning", async () => {
    const { aContext, said, aLog, jobOutput } = await aThenB();
    const seen = `${said}\n${await jobOutput()}`;
    expect(aContext.batchHost, seen).toBe(SLURM_PRIVATE_NODE);
    expect(aContext.isolation, seen).toEqual({ relay: 'job', sockets: 'job' });
    expect(said, seen).toMatch(/^relay closed/m);
    expect(said, seen).toMatch(/^socket closed FileNotFoundError$/m);
    // bhnode2 tracks jobs by cgroup where this machine mounts the v1 freezer (it does): the relay's cgroup rule.
    const rule = privateNodeTracking();
    if (rule !== 'cgroup')
      console.warn('tunnel-isolation: no cgroup v1 freezer here; the relay used its process-tree rule');
    expect(aLog, seen).toMatch(refusedAtRelay(rule));
    // B is active and A's job still runs: a Warning would have been sent by now (it is sent as B comes up).
    await new Promise((resolve) => setTimeout(resolve, 2_000));
    expect(sharedUserWarnings('team-b', 'pod-b')).toEqual([]);
    expect(sharedUserWarnings('team-a', 'pod-a')).toEqual([]);
  }, 240_000);
});
