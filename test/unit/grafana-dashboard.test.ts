import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { POD_STATES, STEPS } from '../../src/machines/pod-types.js';
import { registry } from '../../src/metrics/fleet-metrics.js';

/**
 * deploy/grafana-dashboard.json against the metrics the fleet registers (src/metrics/fleet-metrics.ts):
 * every metric a panel queries exists with the labels the query uses and is queried the way its type
 * wants (counters and histogram series through rate()/increase(), gauges as they are), and every metric
 * the fleet exports is shown somewhere or listed in NOT_SHOWN with the reason.
 */

const DASHBOARD_PATH = join(import.meta.dirname, '../../deploy/grafana-dashboard.json');
// biome-ignore lint/suspicious/noTemplateCurlyInString: Grafana's variable syntax, not a template.
const DS_UID = '${DS_PROMETHEUS}';

/** Labels Prometheus adds to every series it scrapes (the target's labels), not registered by the fleet. */
const SCRAPE_LABELS: ReadonlySet<string> = new Set(['instance', 'job']);

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

/** Label values the source knows at run time: a matcher on these labels must name real values. */
const KNOWN_VALUES: Readonly<Record<string, Readonly<Record<string, readonly string[]>>>> = {
  backhaul_pods: { state: POD_STATES },
  backhaul_steps_total: { step: STEPS },
  backhaul_steps_exhausted_total: { step: STEPS },
};

// ------------------------------------------------------------------------------------------------
// The registered metrics and the series /metrics exposes for them

interface Registered {
  name: string;
  type: string;
  labels: readonly string[];
}

/** How a series is queried: counters and histogram series through a rate, gauges as they are. */
type SeriesKind = 'counter' | 'gauge' | 'bucket' | 'sum' | 'count' | 'quantile';

interface Series {
  metric: Registered;
  kind: SeriesKind;
  labels: ReadonlySet<string>;
}

function labelNamesOf(metric: object): string[] {
  if (!('labelNames' in metric) || !Array.isArray(metric.labelNames)) return [];
  return metric.labelNames.filter((label): label is string => typeof label === 'string');
}

const registered: Registered[] = registry
  .getMetricsAsArray()
  .map((m) => ({ name: m.name, type: String(m.type), labels: labelNamesOf(m) }));

/** Sample names as exposed: prom-client writes a counter's name as registered (ours end in _total). */
function seriesOf(metric: Registered): [string, Series][] {
  const labels = (...extra: string[]) => new Set([...metric.labels, ...extra]);
  switch (metric.type) {
    case 'counter':
      return [[metric.name, { metric, kind: 'counter', labels: labels() }]];
    case 'gauge':
      return [[metric.name, { metric, kind: 'gauge', labels: labels() }]];
    case 'histogram':
      return [
        [`${metric.name}_bucket`, { metric, kind: 'bucket', labels: labels('le') }],
        [`${metric.name}_sum`, { metric, kind: 'sum', labels: labels() }],
        [`${metric.name}_count`, { metric, kind: 'count', labels: labels() }],
      ];
    case 'summary':
      return [
        [metric.name, { metric, kind: 'quantile', labels: labels('quantile') }],
        [`${metric.name}_sum`, { metric, kind: 'sum', labels: labels() }],
        [`${metric.name}_count`, { metric, kind: 'count', labels: labels() }],
      ];
    default:
      throw new Error(`${metric.name}: unknown metric type ${metric.type}`);
  }
}

const exposed = new Map<string, Series>();
for (const metric of registered) {
  for (const [name, series] of seriesOf(metric)) {
    if (exposed.has(name)) throw new Error(`two registered metrics expose ${name}`);
    exposed.set(name, series);
  }
}

// ------------------------------------------------------------------------------------------------
// A small PromQL reader: enough to find every selector, its matchers and range, the function it is
// the argument of, and the labels of every by/without/on/ignoring/group_* clause with its scope.

type Token = { kind: 'ident' | 'number' | 'string' | 'matchers' | 'range' | 'punct'; text: string };

