import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { isDeepStrictEqual } from 'node:util';
import {
  dumpYaml,
  loadAllYaml,
  type V1ClusterRole,
  type V1ClusterRoleBinding,
  type V1ConfigMap,
  type V1Container,
  type V1Deployment,
  type V1MutatingWebhookConfiguration,
  type V1Service,
  type V1ServiceAccount,
  type V1StatefulSet,
  type V1ValidatingWebhookConfiguration,
} from '@kubernetes/client-node';
import { describe, expect, it } from 'vitest';
import { parseAllDocuments } from 'yaml';
import { KUBE_API_ACCESS, KUBE_API_GROUP } from '../../src/cluster/kube-api.js';
import { parseSiteConfigYaml } from '../../src/contract/site-config.js';
import { DEPLOY, renderOverlayText, SITE_ADDRESSES } from '../fixtures/kustomize.js';

/** The bundled-redis overlay as a site renders it, its addresses set (test/fixtures/kustomize.ts). */
const OVERLAY = 'bundled-redis';

interface Loaded {
  file: string;
  raw: Record<string, unknown>;
  obj: { apiVersion?: string; kind?: string; metadata?: { name?: string; namespace?: string } };
}

const text = renderOverlayText(OVERLAY, SITE_ADDRESSES);
const raws = parseAllDocuments(text).map((d) => d.toJS() as Record<string, unknown>);
const loaded: Loaded[] = (loadAllYaml(text) as Loaded['obj'][]).map((obj, i) => ({
  file: `overlays/${OVERLAY}`,
  raw: raws[i] ?? {},
  obj,
}));

function find<T>(kind: string, name: string): T {
  const hit = loaded.find((l) => l.obj.kind === kind && l.obj.metadata?.name === name);
  if (!hit) throw new Error(`no ${kind} ${name} in deploy/overlays/${OVERLAY}`);
  return hit.obj as T;
}

const CORE_GROUPS =
  /^(v1|apps\/v1|policy\/v1|networking\.k8s\.io\/v1|rbac\.authorization\.k8s\.io\/v1|admissionregistration\.k8s\.io\/v1)$/;

