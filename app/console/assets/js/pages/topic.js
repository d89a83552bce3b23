// @ts-check
/**
 * One topic: its configuration, a page of its partitions (log start, high watermark,
 * records, bytes, last append and the broker the cluster prefers for it), and, for a
 * person holding ``admin`` on it, the forms that change it (PATCH) and delete it
 * (DELETE, after typing its name).
 *
 * Partitions are shown a page of {@link PARTITIONS_PER_PAGE} at a time through
 * describe's ``from_partition``/``max_partitions`` (``?from=`` in the address), and the
 * page's states are read again every few seconds while it is shown.
 */

import { ApiError, api, holds } from "../api.js";
import { ago, bytes, count, errorPanel, field, fill, h, when } from "../dom.js";
import { compressionFields, compressionOf, limitFields, numberOf, recordsOf, retentionOf }
  from "./topics.js";

/**
 * @typedef {import("../main.js").Ctx} Ctx
 * @typedef {import("../main.js").Route} Route
 * @typedef {import("./topics.js").Topic} Topic
 * @typedef {import("./topics.js").PartitionState} PartitionState
 *
 * @typedef {Topic & {partition_states: PartitionState[], next_partition: number | null,
 *   deletion?: {started_at_ms: number, partitions_emptied: number} | null}} Description
 *
 * @typedef {object} Placement GET /console/api/placement/{topic}
 * @property {boolean} affinity
 * @property {{partition: number, member_id?: string, broker_id?: string, url?: string}[]} partitions
 */

const PARTITIONS_PER_PAGE = 100;
const REFRESH_MS = 5000;

/**
 * @param {HTMLElement} view
 * @param {Route} route
 * @param {Ctx} ctx
 */
export async function render(view, route, ctx) {
  const name = route.parts[0];
  const from = Math.max(0, Math.floor(Number(route.query.get("from")) || 0));
  const path = `/topics/${encodeURIComponent(name)}`;
  const read = () => Promise.all([
    /** @type {Promise<Description>} */ (api(path, { signal: ctx.signal,
      query: { from_partition: from, max_partitions: PARTITIONS_PER_PAGE } })),
    placement(name, from, ctx.signal),
  ]);
  const [topic, preferred] = await read();
  const admin = holds(ctx.who, "admin", name);

  const facts = h("div");
  const states = h("div");
  const show = (/** @type {Description} */ t, /** @type {Placement | ApiError} */ p) => {
    fill(facts, factsOf(t));
    fill(states, t.status === "deleting" ? deletingOf(t) : partitionsOf(t, p, from));
  };
  show(topic, preferred);
  ctx.every(REFRESH_MS, async () => {
    try {
      const [t, p] = await read();
      show(t, p);
    } catch (err) {
      // A topic deleted meanwhile: say so in place rather than every few seconds.
      if (err instanceof ApiError && err.status === 404) fill(states, errorPanel(err, `reading ${name}`));
      else throw err;
    }
  });

  const q = encodeURIComponent(name);
  fill(view,
    h("div", { class: "head" },
      h("h1", null, h("a", { href: "#/topics", class: "muted" }, "Topics"), " / ", name),
      topic.status === "deleting" ? h("span", { class: "badge warn" }, "being deleted") : null,
      h("div", { class: "actions" },
        h("a", { class: "button", href: `#/messages/${q}`, "data-testid": "topic-messages" }, "Messages"),
        h("a", { class: "button", href: `#/produce?topic=${q}`, "data-testid": "topic-produce" }, "Produce"),
        admin && topic.status !== "deleting"
          ? h("button", { type: "button", class: "danger", "data-testid": "delete-topic",
                          onclick: () => deleteDialog(view, name, ctx).showModal() }, "Delete…")
          : null)),
    facts,
    admin && topic.status !== "deleting" ? updateForm(topic, ctx) : null,
    states);
}

/**
 * The preferred broker of each partition of the page; a refusal is kept (the table says
 * "unknown") since the partitions themselves were readable.
 * @param {string} name
 * @param {number} from
 * @param {AbortSignal} signal
 * @returns {Promise<Placement | ApiError>}
 */
