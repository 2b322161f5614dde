// biome-ignore-all lint/suspicious/noTemplateCurlyInString: the enroot mount is shell text; bash expands it in job.sh.
import { describe, expect, it } from 'vitest';
import { admit, BadReviewError } from '../../src/cluster/admission.js';
import { ANNOTATION } from '../../src/contract/annotations.js';
import { parseReverseRequest } from '../../src/contract/reverse-request.js';
import { PRELUDE_BEGIN, PRELUDE_END, renderPrelude } from '../../src/render/prelude.js';
import {
  annotationPatch,
  ENROOT_HOSTS_MOUNT,
  enrootMountsWithHosts,
  jsonPointerSegment,
  preExecWithPrelude,
} from '../../src/render/webhook-patch.js';
import { patchedAnnotations, podReview } from '../fixtures/admission-reviews.js';
import { jsonPatch } from '../fixtures/fake-apiserver.js';
import { contextWith, siteWith } from './contract-fixtures.js';

const FWD = ANNOTATION.forwards;
const PRE = ANNOTATION.preExec;
const ENROOT = ANNOTATION.enrootMounts;
const SITE = siteWith({ AllowSocks: true });
const MINIO = 'minio.storage.svc.cluster.local:9000';

function prelude(forwards: string, site = SITE): string {
  const request = parseReverseRequest({ [FWD]: forwards }, contextWith({ AllowSocks: true }));
  if (!request) throw new Error('no request');
  return renderPrelude(request, site.Network.SSH.Reverse);
}

function mutate(annotations: Record<string, string> | undefined, site = SITE) {
  const review = podReview(annotations);
  const answer = admit(review, 'mutate', site);
  return { review, answer, response: answer.response };
}

function refusal(annotations: Record<string, string>, site = SITE, mode: 'mutate' | 'validate' = 'mutate') {
  const response = admit(podReview(annotations), mode, site).response;
  expect(response.allowed).toBe(false);
  expect(response.patch).toBeUndefined();
  expect(response.status?.code).toBe(403);
  return response.status?.message ?? '';
}

describe("admission: the site's endpoint policy (hostile pods refused at apply)", () => {
  const DEFAULT_POLICY = siteWith({ AllowSocks: true }, {});
  it.each([
    [
      "the fleet's Redis",
      'backhaul-redis.backhaul.svc.cluster.local:6379',
      "Service backhaul-redis.backhaul is in the fleet's own namespace",
    ],
    ["the fleet's loopback", '8081:127.0.0.1:8081', '127.0.0.1 is loopback (the fleet itself)'],
    ['cloud metadata', '8080:169.254.169.254:80', '169.254.169.254 is link-local (cloud metadata)'],
    [
      'another tenant',
      'postgres.tenant-b.svc:5432',
      "Service postgres.tenant-b is in namespace tenant-b, not the pod's",
    ],
  ])('%s: refused in both modes, the entry and the rule named', (_what, entry, why) => {
    for (const mode of ['mutate', 'validate'] as const) {
      const message = refusal({ [FWD]: entry }, DEFAULT_POLICY, mode);
      expect(message).toContain(`entry ${JSON.stringify(entry)}`);
      expect(message).toContain(`endpoint not allowed: ${why}`);
      expect(message).toContain('Backhaul.EndpointPolicy');
    }
  });

  it('its own namespace and the Kubernetes API are admitted by default', () => {
    const ns = podReview(undefined).request.namespace ?? 'default';
    const { response } = mutate(
      { [FWD]: `minio.${ns}.svc:9000 6443:kubernetes.default.svc.cluster.local:443` },
      DEFAULT_POLICY,
    );
    expect(response.allowed).toBe(true);
  });
});

