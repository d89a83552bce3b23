// @ts-check
/**
 * Overview: the brokers this broker knows and what each appends, and the serving
 * broker's own figures over the last minutes (GET /console/api/series: sampled in the
 * broker's process, so no metrics token reaches the browser).
 */

import uPlot from "../../vendor/uplot.esm.js";
import { api } from "../api.js";
import { ago, bytes, count, fill, h, table } from "../dom.js";

const REFRESH_MS = 2000;
// Placement is summed over at most this many topics (each one request): enough to see
// the spread, bounded however many topics there are.
const PLACEMENT_TOPICS = 50;
const PLACEMENT_AT_ONCE = 4;
const COMPACTOR_REFRESH_MS = 5000;
const MIB = 1024 * 1024;

/**
 * @typedef {object} Snapshot
 * @property {{broker_id: string, roles: string[], status: string, started_at_ms: number}} broker
 * @property {number} interval_s
 * @property {number} capacity
 * @property {Record<string, any>} series columns, one value per sample (t_ms the x axis)
 *
 * @typedef {object} CompactorReading what the standalone compactor answered last
 * @property {string} url
 * @property {boolean} reachable
 * @property {string | null} status
 * @property {string | null} compactor_id
 * @property {number | null} started_at_ms
 * @property {number | null} lag_records
 * @property {number | null} runs
 * @property {number | null} records
 * @property {number | null} failures
 * @property {string | null} error
 *
 * @typedef {{configured: boolean, compactor: CompactorReading | null}} CompactorAnswer
 *
 * @typedef {{title: string, unit: string, lines: {label: string, values: (s: Record<string, any>) => (number | null)[]}[]}} ChartSpec
 */

/** @param {number} v */
const perS = (v) => (v >= 100 ? count(Math.round(v)) : v.toFixed(v >= 10 ? 1 : 2));

/** An axis label: thousands grouped, small values to three significant digits. */
const tick = (/** @type {number} */ v) => (Math.abs(v) >= 1000 ? count(Math.round(v)) : String(+v.toPrecision(3)));

/**
 * @param {(number | null)[]} values
 * @param {number} [scale]
 * @returns {(number | null)[]}
 */
const scaled = (values, scale = 1) => values.map((v) => (v === null ? null : v / scale));

/** @type {ChartSpec[]} */
const CHARTS = [
  { title: "Records per second", unit: "records/s", lines: [
    { label: "produced", values: (s) => s.produce_records_per_s },
    { label: "consumed", values: (s) => s.consume_records_per_s }] },
  { title: "Throughput", unit: "MiB/s", lines: [
    { label: "produced", values: (s) => scaled(s.produce_bytes_per_s, MIB) },
    { label: "consumed", values: (s) => scaled(s.consume_bytes_per_s, MIB) }] },
  { title: "Produce latency", unit: "ms", lines: [
    { label: "p50", values: (s) => s.produce_p50_ms },
    { label: "p99", values: (s) => s.produce_p99_ms }] },
  // A long poll answers when records come or its wait ends: this is not a service time.
  { title: "Consume answer time, long polls' waits included", unit: "ms", lines: [
    { label: "p50", values: (s) => s.consume_p50_ms },
    { label: "p99", values: (s) => s.consume_p99_ms }] },
  { title: "Estimated S3 request cost", unit: "USD/hour", lines: [
    { label: "requests", values: (s) => s.s3_cost_usd_per_hour }] },
];
const COLORS = ["#0369a1", "#d97706", "#059669", "#dc2626", "#7c3aed", "#db2777", "#4b5563"];

/**
 * @param {HTMLElement} view
 * @param {import("../main.js").Route} _route
 * @param {import("../main.js").Ctx} ctx
 */
export async function render(view, _route, ctx) {
  const [snapshot, cluster, compactor] = await Promise.all([
    /** @type {Promise<Snapshot>} */ (api("/console/api/series", { signal: ctx.signal })),
    api("/cluster", { signal: ctx.signal }),
    /** @type {Promise<CompactorAnswer>} */ (api("/console/api/compactor", { signal: ctx.signal }))]);
  const head = h("div", { class: "head" }, h("h1", null, "Overview"));
  const tiles = h("div", { class: "tiles", "data-testid": "tiles" });
  const charts = h("div", { class: "charts" });
  const brokers = h("div", { class: "card", "data-testid": "brokers" }, h("p", { class: "muted" },
    "Loading the brokers…"));
  const compacting = h("div", { class: "card", "data-testid": "compactor" });
  fill(view, head, tiles, charts, h("h2", null, "Brokers"), brokers,
    h("h2", null, "Compactor"), compacting);
  showCompactor(compacting, compactor, snapshot);
  const drawn = new Charts(charts, ctx);
  let lastCompactor = compactor;
  const update = (/** @type {Snapshot} */ s) => {
    fill(head, h("h1", null, "Overview"), h("span", { class: "muted" },
      `served by ${s.broker.broker_id} (${s.broker.roles.join(", ")}), `
      + `${s.broker.status}, started ${ago(s.broker.started_at_ms)}; `
      + `one sample every ${s.interval_s} s, the last ${Math.round(s.interval_s * s.capacity / 60)} min`));
    fill(tiles, ...figures(s, lastCompactor));
    drawn.draw(s);
  };
  update(snapshot);
  await showBrokers(brokers, cluster, snapshot, ctx);
  ctx.every(REFRESH_MS, async () => update(await api("/console/api/series", { signal: ctx.signal })));
  ctx.every(COMPACTOR_REFRESH_MS, async () => {
    lastCompactor = await api("/console/api/compactor", { signal: ctx.signal });
    showCompactor(compacting, lastCompactor, snapshot);
  });
}

