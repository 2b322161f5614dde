import { chmod, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import net from 'node:net';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { admit } from '../../src/cluster/admission.js';
import { ANNOTATION } from '../../src/contract/annotations.js';
import { parseReverseRequest, requestContext } from '../../src/contract/reverse-request.js';
import { renderSessionPlan } from '../../src/render/session-plan.js';
import { ensureUser, JOB_USER, type TestUser } from '../../tools/sandbox/users.js';
import { patchedAnnotations, podReview } from '../fixtures/admission-reviews.js';
import { jsonPatch } from '../fixtures/fake-apiserver.js';
import { siteWith } from '../unit/contract-fixtures.js';
import { deliverRelay, type RunningScript, startScript, uniqueUid } from './script-runner.js';

/**
 * enroot workloads get the Services' names too (ARCHITECTURE.md, "The prelude"). The pod goes through the real
 * admission webhook; its job is built as interLink's Slurm plugin builds it (the pre-exec, then
 * ` job.sh`; job.sh runs `enroot start <EnrootDefaultOptions> <slurm-job.vk.io/enroot-mounts> <name>
 * <command>` with the annotation pasted unquoted); an enroot-like launcher stands in for enroot as
 * bubblewrap stands in for Apptainer: it checks each --mount as enroot does, binds the node's
 * /etc/hosts first (enroot's 20-config.fstab) and the pod's mounts over it, in a mount namespace.
 */

/** `enroot start [--rw] [-m|--mount SRC:DST[:TYPE[:OPTIONS]]]... NAME [COMMAND...]`, run with bwrap. */
const ENROOT_LIKE = `#!/bin/bash
set -euo pipefail
[ "\${1:-}" = start ] || { echo "enroot-like: only start is implemented" >&2; exit 2; }
shift
binds=(--ro-bind /etc/hosts /etc/hosts)
while [ $# -gt 0 ]; do
  case $1 in
    --rw) shift ;;
    -m | --mount)
      spec=$2
      shift 2
      [[ $spec =~ ^[^[:space:]]+:[^[:space:]]+$ ]] || { echo "enroot-like: invalid mount: $spec" >&2; exit 1; }
      IFS=' ' read -r src dst _type opts <<<"\${spec//:/ }"
      [ -e "$src" ] || { echo "enroot-like: mount source $src does not exist" >&2; exit 1; }
      case ,\${opts:-}, in
        *,ro,*) binds+=(--ro-bind "$src" "$dst") ;;
        *) binds+=(--bind "$src" "$dst") ;;
      esac ;;
    -*) echo "enroot-like: unknown option $1" >&2; exit 1 ;;
    *) break ;;
  esac
done
name=$1
shift
echo "enroot-like: starting $name with \${binds[*]}" >&2
exec bwrap --dev-bind / / "\${binds[@]}" "$@"
`;

/** The workload: asks each database, by name and on 5432, who it is; prints what it resolved and heard. */
const CLIENT = `
import socket, sys
for host in sys.argv[1:]:
    with socket.create_connection((host, 5432), timeout=10) as s:
        print("heard %s %s %s" % (host, socket.gethostbyname(host), s.recv(64).decode().strip()), flush=True)
`;

const FORWARDS = 'pg-a:5432 pg-b.user.svc.cluster.local:5432';
const SITE = siteWith({ SocketRoot: '/tmp', PythonPath: '/usr/bin/python3', WaitForForwards: '60s' });

let job: TestUser;
let dir = '';

beforeAll(async () => {
  job = await ensureUser(JOB_USER);
  dir = await mkdtemp('/tmp/bh-enroot-');
  await chmod(dir, 0o755);
}, 60_000);

afterAll(async () => {
  if (dir) await rm(dir, { recursive: true, force: true });
});

/** The pod's annotations once the mutating webhook has answered. */
function admitted(annotations: Record<string, string>): Record<string, string> {
  const review = podReview(annotations);
  const { response } = admit(review, 'mutate', SITE);
  expect(response.allowed, response.status?.message).toBe(true);
  return patchedAnnotations(review, response, jsonPatch);
}

/** job.sh as the plugin writes it for enroot: no shebang, the runtime command pasted as text. */
function jobSh(enroot: string, annotations: Record<string, string>, uid: string): string {
  const mounts = annotations[ANNOTATION.enrootMounts] ?? '';
  return [
    '',
    'runCtn() {',
    '  ctn=$1',
    '  shift',
    '  ( "$@" )',
    '}',
    `runCtn main ${enroot} start --rw ${mounts} main${uid} /usr/bin/python3 -c '${CLIENT}' pg-a pg-b.user.svc.cluster.local`,
    'echo "job.sh: exit $?"',
    '',
  ].join('\n');
}

describe('enroot (slurm-job.vk.io/enroot-mounts)', () => {
  it('a container started by enroot resolves each Service to its own address and reaches it on the unchanged port', async () => {
    const uid = uniqueUid('enroot');
    const annotations = admitted({
      [ANNOTATION.forwards]: FORWARDS,
      [ANNOTATION.enrootMounts]: '--mount /tmp:/mnt',
    });
    const enroot = join(dir, 'enroot');
    await writeFile(enroot, ENROOT_LIKE, { mode: 0o755 });
    const jobFile = join(dir, `job-${uid}.sh`);
    await writeFile(jobFile, jobSh(enroot, annotations, uid), { mode: 0o755 });
    const batch = `#!/bin/bash\nexport POD_IP=10.0.0.5\n${annotations[ANNOTATION.preExec]} ${jobFile}\n`;

    const request = parseReverseRequest(annotations, requestContext(SITE, 'user'));
    if (!request) throw new Error('no request');
    const plan = renderSessionPlan(
      { uid, namespace: 'user', name: 'train', nodeName: undefined, annotations },
      request,
      SITE,
    );

    let script: RunningScript | undefined;
    const servers: net.Server[] = [];
    try {
      script = await startScript(job, 'bash', batch, { SLURM_JOB_NAME: uid });
      await script.waitFor(/waiting up to 60 s for the forwards/, 'stderr');
      // What the session host does first: the relay and the names, then the reverse forwards.
      expect(await deliverRelay(job, { socketDir: plan.socketDir, uid, forwards: plan.forwards })).toBe(
        '0 backhaul-relay-delivered ',
      );
      // What the session host's reverse forwards make: each forward's socket, as the plan names it.
      for (const forward of plan.forwards) {
        const server = net.createServer((c) => c.end(`${forward.dialHost.split('.')[0]} via ${forward.socketPath}\n`));
        servers.push(server);
        await new Promise<void>((resolve, reject) => {
          server.once('error', reject);
          server.listen(forward.socketPath, () => resolve());
        });
        await chmod(forward.socketPath, 0o666);
      }
      await script.waitFor(/^job\.sh: exit \d+$/m, 'stdout', 30_000);
      const seen = `stdout:\n${script.stdout}\nstderr:\n${script.stderr}`;
      expect(script.stdout, seen).toContain('job.sh: exit 0');
      const [a, b] = plan.forwards;
      expect(a?.bindAddress).not.toBe(b?.bindAddress);
      expect(script.stdout, seen).toContain(`heard pg-a ${a?.bindAddress} pg-a via ${a?.socketPath}`);
      expect(script.stdout, seen).toContain(
        `heard pg-b.user.svc.cluster.local ${b?.bindAddress} pg-b via ${b?.socketPath}`,
      );
      // The pod's own mount came first; the hosts file was bound over enroot's default /etc/hosts.
      expect(script.stderr, seen).toMatch(
        new RegExp(
          `enroot-like: starting main${uid} with --ro-bind /etc/hosts /etc/hosts --bind /tmp /mnt --ro-bind ${plan.socketDir}/hosts /etc/hosts`,
        ),
      );
      expect((await script.exited).code, seen).toBe(0);
    } finally {
      script?.child.kill('SIGKILL');
      await Promise.all(servers.map((s) => new Promise((resolve) => s.close(resolve))));
    }
    // The prelude's trap removed the socket dir, hosts file included.
    await expect(readFile(`${plan.socketDir}/hosts`)).rejects.toThrow(/ENOENT/);
  }, 60_000);

  it("a job whose prelude did not run still starts: enroot gets the node's /etc/hosts", async () => {
    const annotations = admitted({ [ANNOTATION.forwards]: FORWARDS });
    const enroot = join(dir, 'enroot');
    await writeFile(enroot, ENROOT_LIKE, { mode: 0o755 });
    const mounts = annotations[ANNOTATION.enrootMounts] ?? '';
    const script = await startScript(
      job,
      'bash',
      `${enroot} start --rw ${mounts} main cat /etc/hosts >/dev/null && echo started\n`,
      {},
    );
    const exit = await script.exited;
    expect(exit.code, script.stderr).toBe(0);
    expect(script.stdout).toContain('started');
    expect(script.stderr).toContain('--ro-bind /etc/hosts /etc/hosts --ro-bind /etc/hosts /etc/hosts');
  }, 30_000);
});