describe('admission: the answer document', () => {
  it('echoes the request uid in an AdmissionReview v1 response', () => {
    const review = podReview(undefined, { uid: 'r-1' });
    expect(admit(review, 'mutate', SITE)).toEqual({
      apiVersion: 'admission.k8s.io/v1',
      kind: 'AdmissionReview',
      response: { uid: 'r-1', allowed: true },
    });
  });

  it.each([
    [{ kind: 'AdmissionReview', apiVersion: 'admission.k8s.io/v1beta1', request: { uid: 'x' } }],
    [{ kind: 'AdmissionReview', apiVersion: 'admission.k8s.io/v1' }],
    [{ kind: 'Pod', apiVersion: 'v1' }],
    ['text'],
  ])('refuses a document that is not an AdmissionReview v1 request: %j', (doc) => {
    expect(() => admit(doc, 'mutate', SITE)).toThrow(BadReviewError);
  });

  it('allows pods without reverse annotations untouched (no patch), in both modes', () => {
    const cases: (Record<string, string> | undefined)[] = [
      undefined,
      {},
      { 'example.org/x': 'y', [PRE]: 'module load x\n' },
    ];
    for (const annotations of cases) {
      for (const mode of ['mutate', 'validate'] as const) {
        const { response } = admit(podReview(annotations), mode, SITE);
        expect(response).toEqual({ uid: expect.any(String), allowed: true });
      }
    }
  });

  it('leaves other operations and other kinds alone (mutation never touches an UPDATE)', () => {
    const update = podReview({ [FWD]: 'bad entry' }, { operation: 'UPDATE' });
    expect(admit(update, 'mutate', SITE).response).toEqual({ uid: expect.any(String), allowed: true });
    expect(admit(podReview({ [FWD]: MINIO }, { operation: 'DELETE' }), 'validate', SITE).response.allowed).toBe(true);
    const binding = podReview({ [FWD]: 'bad entry' });
    (binding.request as Record<string, unknown>).subResource = 'binding';
    expect(admit(binding, 'mutate', SITE).response.allowed).toBe(true);
  });
});

