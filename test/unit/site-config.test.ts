import { describe, expect, it } from 'vitest';
import { parseDuration } from '../../src/contract/duration.js';
import { InputError } from '../../src/contract/input-error.js';
import { parseSiteConfigYaml } from '../../src/contract/site-config.js';

const BASE = `
Network:
  SSH:
    LoginHost: login.example.org
    User: hpc
    KeyFile: /secrets/id_ed25519
    KnownHostsFile: /secrets/known_hosts
`;

function refusal(yaml: string): InputError {
  try {
    parseSiteConfigYaml(yaml);
  } catch (err) {
    expect(err).toBeInstanceOf(InputError);
    return err as InputError;
  }
  throw new Error('accepted');
}

describe('durations', () => {
  it.each([
    ['500ms', 500],
    ['30s', 30_000],
    ['10m', 600_000],
    ['2h', 7_200_000],
    ['1h30m', 5_400_000],
    ['1d', 86_400_000],
  ])('%s is %d ms', (text, ms) => expect(parseDuration(text)).toBe(ms));

  it.each(['', '10', 'm', '10x', '1.5h', '-1s', '10 m', ' 10m'])('refuses %j', (text) => {
    expect(parseDuration(text)).toBeUndefined();
  });
});

describe('site configuration (ARCHITECTURE.md, "Site configuration")', () => {
  it('fills the documented defaults', () => {
    const cfg = parseSiteConfigYaml(BASE);
    expect(cfg.Network.SSH).toMatchObject({
      Port: 22,
      NodeWaitTimeout: 7_200_000,
      InsecureAcceptAnyHostKey: false,
      ConnectTimeout: 20_000,
      SlurmQueryTimeout: 15_000,
    });
    expect(cfg.Network.SSH.Reverse).toEqual({
      Enabled: false,
      Sshd: 'node',
      NodeExec: 'ssh',
      AllowNodeExecOverride: false,
      AllowSocks: false,
      SshdPath: '/usr/sbin/sshd',
      PythonPath: 'python3',
      SocketRoot: '/tmp/backhaul-hpc',
      PrivateSocketRoot: true,
      NodeSshPort: 22,
      WaitForForwards: 600_000,
    });
    expect(cfg.Backhaul.Redis.URL).toBe('redis://127.0.0.1:6379');
    expect(cfg.Backhaul).toMatchObject({ SocketCheckInterval: 3_000, JobCheckInterval: 15_000 });
  });

  it('reads every key', () => {
    const cfg = parseSiteConfigYaml(`${BASE}    Port: 2222
    NodeWaitTimeout: 30m
    Reverse:
      Enabled: true
      Sshd: userspace
      NodeExec: srun
      AllowSocks: true
      SshdPath: /opt/openssh/sbin/sshd
      PythonPath: /usr/bin/python3.11
      SocketRoot: /dev/shm
      NodeSshPort: 2200
      WaitForForwards: 90s
Backhaul:
  Redis: { URL: "redis://redis.backhaul:6379/2" }
  SessionCapacity: 50
  JobCheckInterval: 1m
`);
    expect(cfg.Network.SSH.Port).toBe(2222);
    expect(cfg.Network.SSH.NodeWaitTimeout).toBe(1_800_000);
    expect(cfg.Network.SSH.Reverse).toMatchObject({
      Sshd: 'userspace',
      NodeExec: 'srun',
      NodeSshPort: 2200,
      WaitForForwards: 90_000,
    });
    expect(cfg.Backhaul).toMatchObject({
      SessionCapacity: 50,
      JobCheckInterval: 60_000,
      Redis: { URL: 'redis://redis.backhaul:6379/2' },
    });
  });

  it('refuses an unknown key with its path and the keys accepted there', () => {
    const err = refusal(`${BASE}    Reverse:\n      Enabeld: true\n`);
    expect(err.field).toBe('Network.SSH.Reverse.Enabeld');
    expect(err.message).toContain('unknown key');
    expect(err.accepted).toContain('Enabled');
    expect(refusal(`${BASE}Extra: 1\n`).field).toBe('Extra');
  });

  it.each([
    ['    Port: 0\n', 'Network.SSH.Port'],
    ['    Port: "22"\n', 'Network.SSH.Port'],
    ['    LoginHost2: x\n', 'Network.SSH.LoginHost2'],
    ['    Reverse: { Sshd: container }\n', 'Network.SSH.Reverse.Sshd'],
    ['    Reverse: { WaitForForwards: soon }\n', 'Network.SSH.Reverse.WaitForForwards'],
    ['    Reverse: { SocketRoot: "tmp" }\n', 'Network.SSH.Reverse.SocketRoot'],
    ['    Reverse: { SocketRoot: "/tmp/$(id)" }\n', 'Network.SSH.Reverse.SocketRoot'],
    ['    Reverse: { SocketRoot: "/tmp/bh-%h" }\n', 'Network.SSH.Reverse.SocketRoot'],
    ['    Reverse: { SocketRoot: "/tmp/bh-%" }\n', 'Network.SSH.Reverse.SocketRoot'],
    ['    Reverse: { PythonPath: "python3; rm -rf /" }\n', 'Network.SSH.Reverse.PythonPath'],
    ['    Reverse: { NodeSshPort: 70000 }\n', 'Network.SSH.Reverse.NodeSshPort'],
    ['Backhaul: { RetryLimit: 0 }\n', 'Backhaul.RetryLimit'],
    // squeue more than once a second per login connection is load on slurmctld for no use.
    ['Backhaul: { JobCheckInterval: 500ms }\n', 'Backhaul.JobCheckInterval'],
    ['Backhaul: { JobCheckInterval: often }\n', 'Backhaul.JobCheckInterval'],
  ])('refuses a bad value: %j at %s', (extra, path) => {
    expect(refusal(BASE + extra).field).toBe(path);
  });

  it("makes a SocketRoot with %u the user's own, and one without it shared", () => {
    const own = parseSiteConfigYaml(`${BASE}    Reverse: { SocketRoot: /scratch/%u/run }\n`).Network.SSH.Reverse;
    expect(own).toMatchObject({ SocketRoot: '/scratch/hpc/run', PrivateSocketRoot: true });
    const shared = parseSiteConfigYaml(`${BASE}    Reverse: { SocketRoot: /dev/shm }\n`).Network.SSH.Reverse;
    expect(shared).toMatchObject({ SocketRoot: '/dev/shm', PrivateSocketRoot: false });
  });

  it('refuses a login host that could reach a shell', () => {
    expect(refusal(BASE.replace('login.example.org', '"login;id"')).field).toBe('Network.SSH.LoginHost');
  });

  it('requires a known_hosts file unless the admin explicitly opts out of host key checks', () => {
    const err = refusal(BASE.replace('    KnownHostsFile: /secrets/known_hosts\n', ''));
    expect(err.field).toBe('Network.SSH.KnownHostsFile');
    expect(err.message).toContain('host keys are verified');
    const insecure = parseSiteConfigYaml(
      `${BASE.replace('    KnownHostsFile: /secrets/known_hosts\n', '')}    InsecureAcceptAnyHostKey: true\n`,
    );
    expect(insecure.Network.SSH.InsecureAcceptAnyHostKey).toBe(true);
  });

  it('refuses a duration longer than a timer can wait (24.8 days), naming the key', () => {
    const err = refusal(`${BASE}Backhaul:\n  PhaseTimeout: 25d\n`);
    expect(err.field).toBe('Backhaul.PhaseTimeout');
    expect(err.message).toContain('at most 24d');
    expect(err.message).toContain('"25d"');
    expect(refusal(`${BASE}    NodeWaitTimeout: 999999h\n`).field).toBe('Network.SSH.NodeWaitTimeout');
    expect(refusal(`${BASE}    ConnectTimeout: 100ms\n`).field).toBe('Network.SSH.ConnectTimeout');
    expect(refusal(`${BASE}    SlurmQueryTimeout: 0s\n`).field).toBe('Network.SSH.SlurmQueryTimeout');
    expect(parseSiteConfigYaml(`${BASE}Backhaul:\n  PhaseTimeout: 24d\n`).Backhaul.PhaseTimeout).toBe(24 * 86_400_000);
  });

  it('refuses missing sections and malformed YAML', () => {
    expect(refusal('').field).toBe('Network');
    expect(refusal('Network: [').message).toContain('not valid YAML');
    expect(refusal(`${BASE}    User: twice\n`).message).toContain('not valid YAML');
  });
});
