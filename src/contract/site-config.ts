import { parse as parseYaml } from 'yaml';
import { z } from 'zod';
import { duration } from './duration.js';
import { endpointPolicySchema } from './endpoint-policy.js';
import { InputError } from './input-error.js';
import { redisUrlProblem } from './redis-url.js';

/**
 * ARCHITECTURE.md, "Site configuration". The `Network.SSH` keys follow interLink's own configuration so site admins can reuse
 * theirs; `Backhaul` holds what only backhaul needs. Every object is strict: an unknown key stops
 * start-up with its path, because a typo in a security setting must not be silently ignored.
 */

const HOST_NAME =
  /^(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$/;
const IPV4 = /^(?:(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)$/;
/** Paths end up in shell commands on the login and compute nodes: keep them to a plain character set. */
const SAFE_PATH = /^\/[A-Za-z0-9._/+-]*$/;
const SOCKET_ROOT = /^\/(?:[A-Za-z0-9._/+-]|%u)*$/;
/** Network.SSH.Reverse.SocketRoot when the site gives none: the user's own dir in the node's /tmp. */
export const DEFAULT_SOCKET_ROOT = '/tmp/backhaul-%u';

/** The socket root a SocketRoot setting names for `user` (`%u` is the user). */
export function socketRootOf(setting: string, user: string): string {
  return setting.replaceAll('%u', user);
}
const SAFE_COMMAND = /^[A-Za-z0-9._/+-]+$/;
const POSIX_USER = /^[a-z_][a-z0-9_.-]{0,31}$/;

const port = z.number().int().min(1).max(65535);
const safePath = z.string().regex(SAFE_PATH, 'expected an absolute path of letters, digits and . _ / + -');
const hostName = z
  .string()
  .refine((h) => HOST_NAME.test(h) || IPV4.test(h), 'expected a DNS host name or an IPv4 address');

export const reverseSchema = z.strictObject({
  Enabled: z.boolean().default(false).describe('Reverse forwards are refused unless true.'),
  Sshd: z
    .enum(['node', 'userspace'])
    .default('node')
    .describe(
      "node: the compute node's own sshd allows unix-socket forwarding; userspace: a user-space `sshd -i` per carrier.",
    ),
  NodeExec: z
    .enum(['ssh', 'srun'])
    .default('ssh')
    .describe(
      'ssh: reach the node by ssh through the login node; srun: start the user-space sshd inside the job with `srun --overlap` (implies Sshd: userspace).',
    ),
  AllowNodeExecOverride: z
    .boolean()
    .default(false)
    .describe('Let pods choose ssh or srun with `interlink.eu/reverse-node-exec`.'),
  AllowSocks: z
    .boolean()
    .default(false)
    .describe(
      'Allow `interlink.eu/reverse-socks-port` (SOCKS5 through the relay; every destination still passes the endpoint policy).',
    ),
  SshdPath: safePath.default('/usr/sbin/sshd').describe('sshd on the compute nodes (user-space modes).'),
  PythonPath: z
    .string()
    .regex(SAFE_COMMAND, 'expected a command name or absolute path of letters, digits and . _ / + -')
    .default('python3')
    .describe('Python 3.6 or later on the compute nodes, for the relay.'),
  SocketRoot: z
    .string()
    .regex(SOCKET_ROOT, 'expected an absolute path of letters, digits and . _ / + -, with %u for the user')
    .default(DEFAULT_SOCKET_ROOT)
    .describe(
      "Where socket dirs are made on the node (socket paths must stay under 108 bytes). %u is Network.SSH.User: such a root is the user's own, made 0700 by the first job on a node, and refused when another user made it. A root without %u is shared (e.g. /tmp) and must be sticky.",
    ),
  NodeSshPort: port.default(22).describe("The node sshd's port."),
  WaitForForwards: duration()
    .prefault('10m')
    .describe('How long the prelude waits for the forwards before starting the workload anyway.'),
});

const sshFields = z.strictObject({
  LoginHost: hostName.describe('The login node: a DNS name or an IPv4 address.'),
  Port: port.default(22).describe('Its sshd port.'),
  User: z
    .string()
    .regex(POSIX_USER, 'expected a POSIX user name')
    .describe("The HPC user interLink submits jobs as (the jobs' user)."),
  KeyFile: z.string().min(1).describe('The private key of that user.'),
  KnownHostsFile: z
    .string()
    .min(1)
    .optional()
    .describe(
      'OpenSSH known_hosts with the login node and the compute nodes ([node]:port for a port other than 22; hashed entries, wildcards, ! and @revoked work). Required unless InsecureAcceptAnyHostKey.',
    ),
  InsecureAcceptAnyHostKey: z
    .boolean()
    .default(false)
    .describe('Only for throw-away test sites: accept any login host key when no known_hosts is given.'),
  NodeWaitTimeout: duration()
    .prefault('2h')
    .describe("How long a pod's job may stay pending before its session fails."),
  ConnectTimeout: duration(1000)
    .prefault('20s')
    .describe(
      "How long an SSH handshake with the login node or a batch host may take (at least 1s), as OpenSSH's ConnectTimeout.",
    ),
  SlurmQueryTimeout: duration(1000)
    .prefault('15s')
    .describe(
      'How long one squeue on the login node may take (at least 1s); after three failed attempts the lookup fails as slurm-unreachable and the pod waits without spending a launch.',
    ),
  Reverse: reverseSchema.prefault({}),
});

/** `%u` in SocketRoot becomes the user once, here: every consumer reads the path it names. */
export const sshSchema = sshFields.transform((ssh) => ({
  ...ssh,
  Reverse: {
    ...ssh.Reverse,
    SocketRoot: socketRootOf(ssh.Reverse.SocketRoot, ssh.User),
    /** The root is the user's own (it had `%u`): the job makes it 0700 and refuses one it does not own. */
    PrivateSocketRoot: ssh.Reverse.SocketRoot.includes('%u'),
  },
}));

/** Kubernetes object names (nodes, namespaces): DNS-1123 subdomains. */
const KUBE_NAME = /^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;
const KUBE_NAMESPACE = /^(?=.{1,63}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?$/;
/** A label selector as the API server takes it (`key=value`, `key!=value`, `key in (a,b)`, `!key`, …). */
const LABEL_SELECTOR = /^[A-Za-z0-9!=(),. _/-]+$/;

/** A label as `key=value`: an optional DNS prefix and `/`, a name, and a value (Kubernetes' own syntax). */
const NAMESPACE_LABEL =
  /^$|^(?:[a-z0-9]([-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?=(?:[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$/;

/** How the watch, webhook and Event roles reach the cluster (src/cluster, docs/OPERATING.md). */
export const kubernetesSchema = z.strictObject({
  Kubeconfig: z
    .string()
    .min(1)
    .optional()
    .describe(
      "A kubeconfig file for the watcher and the Event recorder outside a cluster; unset: the pod's service account.",
    ),
  Namespace: z
    .string()
    .regex(KUBE_NAMESPACE, 'expected a namespace name (DNS-1123 label)')
    .optional()
    .describe('Watch only this namespace; unset: every namespace.'),
  VirtualNodes: z
    .array(z.string().regex(KUBE_NAME, 'expected a node name (DNS-1123 subdomain)'))
    .default([])
    .refine((names) => new Set(names).size === names.length, 'node names repeat')
    .describe(
      'The interLink virtual nodes whose pods are served (one watch per node); empty: pods with reverse annotations on any node.',
    ),
  PodSelector: z
    .string()
    .regex(LABEL_SELECTOR, 'expected a label selector such as "app=train,tier!=test"')
    .optional()
    .describe('A label selector pods must also match, e.g. interlink.eu/offload=true.'),
  ResyncInterval: duration(1000)
    .prefault('5m')
    .describe('How often the watcher compares the live pods with the stored machines.'),
  NamespaceLabel: z
    .string()
    .regex(
      NAMESPACE_LABEL,
      'expected a label as key=value (e.g. interlink.eu/backhaul=enabled), or "" for every namespace',
    )
    .default('interlink.eu/backhaul=enabled')
    .describe(
      'Serve only pods of namespaces with this label (key=value), as the webhooks\' namespaceSelector admits them; "" serves every namespace. The watcher checks it and the control role refuses a machine no watcher checked.',
    ),
  NetworkPolicies: z
    .boolean()
    .default(true)
    .describe(
      "Refuse a forward the cluster's NetworkPolicies would refuse to a pod of the offloaded pod's namespace and labels (the fleet dials from its own namespace, where they do not apply), naming the policy.",
    ),
  RecordEvents: z
    .boolean()
    .default(true)
    .describe(
      "Record Events on the pods (forwards established, teardown, SOCKS, failures, a job killed without its trap, a relay that could not start, a tunnel shared with other namespaces' pods).",
    ),
  PodCondition: z
    .boolean()
    .default(true)
    .describe('Set the pod condition interlink.eu/ReverseForwardsReady (RBAC: pods/status patch).'),
  ReadinessGate: z
    .boolean()
    .default(false)
    .describe(
      'The webhook adds a readiness gate of that condition to pods with forwards: they are Ready only once their forwards are up.',
    ),
  Webhook: z
    .strictObject({
      Address: z.string().min(1).default('0.0.0.0').describe('Where the admission webhook listens (HTTPS).'),
      Port: port.default(8443).describe("The webhook's HTTPS port."),
      CertFile: z
        .string()
        .min(1)
        .default('/etc/backhaul/tls/tls.crt')
        .describe("The webhook's certificate, reloaded when it changes."),
      KeyFile: z
        .string()
        .min(1)
        .default('/etc/backhaul/tls/tls.key')
        .describe("The webhook's private key, reloaded when it changes."),
      ReloadInterval: duration(100)
        .prefault('30s')
        .describe('Backstop check of the certificate files (a change is normally noticed at once).'),
    })
    .prefault({}),
});

export const backhaulSchema = z.strictObject({
  Redis: z
    .strictObject({
      URL: z
        .string()
        .superRefine((url, ctx) => {
          const problem = redisUrlProblem(url);
          if (problem) ctx.addIssue({ code: 'custom', message: problem });
        })
        .default('redis://127.0.0.1:6379')
        .describe(
          "The fleet's Redis: redis://[user@]host[:port][/db], rediss:// (TLS), or redis+sentinel://host[:port][,host[:port]…]/master[/db] (rediss+sentinel:// for TLS): the sentinels, and the name of the master they monitor; the fleet follows a failover. A user name may be in it, the password better not (the ConfigMap is readable): REDIS_PASSWORD or PasswordFile, and REDIS_SENTINEL_PASSWORD for sentinels that require one. REDIS_URL overrides it.",
        ),
      PasswordFile: z
        .string()
        .min(1)
        .optional()
        .describe(
          'A file holding the Redis password (a mounted Secret), used when the URL has none; REDIS_PASSWORD, REDIS_PASSWORD_FILE and --redis-password-file come first.',
        ),
    })
    .prefault({}),
  SessionCapacity: z
    .number()
    .int()
    .min(1)
    .max(10_000)
    .default(200)
    .describe('Carriers (shadows whose jobs run) one session host holds; a shadow takes its slot once its job runs.'),
  PendingCapacity: z
    .number()
    .int()
    .min(0)
    .max(100_000)
    .default(2_000)
    .describe(
      "Shadows one session host holds while their jobs are pending, besides SessionCapacity: they hold no carrier, so pods waiting for their jobs never keep a running job's pod from its tunnel.",
    ),
  NamespaceCapacity: z
    .number()
    .int()
    .min(1)
    .max(10_000)
    .optional()
    .describe(
      'Carriers the pods of one namespace may hold on one session host (fairness between tenants); unset: SessionCapacity.',
    ),
  TunnelThreads: z
    .union([z.literal('auto'), z.number().int().min(0).max(64)], {
      error: 'expected "auto" or a number of threads from 0 to 64',
    })
    .default('auto')
    .describe(
      "Worker threads that carry a session host's tunnels (carrier, forwards, endpoint sockets), the least loaded taking each new shadow: auto is one per core, at most 8; 0 keeps everything on the session host's own thread.",
    ),
  TunnelLogin: z
    .enum(['per-thread', 'shared'], { error: 'expected "per-thread" or "shared"' })
    .default('per-thread')
    .describe(
      "Where tunnel threads get their login connections: per-thread (each its own; a tunnel's bytes never leave its thread) or shared (the session host's, through a unix socket; slower on 2 cores).",
    ),
  LoginMaxSessions: z
    .number()
    .int()
    .min(1)
    .max(1_000)
    .default(8)
    .describe("Exec channels per login connection; keep it below the login sshd's MaxSessions."),
  LeaseTTL: duration(1000)
    .prefault('5s')
    .describe("A shadow's lease; another session host takes the shadow over after it expires."),
  RetryLimit: z
    .number()
    .int()
    .min(1, 'expected at least 1 (the first launch counts)')
    .max(100)
    .default(5)
    .describe('Shadow launches in a row that may fail before the pod fails (the first launch counts).'),
  RetryBackoff: duration(100)
    .prefault('2s')
    .describe('The first wait between two shadow launches (it doubles up to RetryBackoffMax).'),
  RetryBackoffMax: duration(100).prefault('5m').describe('The longest wait between two shadow launches.'),
  PhaseTimeout: duration(1000)
    .prefault('2m')
    .describe('How long a shadow may take to come up, open its carrier or establish its forwards.'),
  HistoryTTL: duration(1000).prefault('7d').describe("How long a finished pod's history is kept."),
  KeepaliveInterval: duration(100)
    .prefault('2s')
    .describe(
      "SSH keepalive on every hop, sent only after an interval in which nothing arrived from that hop (as OpenSSH's ServerAliveInterval); a dead hop is noticed after three missed.",
    ),
  ChannelWindowMaxMiB: z
    .number()
    .int()
    .min(2)
    .max(512)
    .default(16)
    .describe(
      "The largest receive window (MiB) one forwarded connection advertises. Each is sized to the measured round trip to the node (400 MB/s × RTT, at least 2 MiB): a window below the path's bandwidth-delay product caps a stream at window / RTT.",
    ),
  ChannelWindowBudgetMiB: z
    .number()
    .int()
    .min(0)
    .max(65_536)
    .default(256)
    .describe(
      'Receive window (MiB) above 2 MiB that all forwarded connections of one session host may hold together (shared evenly among its tunnel threads): what a stalled reader can make the fleet buffer. Beyond it, connections get 2 MiB.',
    ),
  SocketCheckInterval: duration(100)
    .prefault('3s')
    .describe('How often the node checks that the socket dir and sockets still exist.'),
  JobCheckInterval: duration(1000)
    .prefault('15s')
    .describe(
      "How often squeue is asked, while a pod's forwards are held, whether its job still runs (a job killed before its trap leaves sockets the node's watch cannot tell from a live job's); one squeue per login connection per interval; at least 1s.",
    ),
  ClusterDomain: z.string().regex(HOST_NAME).default('cluster.local').describe("The cluster's DNS domain."),
  HostAliases: z
    .record(z.string().regex(HOST_NAME, 'expected a DNS host name'), z.string().regex(IPV4, 'expected an IPv4 address'))
    .default({})
    .describe(
      "Host name → IPv4 address, like a pod's hostAliases: the fleet dials a forward's endpoint (and a SOCKS target) at this address instead of resolving the name. For a fleet outside the cluster's DNS (the demo).",
    ),
  Kubernetes: kubernetesSchema.prefault({}),
  /** What pods may reach through their tunnels (src/contract/endpoint-policy.ts; docs/OPERATING.md "What a pod may reach"). */
  EndpointPolicy: endpointPolicySchema.prefault({}),
});

export const siteConfigSchema = z
  .strictObject({
    Network: z.strictObject({ SSH: sshSchema }),
    Backhaul: backhaulSchema.prefault({}),
  })
  .superRefine((cfg, ctx) => {
    const ssh = cfg.Network.SSH;
    if (!ssh.KnownHostsFile && !ssh.InsecureAcceptAnyHostKey) {
      ctx.addIssue({
        code: 'custom',
        path: ['Network', 'SSH', 'KnownHostsFile'],
        message:
          'required: host keys are verified; give a known_hosts file (or, for a throw-away test site only, InsecureAcceptAnyHostKey: true)',
      });
    }
  });

export type SiteConfig = z.output<typeof siteConfigSchema>;
export type ReverseConfig = SiteConfig['Network']['SSH']['Reverse'];
export type KubernetesConfig = SiteConfig['Backhaul']['Kubernetes'];

/** Validates already-parsed data (e.g. a ConfigMap value); throws InputError naming the key path. */
export function parseSiteConfig(data: unknown): SiteConfig {
  const result = siteConfigSchema.safeParse(data ?? {});
  if (result.success) return result.data;
  const issue = result.error.issues[0];
  if (!issue) throw new InputError('site configuration', 'invalid');
  if (issue.code === 'unrecognized_keys') {
    return unknownKey(issue.path, issue.keys[0] ?? '?');
  }
  throw new InputError(keyPath(issue.path), describeIssue(issue));
}

function unknownKey(path: PropertyKey[], key: string): never {
  const known = objectKeysAt(siteConfigSchema, path);
  throw new InputError(keyPath([...path, key]), 'unknown key', {
    accepted: known.length > 0 ? known.join(', ') : undefined,
  });
}

/** The keys the schema accepts at `path`, looking through defaults, pipes and refinements. */
function objectKeysAt(schema: z.ZodType, path: PropertyKey[]): string[] {
  let current: z.core.$ZodType | undefined = schema;
  for (const segment of [...path, undefined]) {
    // Unwrap wrappers (default, prefault, pipe) down to the object.
    for (let guard = 0; current && guard < 8; guard += 1) {
      const def = current._zod.def as { innerType?: z.core.$ZodType; in?: z.core.$ZodType };
      if (def.innerType) current = def.innerType;
      else if (def.in) current = def.in;
      else break;
    }
    if (!(current instanceof z.ZodObject)) return [];
    if (segment === undefined) return Object.keys(current.shape);
    current = current.shape[String(segment)] as z.core.$ZodType | undefined;
  }
  return [];
}

export function parseSiteConfigYaml(text: string, source = 'site configuration'): SiteConfig {
  let data: unknown;
  try {
    data = parseYaml(text, { prettyErrors: true, uniqueKeys: true });
  } catch (err) {
    throw new InputError(source, `not valid YAML: ${(err as Error).message}`);
  }
  return parseSiteConfig(data);
}

function keyPath(path: PropertyKey[]): string {
  return path.length > 0 ? path.map(String).join('.') : 'site configuration';
}

function describeIssue(issue: z.core.$ZodIssue): string {
  if (issue.code === 'invalid_type' && issue.message.endsWith('received undefined')) {
    return `required (expected ${issue.expected})`;
  }
  // A bad key of a map (HostAliases): say what the key should be, not only that it is invalid.
  if (issue.code === 'invalid_key') return issue.issues[0]?.message ?? issue.message;
  return issue.message;
}