describe('admission: mutation (the prelude in slurm-job.vk.io/pre-exec)', () => {
  it('adds the pre-exec annotation when there is none', () => {
    const { review, response } = mutate({ [FWD]: MINIO });
    expect(response.allowed).toBe(true);
    expect(response.patchType).toBe('JSONPatch');
    const ops = JSON.parse(Buffer.from(response.patch ?? '', 'base64').toString('utf8'));
    expect(ops).toEqual([
      { op: 'add', path: '/metadata/annotations/slurm-job.vk.io~1pre-exec', value: prelude(MINIO) },
      { op: 'add', path: '/metadata/annotations/slurm-job.vk.io~1enroot-mounts', value: ENROOT_HOSTS_MOUNT },
    ]);
    const after = patchedAnnotations(review, response, jsonPatch);
    expect(after[PRE]?.startsWith(`${PRELUDE_BEGIN}\n`)).toBe(true);
    // The plugin appends " job.sh": the text must end with a newline.
    expect(after[PRE]?.endsWith(`${PRELUDE_END}\n`)).toBe(true);
    expect(after[FWD]).toBe(MINIO);
  });

  it('puts the prelude before the commands already there, keeping them', () => {
    const own = 'module load cuda\nexport OMP_NUM_THREADS=4\n';
    const { review, response } = mutate({ [FWD]: MINIO, [PRE]: own });
    const ops = JSON.parse(Buffer.from(response.patch ?? '', 'base64').toString('utf8'));
    expect(ops[0].op).toBe('replace');
    expect(patchedAnnotations(review, response, jsonPatch)[PRE]).toBe(prelude(MINIO) + own);
  });

  it("mounts the job's hosts file over /etc/hosts for enroot, after the pod's own mounts, once", () => {
    const own = '--mount /scratch:/scratch --mount /data:/data:none:bind,ro';
    const { review, response } = mutate({ [FWD]: MINIO, [ENROOT]: own });
    const after = patchedAnnotations(review, response, jsonPatch);
    expect(after[ENROOT]).toBe(`${own} ${ENROOT_HOSTS_MOUNT}`);
    expect(ENROOT_HOSTS_MOUNT).toBe(
      '--mount ${BACKHAUL_HOSTS_FILE:-/etc/hosts}:/etc/hosts:none:x-create=file,bind,ro,nosuid,nodev,noexec,private',
    );
    // A manifest copied from a running pod carries it already: it moves to the end, it is not doubled.
    expect(enrootMountsWithHosts(`${ENROOT_HOSTS_MOUNT} ${own}`)).toBe(`${own} ${ENROOT_HOSTS_MOUNT}`);
    expect(mutate(after).response).toEqual({ uid: expect.any(String), allowed: true });
  });

  it('is idempotent: admitting the admitted pod again changes nothing', () => {
    for (const own of [undefined, 'module load cuda\n', 'echo no trailing newline']) {
      const first = mutate({ [FWD]: MINIO, ...(own === undefined ? {} : { [PRE]: own }) });
      const once = patchedAnnotations(first.review, first.response, jsonPatch);
      const second = mutate(once);
      expect(second.response).toEqual({ uid: expect.any(String), allowed: true });
      expect(once[PRE]?.split(PRELUDE_BEGIN)).toHaveLength(2);
    }
  });

  it('replaces a stale prelude (other forwards, copied from a running pod) instead of stacking a second', () => {
    const stale = `${prelude('redis.cache.svc.cluster.local:6379')}module load cuda\n`;
    const { review, response } = mutate({ [FWD]: MINIO, [PRE]: stale });
    const value = patchedAnnotations(review, response, jsonPatch)[PRE] ?? '';
    expect(value).toBe(`${prelude(MINIO)}module load cuda\n`);
    expect(value.split(PRELUDE_BEGIN)).toHaveLength(2);
  });

  it('admits SOCKS where the site allows it, with a warning', () => {
    const { response } = mutate({ [FWD]: MINIO, [ANNOTATION.socksPort]: '11080' });
    expect(response.allowed).toBe(true);
    expect(response.warnings).toHaveLength(1);
    expect(response.warnings?.[0]).toContain(ANNOTATION.socksPort);
    expect(response.warnings?.[0]).toContain('11080');
    expect(response.warnings?.[0]).toContain('SOCKS reaches all the endpoint policy allows, not only the forwards');
    expect(response.warnings?.[0]?.length).toBeLessThanOrEqual(120);
    // SOCKS alone: allowed (no relay ports), warned.
    const alone = mutate({ [ANNOTATION.socksPort]: '11080' }).response;
    expect(alone.allowed).toBe(true);
    expect(alone.warnings).toHaveLength(1);
  });

  it('escapes JSON Pointer segments', () => {
    expect(jsonPointerSegment('a/b~c')).toBe('a~1b~0c');
    expect(annotationPatch(undefined, { 'k/x': 'v', y: 'w' })).toEqual([
      { op: 'add', path: '/metadata/annotations', value: { 'k/x': 'v', y: 'w' } },
    ]);
    expect(annotationPatch({ 'k/x': 'v' }, { 'k/x': 'v' })).toEqual([]);
    expect(preExecWithPrelude(undefined, 'P\n')).toBe('P\n');
  });
});

