import { describe, expect, it } from 'vitest';
import { bindAddress, socketDir, withSlots } from '../../src/contract/derivations.js';
import { InputError } from '../../src/contract/input-error.js';
import type { PodRef } from '../../src/contract/pod.js';
import {
  carrierCommands,
  carrierCommandTemplates,
  validateBatchHost,
  validateJobId,
} from '../../src/render/carrier-command.js';
import {
  hostNameGroups,
  hostNames,
  hostsLines,
  hostsText,
  MAX_HOSTS_LINE_LENGTH,
  namesByGroup,
} from '../../src/render/hosts-file.js';
import { PRELUDE_BEGIN, PRELUDE_END, renderPrelude, stripPrelude } from '../../src/render/prelude.js';
import { relaySource } from '../../src/render/relay-source.js';
import { renderSessionPlan } from '../../src/render/session-plan.js';
import {
  BOOTSTRAP_EXIT,
  carrierPaths,
  renderBootstrap,
  renderSshdConfig,
  validateAuthorizedKey,
} from '../../src/render/userspace-sshd.js';
import { KEYS, requestFor } from './render-fixtures.js';

const UID = '7c1b0f1e-3c4f-4a5e-9d2b-0123456789ab';

function specError(fn: () => unknown): InputError {
  try {
    fn();
  } catch (err) {
    expect(err).toBeInstanceOf(InputError);
    return err as InputError;
  }
  throw new Error('no error thrown');
}

function pod(uid: string | undefined): PodRef {
  return { uid, namespace: 'user', name: 'trainer', nodeName: undefined, annotations: {} };
}

describe('hosts file lines', () => {
  it('lists each name once, in the order of the forwards', () => {
    const { request } = requestFor(
      'node',
      'redis:6379 7000:redis:6380 minio.storage.svc:9000 8080:10.0.0.1:80',
      undefined,
    );
    expect(hostNames(request.forwards)).toEqual([
      'redis.user.svc.cluster.local',
      'redis.user.svc',
      'redis.user',
      'redis',
      'minio.storage.svc.cluster.local',
      'minio.storage.svc',
      'minio.storage',
    ]);
  });

  it('writes each Service on its own address, the forwards to one Service on one', () => {
    const { request } = requestFor('node', 'redis:6379 db.example.org:5432 9000:redis:6380', undefined);
    const slotted = withSlots(request.forwards);
    expect(slotted.map((f) => f.group)).toEqual([0, 1, 0]);
    expect(namesByGroup(slotted)).toEqual([
      ['redis.user.svc.cluster.local', 'redis.user.svc', 'redis.user', 'redis'],
      ['db.example.org'],
    ]);
    const address = ['127.5.6.7', '127.8.9.10'];
    expect(hostsText(slotted.map((f) => ({ ...f, bindAddress: address[f.group] ?? '' })))).toBe(
      '127.5.6.7 redis.user.svc.cluster.local redis.user.svc redis.user redis\n127.8.9.10 db.example.org',
    );
  });

  it('puts IPv4 endpoints, which have no names, on the first address', () => {
    const { request } = requestFor('node', '8080:10.0.0.1:80 redis:6379 8081:10.0.0.2:81', undefined);
    expect(withSlots(request.forwards).map((f) => f.group)).toEqual([0, 1, 0]);
    const named = requestFor('node', 'redis:6379 8080:10.0.0.1:80', undefined).request;
    expect(withSlots(named.forwards).map((f) => f.group)).toEqual([0, 0]);
  });

  it('names the sockets of Services that share a port apart, and keeps <port>.sock for the first', () => {
    const { request } = requestFor(
      'node',
      'pg-a:5432 pg-b:5432 redis:6379 pg-c.user.svc.cluster.local:5432',
      undefined,
    );
    expect(withSlots(request.forwards).map((f) => [f.group, f.socketName])).toEqual([
      [0, '5432.sock'],
      [1, '5432.2.sock'],
      [2, '6379.sock'],
      [3, '5432.3.sock'],
    ]);
  });

  it('writes no line for IPv4 endpoints only', () => {
    const { request } = requestFor('node', '8080:10.0.0.1:80 8081:10.0.0.2:81', undefined);
    expect(hostNames(request.forwards)).toEqual([]);
    expect(hostsLines('127.5.6.7', [])).toEqual([]);
    expect(hostsText([{ bindAddress: '127.5.6.7', names: [] }])).toBeUndefined();
  });

  it('splits long name lists into short lines (musl reads 512-byte lines)', () => {
    const names = Array.from({ length: 100 }, (_, i) => `service-${i}.namespace-${i}.svc.cluster.local`);
    const lines = hostsLines('127.255.255.255', names);
    expect(lines.length).toBeGreaterThan(1);
    for (const line of lines) {
      expect(line.length).toBeLessThanOrEqual(MAX_HOSTS_LINE_LENGTH);
      expect(line.startsWith('127.255.255.255 ')).toBe(true);
    }
    expect(lines.flatMap((l) => l.split(' ').slice(1))).toEqual(names);
    expect(hostNameGroups(names).flat()).toEqual(names);
    expect(hostsText([{ bindAddress: '127.1.1.1', names }])).toBe(hostsLines('127.1.1.1', names).join('\n'));
  });
});

