// @ts-check
/**
 * Topics: the list (GET /topics), filtered and shown 200 at a time, with each shown
 * topic's retained bytes and last append read from its describe (GET /topics/{topic}),
 * a few at once; and the form that creates a topic (POST /topics).
 *
 * GET /topics answers every topic's configuration but none of its partitions' states:
 * those cost a storage read per partition, so they are asked only for the rows on
 * screen, at most {@link CONCURRENCY} describes in flight, each bounded to its first
 * page of partitions (a topic with more shows its figure as "at least").
 */

import { api, holds, holdsAny } from "../api.js";
import { ago, bytes, count, duration, errorPanel, field, fill, h, when } from "../dom.js";

/**
 * @typedef {import("../main.js").Ctx} Ctx
 * @typedef {import("../main.js").Route} Route
 *
 * @typedef {object} Topic GET /topics' entry (and a describe's head)
 * @property {string} topic
 * @property {number} partitions
 * @property {number | null} retention_ms
 * @property {number | null} retention_bytes
 * @property {number | null} max_record_bytes
 * @property {"none" | "zstd"} compression
 * @property {number | null} compression_level
 * @property {number} created_at_ms
 * @property {"active" | "deleting" | "deleted"} [status]
 *
 * @typedef {object} PartitionState
 * @property {number} partition
 * @property {number} log_start_offset
 * @property {number} high_watermark
 * @property {number | null} retained_bytes
 * @property {number | null} last_append_ms
 *
 * @typedef {object} Figures what a describe's first page says of a topic
 * @property {number} records
 * @property {number | null} retained null: some partition's size is not known
 * @property {number | null} lastAppend
 * @property {boolean} partial more partitions than the page holds
 */

/** Rows per view: the DOM and the describes stay bounded however many topics there are. */
export const PAGE = 200;
/** Describes in flight at once: enough to fill a view quickly, few enough not to crowd the broker. */
const CONCURRENCY = 8;
/** Partitions per describe in the list (the API's most); beyond, a figure is a lower bound. */
const DESCRIBE_MAX = 1000;

/**
 * @param {HTMLElement} view
 * @param {Route} route
 * @param {Ctx} ctx
 */
export async function render(view, route, ctx) {
  const { topics } = /** @type {{topics: Topic[]}} */ (await api("/topics", { signal: ctx.signal }));
  topics.sort((a, b) => a.topic.localeCompare(b.topic));
  /** @type {Map<string, Figures | Error>} describes already answered, kept while the page lives */
  const figures = new Map();
  let filter = route.query.get("q") ?? "";
  let from = Math.max(0, Number(route.query.get("from")) || 0);
  /** @type {AbortController | null} the describes of the rows shown */
  let batch = null;

  const input = h("input", { type: "search", name: "filter", placeholder: "Filter by name",
                             value: filter, autocomplete: "off", "data-testid": "topic-filter" });
  const summary = h("span", { class: "muted" });
  const body = h("tbody");
  const pager = h("div", { class: "pager" });
  const grid = h("table", { "data-testid": "topics" },
    h("thead", null, h("tr", null,
      h("th", null, "Topic"), h("th", { class: "num" }, "Partitions"),
      h("th", { class: "num" }, "Records"), h("th", { class: "num" }, "Retained"),
      h("th", null, "Last append"), h("th", null, "Compression"),
      h("th", null, "Retention"), h("th", null, "Created"))),
    body);

  const show = () => {
    batch?.abort();
    batch = new AbortController();
    const signal = AbortSignal.any([ctx.signal, batch.signal]);
    const needle = filter.trim().toLowerCase();
    const matching = needle ? topics.filter((t) => t.topic.toLowerCase().includes(needle)) : topics;
    if (from >= matching.length) from = Math.max(0, matching.length - PAGE);
    from -= from % PAGE;
    const shown = matching.slice(from, from + PAGE);
    // Kept in the address so that a reload or "back" returns to this view; replaceState
    // fires no hashchange, so the page is not rendered again.
    const query = new URLSearchParams();
    if (filter) query.set("q", filter);
    if (from) query.set("from", String(from));
    history.replaceState(null, "", `#/topics${query.size ? `?${query}` : ""}`);

    summary.textContent = matching.length === topics.length
      ? `${count(topics.length)} topics`
      : `${count(matching.length)} of ${count(topics.length)} topics match`;
    /** @type {Map<string, HTMLTableRowElement>} */
    const rows = new Map(shown.map((t) => [t.topic, topicRow(t)]));
    fill(body, [...rows.values()]);
    if (!shown.length) {
      fill(body, h("tr", null, h("td", { colspan: 8, class: "muted" },
        topics.length ? "No topic matches the filter."
          : ctx.who.auth ? `No topics ${ctx.who.principal} holds a right on.` : "No topics yet.")));
    }
    fill(pager, pagerOf(from, matching.length, (next) => { from = next; show(); }));
    for (const [name, row] of rows) {
      const known = figures.get(name);
      if (known) showFigures(row, known);
    }
    const wanted = shown.filter((t) => t.status !== "deleting" && !figures.has(t.topic));
    void pool(wanted, CONCURRENCY, async (t) => {
      const found = await describe(t.topic, signal);
      if (signal.aborted) return;
      figures.set(t.topic, found);
      const row = rows.get(t.topic);
      if (row) showFigures(row, found);
    });
  };

  /** @type {number | undefined} */
  let typing;
  input.addEventListener("input", () => {
    window.clearTimeout(typing);
    // A short pause before the rows change: typing a name does not start a describe
    // batch per key.
    typing = window.setTimeout(() => { filter = input.value; from = 0; show(); }, 120);
  });
  ctx.onLeave(() => window.clearTimeout(typing));

  const admin = holdsAny(ctx.who, "admin");
  fill(view,
    h("div", { class: "head" }, h("h1", null, "Topics"), summary,
      h("div", { class: "actions" }, input)),
    admin ? createForm(ctx) : null,
    h("div", { class: "card flush" }, grid),
    pager);
  show();
}

