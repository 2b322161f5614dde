import { readdirSync, readFileSync } from 'node:fs';
import { join, relative } from 'node:path';
import { describe, expect, it } from 'vitest';
import { parseAllDocuments } from 'yaml';
import {
  DEPLOY,
  invalidAddressBlocks,
  OVERLAYS,
  type RenderedObject,
  renderOverlay,
  SITE_ADDRESSES,
  siteAddressKeys,
} from '../fixtures/kustomize.js';
import { problemsOf } from '../fixtures/promql-check.js';

/**
 * deploy/ as kustomize base, components and overlays (`kubectl kustomize` renders each, as
 * `kubectl apply -k` would): the site's addresses are set in one file per overlay and land where the
 * NetworkPolicies need them; an address left at its placeholder makes the API server refuse the policy
 * that needs it (an invalid CIDR), never applies silently wrong; the monitoring objects and the
 * certificate components fit the fleet they watch and serve.
 */

function of(objects: readonly RenderedObject[], kind: string, name: string): RenderedObject {
  const hit = objects.find((o) => o.kind === kind && o.metadata.name === name);
  if (!hit) throw new Error(`no ${kind} ${name} in ${objects.map((o) => `${o.kind}/${o.metadata.name}`).join(' ')}`);
  return hit;
}

function pick(obj: unknown, path: string): unknown {
  return path.split('.').reduce<unknown>((at, key) => (at as Record<string, unknown> | undefined)?.[key], obj);
}

const rendered = new Map(OVERLAYS.map((o) => [o, renderOverlay(o, SITE_ADDRESSES)] as const));
function overlay(name: string): RenderedObject[] {
  const objects = rendered.get(name);
  if (!objects) throw new Error(`no overlay ${name}: ${OVERLAYS.join(', ')}`);
  return objects;
}