/**
 * The latest figure of each series, as tiles.
 * @param {Snapshot} s
 * @param {CompactorAnswer} compactor the standalone compactor's backlog, when this
 *   broker does not compact
 */
function figures(s, compactor) {
  const last = (/** @type {(number | null)[]} */ values) => {
    for (let i = values.length - 1; i >= 0; i -= 1) if (values[i] !== null) return values[i];
    return null;
  };
  const c = s.series;
  const s3 = Object.values(/** @type {Record<string, (number | null)[]>} */ (c.s3_requests_per_s))
    .reduce((sum, values) => sum + (last(values) ?? 0), 0);
  /** @type {[string, string][]} */
  const shown = [
    ["Produced", `${bytes(last(c.produce_bytes_per_s) ?? 0)}/s`],
    ["Produced records", `${perS(last(c.produce_records_per_s) ?? 0)}/s`],
    ["Consumed", `${bytes(last(c.consume_bytes_per_s) ?? 0)}/s`],
    ["Produce p99", last(c.produce_p99_ms) === null ? "–" : `${perS(last(c.produce_p99_ms) ?? 0)} ms`],
    ["HTTP requests", `${perS(last(c.http_requests_per_s) ?? 0)}/s`],
    ["S3 requests", `${perS(s3)}/s`],
    ["S3 request cost", `$${(last(c.s3_cost_usd_per_hour) ?? 0).toFixed(4)}/h`],
  ];
  const lag = last(c.compaction_lag_records) ?? compactor.compactor?.lag_records ?? null;
  shown.push(["Compaction backlog", lag === null ? "–" : `${count(lag)} records`]);
  return shown.map(([label, value]) => h("div", { class: "tile" },
    h("div", { class: "label" }, label), h("div", { class: "value" }, value)));
}

/** The charts, made once and given new data on each refresh. */
class Charts {
  /**
   * @param {HTMLElement} where
   * @param {import("../main.js").Ctx} ctx
   */
  constructor(where, ctx) {
    this.where = where;
    /** @type {Map<string, {plot: uPlot, box: HTMLElement, labels: string[]}>} */
    this.plots = new Map();
    const resized = new ResizeObserver(() => {
      for (const { plot, box } of this.plots.values()) plot.setSize(size(box));
    });
    resized.observe(where);
    ctx.onLeave(() => {
      resized.disconnect();
      for (const { plot } of this.plots.values()) plot.destroy();
    });
  }

  /** @param {Snapshot} s */
  draw(s) {
    const x = s.series.t_ms.map((/** @type {number} */ t) => t / 1000);
    const specs = [...CHARTS, s3Chart(s), lagChart(s)].filter((c) => c !== null);
    for (const spec of /** @type {ChartSpec[]} */ (specs)) {
      const labels = spec.lines.map((l) => l.label);
      const data = /** @type {uPlot.AlignedData} */ ([x, ...spec.lines.map((l) => l.values(s.series))]);
      let shown = this.plots.get(spec.title);
      if (shown && shown.labels.join() !== labels.join()) {  // a new S3 operation appeared
        shown.plot.destroy();
        shown.box.remove();
        shown = undefined;
      }
      if (shown) {
        shown.plot.setData(data);
        continue;
      }
      const box = h("div", { class: "chart", "data-chart": spec.title });
      const title = h("h3", null, `${spec.title} (${spec.unit})`);
      this.where.append(box);
      box.append(title);
      const plot = new uPlot({
        ...size(box), legend: { live: false },
        cursor: { drag: { x: false, y: false } },
        scales: { x: { time: true } },
        axes: [{}, { size: 60, values: (_u, ticks) => ticks.map(tick) }],
        series: [{}, ...spec.lines.map((l, i) => ({
          label: l.label, stroke: COLORS[i % COLORS.length], width: 1.5, spanGaps: false }))],
      }, data, box);
      this.plots.set(spec.title, { plot, box, labels });
    }
  }
}

/** @param {HTMLElement} box */
function size(box) {
  return { width: Math.max(300, box.clientWidth - 20), height: 170 };
}

/**
 * @param {Snapshot} s
 * @returns {ChartSpec}
 */
function s3Chart(s) {
  const ops = Object.keys(s.series.s3_requests_per_s).sort();
  return { title: "S3 requests per second", unit: "requests/s", lines: ops.map((op) => ({
    label: op, values: (/** @type {Record<string, any>} */ c) => c.s3_requests_per_s[op] })) };
}

/**
 * @param {Snapshot} s
 * @returns {ChartSpec | null}
 */