describe('deploy/: every manifest loads with the client library', () => {
  it('finds the manifests', () => {
    const kinds = loaded.map((l) => l.obj.kind).sort();
    for (const kind of [
      'ClusterRole',
      'ClusterRoleBinding',
      'ConfigMap',
      'Deployment',
      'MutatingWebhookConfiguration',
      'Namespace',
      'Service',
      'ServiceAccount',
      'StatefulSet',
      'ValidatingWebhookConfiguration',
    ]) {
      expect(kinds).toContain(kind);
    }
  });

  it.each(
    loaded.map((l) => [`${l.file}: ${l.obj.kind} ${l.obj.metadata?.name}`, l] as const),
  )('%s loads with loadAllYaml, has a name, and has no field the API does not know', (_label, { obj, raw }) => {
    expect(obj.apiVersion).toBeTruthy();
    expect(obj.kind).toBeTruthy();
    expect(obj.metadata?.name).toBeTruthy();
    if (CORE_GROUPS.test(obj.apiVersion ?? '')) {
      // The typed object written back is the document: a misspelt field would have been dropped.
      const back = parseAllDocuments(dumpYaml(obj))[0]?.toJS();
      expect(isDeepStrictEqual(JSON.parse(JSON.stringify(back)), JSON.parse(JSON.stringify(raw)))).toBe(true);
    }
  });

  it("limits the fleet's egress: DNS, its Redis, other namespaces' pods, the login node's SSH and the API; never its own namespace at large nor metadata", () => {
    interface Peer {
      ipBlock?: { cidr: string; except?: string[] };
      namespaceSelector?: {
        matchLabels?: Record<string, string>;
        matchExpressions?: { key: string; operator: string; values?: string[] }[];
      };
      podSelector?: { matchLabels?: Record<string, string> };
    }
    type Policy = {
      metadata: { name: string };
      spec: {
        podSelector: { matchLabels: Record<string, string> };
        policyTypes: string[];
        egress?: { to: Peer[]; ports?: { port: number; protocol: string }[] }[];
      };
    };
    // NetworkPolicies add up: the fleet may reach what any policy selecting it allows.
    const policies = loaded
      .filter((l) => l.obj.kind === 'NetworkPolicy')
      .map((l) => l.obj as unknown as Policy)
      .filter((p) => p.spec.policyTypes.includes('Egress'));
    expect(policies.map((p) => p.metadata.name).sort()).toEqual([
      'backhaul-fleet-egress',
      'backhaul-fleet-egress-apiserver',
      'backhaul-fleet-egress-login',
      'backhaul-fleet-egress-redis',
    ]);
    for (const p of policies) {
      expect(p.spec.podSelector.matchLabels).toEqual({
        'app.kubernetes.io/name': 'backhaul',
        'app.kubernetes.io/component': 'fleet',
      });
      expect(p.spec.policyTypes).toEqual(['Egress']);
    }
    const policy = { spec: { egress: policies.flatMap((p) => p.spec.egress ?? []) } };
    const peers = policy.spec.egress.flatMap((rule) => rule.to.map((peer) => ({ peer, ports: rule.ports })));
    for (const { peer, ports } of peers) {
      if (peer.ipBlock) {
        // Addresses only with a port, and never a range that holds link-local (metadata) or loopback.
        expect(ports?.length, JSON.stringify(peer)).toBeGreaterThan(0);
        expect(peer.ipBlock.cidr.endsWith('/32'), peer.ipBlock.cidr).toBe(true);
        expect(peer.ipBlock.cidr.startsWith('169.254.') || peer.ipBlock.cidr.startsWith('127.')).toBe(false);
      } else if (!peer.namespaceSelector) {
        // A bare podSelector is this namespace: only the Redis, on its port.
        expect(peer.podSelector?.matchLabels?.['app.kubernetes.io/component']).toBe('redis');
        expect(ports).toEqual([{ port: 6379, protocol: 'TCP' }]);
      } else if (peer.namespaceSelector.matchExpressions) {
        expect(peer.namespaceSelector.matchExpressions).toEqual([
          { key: 'kubernetes.io/metadata.name', operator: 'NotIn', values: ['backhaul'] },
        ]);
      } else {
        expect(peer.namespaceSelector.matchLabels).toEqual({ 'kubernetes.io/metadata.name': 'kube-system' });
        expect(ports?.map((p) => p.port)).toEqual([53, 53]);
      }
    }
    const sshRule = policy.spec.egress.find((rule) => rule.ports?.some((p) => p.port === 22));
    expect(sshRule?.to[0]?.ipBlock?.cidr).toBe(SITE_ADDRESSES.loginNode);
    const apiRule = policy.spec.egress.find((rule) => rule.ports?.some((p) => p.port === 6443));
    expect(apiRule?.to[0]?.ipBlock?.cidr).toBe(SITE_ADDRESSES.apiServer);
  });

  it('lets only the API server reach the webhook and only the scraper the health port (issue 25, item 4)', () => {
    type Ingress = {
      _from: Array<{
        ipBlock?: { cidr: string; except?: string[] };
        namespaceSelector?: unknown;
        podSelector?: unknown;
      }>;
      ports: { port: number }[];
    };
    const ingressOf = (name: string) =>
      find<{
        spec: { podSelector: { matchLabels: Record<string, string> }; policyTypes: string[]; ingress: Ingress[] };
      }>('NetworkPolicy', name).spec;
    const webhook = ingressOf('backhaul-webhook-ingress');
    expect(webhook.policyTypes).toEqual(['Ingress']);
    expect(webhook.podSelector.matchLabels['app.kubernetes.io/component']).toBe('webhook');
    // No pod at all: an address range (the API server's), on the webhook's port only.
    // (the client library names `from` `_from`)
    expect(webhook.ingress.flatMap((rule) => rule._from.map((peer) => Object.keys(peer)))).toEqual([['ipBlock']]);
    expect(webhook.ingress.flatMap((rule) => rule.ports.map((p) => p.port))).toEqual([8443]);
    // The pod network is left out (a wrong value fails open: the API server is never kept out).
    expect(webhook.ingress[0]?._from[0]?.ipBlock).toEqual({ cidr: '0.0.0.0/0', except: [SITE_ADDRESSES.podNetwork] });
    const fleet = ingressOf('backhaul-fleet-ingress');
    expect(fleet.podSelector.matchLabels['app.kubernetes.io/component']).toBe('fleet');
    expect(fleet.ingress).toEqual([
      {
        _from: [{ namespaceSelector: { matchLabels: { 'kubernetes.io/metadata.name': 'monitoring' } } }],
        ports: [{ port: 8081, protocol: 'TCP' }],
      },
    ]);
    // Every port the two Deployments open is one of these.
    for (const [deployment, ports] of [
      ['backhaul-webhook', [8443]],
      ['backhaul-fleet', [8081]],
    ] as const) {
      const opened = find<V1Deployment>('Deployment', deployment).spec?.template.spec?.containers.flatMap((c) =>
        (c.ports ?? []).map((p) => p.containerPort),
      );
      expect(opened).toEqual(ports);
    }
  });

  it('puts every namespaced object in the backhaul namespace', () => {
    const clusterScoped = new Set([
      'Namespace',
      'ClusterRole',
      'ClusterRoleBinding',
      'MutatingWebhookConfiguration',
      'ValidatingWebhookConfiguration',
      'Kustomization',
    ]);
    for (const { obj } of loaded) {
      if (clusterScoped.has(obj.kind ?? '')) continue;
      expect(obj.metadata?.namespace, `${obj.kind} ${obj.metadata?.name}`).toBe('backhaul');
    }
  });

  it('leaves nothing of the site-addresses ConfigMap in what is applied (it is local configuration)', () => {
    expect(loaded.filter((l) => l.obj.metadata?.name === 'backhaul-site-addresses')).toEqual([]);
  });
});