describe('deploy/overlays: every overlay renders, with the site addresses set in one place', () => {
  it('has the overlays the docs name', () => {
    expect(OVERLAYS).toEqual(['bundled-redis', 'external-redis']);
  });

  it.each(OVERLAYS)('%s: as shipped, every address the site must set is refused by name', (name) => {
    const problems = invalidAddressBlocks(renderOverlay(name));
    const keys = siteAddressKeys(name);
    expect(keys.length).toBeGreaterThanOrEqual(3);
    // One refusal per key, each naming the placeholder of the key (SET-…) and the field it lands in.
    expect(problems, problems.join('\n')).toHaveLength(keys.length);
    for (const line of problems) expect(line).toMatch(/^NetworkPolicy backhaul-[a-z-]+: spec\.\S+: "SET-[A-Z-]+/);
  });

  it.each(
    OVERLAYS.flatMap((o) => siteAddressKeys(o).map((k) => [o, k] as const)),
  )('%s: leaving only %s unset is refused', (name, key) => {
    const others = Object.fromEntries(Object.entries(SITE_ADDRESSES).filter(([k]) => k !== key));
    const problems = invalidAddressBlocks(renderOverlay(name, others));
    expect(problems, problems.join('\n')).toHaveLength(1);
  });

  it.each(OVERLAYS)('%s: with the addresses set, nothing is refused and each lands where it is needed', (name) => {
    const objects = overlay(name);
    expect(invalidAddressBlocks(objects)).toEqual([]);
    const cidr = (policy: string, path: string) => pick(of(objects, 'NetworkPolicy', policy), path);
    expect(cidr('backhaul-fleet-egress-login', 'spec.egress.0.to.0.ipBlock.cidr')).toBe(SITE_ADDRESSES.loginNode);
    expect(cidr('backhaul-fleet-egress-apiserver', 'spec.egress.0.to.0.ipBlock.cidr')).toBe(SITE_ADDRESSES.apiServer);
    expect(cidr('backhaul-webhook-ingress', 'spec.ingress.0.from.0.ipBlock.except')).toEqual([
      SITE_ADDRESSES.podNetwork,
    ]);
    expect(objects.filter((o) => o.metadata.name === 'backhaul-site-addresses')).toEqual([]);
  });

  it('reaches every object under deploy/ from some overlay (no file is left out)', () => {
    const files = (function walk(dir: string): string[] {
      return readdirSync(dir, { withFileTypes: true }).flatMap((e) =>
        e.isDirectory() ? walk(join(dir, e.name)) : /\.ya?ml$/.test(e.name) ? [join(dir, e.name)] : [],
      );
    })(DEPLOY).filter((f) => !/kustomization\.yaml$|site-addresses\.yaml$/.test(f));
    const reached = new Set([...rendered.values()].flat().map((o) => `${o.kind}/${o.metadata.name}`));
    const missing = files.flatMap((file) =>
      parseAllDocuments(readFileSync(file, 'utf8'))
        .map((d) => d.toJS() as RenderedObject)
        .map((o) => `${o.kind}/${o.metadata.name}`)
        .filter((id) => !reached.has(id))
        .map((id) => `${relative(DEPLOY, file)}: ${id}`),
    );
    expect(missing).toEqual([]);
  });
});

describe('deploy/overlays: Redis, bundled or the site’s', () => {
  it('bundled: a StatefulSet kept by a PDB that selects its pods, reachable by the fleet', () => {
    const objects = overlay('bundled-redis');
    const redis = of(objects, 'StatefulSet', 'backhaul-redis');
    const pdb = of(objects, 'PodDisruptionBudget', 'backhaul-redis');
    expect(pick(pdb, 'spec.selector.matchLabels')).toEqual(pick(redis, 'spec.selector.matchLabels'));
    expect(pick(redis, 'spec.template.metadata.labels')).toMatchObject(
      pick(redis, 'spec.selector.matchLabels') as Record<string, string>,
    );
    expect(pick(pdb, 'spec.maxUnavailable')).toBe(0);
    const egress = of(objects, 'NetworkPolicy', 'backhaul-fleet-egress-redis');
    expect(pick(egress, 'spec.egress.0.to.0.podSelector.matchLabels')).toEqual(
      pick(redis, 'spec.selector.matchLabels'),
    );
  });

  it('external: no Redis of its own; the fleet may reach the site’s Redis (or its sentinels) at its address, on their ports only', () => {
    const objects = overlay('external-redis');
    expect(objects.filter((o) => o.kind === 'StatefulSet')).toEqual([]);
    const egress = of(objects, 'NetworkPolicy', 'backhaul-fleet-egress-redis');
    expect(pick(egress, 'spec.egress')).toEqual([
      {
        to: [{ ipBlock: { cidr: SITE_ADDRESSES.redis } }],
        ports: [
          { port: 6379, protocol: 'TCP' },
          { port: 26379, protocol: 'TCP' },
        ],
      },
    ]);
  });
});

describe('deploy/overlays: the webhook’s certificate', () => {
  const webhookConfigs = (objects: readonly RenderedObject[]) =>
    objects.filter((o) => /^(Mutating|Validating)WebhookConfiguration$/.test(o.kind));

  it('cert-manager: a Certificate for the webhook’s Service into the Secret it mounts; CA injected into every configuration', () => {
    const objects = overlay('bundled-redis');
    const cert = of(objects, 'Certificate', 'backhaul-webhook');
    const webhook = of(objects, 'Deployment', 'backhaul-webhook');
    const volumes = pick(webhook, 'spec.template.spec.volumes') as { name: string; secret?: { secretName: string } }[];
    expect(volumes.find((v) => v.name === 'tls')?.secret?.secretName).toBe(pick(cert, 'spec.secretName'));
    expect(pick(cert, 'spec.dnsNames')).toContain('backhaul-webhook.backhaul.svc');
    const configs = webhookConfigs(objects);
    expect(configs).toHaveLength(3);
    for (const config of configs)
      expect(config.metadata.annotations?.['cert-manager.io/inject-ca-from']).toBe('backhaul/backhaul-webhook');
  });

  it('self-signed: the Job writes the Secret the webhook mounts and patches exactly the configurations there are', () => {
    const objects = overlay('external-redis');
    const job = of(objects, 'Job', 'backhaul-certgen');
    const pod = pick(job, 'spec.template.spec') as {
      initContainers: { args: string[] }[];
      containers: { args: string[] }[];
    };
    const runs = [...pod.initContainers, ...pod.containers].map((c) => c.args);
    const flag = (args: string[], name: string) => args.find((a) => a.startsWith(`--${name}=`))?.split('=')[1];
    const create = runs.find((a) => a[0] === 'create') ?? [];
    expect(flag(create, 'secret-name')).toBe('backhaul-webhook-tls');
    expect([flag(create, 'cert-name'), flag(create, 'key-name')]).toEqual(['tls.crt', 'tls.key']);
    expect(flag(create, 'host')?.split(',')).toContain('backhaul-webhook.backhaul.svc');
    const patched = runs
      .filter((a) => a[0] === 'patch')
      .flatMap((a) => {
        const name = flag(a, 'webhook-name');
        const kinds = [
          flag(a, 'patch-mutating') !== 'false' ? 'Mutating' : '',
          flag(a, 'patch-validating') !== 'false' ? 'Validating' : '',
        ];
        return kinds.filter(Boolean).map((k) => `${k}WebhookConfiguration/${name}`);
      });
    const configs = webhookConfigs(objects);
    expect(patched.sort()).toEqual(configs.map((c) => `${c.kind}/${c.metadata.name}`).sort());
    // Its ClusterRole reaches those configurations by name, nothing else; no cert-manager objects here.
    const role = of(objects, 'ClusterRole', 'backhaul-certgen');
    expect(pick(role, 'rules.0.resourceNames')).toEqual([...new Set(configs.map((c) => c.metadata.name))].sort());
    expect(configs.every((c) => c.metadata.annotations === undefined)).toBe(true);
  });
});

describe('deploy/components/monitoring: what an operator is paged for, read against the fleet’s metrics', () => {
  const objects = overlay('bundled-redis');
  const rule = of(objects, 'PrometheusRule', 'backhaul');
  const alerts = (
    pick(rule, 'spec.groups') as {
      rules: {
        alert: string;
        expr: string;
        for?: string;
        labels: Record<string, string>;
        annotations: Record<string, string>;
      }[];
    }[]
  ).flatMap((g) => g.rules);

  it('has the alerts the issue asks for', () => {
    expect(alerts.map((a) => a.alert).sort()).toEqual([
      'BackhaulCasConflictsClimbing',
      'BackhaulJobsEndedWithoutTrap',
      'BackhaulOutboxRepairsClimbing',
      'BackhaulPodsFailed',
      'BackhaulSessionHostIdleWhilePodsWait',
      'BackhaulSlowCryptoPath',
      'BackhaulSqueueFailing',
      'BackhaulStepsExhausted',
    ]);
  });

  it.each(
    alerts.map((a) => [a.alert, a] as const),
  )('%s: its expression reads metrics the fleet registers, as their types want', (_name, a) => {
    const { problems, metrics } = problemsOf(a.expr);
    expect(problems, a.expr).toEqual([]);
    expect(metrics.size).toBeGreaterThan(0);
    expect(['info', 'warning', 'critical']).toContain(a.labels.severity);
    expect(a.annotations.summary).toBeTruthy();
    if (a.for !== undefined) expect(a.for).toMatch(/^\d+[smh]$/);
  });

  it('scrapes the fleet pods on the port their container names, which the ingress policy lets the scraper reach', () => {
    const monitor = of(objects, 'PodMonitor', 'backhaul-fleet');
    const fleet = of(objects, 'Deployment', 'backhaul-fleet');
    expect(pick(monitor, 'spec.selector.matchLabels')).toEqual(pick(fleet, 'spec.selector.matchLabels'));
    const [endpoint] = pick(monitor, 'spec.podMetricsEndpoints') as { port: string; path: string }[];
    const ports = pick(fleet, 'spec.template.spec.containers.0.ports') as { name: string; containerPort: number }[];
    const port = ports.find((p) => p.name === endpoint?.port);
    expect(port, JSON.stringify(ports)).toBeDefined();
    expect(endpoint?.path).toBe('/metrics');
    const ingress = of(objects, 'NetworkPolicy', 'backhaul-fleet-ingress');
    expect(pick(ingress, 'spec.ingress.0.ports')).toEqual([{ port: port?.containerPort, protocol: 'TCP' }]);
  });
});
