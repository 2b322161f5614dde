import { existsSync } from 'node:fs';
import { KubeConfig } from '@kubernetes/client-node';
import { InputError } from '../contract/input-error.js';
import type { KubernetesConfig } from '../contract/site-config.js';

/**
 * Every call backhaul makes to the Kubernetes API, by resource. This is the one place it is written
 * down: the watcher, the cluster gate and the Event recorder name their calls from it, and
 * deploy/base/rbac.yaml grants exactly these rules (test/unit/kube-manifests.test.ts compares the two).
 */
export const KUBE_API_ACCESS = {
  /**
   * The watcher lists and watches pods, and reads one pod to confirm it is gone before tearing down;
   * the cluster gate reads the pods behind a Service (their labels, for NetworkPolicies).
   */
  pods: ['get', 'list', 'watch'],
  /** The control role sets the interlink.eu/ReverseForwardsReady condition (Backhaul.Kubernetes.PodCondition). */
  'pods/status': ['patch'],
  /** The recorder creates Events and patches their count when they repeat. */
  events: ['create', 'patch'],
  /** The cluster gate: a pod's namespace carries the opt-in label; labels for namespaceSelectors. */
  namespaces: ['get'],
  /**
   * The cluster gate and the session role: the Service a forward names (its ClusterIP is what the fleet
   * dials), its ports and selector; the session role lists the fleet namespace's (never dialled).
   */
  services: ['get', 'list'],
  /** The cluster gate and the session role: the Service's endpoints and the pods behind them. */
  endpointslices: ['list'],
  /** The cluster gate: the policies of the pod's namespace and of the endpoints'. */
  networkpolicies: ['list'],
} as const;

/** The API group of each resource above (RBAC rules name it). */
export const KUBE_API_GROUP: Record<keyof typeof KUBE_API_ACCESS, string> = {
  pods: '',
  'pods/status': '',
  events: '',
  namespaces: '',
  services: '',
  endpointslices: 'discovery.k8s.io',
  networkpolicies: 'networking.k8s.io',
};

export type KubeResource = keyof typeof KUBE_API_ACCESS;
export type KubeVerb<R extends KubeResource> = (typeof KUBE_API_ACCESS)[R][number];
/** A call as `resource.verb`, e.g. `pods.watch`: only the pairs above type-check. */
export type KubeCall = { [R in KubeResource]: `${R}.${KubeVerb<R>}` }[KubeResource];

/** Names a call site by its RBAC rule (the string is checked at compile time against KUBE_API_ACCESS). */
export function kubeCall<C extends KubeCall>(call: C): C {
  return call;
}

const SERVICE_ACCOUNT_TOKEN = '/var/run/secrets/kubernetes.io/serviceaccount/token';

/**
 * The cluster to talk to: `Backhaul.Kubernetes.Kubeconfig` when set, else the pod's service account
 * when running in a cluster, else none (the roles that need a cluster refuse to start; Events are not
 * recorded).
 */
export function loadKubeConfig(cfg: Pick<KubernetesConfig, 'Kubeconfig'>, env = process.env): KubeConfig | undefined {
  const kc = new KubeConfig();
  if (cfg.Kubeconfig) {
    try {
      kc.loadFromFile(cfg.Kubeconfig);
    } catch (err) {
      throw new InputError(
        'Backhaul.Kubernetes.Kubeconfig',
        `cannot load ${cfg.Kubeconfig}: ${(err as Error).message}`,
      );
    }
    if (!kc.getCurrentCluster()) {
      throw new InputError('Backhaul.Kubernetes.Kubeconfig', `${cfg.Kubeconfig} has no current context with a cluster`);
    }
    return kc;
  }
  if (env.KUBERNETES_SERVICE_HOST && env.KUBERNETES_SERVICE_PORT && existsSync(SERVICE_ACCOUNT_TOKEN)) {
    kc.loadFromCluster();
    return kc;
  }
  return undefined;
}

/** The HTTP status of a failed API call (ApiException.code, or a watch's statusCode), if any. */
export function statusCodeOf(err: unknown): number | undefined {
  if (typeof err !== 'object' || err === null) return undefined;
  const e = err as { code?: unknown; statusCode?: unknown };
  if (typeof e.code === 'number') return e.code;
  if (typeof e.statusCode === 'number') return e.statusCode;
  return undefined;
}

/** A short description of a failed call for logs and Events, without the response headers. */
export function describeKubeError(err: unknown): string {
  const code = statusCodeOf(err);
  const body = (err as { body?: unknown } | null)?.body;
  let message: string | undefined;
  if (typeof body === 'string') {
    try {
      message = (JSON.parse(body) as { message?: string }).message;
    } catch {
      message = body.slice(0, 200);
    }
  } else if (body && typeof body === 'object') {
    message = (body as { message?: string }).message;
  }
  const base = message ?? (err as Error | null)?.message ?? String(err);
  return code === undefined ? base : `HTTP ${code}: ${base}`;
}

/** A read's value, or undefined when the object does not exist (404); other errors are thrown. */
export async function orNotFound<T>(call: Promise<T>): Promise<T | undefined> {
  try {
    return await call;
  } catch (err) {
    if (statusCodeOf(err) === 404) return undefined;
    throw err;
  }
}