describe('deploy/: RBAC is exactly what the code calls', () => {
  const roles = loaded.filter((l) => l.obj.kind === 'ClusterRole' || l.obj.kind === 'Role');

  it('grants the fleet exactly KUBE_API_ACCESS, each in its API group, without wildcards', () => {
    expect(roles).toHaveLength(1);
    const role = find<V1ClusterRole>('ClusterRole', 'backhaul-fleet');
    const granted = new Set<string>();
    for (const rule of role.rules ?? []) {
      expect(rule.apiGroups, JSON.stringify(rule)).toHaveLength(1);
      expect(rule.resourceNames).toBeUndefined();
      expect(rule.nonResourceURLs).toBeUndefined();
      for (const resource of rule.resources ?? []) {
        for (const verb of rule.verbs) {
          expect(resource).not.toBe('*');
          expect(verb).not.toBe('*');
          granted.add(`${rule.apiGroups?.[0]}/${resource}.${verb}`);
        }
      }
    }
    const used = new Set(
      Object.entries(KUBE_API_ACCESS).flatMap(([resource, verbs]) =>
        verbs.map((v) => `${KUBE_API_GROUP[resource as keyof typeof KUBE_API_ACCESS]}/${resource}.${v}`),
      ),
    );
    expect([...granted].sort()).toEqual([...used].sort());
  });

  it('binds it to the fleet only; the webhook has no role and no token', () => {
    const binding = find<V1ClusterRoleBinding>('ClusterRoleBinding', 'backhaul-fleet');
    expect(binding.roleRef).toMatchObject({ kind: 'ClusterRole', name: 'backhaul-fleet' });
    expect(binding.subjects).toEqual([{ kind: 'ServiceAccount', name: 'backhaul-fleet', namespace: 'backhaul' }]);
    expect(loaded.filter((l) => /RoleBinding$/.test(l.obj.kind ?? ''))).toHaveLength(1);
    expect(find<V1ServiceAccount>('ServiceAccount', 'backhaul-webhook').automountServiceAccountToken).toBe(false);
    const webhook = find<V1Deployment>('Deployment', 'backhaul-webhook');
    expect(webhook.spec?.template.spec?.serviceAccountName).toBe('backhaul-webhook');
    expect(webhook.spec?.template.spec?.automountServiceAccountToken).toBe(false);
    expect(find<V1Deployment>('Deployment', 'backhaul-fleet').spec?.template.spec?.serviceAccountName).toBe(
      'backhaul-fleet',
    );
  });
});