/**
 * A row with the figures still to come.
 * @param {Topic} t
 */
function topicRow(t) {
  const deleting = t.status === "deleting";
  return h("tr", { "data-testid": `topic-${t.topic}`, "data-topic": t.topic },
    h("td", null, h("a", { href: `#/topics/${encodeURIComponent(t.topic)}` }, t.topic),
      deleting ? [" ", h("span", { class: "badge warn" }, "being deleted")] : null),
    h("td", { class: "num" }, count(t.partitions)),
    h("td", { class: "num", "data-col": "records" }, deleting ? "–" : "…"),
    h("td", { class: "num", "data-col": "retained" }, deleting ? "–" : "…"),
    h("td", { "data-col": "last-append" }, deleting ? "–" : "…"),
    h("td", null, compressionOf(t)),
    h("td", null, retentionOf(t)),
    h("td", { class: "muted" }, when(t.created_at_ms).slice(0, 10)));
}

/**
 * @param {HTMLTableRowElement} row
 * @param {Figures | Error} found
 */
function showFigures(row, found) {
  const cell = (/** @type {string} */ name) =>
    /** @type {HTMLElement} */ (row.querySelector(`[data-col="${name}"]`));
  if (found instanceof Error) {
    for (const name of ["records", "retained", "last-append"]) {
      fill(cell(name), "–");
      cell(name).title = `not described: ${found.message}`;
    }
    return;
  }
  const atLeast = found.partial ? "≥ " : "";
  const hint = found.partial ? `the first ${count(DESCRIBE_MAX)} partitions` : "";
  fill(cell("records"), atLeast + count(found.records));
  fill(cell("retained"), found.retained === null ? "–" : atLeast + bytes(found.retained));
  fill(cell("last-append"), found.lastAppend === null ? "never" : ago(found.lastAppend));
  cell("records").title = hint;
  cell("retained").title = hint;
  cell("last-append").title = when(found.lastAppend);
}

/**
 * One describe's first page, summed; a refusal (the topic deleted since the list, say)
 * is kept as the error so the row says why it has no figures.
 * @param {string} name
 * @param {AbortSignal} signal
 * @returns {Promise<Figures | Error>}
 */