async function placement(name, from, signal) {
  try {
    return await api(`/console/api/placement/${encodeURIComponent(name)}`,
                     { query: { from_partition: from, max_partitions: PARTITIONS_PER_PAGE }, signal });
  } catch (err) {
    if (err instanceof ApiError) return err;
    throw err;
  }
}

/** @param {Description} t */
function factsOf(t) {
  let records = 0;
  let retained = 0;
  for (const p of t.partition_states) {
    records += recordsOf(p);
    retained += p.retained_bytes ?? 0;
  }
  const paged = t.partitions > t.partition_states.length;
  const tile = (/** @type {string} */ label, /** @type {string} */ value, /** @type {string} */ id) =>
    h("div", { class: "tile", "data-testid": `fact-${id}` },
      h("div", { class: "label" }, label), h("div", { class: "value" }, value));
  return h("div", { class: "tiles" },
    tile("Partitions", count(t.partitions), "partitions"),
    tile(paged ? "Records (this page)" : "Records", count(records), "records"),
    tile(paged ? "Retained (this page)" : "Retained", bytes(retained), "retained"),
    tile("Retention", retentionOf(t), "retention"),
    tile("Max record", t.max_record_bytes === null ? "broker's" : bytes(t.max_record_bytes),
         "max-record"),
    tile("Compression", compressionOf(t), "compression"),
    tile("Created", when(t.created_at_ms).slice(0, 19), "created"));
}

/** @param {Description} t */
function deletingOf(t) {
  const done = t.deletion?.partitions_emptied ?? 0;
  return h("div", { class: "card", "data-testid": "topic-deleting" },
    h("strong", null, "This topic is being deleted. "),
    `${count(done)} of ${count(t.partitions)} partitions emptied`,
    t.deletion ? ` (started ${ago(t.deletion.started_at_ms)})` : "",
    ". It is neither produced to nor read; the page says \"not found\" once it is gone.");
}

/**
 * @param {Description} t
 * @param {Placement | ApiError} p
 * @param {number} from
 */
function partitionsOf(t, p, from) {
  /** @type {Map<number, string>} */
  const brokers = new Map();
  let none = "unknown";
  if (!(p instanceof ApiError)) {
    none = p.affinity ? "none" : "any broker (affinity off)";
    for (const e of p.partitions) {
      if (e.broker_id) brokers.set(e.partition, e.url ? `${e.broker_id} (${e.url})` : e.broker_id);
    }
  }
  const rows = t.partition_states.map((s) => h("tr", { "data-testid": `partition-${s.partition}` },
    h("td", { class: "num" }, String(s.partition)),
    h("td", { class: "num" }, count(s.log_start_offset)),
    h("td", { class: "num" }, count(s.high_watermark)),
    h("td", { class: "num" }, count(recordsOf(s))),
    h("td", { class: "num" }, bytes(s.retained_bytes)),
    h("td", { title: when(s.last_append_ms) }, s.last_append_ms === null ? "never" : ago(s.last_append_ms)),
    h("td", { class: brokers.has(s.partition) ? "mono" : "muted" }, brokers.get(s.partition) ?? none)));
  const last = from + t.partition_states.length;
  const q = encodeURIComponent(t.topic);
  const pager = t.partitions > PARTITIONS_PER_PAGE ? h("div", { class: "pager" },
    from > 0 ? h("a", { class: "button quiet",
      href: `#/topics/${q}?from=${Math.max(0, from - PARTITIONS_PER_PAGE)}` }, "← Previous") : null,
    h("span", { class: "muted" }, `partitions ${count(from)}–${count(last - 1)} of ${count(t.partitions)}`),
    t.next_partition !== null ? h("a", { class: "button quiet",
      href: `#/topics/${q}?from=${t.next_partition}` }, "Next →") : null) : null;
  return [
    h("h2", null, "Partitions"),
    h("div", { class: "card flush" }, h("table", { "data-testid": "partitions" },
      h("thead", null, h("tr", null,
        ["Partition", "Log start", "High watermark", "Records", "Retained"].map(
          (label) => h("th", { class: "num" }, label)),
        h("th", null, "Last append"), h("th", null, "Preferred broker"))),
      h("tbody", null, rows))),
    pager,
  ];
}

/**
 * The change form: only what was changed is sent (PATCH changes only the fields
 * present), partitions only upward, a blank limit clears it.
 * @param {Topic} t
 * @param {Ctx} ctx
 */