describe('admission: refusals name the annotation, the entry and what would be accepted (ARCHITECTURE.md, "Annotations")', () => {
  it.each([
    ['UDP', { [FWD]: 'dns.kube-system.svc:53/udp' }, ['TCP only', 'dns.kube-system.svc:53/udp']],
    ['IPv6 literal', { [FWD]: '[fd00::1]:9000' }, ['IPv6', '[fd00::1]:9000']],
    ['"_" in a host', { [FWD]: 'my_svc.user:9000' }, ['"_"', 'my_svc.user:9000']],
    ['a bad port', { [FWD]: 'minio:65536' }, ['not a port number', 'minio:65536']],
    [
      'a listen port below 1024',
      { [FWD]: 'kubernetes.default.svc.cluster.local:443' },
      ['below 1024', ':kubernetes.default.svc.cluster.local:443'],
    ],
    ['a listen port repeated for one Service', { [FWD]: 'a.x:9000 9000:a.x:80' }, ['already used', '"9000:a.x:80"']],
    [
      'more than 64 entries',
      { [FWD]: Array.from({ length: 65 }, (_, i) => `s${i}:${2000 + i}`).join(' ') },
      ['at most 64'],
    ],
    ['no forwards', { [FWD]: '  ' }, ['no forwards declared']],
  ])('%s', (_name, annotations, expected) => {
    const message = refusal(annotations);
    expect(message).toContain(FWD);
    expect(message).toContain('accepted:');
    for (const part of expected) expect(message).toContain(part);
  });

  it('SOCKS where the site does not allow it', () => {
    const message = refusal({ [FWD]: MINIO, [ANNOTATION.socksPort]: '11080' }, siteWith({ AllowSocks: false }));
    expect(message).toContain(ANNOTATION.socksPort);
    expect(message).toContain('"11080"');
    expect(message).toContain('SOCKS is not allowed');
    expect(message).toContain('accepted:');
  });

  it.each([
    ['below 1024', '443', 'not a port number of 1024 or more'],
    ['a forward listen port', '9000', 'already a listen port'],
  ])('a SOCKS port that is %s', (_name, port, problem) => {
    const message = refusal({ [FWD]: MINIO, [ANNOTATION.socksPort]: port });
    expect(message).toContain(ANNOTATION.socksPort);
    expect(message).toContain(`"${port}"`);
    expect(message).toContain(problem);
    expect(message).toContain('accepted:');
  });

  it('a node exec override the site does not allow, or an unknown one', () => {
    const notAllowed = refusal({ [FWD]: MINIO, [ANNOTATION.nodeExec]: 'srun' });
    expect(notAllowed).toContain(ANNOTATION.nodeExec);
    expect(notAllowed).toContain('"srun"');
    expect(notAllowed).toContain('AllowNodeExecOverride');
    const unknown = refusal({ [FWD]: MINIO, [ANNOTATION.nodeExec]: 'telnet' });
    expect(unknown).toContain('"telnet"');
    expect(unknown).toContain('accepted: "ssh" or "srun"');
    const allowed = siteWith({ AllowNodeExecOverride: true });
    expect(admit(podReview({ [FWD]: MINIO, [ANNOTATION.nodeExec]: 'srun' }), 'mutate', allowed).response.allowed).toBe(
      true,
    );
  });

  it('the pod VPN combined with reverse forwards', () => {
    const message = refusal({ [FWD]: MINIO, [ANNOTATION.podVpn]: 'true' });
    expect(message).toContain(FWD);
    expect(message).toContain(ANNOTATION.podVpn);
    expect(message).toContain('accepted:');
  });

  it('reverse forwards on a site that has them disabled', () => {
    const message = refusal({ [FWD]: MINIO }, siteWith({ Enabled: false }));
    expect(message).toContain('not enabled');
    expect(message).toContain('Network.SSH.Reverse.Enabled');
  });

  it('a pre-exec holding the start of a prelude without its end', () => {
    for (const mode of ['mutate', 'validate'] as const) {
      const message = refusal({ [FWD]: MINIO, [PRE]: `${PRELUDE_BEGIN}\necho half\n` }, SITE, mode);
      expect(message).toContain(PRE);
      expect(message).toContain('end marker');
      expect(message).toContain('accepted:');
    }
  });
});

describe('admission: validation of the stored pod', () => {
  it('refuses a pod with forwards whose pre-exec has no prelude (the mutating webhook did not run)', () => {
    const message = refusal({ [FWD]: MINIO, [PRE]: 'module load x\n' }, SITE, 'validate');
    expect(message).toContain(PRE);
    expect(message).toContain('no backhaul prelude');
    expect(message).toContain('accepted:');
  });

  it('allows the pod the mutating webhook produced', () => {
    const { review, response } = mutate({ [FWD]: MINIO, [PRE]: 'module load x\n' });
    const stored = patchedAnnotations(review, response, jsonPatch);
    expect(admit(podReview(stored), 'validate', SITE).response).toEqual({ uid: expect.any(String), allowed: true });
  });

  it('validates with the same rules as the mutation', () => {
    const message = refusal({ [FWD]: 'minio:9000/udp', [PRE]: prelude(MINIO) }, SITE, 'validate');
    expect(message).toContain('TCP only');
  });
});