function container(deployment: V1Deployment | V1StatefulSet): V1Container {
  const c = deployment.spec?.template.spec?.containers[0];
  if (!c) throw new Error('no container');
  return c;
}

function mountOf(c: V1Container, volume: string): string {
  const mount = c.volumeMounts?.find((m) => m.name === volume);
  if (!mount) throw new Error(`no mount of ${volume}`);
  return mount.mountPath;
}

describe('deploy/: the workloads', () => {
  const site = find<V1ConfigMap>('ConfigMap', 'backhaul-site');
  const config = parseSiteConfigYaml(site.data?.['site.yaml'] ?? '', 'deploy/base/site-config.yaml');

  it('ships a site configuration that parses, uses the cluster itself, and names the virtual nodes', () => {
    expect(config.Backhaul.Kubernetes.Kubeconfig).toBeUndefined();
    expect(config.Backhaul.Kubernetes.VirtualNodes.length).toBeGreaterThan(0);
    expect(config.Network.SSH.KnownHostsFile).toBeTruthy();
    expect(config.Network.SSH.InsecureAcceptAnyHostKey).toBe(false);
  });

  it('runs the fleet with its roles, probes, resources, graceful stop and the SSH Secret where the config says', () => {
    const fleet = find<V1Deployment>('Deployment', 'backhaul-fleet');
    const pod = fleet.spec?.template.spec;
    const c = container(fleet);
    const args = c.args ?? [];
    expect(args[0]).toBe('worker');
    expect(args[args.indexOf('--roles') + 1]?.split(',').sort()).toEqual(['control', 'session', 'watch']);
    const healthPort = Number(args[args.indexOf('--health-port') + 1]);
    expect(c.ports?.find((p) => p.name === 'health')?.containerPort).toBe(healthPort);
    expect(c.livenessProbe?.httpGet).toMatchObject({ path: '/livez', port: 'health' });
    expect(c.readinessProbe?.httpGet).toMatchObject({ path: '/readyz', port: 'health' });
    expect(c.resources?.requests).toBeDefined();
    expect(c.resources?.limits?.memory).toBeDefined();
    expect(pod?.terminationGracePeriodSeconds).toBeGreaterThanOrEqual(30);
    expect(c.env?.find((e) => e.name === 'BACKHAUL_CONFIG')?.value).toBe(`${mountOf(c, 'config')}/site.yaml`);
    expect(c.env?.find((e) => e.name === 'REDIS_URL')?.valueFrom?.secretKeyRef).toMatchObject({
      name: 'backhaul-redis',
      key: 'url',
    });
    const ssh = mountOf(c, 'ssh');
    const secret = pod?.volumes?.find((v) => v.name === 'ssh')?.secret;
    expect(secret?.secretName).toBe('backhaul-ssh');
    expect(secret?.defaultMode).toBe(0o440);
    const files = (secret?.items ?? []).map((i) => `${ssh}/${i.path}`);
    expect(files).toContain(config.Network.SSH.KeyFile);
    expect(files).toContain(config.Network.SSH.KnownHostsFile);
  });

  it('runs the webhook with its certificate where the config says, probed over HTTPS', () => {
    const webhook = find<V1Deployment>('Deployment', 'backhaul-webhook');
    const c = container(webhook);
    expect(c.args).toEqual(['worker', '--roles', 'webhook']);
    const https = c.ports?.find((p) => p.name === 'https');
    expect(https?.containerPort).toBe(config.Backhaul.Kubernetes.Webhook.Port);
    expect(c.readinessProbe?.httpGet).toMatchObject({ scheme: 'HTTPS', port: 'https' });
    expect(c.livenessProbe?.httpGet).toMatchObject({ scheme: 'HTTPS', port: 'https' });
    const tls = mountOf(c, 'tls');
    expect(config.Backhaul.Kubernetes.Webhook.CertFile).toBe(`${tls}/tls.crt`);
    expect(config.Backhaul.Kubernetes.Webhook.KeyFile).toBe(`${tls}/tls.key`);
    expect(webhook.spec?.template.spec?.volumes?.find((v) => v.name === 'tls')?.secret?.secretName).toBe(
      'backhaul-webhook-tls',
    );
    const service = find<V1Service>('Service', 'backhaul-webhook');
    expect(service.spec?.selector).toEqual(webhook.spec?.selector?.matchLabels);
    expect(service.spec?.ports?.[0]).toMatchObject({ port: 443, targetPort: 'https' });
  });

  it('runs every container unprivileged', () => {
    for (const kind of ['Deployment', 'StatefulSet']) {
      for (const { obj } of loaded.filter((l) => l.obj.kind === kind)) {
        const workload = obj as V1Deployment;
        const pod = workload.spec?.template.spec;
        expect(pod?.securityContext?.runAsNonRoot).toBe(true);
        for (const c of pod?.containers ?? []) {
          expect(c.securityContext).toMatchObject({
            allowPrivilegeEscalation: false,
            readOnlyRootFilesystem: true,
            capabilities: { drop: ['ALL'] },
          });
        }
      }
    }
  });
});

