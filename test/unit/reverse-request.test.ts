import { describe, expect, it } from 'vitest';
import { ANNOTATION } from '../../src/contract/annotations.js';
import { InputError } from '../../src/contract/input-error.js';
import { parseReverseRequest } from '../../src/contract/reverse-request.js';
import { contextWith } from './contract-fixtures.js';

const FWD = ANNOTATION.forwards;

function refused(annotations: Record<string, string>, ctx = contextWith()): InputError {
  try {
    parseReverseRequest(annotations, ctx);
  } catch (err) {
    expect(err).toBeInstanceOf(InputError);
    return err as InputError;
  }
  throw new Error(`accepted: ${JSON.stringify(annotations)}`);
}

describe('interlink.eu/reverse-forwards grammar (ARCHITECTURE.md, "Annotations")', () => {
  it('quotes a huge or hostile entry once, cut short and escaped, in its refusal', () => {
    const huge = `${'a_'.repeat(200_000)}:80`;
    const err = refused({ [FWD]: huge });
    expect(err.message.length).toBeLessThan(1_000);
    expect(err.message).toContain('(400003 characters)');
    const hostile = refused({ [FWD]: 'evil\u001b[2J\nhost_x:80' });
    expect([...hostile.message].some((c) => c.charCodeAt(0) < 0x20)).toBe(false);
    expect(hostile.message).toContain('"evil\\u001B[2J"');
  });

  it('ignores a pod without reverse annotations', () => {
    expect(parseReverseRequest({ other: 'x' }, contextWith())).toBeUndefined();
  });

  it('accepts host:port and listenPort:host:port separated by any white space', () => {
    const req = parseReverseRequest(
      {
        [FWD]: ' minio.user.svc.cluster.local:9000\n\t6443:kubernetes.default.svc.cluster.local:443  10.96.0.10:5432 ',
      },
      contextWith(),
    );
    expect(req?.forwards.map((f) => [f.listenPort, f.host, f.port])).toEqual([
      [9000, 'minio.user.svc.cluster.local', 9000],
      [6443, 'kubernetes.default.svc.cluster.local', 443],
      [5432, '10.96.0.10', 5432],
    ]);
  });

  it('derives Service names for the hosts file and dials the fully qualified name', () => {
    const req = parseReverseRequest(
      { [FWD]: 'redis:6379 minio.storage.svc:9000 db.example.org:5432 10.0.0.1:8080' },
      contextWith({}, 'user'),
    );
    const [redis, minio, db, ip] = req?.forwards ?? [];
    expect(redis).toMatchObject({
      dialHost: 'redis.user.svc.cluster.local',
      names: ['redis.user.svc.cluster.local', 'redis.user.svc', 'redis.user', 'redis'],
    });
    // Another namespace: no bare name (it would shadow the pod's own namespace).
    expect(minio).toMatchObject({
      dialHost: 'minio.storage.svc.cluster.local',
      names: ['minio.storage.svc.cluster.local', 'minio.storage.svc', 'minio.storage'],
    });
    expect(db).toMatchObject({ dialHost: 'db.example.org', names: ['db.example.org'] });
    expect(ip).toMatchObject({ dialHost: '10.0.0.1', names: [] });
  });

  it('lower-cases host names', () => {
    const req = parseReverseRequest({ [FWD]: 'MinIO.User.svc.cluster.local:9000' }, contextWith());
    expect(req?.forwards[0]?.host).toBe('minio.user.svc.cluster.local');
  });

  it.each([
    ['minio:0', 'port "0" is not a port number'],
    ['minio:65536', 'port "65536" is not a port number'],
    ['minio:09000', 'port "09000" is not a port number'],
    ['minio:http', 'port "http" is not a port number'],
    ['minio', 'missing port'],
    ['70000:minio:9000', 'listen port "70000" is not a port number'],
  ])('refuses a bad port in %s', (entry, problem) => {
    const err = refused({ [FWD]: entry });
    expect(err.field).toBe(FWD);
    expect(err.entry).toBe(entry);
    expect(err.message).toContain(problem);
    expect(err.message).toContain(FWD);
  });

  it('refuses a listen port below 1024 and says how to write it', () => {
    const err = refused({ [FWD]: 'kubernetes.default.svc.cluster.local:443' });
    expect(err.message).toContain('listen port 443 is below 1024');
    expect(err.accepted).toContain(':kubernetes.default.svc.cluster.local:443');
    expect(err.accepted).toMatch(/\b\d{4,5}:kubernetes/);
    expect(refused({ [FWD]: '80:web:8080' }).message).toContain('listen port 80 is below 1024');
  });

  it('refuses a listen port repeated on one address, naming both entries', () => {
    const err = refused({ [FWD]: 'minio:9000 9000:minio.user.svc.cluster.local:80' });
    expect(err.entry).toBe('9000:minio.user.svc.cluster.local:80');
    expect(err.message).toContain('"minio:9000"');
    expect(err.message).toContain('both are minio.user.svc.cluster.local');
    expect(err.accepted).toContain('two different Services may share a port');
    // IPv4 endpoints have no names: they are reached at the first address, with the first Service.
    const v4 = refused({ [FWD]: 'minio:9000 9000:10.0.0.1:80' });
    expect(v4.entry).toBe('9000:10.0.0.1:80');
    expect(v4.message).toContain("IPv4 endpoints are reached at the pod's first address");
  });

  it('lets two Services share a listen port: each has its own address', () => {
    const request = parseReverseRequest({ [FWD]: 'pg-a:5432 pg-b:5432 9000:other:80 minio:9000' }, contextWith());
    expect(request?.forwards.map((f) => `${f.listenPort} ${f.dialHost}`)).toEqual([
      '5432 pg-a.user.svc.cluster.local',
      '5432 pg-b.user.svc.cluster.local',
      '9000 other.user.svc.cluster.local',
      '9000 minio.user.svc.cluster.local',
    ]);
  });

  it('refuses more than 64 entries', () => {
    const entries = Array.from({ length: 65 }, (_, i) => `svc${i}:${2000 + i}`).join(' ');
    expect(refused({ [FWD]: entries }).message).toContain('at most 64');
    const ok = Array.from({ length: 64 }, (_, i) => `svc${i}:${2000 + i}`).join(' ');
    expect(parseReverseRequest({ [FWD]: ok }, contextWith())?.forwards).toHaveLength(64);
  });

  it('refuses UDP with a message saying SSH carries TCP only', () => {
    const err = refused({ [FWD]: 'dns:5353/udp' });
    expect(err.message).toContain('TCP only');
  });

  it.each(['[fd00::1]:80', 'fd00::1:80', '2001:db8::1:8080'])('refuses the IPv6 literal %s', (entry) => {
    expect(refused({ [FWD]: entry }).message).toContain('IPv6 literals are not supported');
  });

  it.each([
    ['my_svc:80', 'contains "_"'],
    ['-bad.example:8080', 'is not a DNS name'],
    ['bad-.example:8080', 'is not a DNS name'],
    [`${'a'.repeat(64)}.example:8080`, 'is not a DNS name'],
    [`${'a.'.repeat(127)}ab:8080`, 'is not a DNS name'],
    ['999.1.1.1:8080', 'is not a valid IPv4 address'],
    ['1.2.3:8080', 'is not a valid IPv4 address'],
    ['$(id):8080', 'is not a DNS name'],
    ['`id`:8080', 'is not a DNS name'],
    ['a;b:8080', 'is not a DNS name'],
    ["a'b:8080", 'is not a DNS name'],
    ['ä.example:8080', 'is not a DNS name'],
  ])('refuses the host in %s', (entry, problem) => {
    const err = refused({ [FWD]: entry });
    expect(err.message).toContain(problem);
    expect(err.entry).toBe(entry);
  });

  it('refuses a newline inside a host (white space separates entries, so it becomes two bad entries)', () => {
    expect(refused({ [FWD]: 'a\nb:8080' }).entry).toBe('a');
  });

  it('accepts a 253-character host name', () => {
    const host = `${'a'.repeat(63)}.${'b'.repeat(63)}.${'c'.repeat(63)}.${'d'.repeat(61)}`;
    expect(host).toHaveLength(253);
    expect(parseReverseRequest({ [FWD]: `${host}:8080` }, contextWith())?.forwards[0]?.host).toBe(host);
  });

  it('refuses an empty annotation', () => {
    expect(refused({ [FWD]: '  ' }).message).toContain('no forwards declared');
  });
});