describe('prelude markers', () => {
  const { site, request } = requestFor('node', 'redis:6379', undefined);
  const prelude = renderPrelude(request, site.Network.SSH.Reverse);

  it('wraps the prelude in the markers and ends with a newline (the plugin appends " job.sh")', () => {
    expect(prelude.startsWith(`${PRELUDE_BEGIN}\n`)).toBe(true);
    expect(prelude.endsWith(`\n${PRELUDE_END}\n`)).toBe(true);
    expect(prelude.split('\n').filter((l) => l === PRELUDE_BEGIN || l === PRELUDE_END)).toHaveLength(2);
  });

  it('strips a prelude and keeps everything else', () => {
    expect(stripPrelude(prelude)).toBe('');
    expect(stripPrelude(`echo before\n${prelude}echo after\n`)).toBe('echo before\necho after\n');
    expect(stripPrelude('module load cuda\n')).toBe('module load cuda\n');
  });

  it('is idempotent, and re-rendering replaces rather than stacks', () => {
    const user = 'module load cuda\nexport X=1\n';
    const once = `${prelude}${user}`;
    expect(stripPrelude(stripPrelude(once))).toBe(stripPrelude(once));
    const again = `${renderPrelude(request, { ...site.Network.SSH.Reverse, WaitForForwards: 5000 })}${stripPrelude(once)}`;
    expect(again.split('\n').filter((l) => l === PRELUDE_BEGIN)).toHaveLength(1);
    expect(stripPrelude(again)).toBe(user);
    // Two stacked blocks (e.g. written by hand) both go.
    expect(stripPrelude(`${prelude}${prelude}${user}`)).toBe(user);
  });

  it('strips blocks of other versions too', () => {
    const v2 = '# >>> backhaul prelude v2 (do not edit) >>>\necho v2\n# <<< backhaul prelude v2 <<<\n';
    expect(stripPrelude(`${v2}echo mine\n`)).toBe('echo mine\n');
  });

  it('refuses a block without its end marker', () => {
    const err = specError(() => stripPrelude(`${PRELUDE_BEGIN}\necho half\n`));
    expect(err.field).toBe('slurm-job.vk.io/pre-exec');
    expect(err.message).toMatch(/without its end marker/);
  });

  it('reads the relay the session host delivers', () => {
    expect(relaySource()).toMatch(/def serve\(/);
  });
});

describe('socket path length', () => {
  it('refuses a SocketRoot whose socket paths exceed 107 bytes', () => {
    const { site, request } = requestFor('node', 'redis:6379', undefined);
    const long = `/${'d'.repeat(80)}`;
    const err = specError(() => renderPrelude(request, { ...site.Network.SSH.Reverse, SocketRoot: long }));
    expect(err.field).toBe('Network.SSH.Reverse.SocketRoot');
    expect(err.message).toMatch(/too long/);
    expect(err.message).toMatch(/107/);
    // The longest that fits: /<root>/bh-<16 hex>/<5 digits>.sock = 107 bytes.
    const fits = `/${'d'.repeat(107 - '/bh-0123456789abcdef/65535.sock'.length - 1)}`;
    const wide = requestFor('node', '65535:redis:6379', undefined);
    expect(() => renderPrelude(wide.request, { ...site.Network.SSH.Reverse, SocketRoot: fits })).not.toThrow();
    expect(() => renderPrelude(wide.request, { ...site.Network.SSH.Reverse, SocketRoot: `${fits}x` })).toThrow(
      InputError,
    );
  });
});

describe('authorized key validation', () => {
  it('accepts one plain key of each allowed type and drops the comment', () => {
    expect(validateAuthorizedKey(KEYS.ed25519)).toBe(KEYS.ed25519.replace(/ test$/, ''));
    expect(validateAuthorizedKey(KEYS.ecdsa)).toBe(KEYS.ecdsa.replace(/ test$/, ''));
    expect(validateAuthorizedKey(KEYS.rsa)).toBe(KEYS.rsa.replace(/ test$/, ''));
    expect(validateAuthorizedKey(`${KEYS.ed25519}\n`)).toBe(KEYS.ed25519.replace(/ test$/, ''));
  });

  it.each([
    ['an options prefix', `command="/bin/sh" ${KEYS.ed25519}`],
    ['a second line', `${KEYS.ed25519}\n${KEYS.rsa}`],
    ['an embedded newline in the comment', `${KEYS.ed25519.replace(/ test$/, '')} a\nb`],
    ['an unknown type', KEYS.ed25519.replace('ssh-ed25519', 'ssh-dss')],
    ['broken base64', KEYS.ed25519.replace('AAAAC3', 'AAAA*3')],
    ['a blob of another type', `ssh-rsa ${KEYS.ed25519.split(' ')[1]}`],
    ['a truncated blob', 'ssh-ed25519 AAAA'],
    ['nothing', ''],
  ])('refuses %s', (_, key) => {
    expect(specError(() => validateAuthorizedKey(key)).field).toBe('authorizedKey');
  });

  it('drops a comment rather than carrying it into authorized_keys', () => {
    expect(validateAuthorizedKey(`${KEYS.ed25519.replace(/ test$/, '')} it's $(id)`)).toBe(
      KEYS.ed25519.replace(/ test$/, ''),
    );
  });
});

describe('user-space sshd', () => {
  const dir = socketDir('/tmp', UID);

  it('allows remote unix forwards only (SOCKS is a unix socket too: no TCP listener, ever)', () => {
    const config = renderSshdConfig({ socketDir: dir, clientAliveIntervalS: 15 });
    for (const line of [
      'AllowStreamLocalForwarding remote',
      'AllowTcpForwarding remote',
      'PermitListen none',
      'PermitOpen none',
      'StreamLocalBindUnlink yes',
      'StreamLocalBindMask 0177',
      'PermitTTY no',
      'UsePAM no',
      'StrictModes no',
      'PasswordAuthentication no',
      'KbdInteractiveAuthentication no',
      'X11Forwarding no',
      'AllowAgentForwarding no',
      'PermitTunnel no',
      'PermitUserRC no',
      'ClientAliveInterval 15',
      'ClientAliveCountMax 3',
      'PidFile none',
      `HostKey ${dir}/carrier/host_ed25519`,
      `AuthorizedKeysFile ${dir}/carrier/authorized_keys`,
      'LogLevel INFO',
    ]) {
      expect(config.split('\n')).toContain(line);
    }
  });

  it('bootstraps with the restricted key and the config, and reports the host key', () => {
    const script = renderBootstrap({
      socketDir: dir,
      sshdPath: '/usr/sbin/sshd',
      authorizedKey: KEYS.ed25519,
      clientAliveIntervalS: 15,
    });
    expect(script).toContain(`'restrict,port-forwarding ${KEYS.ed25519.replace(/ test$/, '')}'`);
    expect(script).toContain(`bh_dir='${dir}'`);
    expect(script).toContain('"$bh_sshd" -t -f "$bh_cfg"');
    expect(script).toContain('printf \'%s %s %s\\n\' \'backhaul-hostkey\' "$bh_type" "$bh_blob"');
    expect(script).toContain(`socket dir $bh_dir missing: job not started or prelude not run`);
    expect(new Set(Object.values(BOOTSTRAP_EXIT)).size).toBe(Object.values(BOOTSTRAP_EXIT).length);
  });

  it('refuses a bad key, path or interval', () => {
    const base = {
      socketDir: dir,
      sshdPath: '/usr/sbin/sshd',
      authorizedKey: KEYS.ed25519,
      clientAliveIntervalS: 15,
    };
    expect(() => renderBootstrap({ ...base, authorizedKey: 'no' })).toThrow(InputError);
    expect(() => renderBootstrap({ ...base, sshdPath: 'sshd' })).toThrow(InputError);
    expect(() => renderBootstrap({ ...base, socketDir: '/tmp/a b' })).toThrow(InputError);
    expect(() => renderBootstrap({ ...base, clientAliveIntervalS: 0 })).toThrow(InputError);
  });
});

describe('carrier commands', () => {
  const settings = { sshdPath: '/usr/sbin/sshd', socketDir: socketDir('/tmp', UID), nodeSshPort: 2222 };
  const job = { jobId: '4242', batchHost: 'node-001' };
  const cfg = carrierPaths(settings.socketDir).config;

  it('node mode: the node sshd, no command', () => {
    expect(carrierCommands('node', settings, job)).toEqual({
      mode: 'node',
      nodeTarget: { host: 'node-001', port: 2222 },
    });
  });

  it('userspace mode: sh -s then exec sshd -i on the node', () => {
    expect(carrierCommands('userspace', settings, job)).toEqual({
      mode: 'userspace',
      nodeTarget: { host: 'node-001', port: 2222 },
      bootstrapCommand: '/bin/sh -s',
      sshdCommand: `exec /usr/sbin/sshd -i -e -f ${cfg}`,
    });
  });

  it('srun mode: both wrapped in srun -u --overlap into the job', () => {
    expect(carrierCommands('srun', settings, { jobId: '4242_7', batchHost: 'gpu_node-01.hpc' })).toEqual({
      mode: 'srun',
      bootstrapCommand: 'srun -u --overlap --jobid=4242_7 -w gpu_node-01.hpc -N1 -n1 /bin/sh -s',
      sshdCommand: `exec srun -u --overlap --jobid=4242_7 -w gpu_node-01.hpc -N1 -n1 /usr/sbin/sshd -i -e -f ${cfg}`,
    });
    const templates = carrierCommandTemplates('srun', settings);
    expect(templates.mode === 'srun' && templates.sshdCommand).toContain('--jobid=<job> -w <batch-host>');
  });

  it.each(['4242', '1', '4242_7', '123456789012'])('accepts job id %s', (jobId) => {
    expect(validateJobId(jobId)).toBe(jobId);
  });

  it.each(['', '12a', '1;id', '$(id)', '-1', '123_', '_1', '1 2', '1\n2', '4242_7_1'])('refuses job id %j', (jobId) => {
    expect(specError(() => validateJobId(jobId)).field).toBe('jobId');
    expect(() => carrierCommands('srun', settings, { jobId, batchHost: 'node-001' })).toThrow(InputError);
  });

  it.each(['node001', 'n1.cluster.local', 'gpu_node-01', 'NODE7'])('accepts batch host %s', (host) => {
    expect(validateBatchHost(host)).toBe(host);
  });

  it.each([
    '',
    'a b',
    '-x',
    '$(id)',
    'a..b',
    '.a',
    'a.',
    'a;b',
    'a\nb',
    `${'a'.repeat(254)}`,
  ])('refuses batch host %j', (host) => {
    expect(specError(() => validateBatchHost(host)).field).toBe('batchHost');
    expect(() => carrierCommands('node', settings, { jobId: '1', batchHost: host })).toThrow(InputError);
  });
});

describe('session plan', () => {
  it('derives addresses, socket paths, names and the carrier', () => {
    const { site, request } = requestFor('srun', 'redis:6379 10.0.0.1:8080', 11080);
    const plan = renderSessionPlan(pod(UID), request, site);
    const dir = socketDir(`/tmp/backhaul-${site.Network.SSH.User}`, UID);
    expect(plan).toMatchObject({
      uid: UID,
      namespace: 'user',
      name: 'trainer',
      bindAddress: bindAddress(UID),
      socketDir: dir,
      socks: 11080,
      hostsLine: `${bindAddress(UID)} redis.user.svc.cluster.local redis.user.svc redis.user redis`,
      waitForForwardsMs: 600_000,
    });
    expect(plan.forwards).toEqual([
      {
        listenPort: 6379,
        host: 'redis',
        port: 6379,
        dialHost: 'redis.user.svc.cluster.local',
        bindAddress: bindAddress(UID),
        socketPath: `${dir}/6379.sock`,
        names: ['redis.user.svc.cluster.local', 'redis.user.svc', 'redis.user', 'redis'],
      },
      {
        listenPort: 8080,
        host: '10.0.0.1',
        port: 8080,
        dialHost: '10.0.0.1',
        bindAddress: bindAddress(UID),
        socketPath: `${dir}/8080.sock`,
        names: [],
      },
    ]);
    expect(plan.carrier).toEqual({
      mode: 'srun',
      loginHost: 'login.example.org',
      loginPort: 22,
      user: 'hpc',
      carrierDir: `${dir}/carrier`,
      bootstrapCommand: 'srun -u --overlap --jobid=<job> -w <batch-host> -N1 -n1 /bin/sh -s',
      sshdCommand: `exec srun -u --overlap --jobid=<job> -w <batch-host> -N1 -n1 /usr/sbin/sshd -i -e -f ${dir}/carrier/sshd_config`,
    });
    expect(JSON.parse(JSON.stringify(plan))).toEqual(plan);
  });

  it('gives each Service its own address, so two Services keep one port', () => {
    const { site, request } = requestFor('node', 'pg-a:5432 pg-b:5432 10.0.0.1:8080', undefined);
    const plan = renderSessionPlan(pod(UID), request, site);
    const dir = socketDir(`/tmp/backhaul-${site.Network.SSH.User}`, UID);
    expect(plan.forwards.map((f) => [f.bindAddress, f.socketPath])).toEqual([
      [bindAddress(UID), `${dir}/5432.sock`],
      [bindAddress(UID, 1), `${dir}/5432.2.sock`],
      [bindAddress(UID), `${dir}/8080.sock`],
    ]);
    expect(bindAddress(UID, 1)).not.toBe(bindAddress(UID));
    expect(plan.hostsLine).toBe(
      `${bindAddress(UID)} pg-a.user.svc.cluster.local pg-a.user.svc pg-a.user pg-a\n` +
        `${bindAddress(UID, 1)} pg-b.user.svc.cluster.local pg-b.user.svc pg-b.user pg-b`,
    );
  });

  it('gives node mode the node sshd port and no commands, and no hosts line for IPv4 only', () => {
    const { site, request } = requestFor('node', '10.0.0.1:8080', undefined, { NodeSshPort: 2022 });
    const plan = renderSessionPlan(pod(UID), request, site);
    expect(plan.carrier).toEqual({
      mode: 'node',
      loginHost: 'login.example.org',
      loginPort: 22,
      user: 'hpc',
      nodeSshPort: 2022,
    });
    expect(plan.hostsLine).toBeNull();
    expect(plan.socks).toBeNull();
  });

  it('gives userspace mode the node port and the commands', () => {
    const { site, request } = requestFor('userspace', 'redis:6379', undefined);
    const plan = renderSessionPlan(pod(UID), request, site);
    expect(plan.carrier).toMatchObject({ mode: 'userspace', nodeSshPort: 22, bootstrapCommand: '/bin/sh -s' });
  });

  it('refuses a pod without a UID', () => {
    const { site, request } = requestFor('node', 'redis:6379', undefined);
    expect(specError(() => renderSessionPlan(pod(undefined), request, site)).field).toBe('metadata.uid');
  });

  it('refuses socket paths of 108 bytes or more', () => {
    const { site, request } = requestFor('node', 'redis:6379', undefined, { SocketRoot: `/${'s'.repeat(90)}` });
    const err = specError(() => renderSessionPlan(pod(UID), request, site));
    expect(err.field).toBe('Network.SSH.Reverse.SocketRoot');
    expect(err.message).toMatch(/too long.*107/);
  });
});