describe('deploy/: the admission webhook configurations', () => {
  const mutating = find<V1MutatingWebhookConfiguration>('MutatingWebhookConfiguration', 'backhaul');
  const validating = find<V1ValidatingWebhookConfiguration>('ValidatingWebhookConfiguration', 'backhaul');
  const service = find<V1Service>('Service', 'backhaul-webhook');

  it.each([
    ['mutating', mutating.webhooks?.[0], '/mutate'],
    ['validating', validating.webhooks?.[0], '/validate'],
  ])('%s: v1 reviews, no side effects, fails closed, bounded timeout, pods, opt-in namespaces', (_n, hook, path) => {
    expect(hook?.admissionReviewVersions).toEqual(['v1']);
    expect(hook?.sideEffects).toBe('None');
    expect(hook?.failurePolicy).toBe('Fail');
    expect(hook?.timeoutSeconds).toBeGreaterThan(0);
    expect(hook?.timeoutSeconds).toBeLessThanOrEqual(10);
    expect(hook?.clientConfig.service).toEqual({
      namespace: service.metadata?.namespace,
      name: service.metadata?.name,
      path,
      port: service.spec?.ports?.[0]?.port,
    });
    // Mutation on CREATE only (the prelude is rendered once); validation also on UPDATE (it stays fixed).
    const operations = path === '/mutate' ? ['CREATE'] : ['CREATE', 'UPDATE'];
    expect(hook?.rules).toEqual([
      { operations, apiGroups: [''], apiVersions: ['v1'], resources: ['pods'], scope: 'Namespaced' },
    ]);
    expect(hook?.namespaceSelector?.matchLabels).toEqual({ 'interlink.eu/backhaul': 'enabled' });
    // backhaul's own namespace never waits for the webhook; no label a tenant can set skips it.
    expect(hook?.namespaceSelector?.matchExpressions).toEqual([
      { key: 'kubernetes.io/metadata.name', operator: 'NotIn', values: ['backhaul'] },
    ]);
    expect(hook?.objectSelector).toBeUndefined();
  });

  it('reinvokes the mutation if a later webhook changes the pod (the patch is idempotent)', () => {
    expect(mutating.webhooks?.[0]?.reinvocationPolicy).toBe('IfNeeded');
  });

  it('refuses reverse forwards in the other namespaces, without ever blocking their other pods', () => {
    const refusing = find<V1ValidatingWebhookConfiguration>('ValidatingWebhookConfiguration', 'backhaul-not-enabled');
    const [hook, ...more] = refusing.webhooks ?? [];
    expect(more).toEqual([]);
    expect(hook?.clientConfig.service?.path).toBe('/validate-not-enabled');
    expect(hook?.clientConfig.service?.name).toBe(service.metadata?.name);
    // The complement of the other webhooks' namespaceSelector: NotIn also matches a missing label.
    expect(hook?.namespaceSelector).toEqual({
      matchExpressions: [
        { key: 'interlink.eu/backhaul', operator: 'NotIn', values: ['enabled'] },
        { key: 'kubernetes.io/metadata.name', operator: 'NotIn', values: ['backhaul'] },
      ],
    });
    expect(hook?.objectSelector).toBeUndefined();
    expect(hook?.failurePolicy).toBe('Ignore');
    expect(hook?.sideEffects).toBe('None');
    expect(hook?.rules).toEqual([
      { operations: ['CREATE'], apiGroups: [''], apiVersions: ['v1'], resources: ['pods'], scope: 'Namespaced' },
    ]);
    expect(hook?.matchConditions?.map((c) => c.expression)).toEqual([
      "has(object.metadata.annotations) && object.metadata.annotations.exists(k, k.startsWith('interlink.eu/reverse-'))",
    ]);
  });
});

