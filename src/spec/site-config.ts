import { parse as parseYaml } from 'yaml';
import { z } from 'zod';
import { duration } from './duration.js';
import { endpointPolicySchema } from './endpoint-policy.js';
import { SpecError } from './spec-error.js';

/**
 * ARCHITECTURE.md §3.2. The `Network.SSH` keys follow interLink's own configuration so site admins can reuse
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
  Enabled: z.boolean().default(false),
  Sshd: z.enum(['node', 'userspace']).default('node'),
  NodeExec: z.enum(['ssh', 'srun']).default('ssh'),
  /** Whether a pod may choose its own NodeExec with `interlink.eu/reverse-node-exec`. */
  AllowNodeExecOverride: z.boolean().default(false),
  AllowSocks: z.boolean().default(false),
  SshdPath: safePath.default('/usr/sbin/sshd'),
  PythonPath: z
    .string()
    .regex(SAFE_COMMAND, 'expected a command name or absolute path of letters, digits and . _ / + -')
    .default('python3'),
  /**
   * Where the pods' socket dirs go on the compute nodes. `%u` stands for Network.SSH.User: such a root
   * is the user's own, made 0700 by the job (nobody else can make or take a socket dir in it); a root
   * without `%u` is shared and must be sticky like /tmp.
   */
  SocketRoot: z
    .string()
    .regex(SOCKET_ROOT, 'expected an absolute path of letters, digits and . _ / + -, with %u for the user')
    .default(DEFAULT_SOCKET_ROOT),
  NodeSshPort: port.default(22),
  WaitForForwards: duration().prefault('10m'),
});