async function describe(name, signal) {
  try {
    const d = await api(`/topics/${encodeURIComponent(name)}`,
                        { query: { max_partitions: DESCRIBE_MAX }, signal });
    return summarize(d.partition_states, d.next_partition !== null && d.next_partition !== undefined);
  } catch (err) {
    return err instanceof Error ? err : new Error(String(err));
  }
}

/**
 * @param {PartitionState[]} states
 * @param {boolean} partial
 * @returns {Figures}
 */
export function summarize(states, partial) {
  let records = 0;
  /** @type {number | null} */
  let retained = 0;
  /** @type {number | null} */
  let lastAppend = null;
  for (const p of states) {
    records += recordsOf(p);
    retained = retained === null || p.retained_bytes === null ? null : retained + p.retained_bytes;
    if (p.last_append_ms !== null && (lastAppend === null || p.last_append_ms > lastAppend)) {
      lastAppend = p.last_append_ms;
    }
  }
  return { records, retained, lastAppend, partial };
}

/**
 * Records a partition holds: offsets start at 1, and an empty log has high watermark 0
 * (or, emptied by retention, a log start one past it).
 * @param {PartitionState} p
 */
export function recordsOf(p) {
  return Math.max(0, p.high_watermark - p.log_start_offset + 1);
}

/** @param {Topic} t */
export function compressionOf(t) {
  if (t.compression !== "zstd") return "none";
  return `zstd ${t.compression_level ?? 3}${t.compression_level === null ? " (default)" : ""}`;
}

/** @param {Topic} t */
export function retentionOf(t) {
  const parts = [];
  if (t.retention_ms !== null) parts.push(duration(t.retention_ms));
  if (t.retention_bytes !== null) parts.push(`${bytes(t.retention_bytes)}/partition`);
  return parts.length ? parts.join(", ") : "forever";
}

/**
 * Previous and next page of the view.
 * @param {number} from
 * @param {number} total
 * @param {(from: number) => void} go
 */
function pagerOf(from, total, go) {
  if (total <= PAGE) return [];
  return [
    h("button", { type: "button", class: "quiet", disabled: from === 0,
                  onclick: () => go(Math.max(0, from - PAGE)) }, "← Previous"),
    h("span", { class: "muted" }, `${count(from + 1)}–${count(Math.min(total, from + PAGE))} of ${count(total)}`),
    h("button", { type: "button", class: "quiet", disabled: from + PAGE >= total,
                  onclick: () => go(from + PAGE) }, "Next →"),
  ];
}

/**
 * Run ``work`` over ``items``, at most ``limit`` at once.
 * @template T
 * @param {T[]} items
 * @param {number} limit
 * @param {(item: T) => Promise<void>} work
 */
export async function pool(items, limit, work) {
  let next = 0;
  const worker = async () => {
    while (next < items.length) await work(items[next++]);
  };
  await Promise.all(Array.from({ length: Math.min(limit, items.length) }, worker));
}

/**
 * A number input's value: null when blank.
 * @param {HTMLInputElement} input
 */
export function numberOf(input) {
  const text = input.value.trim();
  return text === "" ? null : Number(text);
}

/**
 * Retention and record limits as the form's fields, each with the figure in words
 * beside it as it is typed.
 * @param {Partial<Topic>} [now] the topic's current values
 */
export function limitFields(now = {}) {
  const input = (/** @type {string} */ name, /** @type {number | null | undefined} */ value) =>
    h("input", { type: "number", name, min: 1, step: 1, value: value ?? "", placeholder: "none",
                 inputmode: "numeric" });
  const retentionMs = input("retention_ms", now.retention_ms);
  const retentionBytes = input("retention_bytes", now.retention_bytes);
  const maxRecord = input("max_record_bytes", now.max_record_bytes);
  const said = (/** @type {HTMLInputElement} */ el, /** @type {(n: number) => string} */ say) => {
    const hint = h("small", { class: "muted" });
    const update = () => {
      const n = numberOf(el);
      hint.textContent = n === null ? "none" : Number.isFinite(n) ? say(n) : "";
    };
    el.addEventListener("input", update);
    update();
    return hint;
  };
  return {
    retentionMs, retentionBytes, maxRecord,
    nodes: [
      h("label", { class: "field" }, h("span", null, "Retention (ms)"), retentionMs,
        said(retentionMs, duration)),
      h("label", { class: "field" }, h("span", null, "Retention bytes / partition"),
        retentionBytes, said(retentionBytes, bytes)),
      h("label", { class: "field" }, h("span", null, "Max record bytes"), maxRecord,
        said(maxRecord, bytes)),
    ],
  };
}