describe('deploy/: Redis', () => {
  /** Directive → value lines of a redis.conf, comments dropped. */
  function directives(text: string): Map<string, string> {
    const map = new Map<string, string>();
    for (const line of text.split('\n')) {
      const trimmed = line.trim();
      if (!trimmed || trimmed.startsWith('#')) continue;
      const [key = '', ...rest] = trimmed.split(/\s+/);
      map.set(key, rest.join(' '));
    }
    return map;
  }

  it('runs with the production settings of redis/redis.conf (only the listening address differs)', () => {
    const shipped = directives(readFileSync(join(DEPLOY, '../redis/redis.conf'), 'utf8'));
    const inCluster = directives(find<V1ConfigMap>('ConfigMap', 'backhaul-redis-config').data?.['redis.conf'] ?? '');
    expect(inCluster.get('bind')).toBe('* -::*');
    shipped.delete('bind');
    inCluster.delete('bind');
    expect(Object.fromEntries(inCluster)).toEqual(Object.fromEntries(shipped));
    expect(inCluster.get('appendonly')).toBe('yes');
    expect(inCluster.get('maxmemory-policy')).toBe('noeviction');
  });

  it('keeps its data on a volume where redis.conf puts it, with a password from the Secret', () => {
    const redis = find<V1StatefulSet>('StatefulSet', 'backhaul-redis');
    const c = container(redis);
    const conf = directives(find<V1ConfigMap>('ConfigMap', 'backhaul-redis-config').data?.['redis.conf'] ?? '');
    expect(mountOf(c, 'data')).toBe(conf.get('dir'));
    expect(redis.spec?.volumeClaimTemplates?.[0]?.metadata?.name).toBe('data');
    expect(c.args).toContain('--requirepass');
    expect(c.env?.find((e) => e.name === 'REDIS_PASSWORD')?.valueFrom?.secretKeyRef?.name).toBe('backhaul-redis');
  });
});