describe('site policy and the other annotations', () => {
  it('refuses every reverse annotation where the site has not enabled reverse forwards', () => {
    const ctx = contextWith({ Enabled: false });
    for (const name of [ANNOTATION.forwards, ANNOTATION.socksPort, ANNOTATION.nodeExec]) {
      const err = refused({ [name]: 'minio:9000' }, ctx);
      expect(err.field).toBe(name);
      expect(err.message).toContain('not enabled on this site');
    }
  });

  it('refuses interlink.eu/pod-vpn together with reverse forwards', () => {
    const err = refused({ [FWD]: 'minio:9000', [ANNOTATION.podVpn]: 'true' });
    expect(err.message).toContain('cannot be combined with interlink.eu/pod-vpn');
  });

  it('refuses SOCKS unless the site allows it', () => {
    const err = refused({ [ANNOTATION.socksPort]: '11080' });
    expect(err.field).toBe(ANNOTATION.socksPort);
    expect(err.message).toContain('SOCKS is not allowed on this site');
    const req = parseReverseRequest({ [ANNOTATION.socksPort]: '11080' }, contextWith({ AllowSocks: true }));
    expect(req).toEqual({ forwards: [], socksPort: 11080, nodeExec: undefined });
  });

  it.each(['1023', '0', '70000', 'x', '1 2'])('refuses the SOCKS port %s', (value) => {
    const err = refused({ [ANNOTATION.socksPort]: value }, contextWith({ AllowSocks: true }));
    expect(err.message).toContain('1024 or more');
  });

  it('refuses a SOCKS port that a forward listens on', () => {
    const err = refused({ [FWD]: 'minio:9000', [ANNOTATION.socksPort]: '9000' }, contextWith({ AllowSocks: true }));
    expect(err.message).toContain('already a listen port');
  });

  it('accepts a node exec override only where the site allows it', () => {
    expect(refused({ [FWD]: 'minio:9000', [ANNOTATION.nodeExec]: 'srun' }).message).toContain('AllowNodeExecOverride');
    const ctx = contextWith({ AllowNodeExecOverride: true });
    expect(parseReverseRequest({ [FWD]: 'minio:9000', [ANNOTATION.nodeExec]: 'srun' }, ctx)?.nodeExec).toBe('srun');
    expect(refused({ [FWD]: 'minio:9000', [ANNOTATION.nodeExec]: 'rsh' }, ctx).accepted).toBe('"ssh" or "srun"');
  });
});