function lagChart(s) {
  if (!s.series.compaction_lag_records.some((/** @type {number | null} */ v) => v !== null)) {
    return null;
  }
  return { title: "Compaction backlog", unit: "records", lines: [
    { label: "not compacted", values: (c) => c.compaction_lag_records }] };
}

/**
 * The members (GET /cluster) and how many partitions each is preferred for.
 * @param {HTMLElement} where
 * @param {{members: {member_id: string, broker_id: string, url: string, roles: string[]}[]}} cluster
 * @param {Snapshot} snapshot
 * @param {import("../main.js").Ctx} ctx
 */
async function showBrokers(where, cluster, snapshot, ctx) {
  if (!cluster.members.length) {
    fill(where, h("p", null, "Partition affinity is off: every broker appends any partition. ",
      "This page is served by ", h("strong", null, snapshot.broker.broker_id),
      ` (roles: ${snapshot.broker.roles.join(", ")}).`),
    snapshot.broker.roles.includes("compact")
      ? h("p", { class: "muted" }, "It runs the compactor in process.")
      : h("p", { class: "muted" }, "It does not compact in process (the compactor, if one is known, is below)."));
    return;
  }
  /** @type {Map<string, number>} */
  const preferred = new Map();
  const { topics } = await api("/topics", { signal: ctx.signal });
  const some = /** @type {{topic: string, partitions: number}[]} */ (topics).slice(0, PLACEMENT_TOPICS);
  let uncounted = 0;
  // A few at a time: the person's request quota is shared with whatever else uses the
  // same key, and a page must not take all of it at once.
  for (let i = 0; i < some.length; i += PLACEMENT_AT_ONCE) {
    const placements = await Promise.all(some.slice(i, i + PLACEMENT_AT_ONCE).map((t) => api(
      `/console/api/placement/${encodeURIComponent(t.topic)}`,
      { query: { max_partitions: Math.min(t.partitions, 1000) }, signal: ctx.signal })
      .catch(() => null)));
    for (const placed of placements) {
      if (placed === null) uncounted += 1;
      for (const p of placed?.partitions ?? []) {
        if (p.member_id) preferred.set(p.member_id, (preferred.get(p.member_id) ?? 0) + 1);
      }
    }
  }
  const compactors = cluster.members.filter((m) => m.roles.includes("compact"));
  fill(where,
    table(["Member", "Broker", "URL", "Roles", "Preferred for"], cluster.members.map((m) => [
      h("code", null, m.member_id), m.broker_id, h("code", null, m.url), m.roles.join(", "),
      `${count(preferred.get(m.member_id) ?? 0)} partitions`])),
    h("p", { class: "muted" },
      `Each partition has a preferred appender, the first member of its rendezvous ranking; `
      + `any broker still takes any partition's records and forwards them there. `
      + (topics.length > some.length ? `Counted over the first ${some.length} of ${topics.length} topics. ` : "")
      + (uncounted ? `${uncounted} of them could not be read (deleted meanwhile, or refused) and are not counted. ` : "")
      + (compactors.length ? `Compacting: ${compactors.map((m) => m.broker_id).join(", ")}.`
        : "No member compacts in process (the compactor, if one is known, is below).")));
}

/**
 * The compactor: in this broker (the compact role), or the standalone one the broker
 * was told of (LLOG_COMPACTOR_URL), with its health and figures.
 * @param {HTMLElement} where
 * @param {CompactorAnswer} answer
 * @param {Snapshot} snapshot
 */
function showCompactor(where, answer, snapshot) {
  const here = snapshot.broker.roles.includes("compact");
  const c = answer.compactor;
  if (c === null) {
    fill(where, h("p", null, here
      ? "This broker compacts in process: its backlog is charted above."
      : "No compactor is known to this broker: one in process (the compact role) shows "
        + "here, and a standalone one when LLOG_COMPACTOR_URL names where it serves."));
    return;
  }
  const state = !c.reachable ? ["unreachable", "bad"] : c.status === "ok" ? ["ok", "ok"]
    : [c.status ?? "unknown", "warn"];
  fill(where,
    h("dl", { class: "facts" },
      h("dt", null, "Standalone"), h("dd", null, h("code", null, c.url), " ",
        h("span", { class: `badge ${state[1]}`, "data-testid": "compactor-status" }, state[0])),
      c.compactor_id ? [h("dt", null, "Id"), h("dd", null, c.compactor_id)] : null,
      c.started_at_ms ? [h("dt", null, "Started"), h("dd", null, ago(c.started_at_ms))] : null,
      h("dt", null, "Backlog"), h("dd", { "data-testid": "compactor-backlog" },
        c.lag_records === null ? "–" : `${count(c.lag_records)} records not compacted yet`),
      h("dt", null, "Runs"), h("dd", null, c.runs === null ? "–"
        : `${count(c.runs)} (${count(c.records ?? 0)} records compacted, `
          + `${count(c.failures ?? 0)} failed)`)),
    c.error ? h("p", { class: "muted" }, c.error) : null,
    here ? h("p", { class: "muted" }, "This broker compacts in process too.") : null);
}