function updateForm(t, ctx) {
  const partitions = h("input", { type: "number", name: "partitions", min: t.partitions,
                                  max: 100000, step: 1, value: t.partitions, required: true });
  const limits = limitFields(t);
  const codec = compressionFields(t);
  const problem = h("div");
  const submit = h("button", { type: "submit" }, "Save changes");
  const form = h("form", { class: "row fields", "data-testid": "update-topic" },
    field("Partitions", partitions, `only grow: at least ${t.partitions}`),
    limits.nodes, codec.nodes, h("div", { class: "field" }, h("span", null, "\u00a0"), submit));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    fill(problem);
    /** @type {Record<string, unknown>} */
    const body = {};
    const grow = Number(partitions.value);
    if (grow !== t.partitions) body.partitions = grow;
    for (const [key, el] of /** @type {[keyof Topic, HTMLInputElement][]} */ ([
      ["retention_ms", limits.retentionMs], ["retention_bytes", limits.retentionBytes],
      ["max_record_bytes", limits.maxRecord]])) {
      const n = numberOf(el);
      if (n !== t[key]) body[key] = n; // null clears the limit
    }
    const level = codec.codec.value === "zstd" ? numberOf(codec.level) : null;
    if (codec.codec.value !== t.compression || level !== t.compression_level) {
      body.compression = codec.codec.value;
      if (level !== null) body.compression_level = level;
    }
    if (!Object.keys(body).length) {
      fill(problem, h("p", { class: "muted" }, "Nothing changed."));
      return;
    }
    submit.disabled = true;
    try {
      await api(`/topics/${encodeURIComponent(t.topic)}`, { method: "PATCH", body, signal: ctx.signal });
      ctx.notify(`Topic ${t.topic} changed: ${Object.keys(body).join(", ")}`);
      ctx.reload();
    } catch (err) {
      if (ctx.signal.aborted) return;
      fill(problem, errorPanel(err, `changing topic ${t.topic}`));
      submit.disabled = false;
    }
  });
  return h("details", { class: "card" }, h("summary", null, h("strong", null, "Change")),
    form, problem);
}

/**
 * The delete confirmation: the button is enabled only once the topic's name is typed
 * exactly, so a delete is never one misplaced click. 202 means the broker goes on
 * deleting in the background; the person is told so.
 * @param {HTMLElement} view
 * @param {string} name
 * @param {Ctx} ctx
 */
function deleteDialog(view, name, ctx) {
  const typed = h("input", { name: "confirm", autocomplete: "off", spellcheck: "false",
                             "data-testid": "confirm-name", placeholder: name });
  const confirm = h("button", { type: "submit", class: "danger", disabled: true,
                                "data-testid": "confirm-delete" }, "Delete this topic");
  const problem = h("div");
  const dialog = h("dialog", { "data-testid": "delete-dialog" });
  const form = h("form", { method: "dialog" },
    h("h2", null, `Delete topic ${name}?`),
    h("p", null, "Every record of every partition is removed and cannot be read again. ",
      "Its offsets are never reused: written again, the topic continues where it stopped."),
    field(`Type ${name} to confirm`, typed),
    problem,
    h("div", { class: "row" },
      confirm,
      h("button", { type: "button", class: "quiet", onclick: () => dialog.close() }, "Cancel")));
  typed.addEventListener("input", () => { confirm.disabled = typed.value !== name; });
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    if (typed.value !== name) return;
    confirm.disabled = true;
    fill(problem);
    try {
      const gone = await api(`/topics/${encodeURIComponent(name)}`, { method: "DELETE", signal: ctx.signal });
      dialog.close();
      ctx.notify(gone?.status === "deleting"
        ? `Topic ${name} is being deleted: it is no longer produced to or read, and its records `
          + "are removed in the background"
        : `Topic ${name} deleted`);
      ctx.go("#/topics");
    } catch (err) {
      if (ctx.signal.aborted) return;
      fill(problem, errorPanel(err, `deleting topic ${name}`));
      confirm.disabled = typed.value !== name;
    }
  });
  dialog.append(form);
  dialog.addEventListener("close", () => dialog.remove());
  view.append(dialog);
  return dialog;
}