describe('admission: updates of a pod that exists', () => {
  /** An UPDATE review: the pod as stored (`before`) and as it would be (`after`). */
  function update(before: Record<string, string> | undefined, after: Record<string, string> | undefined) {
    const review = podReview(after, { operation: 'UPDATE' });
    const old = podReview(before).request.object;
    (review.request as Record<string, unknown>).oldObject = old;
    return admit(review, 'validate', SITE).response;
  }
  const created = { [FWD]: MINIO, [PRE]: preExecWithPrelude(undefined, prelude(MINIO)) };

  it('allows updates that keep the reverse annotations and the prelude (labels, other annotations)', () => {
    expect(update(created, { ...created, 'example.org/owner': 'alice' }).allowed).toBe(true);
    expect(update(created, created).allowed).toBe(true);
    // Pods that never used backhaul are not its business.
    expect(update({ a: '1' }, { a: '2', [PRE]: 'module load x\n' }).allowed).toBe(true);
  });

  it.each([
    [
      'changing the forwards',
      created,
      { ...created, [FWD]: 'redis.user.svc:6379' },
      FWD,
      /from "minio.*" to "redis.user.svc:6379"/,
    ],
    [
      'adding SOCKS',
      created,
      { ...created, [ANNOTATION.socksPort]: '1080' },
      ANNOTATION.socksPort,
      /from unset to "1080"/,
    ],
    ['removing the forwards', created, { [PRE]: created[PRE] }, FWD, /to unset/],
    ['editing the prelude', created, { ...created, [PRE]: 'echo hi\n' }, PRE, /to "echo hi\\u000A"/],
    ['adding forwards to a pod created without', { a: '1' }, { a: '1', [FWD]: MINIO }, FWD, /from unset/],
  ])('refuses %s, naming the annotation and what to do instead', (_what, before, after, key, detail) => {
    const response = update(before, after);
    expect(response.allowed).toBe(false);
    expect(response.status?.code).toBe(403);
    const message = response.status?.message ?? '';
    expect(message.startsWith(`${key}: cannot change once the pod exists`)).toBe(true);
    expect(message).toMatch(detail);
    expect(message).toContain('delete the pod and create it again');
  });
});

describe('admission: namespaces that have not opted in (/validate-not-enabled)', () => {
  it('refuses a new pod that asks for reverse forwards, saying how to opt in', () => {
    const response = admit(podReview({ [FWD]: MINIO }, { namespace: 'quiet' }), 'not-enabled', SITE).response;
    expect(response).toMatchObject({ allowed: false, status: { code: 403, reason: 'Forbidden' } });
    expect(response.status?.message).toBe(
      'the pod asks for reverse forwards (interlink.eu/reverse-*), but namespace quiet has not opted in to them: an admin labels it with kubectl label namespace quiet interlink.eu/backhaul=enabled (Backhaul.Kubernetes.NamespaceLabel); until then its pods get no tunnel',
    );
  });

  it('lets every other pod through, and everything when the site serves every namespace', () => {
    expect(admit(podReview({}, { namespace: 'quiet' }), 'not-enabled', SITE).response.allowed).toBe(true);
    expect(admit(podReview(undefined, { namespace: 'quiet' }), 'not-enabled', SITE).response.allowed).toBe(true);
    const open = {
      ...SITE,
      Backhaul: { ...SITE.Backhaul, Kubernetes: { ...SITE.Backhaul.Kubernetes, NamespaceLabel: '' } },
    };
    expect(admit(podReview({ [FWD]: MINIO }, { namespace: 'quiet' }), 'not-enabled', open).response.allowed).toBe(true);
  });
});