/**
 * The codec and its level; the level only with zstd (the API refuses it otherwise).
 * @param {Partial<Topic>} [now]
 * @param {boolean} [brokerDefault] offer "the broker's default" (on create)
 */
export function compressionFields(now = {}, brokerDefault = false) {
  const codec = h("select", { name: "compression" },
    brokerDefault ? h("option", { value: "" }, "broker default") : null,
    h("option", { value: "none" }, "none"),
    h("option", { value: "zstd" }, "zstd"));
  codec.value = now.compression ?? (brokerDefault ? "" : "none");
  const level = h("input", { type: "number", name: "compression_level", min: -7, max: 19,
                             step: 1, placeholder: "3", value: now.compression_level ?? "" });
  const sync = () => { level.disabled = codec.value !== "zstd"; };
  codec.addEventListener("change", sync);
  sync();
  return { codec, level, nodes: [field("Compression", codec),
    field("zstd level", level, "-7 … 19; blank: 3")] };
}

/**
 * The create form: a topic with the name, partitions, limits and codec given. The name
 * is checked against the person's admin patterns before it is sent, so a refusal says
 * which names they may create.
 * @param {Ctx} ctx
 */
function createForm(ctx) {
  const name = h("input", { name: "topic", required: true, maxlength: 249, autocomplete: "off",
                            pattern: "[A-Za-z0-9._\\-]+", placeholder: "orders" });
  const partitions = h("input", { type: "number", name: "partitions", min: 1, max: 100000,
                                  step: 1, value: 1, required: true });
  const limits = limitFields();
  const codec = compressionFields({}, true);
  const problem = h("div");
  const submit = h("button", { type: "submit" }, "Create topic");
  const form = h("form", { "data-testid": "create-topic", class: "row fields" },
    field("Name", name, "A-Z a-z 0-9 . _ -"), field("Partitions", partitions),
    limits.nodes, codec.nodes, h("div", { class: "field" }, h("span", null, "\u00a0"), submit));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    fill(problem);
    const topic = name.value.trim();
    if (!holds(ctx.who, "admin", topic)) {
      fill(problem, h("div", { class: "error", role: "alert", "data-error-type": "Forbidden" },
        h("strong", null, "Not allowed"),
        h("p", null, `${ctx.who.principal ?? "you"} may create only topics named `,
          (ctx.who.rights.admin ?? []).join(", "), ".")));
      return;
    }
    /** @type {Record<string, unknown>} */
    const body = { topic, partitions: Number(partitions.value) };
    for (const [key, el] of /** @type {[string, HTMLInputElement][]} */ ([
      ["retention_ms", limits.retentionMs], ["retention_bytes", limits.retentionBytes],
      ["max_record_bytes", limits.maxRecord]])) {
      const n = numberOf(el);
      if (n !== null) body[key] = n;
    }
    if (codec.codec.value) body.compression = codec.codec.value;
    const level = numberOf(codec.level);
    if (codec.codec.value === "zstd" && level !== null) body.compression_level = level;
    submit.disabled = true;
    try {
      await api("/topics", { method: "POST", body, signal: ctx.signal });
      ctx.notify(`Topic ${topic} created`);
      // The list again, filtered to the new topic: among thousands it would be on some
      // later view otherwise.
      history.replaceState(null, "", `#/topics?q=${encodeURIComponent(topic)}`);
      ctx.reload();
    } catch (err) {
      if (ctx.signal.aborted) return;
      fill(problem, errorPanel(err, `creating topic ${topic}`));
      submit.disabled = false;
    }
  });
  return h("details", { class: "card", open: false },
    h("summary", null, h("strong", null, "New topic")), form, problem);
}
