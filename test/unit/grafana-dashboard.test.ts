import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { POD_STATES } from '../../src/machines/pod-machine.js';
import { exposed, problemsOf, registered, registry, SCRAPE_LABELS } from '../fixtures/promql-check.js';

/**
 * deploy/grafana-dashboard.json against the metrics the fleet registers (src/metrics/fleet-metrics.ts):
 * every metric a panel queries exists with the labels the query uses and is queried the way its type
 * wants (counters and histogram series through rate()/increase(), gauges as they are), and every metric
 * the fleet exports is shown somewhere or listed in NOT_SHOWN with the reason.
 */

const DASHBOARD_PATH = join(import.meta.dirname, '../../deploy/grafana-dashboard.json');
// biome-ignore lint/suspicious/noTemplateCurlyInString: Grafana's variable syntax, not a template.
const DS_UID = '${DS_PROMETHEUS}';

/** Registered metrics no panel shows, and why. The test fails when one of these is shown or disappears. */
const NOT_SHOWN: Readonly<Record<string, string>> = {
  backhaul_process_cpu_seconds_total: 'user + system: the CPU panel shows the two separately',
  backhaul_process_virtual_memory_bytes: 'address space, not memory used; the resident set is shown',
  backhaul_process_heap_bytes: "the process's heap from /proc; the V8 heap (nodejs_heap_size_*) is shown",
  backhaul_nodejs_eventloop_lag_seconds: 'one sample at scrape time; the lag percentiles are shown',
  backhaul_nodejs_eventloop_lag_min_seconds: 'the lag panel shows p50, p99 and max',
  backhaul_nodejs_eventloop_lag_mean_seconds: 'the lag panel shows p50, p99 and max',
  backhaul_nodejs_eventloop_lag_stddev_seconds: 'the lag panel shows p50, p99 and max',
  backhaul_nodejs_eventloop_lag_p90_seconds: 'the lag panel shows p50, p99 and max',
  backhaul_nodejs_active_resources_total: 'the sum of nodejs_active_resources{type}, which is shown',
  backhaul_nodejs_active_handles: 'the older API of nodejs_active_resources{type}, which is shown',
  backhaul_nodejs_active_handles_total: 'the older API of nodejs_active_resources{type}, which is shown',
  backhaul_nodejs_active_requests: 'the older API of nodejs_active_resources{type}, which is shown',
  backhaul_nodejs_active_requests_total: 'the older API of nodejs_active_resources{type}, which is shown',
  backhaul_nodejs_heap_space_size_total_bytes: 'per V8 heap space: detail for a heap investigation, not the fleet',
  backhaul_nodejs_heap_space_size_used_bytes: 'per V8 heap space: detail for a heap investigation, not the fleet',
  backhaul_nodejs_heap_space_size_available_bytes: 'per V8 heap space: detail for a heap investigation, not the fleet',
};

// ------------------------------------------------------------------------------------------------
// The dashboard

const datasource = z.looseObject({ type: z.string(), uid: z.string() });
const target = z.looseObject({ refId: z.string(), expr: z.string(), datasource: datasource.optional() });
const panel = z.looseObject({
  id: z.number(),
  type: z.string(),
  title: z.string(),
  datasource: datasource.optional(),
  gridPos: z.object({ h: z.number(), w: z.number(), x: z.number(), y: z.number() }),
  targets: z.array(target).optional(),
});
const dashboardSchema = z.looseObject({
  uid: z.string(),
  title: z.string(),
  schemaVersion: z.number(),
  __inputs: z.array(z.looseObject({ name: z.string(), type: z.string(), pluginId: z.string() })),
  panels: z.array(panel.extend({ panels: z.array(panel).optional() })),
  templating: z.object({
    list: z.array(
      z.looseObject({
        name: z.string(),
        type: z.string(),
        datasource: datasource.optional(),
        query: z.union([z.string(), z.looseObject({ query: z.string() })]).optional(),
        definition: z.string().optional(),
      }),
    ),
  }),
});

const dashboard = dashboardSchema.parse(JSON.parse(readFileSync(DASHBOARD_PATH, 'utf8')));
const panels = dashboard.panels.flatMap((p) => [p, ...(p.panels ?? [])]);
const queries = panels.flatMap((p) =>
  (p.targets ?? []).map((t) => ({ where: `${p.title} ${t.refId}`, expr: t.expr, panel: p, target: t })),
);