const LEXEMES: [Token['kind'] | 'space', RegExp][] = [
  ['space', /\s+/y],
  ['number', /(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?(?![a-zA-Z_])/y],
  ['ident', /[a-zA-Z_:][a-zA-Z0-9_:]*/y],
  ['string', /"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'/y],
  ['matchers', /\{(?:[^}"']|"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')*\}/y],
  ['range', /\[[^\]]*\]/y],
  ['punct', /==|!=|>=|<=|[()+\-*/%^<>,]/y],
];

function lex(expr: string): Token[] {
  const tokens: Token[] = [];
  let at = 0;
  outer: while (at < expr.length) {
    for (const [kind, re] of LEXEMES) {
      re.lastIndex = at;
      const m = re.exec(expr);
      if (!m) continue;
      at = re.lastIndex;
      if (kind !== 'space') tokens.push({ kind, text: m[0] });
      continue outer;
    }
    throw new Error(`cannot read PromQL at ${JSON.stringify(expr.slice(at))} in ${expr}`);
  }
  return tokens;
}

interface Matcher {
  label: string;
  op: string;
  value: string;
}

function parseMatchers(block: string): Matcher[] {
  const inner = block.slice(1, -1);
  const re = /\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)/y;
  const matchers: Matcher[] = [];
  let at = 0;
  while (at < inner.length && inner.slice(at).trim() !== '') {
    re.lastIndex = at;
    const m = re.exec(inner);
    if (!m) throw new Error(`cannot read the matchers ${block}`);
    matchers.push({ label: m[1]!, op: m[2]!, value: m[3]! });
    at = re.lastIndex;
  }
  return matchers;
}

interface Selector {
  name: string;
  matchers: Matcher[];
  range: boolean;
  /** The functions the selector is an argument of, innermost last ('' for a plain parenthesis). */
  within: string[];
  index: number;
}

interface Grouping {
  keyword: string;
  labels: string[];
  /** Token indexes [from, to] the clause applies to. */
  scope: [number, number];
}

const AGGREGATIONS = new Set([
  'sum',
  'min',
  'max',
  'avg',
  'group',
  'stddev',
  'stdvar',
  'count',
  'count_values',
  'bottomk',
  'topk',
  'quantile',
]);
const GROUPING = new Set(['by', 'without', 'on', 'ignoring', 'group_left', 'group_right']);
const BINARY_KEYWORDS = new Set(['and', 'or', 'unless', 'bool']);
const RATES = new Set(['rate', 'irate', 'increase']);
const GAUGE_RANGE_FUNCTION = /_over_time$|^(deriv|delta|idelta|predict_linear|changes)$/;

function matchingClose(tokens: Token[], open: number): number {
  let depth = 0;
  for (let i = open; i < tokens.length; i++) {
    if (tokens[i]!.text === '(') depth++;
    else if (tokens[i]!.text === ')' && --depth === 0) return i;
  }
  throw new Error('unbalanced parentheses');
}

function matchingOpen(tokens: Token[], close: number): number {
  let depth = 0;
  for (let i = close; i >= 0; i--) {
    if (tokens[i]!.text === ')') depth++;
    else if (tokens[i]!.text === '(' && --depth === 0) return i;
  }
  throw new Error('unbalanced parentheses');
}

function readPromQL(expr: string): { selectors: Selector[]; groupings: Grouping[] } {
  const tokens = lex(expr);
  const selectors: Selector[] = [];
  const groupings: Grouping[] = [];
  const open: string[] = [];
  let nextOwner = '';
  for (let i = 0; i < tokens.length; i++) {
    const token = tokens[i]!;
    const next = tokens[i + 1];
    if (token.text === '(') {
      open.push(nextOwner);
      nextOwner = '';
      continue;
    }
    if (token.text === ')') {
      open.pop();
      continue;
    }
    if (token.kind === 'matchers' || token.kind === 'range') throw new Error(`${token.text} without a metric name`);
    if (token.kind !== 'ident') continue;
    if (GROUPING.has(token.text)) {
      const labels: string[] = [];
      let end = i;
      if (next?.text === '(') {
        end = matchingClose(tokens, i + 1);
        for (const t of tokens.slice(i + 2, end)) if (t.kind === 'ident') labels.push(t.text);
      }
      let scope: [number, number] = [0, tokens.length - 1];
      if (token.text === 'by' || token.text === 'without') {
        const before = tokens[i - 1];
        if (before?.kind === 'ident' && AGGREGATIONS.has(before.text)) {
          if (tokens[end + 1]?.text !== '(') throw new Error(`${before.text} ${token.text} (…) without an argument`);
          scope = [end + 1, matchingClose(tokens, end + 1)];
          nextOwner = before.text;
        } else if (before?.text === ')') {
          scope = [matchingOpen(tokens, i - 1), i - 1];
        } else throw new Error(`${token.text} outside an aggregation`);
      }
      groupings.push({ keyword: token.text, labels, scope });
      i = end;
      continue;
    }
    if (BINARY_KEYWORDS.has(token.text)) continue;
    if (token.text === 'offset') throw new Error('offset is not read by this test');
    if (next?.text === '(') {
      nextOwner = token.text;
      continue;
    }
    if (AGGREGATIONS.has(token.text) && (next?.text === 'by' || next?.text === 'without')) continue;
    // A metric name, its matchers and range.
    const selector: Selector = { name: token.text, matchers: [], range: false, within: [...open], index: i };
    if (tokens[i + 1]?.kind === 'matchers') selector.matchers = parseMatchers(tokens[++i]!.text);
    if (tokens[i + 1]?.kind === 'range') {
      selector.range = true;
      i++;
    }
    selectors.push(selector);
  }
  if (open.length !== 0) throw new Error('unbalanced parentheses');
  return { selectors, groupings };
}

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

/** What is wrong with one PromQL expression, as readable lines (empty: nothing). */
function problemsOf(expr: string): { problems: string[]; metrics: Set<string> } {
  const problems: string[] = [];
  const metrics = new Set<string>();
  let read: ReturnType<typeof readPromQL>;
  try {
    read = readPromQL(expr);
  } catch (err) {
    return { problems: [String(err)], metrics };
  }
  const { selectors, groupings } = read;
  if (selectors.length === 0) problems.push('no metric');
  for (const s of selectors) {
    const series = exposed.get(s.name);
    if (!series) {
      problems.push(`${s.name} is not a metric the fleet exposes`);
      continue;
    }
    metrics.add(series.metric.name);
    for (const m of s.matchers) {
      if (!series.labels.has(m.label) && !SCRAPE_LABELS.has(m.label))
        problems.push(`${s.name} has no label ${m.label} (it has: ${[...series.labels].join(', ') || 'none'})`);
      const known = KNOWN_VALUES[series.metric.name]?.[m.label];
      if (known && !m.value.includes('$')) {
        const values = m.op === '=' || m.op === '!=' ? [m.value] : m.value.split('|');
        for (const v of values)
          if (!known.includes(v)) problems.push(`${s.name}: ${m.label}="${v}" is not one of ${known.join(', ')}`);
      }
    }
    const fn = s.within.at(-1) ?? '';
    if (series.kind === 'counter' || series.kind === 'bucket' || series.kind === 'sum' || series.kind === 'count') {
      if (!RATES.has(fn) || !s.range) problems.push(`${s.name} (${series.kind}) must be read with rate()/increase()`);
    } else {
      if (RATES.has(fn)) problems.push(`${s.name} is a gauge: ${fn}() means nothing on it`);
      if (s.range && !GAUGE_RANGE_FUNCTION.test(fn)) problems.push(`${s.name} is a gauge: a range needs *_over_time`);
    }
    if (series.kind === 'bucket' && !s.within.includes('histogram_quantile'))
      problems.push(`${s.name} outside histogram_quantile()`);
    if (series.kind !== 'bucket' && s.within.includes('histogram_quantile'))
      problems.push(`${s.name} inside histogram_quantile() is not a _bucket series`);
  }
  for (const g of groupings) {
    const inScope = selectors.filter((s) => s.index >= g.scope[0] && s.index <= g.scope[1]);
    for (const label of g.labels) {
      if (SCRAPE_LABELS.has(label)) continue;
      for (const s of inScope) {
        const series = exposed.get(s.name);
        if (series && !series.labels.has(label))
          problems.push(`${g.keyword} (${label}): ${s.name} has no label ${label}`);
      }
    }
    const buckets = inScope.some((s) => exposed.get(s.name)?.kind === 'bucket');
    if (buckets && g.keyword === 'by' && !g.labels.includes('le'))
      problems.push(`by (${g.labels.join(', ')}) over _bucket series drops le`);
  }
  return { problems, metrics };
}

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