const sshFields = z.strictObject({
  LoginHost: hostName,
  Port: port.default(22),
  User: z.string().regex(POSIX_USER, 'expected a POSIX user name'),
  KeyFile: z.string().min(1),
  KnownHostsFile: z.string().min(1).optional(),
  /** Only for throw-away test sites: accept any login host key. Never the default. */
  InsecureAcceptAnyHostKey: z.boolean().default(false),
  NodeWaitTimeout: duration().prefault('2h'),
  /** How long an SSH handshake (login node, batch host) may take before the attempt fails, as OpenSSH's ConnectTimeout. */
  ConnectTimeout: duration(1000).prefault('20s'),
  /**
   * How long one `squeue` on the login node may take before the attempt counts as failed (three attempts,
   * then the lookup fails: slurm-unreachable). Raise it where slurmctld answers slowly under load.
   */
  SlurmQueryTimeout: duration(1000).prefault('15s'),
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

/** How the watch, webhook and Event roles reach the cluster (src/cluster, deploy/README.md). */
export const kubernetesSchema = z.strictObject({
  /** A kubeconfig file; without it, the pod's service account when running in a cluster. */
  Kubeconfig: z.string().min(1).optional(),
  /** Watch pods of this namespace only (default: every namespace). */
  Namespace: z.string().regex(KUBE_NAMESPACE, 'expected a namespace name (DNS-1123 label)').optional(),
  /** interLink virtual nodes whose pods are served; empty: pods with reverse annotations on any node. */
  VirtualNodes: z
    .array(z.string().regex(KUBE_NAME, 'expected a node name (DNS-1123 subdomain)'))
    .default([])
    .refine((names) => new Set(names).size === names.length, 'node names repeat'),
  /** Serve only pods matching this label selector (default: every pod with reverse annotations). */
  PodSelector: z.string().regex(LABEL_SELECTOR, 'expected a label selector such as "app=train,tier!=test"').optional(),
  /** How often the watcher compares the pods it sees with the machines in Redis. */
  ResyncInterval: duration(1000).prefault('5m'),
  /**
   * Serve only pods of namespaces with this label (`key=value`), as the webhook's namespaceSelector
   * admits them; "" serves every namespace. The watch role checks it and stamps its verdict on what
   * it sends; the validate step refuses a pod without that verdict (src/spec/cluster-verdict.ts).
   */
  NamespaceLabel: z
    .string()
    .regex(
      NAMESPACE_LABEL,
      'expected a label as key=value (e.g. interlink.eu/backhaul=enabled), or "" for every namespace',
    )
    .default('interlink.eu/backhaul=enabled'),
  /**
   * Refuse a forward that the cluster's NetworkPolicies would refuse to a pod of the offloaded pod's
   * namespace and labels (src/cluster/network-policy-eval.ts): the fleet dials from its own namespace,
   * where those policies do not apply.
   */
  NetworkPolicies: z.boolean().default(true),
  /** Record Kubernetes Events on pods for the control role's transitions (needs a cluster). */
  RecordEvents: z.boolean().default(true),
  /**
   * Set the pod condition `interlink.eu/ReverseForwardsReady` (True once the forwards are up) from the
   * control role's transitions; the watch role puts it back if something else drops it. RBAC: pods/status patch.
   */
  PodCondition: z.boolean().default(true),
  /**
   * The mutating webhook adds a readiness gate of that condition to the pods it admits: such a pod is
   * Ready (in its Services' endpoints, `kubectl wait --for=condition=Ready`) only once its forwards are up.
   */
  ReadinessGate: z.boolean().default(false),
  Webhook: z
    .strictObject({
      Address: z.string().min(1).default('0.0.0.0'),
      Port: port.default(8443),
      CertFile: z.string().min(1).default('/etc/backhaul/tls/tls.crt'),
      KeyFile: z.string().min(1).default('/etc/backhaul/tls/tls.key'),
      /** How often the certificate files are checked for a change (a change is also noticed at once). */
      ReloadInterval: duration(100).prefault('30s'),
    })
    .prefault({}),
});

export const backhaulSchema = z.strictObject({
  Redis: z
    .strictObject({
      /** redis:// or rediss:// (TLS); a user name may be in it, a password better not (it is in a ConfigMap). */
      URL: z.string().url().default('redis://127.0.0.1:6379'),
      /** A file holding the password (a mounted Secret); used when the URL has none. */
      PasswordFile: z.string().min(1).optional(),
    })
    .prefault({}),
  /** Carriers (shadows whose jobs run) one session host holds at once. */
  SessionCapacity: z.number().int().min(1).max(10_000).default(200),
  /**
   * Shadows one session host holds while their jobs are pending, besides SessionCapacity: they hold no
   * carrier, only a share of one batched squeue, so pods waiting for their jobs never keep a running
   * job's pod from its tunnel.
   */
  PendingCapacity: z.number().int().min(0).max(100_000).default(2_000),
  /** Carriers one namespace may hold on one session host (fairness between tenants); default SessionCapacity. */
  NamespaceCapacity: z.number().int().min(1).max(10_000).optional(),
  /**
   * Worker threads that carry a session host's tunnels: carriers, forwards, endpoint sockets ("auto":
   * one per core, at most 8; 0: all on the session host's own thread). docs/PERFORMANCE.md "Many cores".
   */
  TunnelThreads: z
    .union([z.literal('auto'), z.number().int().min(0).max(64)], {
      error: 'expected "auto" or a number of threads from 0 to 64',
    })
    .default('auto'),
  /**
   * Where tunnel threads get their login connections: "per-thread" (each its own: a tunnel's bytes
   * never leave its thread) or "shared" (the session host's, through a unix socket: a tunnel's two SSH
   * layers on two threads, which costs a copy; measured slower on 2 cores).
   */
  TunnelLogin: z.enum(['per-thread', 'shared'], { error: 'expected "per-thread" or "shared"' }).default('per-thread'),
  /** Carriers sharing one login connection; stay below the login sshd's MaxSessions. */
  LoginMaxSessions: z.number().int().min(1).max(1_000).default(8),
  LeaseTTL: duration(1000).prefault('5s'),
  /** Shadow launches in a row that may fail before the pod fails (the first launch counts: at least 1). */
  RetryLimit: z.number().int().min(1, 'expected at least 1 (the first launch counts)').max(100).default(5),
  RetryBackoff: duration(100).prefault('2s'),
  /** The longest wait between two shadow launches (the backoff doubles up to it). */
  RetryBackoffMax: duration(100).prefault('5m'),
  /** How long a shadow may take to come up, open its carrier or establish its forwards. */
  PhaseTimeout: duration(1000).prefault('2m'),
  /** How long a forgotten pod's history is kept. */
  HistoryTTL: duration(1000).prefault('7d'),
  KeepaliveInterval: duration(100).prefault('2s'),
  /**
   * The largest receive window (MiB) one forwarded connection advertises. Each is sized to the measured
   * round trip to the node (400 MB/s × RTT, at least ssh2's 2 MiB): a window smaller than the path's
   * bandwidth-delay product caps a stream at window / RTT (2 MiB at 20 ms: 105 MB/s).
   */
  ChannelWindowMaxMiB: z.number().int().min(2).max(512).default(16),
  /**
   * Receive window (MiB) above 2 MiB that all forwarded connections of one session host may hold
   * together (shared out evenly among its tunnel threads): a window is what a stalled reader can make the
   * fleet buffer. Beyond it, connections get 2 MiB, as before tuning.
   */
  ChannelWindowBudgetMiB: z.number().int().min(0).max(65_536).default(256),
  SocketCheckInterval: duration(100).prefault('3s'),
  /**
   * How often squeue is asked, while a pod's forwards are held, whether its job still runs: a job killed
   * before its trap (SIGKILL, the OOM killer) leaves its sockets, which the node's watch cannot tell from
   * a live job's. One squeue per login connection per interval, whatever the number of pods.
   */
  JobCheckInterval: duration(1000).prefault('15s'),
  ClusterDomain: z.string().regex(HOST_NAME).default('cluster.local'),
  /**
   * Like a pod's `hostAliases` in Kubernetes: host name → IPv4 address, looked up (case-insensitively)
   * before the fleet dials a forward's endpoint, instead of DNS. For a fleet outside the cluster's DNS
   * (the demo, a test site); empty by default.
   */
  HostAliases: z
    .record(z.string().regex(HOST_NAME, 'expected a DNS host name'), z.string().regex(IPV4, 'expected an IPv4 address'))
    .default({}),
  Kubernetes: kubernetesSchema.prefault({}),
  /** What pods may reach through their tunnels (src/spec/endpoint-policy.ts; README "Endpoint policy"). */
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

/** Validates already-parsed data (e.g. a ConfigMap value); throws SpecError naming the key path. */
export function parseSiteConfig(data: unknown): SiteConfig {
  const result = siteConfigSchema.safeParse(data ?? {});
  if (result.success) return result.data;
  const issue = result.error.issues[0];
  if (!issue) throw new SpecError('site configuration', 'invalid');
  if (issue.code === 'unrecognized_keys') {
    return unknownKey(issue.path, issue.keys[0] ?? '?');
  }
  throw new SpecError(keyPath(issue.path), describeIssue(issue));
}

function unknownKey(path: PropertyKey[], key: string): never {
  const known = objectKeysAt(siteConfigSchema, path);
  throw new SpecError(keyPath([...path, key]), 'unknown key', {
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
    throw new SpecError(source, `not valid YAML: ${(err as Error).message}`);
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