describe('deploy/grafana-dashboard.json', () => {
  it('imports on any Grafana: the DS_PROMETHEUS input and variable, the uid and title', () => {
    expect(dashboard.uid).toBe('backhaul-fleet');
    expect(dashboard.title).toBe('backhaul fleet');
    expect(dashboard.schemaVersion).toBe(39);
    expect(dashboard.__inputs).toContainEqual(
      expect.objectContaining({ name: 'DS_PROMETHEUS', type: 'datasource', pluginId: 'prometheus' }),
    );
    expect(dashboard.templating.list).toContainEqual(
      expect.objectContaining({ name: 'DS_PROMETHEUS', type: 'datasource', query: 'prometheus' }),
    );
  });

  it('queries the chosen data source in every panel and target', () => {
    const elsewhere = [
      ...panels.filter((p) => p.type !== 'row' && p.datasource?.uid !== DS_UID).map((p) => p.title),
      ...queries.filter((q) => q.target.datasource?.uid !== DS_UID).map((q) => q.where),
    ];
    expect(elsewhere).toEqual([]);
  });

  it('has unique panel ids, unique refIds per panel and panels inside the 24-column grid', () => {
    const ids = panels.map((p) => p.id);
    expect(new Set(ids).size).toBe(ids.length);
    for (const p of panels) {
      const refIds = (p.targets ?? []).map((t) => t.refId);
      expect(new Set(refIds).size, p.title).toBe(refIds.length);
      expect(p.gridPos.x + p.gridPos.w, p.title).toBeLessThanOrEqual(24);
    }
    expect(queries.length).toBeGreaterThan(0);
    for (const p of panels) if (p.type !== 'row') expect(p.targets?.length ?? 0, p.title).toBeGreaterThan(0);
  });

  it('names the metrics as /metrics exposes them (the registry agrees with its exposition)', async () => {
    const text = await registry.metrics();
    const typeLines = [...text.matchAll(/^# TYPE (\S+) (\S+)$/gm)].map((m) => `${m[1]} ${m[2]}`);
    expect(typeLines.sort()).toEqual(registered.map((m) => `${m.name} ${m.type}`).sort());
  });

  it.each(
    queries.map((q) => [q.where, q.expr] as const),
  )('%s: metrics exist, labels are theirs, and the query suits the type', (_where, expr) => {
    expect(problemsOf(expr).problems).toEqual([]);
  });

  it('template variables read labels the metric has', () => {
    const problems: string[] = [];
    for (const v of dashboard.templating.list.filter((t) => t.type === 'query')) {
      const query = typeof v.query === 'string' ? v.query : (v.query?.query ?? '');
      for (const q of [query, v.definition ?? '']) {
        const m = /^label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*,\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)$/.exec(q);
        if (!m) {
          problems.push(`${v.name}: expected label_values(metric, label), got ${q}`);
          continue;
        }
        const series = exposed.get(m[1]!);
        if (!series) problems.push(`${v.name}: ${m[1]} is not a metric the fleet exposes`);
        else if (!series.labels.has(m[2]!) && !SCRAPE_LABELS.has(m[2]!))
          problems.push(`${v.name}: ${m[1]} has no label ${m[2]}`);
      }
      if (v.datasource?.uid !== DS_UID) problems.push(`${v.name}: not on ${DS_UID}`);
    }
    expect(problems).toEqual([]);
  });

  it('shows every metric the fleet registers, or says in NOT_SHOWN why not', () => {
    const shown = new Set(queries.flatMap((q) => [...problemsOf(q.expr).metrics]));
    const names = new Set(registered.map((m) => m.name));
    expect(registered.map((m) => m.name).filter((n) => !shown.has(n) && !(n in NOT_SHOWN))).toEqual([]);
    expect(
      Object.keys(NOT_SHOWN).filter((n) => !names.has(n)),
      'NOT_SHOWN names unknown metrics',
    ).toEqual([]);
    expect(
      Object.keys(NOT_SHOWN).filter((n) => shown.has(n)),
      'NOT_SHOWN names shown metrics',
    ).toEqual([]);
  });

  it('the reader finds what it checks (a broken query is caught)', () => {
    expect(problemsOf('sum(rate(backhaul_transitions[5m]))').problems).toEqual([
      'backhaul_transitions is not a metric the fleet exposes',
    ]);
    expect(problemsOf('sum by (host) (backhaul_shadows_held)').problems).toEqual([
      'by (host): backhaul_shadows_held has no label host',
    ]);
    expect(problemsOf('backhaul_steps_total{outcome="done"}').problems).toEqual([
      'backhaul_steps_total (counter) must be read with rate()/increase()',
    ]);
    expect(problemsOf('rate(backhaul_shadows_held[5m])').problems).toContain(
      'backhaul_shadows_held is a gauge: rate() means nothing on it',
    );
    expect(problemsOf('max(backhaul_pods{state="runing"})').problems).toEqual([
      `backhaul_pods: state="runing" is not one of ${POD_STATES.join(', ')}`,
    ]);
    expect(
      problemsOf('histogram_quantile(0.9, sum by (kind) (rate(backhaul_nodejs_gc_duration_seconds_bucket[5m])))')
        .problems,
    ).toEqual(['by (kind) over _bucket series drops le']);
    expect(problemsOf('up').problems).toEqual(['up is not a metric the fleet exposes']);
  });
});
