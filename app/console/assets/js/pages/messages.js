// @ts-check
/**
 * Messages: a topic's records, read through POST /consume, from the start, the end, an
 * offset or a time (POST /offsets), in one partition or merged over all of them by
 * append time; filtered by key and by text in the value; and a live tail over the event
 * stream (tail.js).
 *
 * Every read is bounded: a request asks at most {@link MAX_BYTES} and a scan stops at
 * {@link SCAN_MAX} records or {@link MAX_REQUESTS} requests, saying how far it got, so a
 * filter that matches nothing in a large topic costs a few MiB and a click to go on,
 * never an unbounded read. The view's form lives in the route's query, so every view
 * (and a record's permalink, ``?partition=P&offset=O``) is an address.
 */

import { ApiError, api, holds } from "../api.js";
import { count, errorPanel, field, fill, h } from "../dom.js";
import {
  FORMATS, byAppendTime, filtering, matches, recordRow, recordsTable,
} from "../records.js";
import { STREAM_MAX_PARTITIONS, Tail } from "../tail.js";

/**
 * @typedef {import("../main.js").Ctx} Ctx
 * @typedef {import("../main.js").Route} Route
 * @typedef {import("../records.js").Rec} Rec
 * @typedef {import("../records.js").PRec} PRec
 * @typedef {import("../records.js").Format} Format
 * @typedef {import("../records.js").Filter} Filter
 *
 * @typedef {object} PartitionState a describe's partition
 * @property {number} partition
 * @property {number} log_start_offset
 * @property {number} high_watermark
 *
 * @typedef {"end" | "start" | "offset" | "time"} From
 *
 * @typedef {object} View what the route's query asks for
 * @property {number | null} partition null: all partitions
 * @property {From} from
 * @property {number | null} offset
 * @property {number | null} time Unix ms
 * @property {Filter} filter
 * @property {Format} format
 * @property {number} limit rows per read
 * @property {boolean} tail
 *
 * @typedef {object} Scan one bounded read (one direction, per-partition ranges)
 * @property {Map<number, number>} from first offset to read, per partition
 * @property {Map<number, number>} until first offset not to read (Infinity: no end)
 * @property {"first" | "last"} keep which matches to keep when there are more than
 *   ``want``: the first (reading forward) or the last (the end, and "Older")
 * @property {number} want
 *
 * @typedef {object} Scanned
 * @property {PRec[]} shown the matches kept, by append time
 * @property {number} scanned records read (and kept account of)
 * @property {Map<number, [number, number]>} covered per partition, [first, next) read
 * @property {boolean} more the ranges were not all read (a bound stopped the scan)
 * @property {string[]} notes per-partition problems (a partition that failed)
 */

/** Record bytes one consume asks for: a page never holds much more than this per click. */
export const MAX_BYTES = 1024 * 1024;
/** A filtered scan stops after this many records... */
export const SCAN_MAX = 5000;
/** ...or this many requests, and offers to go on. */
export const MAX_REQUESTS = 10;
/** Partitions per consume request: far below the API's default bound of 1,000. */
const CHUNK = 100;
// Rows a page holds however often Older/Newer is pressed, and notes it shows.
const MAX_ROWS = 2000;
const MAX_NOTES = 5;
/** Partitions per describe page (the API's most). */
const DESCRIBE_PAGE = 1000;
const LIMITS = [20, 50, 200, 500];
// Up to this many partitions the picker is a list; beyond, a number.
const SELECT_MAX = 256;

/**
 * @param {HTMLElement} view
 * @param {Route} route
 * @param {Ctx} ctx
 */
export async function render(view, route, ctx) {
  const topic = route.parts[0];
  if (!topic) {
    await picker(view, ctx);
    return;
  }
  if (!holds(ctx.who, "consume", topic)) {
    fill(view, head(topic, ctx), errorPanel(new ApiError(403, "Forbidden",
      `${ctx.who.principal ?? "this principal"} holds no consume right on topic ${topic}`),
      "reading its messages"));
    return;
  }
  const partitions = await describe(topic, ctx.signal);
  const asked = parseView(route.query, partitions.length);
  const page = new MessagesView(view, topic, partitions, asked, ctx);
  await page.load();
}

/**
 * The topic picker: the topics the person may consume.
 * @param {HTMLElement} view
 * @param {Ctx} ctx
 */
async function picker(view, ctx) {
  const { topics } = /** @type {{topics: {topic: string, partitions: number, status?: string}[]}} */ (
    await api("/topics", { signal: ctx.signal }));
  const mine = topics.filter((t) => holds(ctx.who, "consume", t.topic) && t.status !== "deleting")
    .sort((a, b) => a.topic.localeCompare(b.topic));
  const input = h("input", { type: "search", name: "topic-filter", placeholder: "Filter topics",
                             autocomplete: "off" });
  const body = h("tbody");
  const show = () => {
    const q = input.value.trim().toLowerCase();
    const rows = mine.filter((t) => t.topic.toLowerCase().includes(q)).slice(0, 500);
    fill(body, rows.map((t) => h("tr", null,
      h("td", null, h("a", { href: `#/messages/${encodeURIComponent(t.topic)}` }, t.topic)),
      h("td", { class: "num" }, count(t.partitions)))));
  };
  input.addEventListener("input", show);
  show();
  fill(view,
    h("div", { class: "head" }, h("h1", null, "Messages"),
      h("span", { class: "muted" }, "pick a topic to read")),
    mine.length === 0
      ? h("p", { class: "muted", "data-testid": "no-topics" }, "No topic you may consume.")
      : h("div", { class: "card" }, input,
          h("table", { "data-testid": "topic-picker" },
            h("thead", null, h("tr", null, h("th", null, "Topic"), h("th", { class: "num" }, "Partitions"))),
            body)));
}

/**
 * Every partition's state, page by page (max_partitions bounds each answer).
 * @param {string} topic
 * @param {AbortSignal} signal
 * @returns {Promise<PartitionState[]>}
 */
async function describe(topic, signal) {
  /** @type {PartitionState[]} */
  const out = [];
  /** @type {number | null} */
  let from = 0;
  while (from !== null) {
    const page = await api(`/topics/${encodeURIComponent(topic)}`,
                           { query: { from_partition: from, max_partitions: DESCRIBE_PAGE }, signal });
    out.push(...page.partition_states);
    from = page.next_partition ?? null;
  }
  return out;
}

/**
 * @param {URLSearchParams} q
 * @param {number} partitions
 * @returns {View}
 */
function parseView(q, partitions) {
  const int = (/** @type {string} */ name) => {
    const raw = q.get(name);
    if (raw === null || raw.trim() === "") return null;
    const n = Number(raw);
    return Number.isSafeInteger(n) && n >= 0 ? n : null;
  };
  let partition = int("partition");
  if (partition !== null && partition >= partitions) partition = null;
  const offset = int("offset");
  const time = int("time");
  let from = /** @type {From} */ (q.get("from") ?? "");
  if (!["end", "start", "offset", "time"].includes(from)) {
    from = offset !== null ? "offset" : time !== null ? "time" : "end";
  }
  if (from === "offset" && offset === null) from = "end";
  if (from === "time" && time === null) from = "end";
  const format = /** @type {Format} */ (q.get("format") ?? "auto");
  const limit = int("limit");
  return {
    partition: partitions === 1 ? 0 : partition,
    from, offset, time,
    filter: { key: q.get("key") ?? "", text: q.get("q") ?? "" },
    format: FORMATS.includes(format) ? format : "auto",
    limit: limit !== null && LIMITS.includes(limit) ? limit : 50,
    tail: q.get("tail") === "1",
  };
}

/**
 * The route's query for a view (what the form submits).
 * @param {View} v
 */
function queryOf(v) {
  const q = new URLSearchParams();
  if (v.partition !== null) q.set("partition", String(v.partition));
  if (v.from !== "end" && !(v.from === "offset" && v.partition !== null)) q.set("from", v.from);
  if (v.from === "offset" && v.offset !== null) q.set("offset", String(v.offset));
  if (v.from === "time" && v.time !== null) q.set("time", String(v.time));
  if (v.filter.key) q.set("key", v.filter.key);
  if (v.filter.text) q.set("q", v.filter.text);
  if (v.format !== "auto") q.set("format", v.format);
  if (v.limit !== 50) q.set("limit", String(v.limit));
  if (v.tail) q.set("tail", "1");
  return q.toString();
}

/**
 * @param {string} topic
 * @param {Ctx} ctx
 */
function head(topic, ctx) {
  const q = encodeURIComponent(topic);
  return h("div", { class: "head" },
    h("h1", null, "Messages ", h("span", { class: "muted" }, "· "), topic),
    h("a", { href: `#/topics/${q}` }, "topic"),
    h("a", { href: "#/messages" }, "other topic"),
    holds(ctx.who, "produce", topic)
      ? h("span", { class: "actions" }, h("a", { class: "button", href: `#/produce?topic=${q}`,
                                                 "data-testid": "messages-produce" }, "Produce"))
      : null);
}

/**
 * A datetime-local input's value for a time (local time, to the millisecond: append
 * times are milliseconds, and records of one second are told apart by them).
 * @param {number} ms Unix ms
 */
export function localInput(ms) {
  const d = new Date(ms - new Date(ms).getTimezoneOffset() * 60000);
  return d.toISOString().slice(0, 23);
}

/** One topic's messages: the form, the records read, and the tail. */
class MessagesView {
  /**
   * @param {HTMLElement} view
   * @param {string} topic
   * @param {PartitionState[]} partitions
   * @param {View} asked
   * @param {Ctx} ctx
   */
  constructor(view, topic, partitions, asked, ctx) {
    this.view = view;
    this.topic = topic;
    this.partitions = partitions;
    this.asked = asked;
    this.ctx = ctx;
    /** @type {Map<number, PartitionState>} */
    this.state = new Map(partitions.map((p) => [p.partition, p]));
    /** @type {number[]} */
    this.reading = asked.partition === null ? partitions.map((p) => p.partition) : [asked.partition];
    /** @type {Map<number, number>} per partition, the first offset read (for Older) */
    this.lo = new Map();
    /** @type {Map<number, number>} per partition, the next offset to read (for Newer) */
    this.hi = new Map();
    /** @type {PRec[]} the rows shown, by append time */
    this.rows = [];
    this.scanned = 0;
    /** @type {Tail | null} */
    this.tail = null;
    /** @type {(Scanned & {how: string}) | null} the last read, for its summary */
    this.last = null;
    /** @type {"older" | "newer"} which way "Scan further" goes */
    this.direction = "newer";

    this.table = recordsTable("records");
    this.body = /** @type {HTMLTableSectionElement} */ (this.table.tBodies[0]);
    this.summary = h("div", { class: "muted", "data-testid": "records-summary" });
    this.problems = h("div");
    this.olderButton = h("button", { type: "button", class: "quiet", name: "older",
                                     onclick: () => void this.step("older") }, "Older");
    this.newerButton = h("button", { type: "button", class: "quiet", name: "newer",
                                     onclick: () => void this.step("newer") }, "Newer");
    this.tailSlot = h("div");
    this.tailButton = h("button", { type: "button", class: "quiet", name: "tail",
                                    "data-testid": "tail-toggle",
                                    onclick: () => this.toggleTail() }, "Live tail");
    ctx.onLeave(() => this.tail?.stop());
  }

  async load() {
    const a = this.asked;
    fill(this.view,
      head(this.topic, this.ctx),
      this.form(),
      this.tailSlot,
      h("div", { class: "card" },
        h("div", { class: "head" }, this.summary,
          h("span", { class: "actions" }, this.olderButton, this.newerButton)),
        this.problems,
        this.table,
        h("div", { class: "row pager" }, h("span", { class: "grow" }))));
    if (a.tail) this.toggleTail();
    const from = await this.startOffsets();
    const keepLast = a.from === "end";
    /** @type {Map<number, number>} */
    const until = new Map(this.reading.map((p) => [p, Infinity]));
    const result = await this.scan({ from, until, keep: keepLast ? "last" : "first", want: a.limit });
    this.direction = keepLast ? "older" : "newer";
    this.take(result, "replace");
    if (a.from === "offset" && a.partition !== null && a.offset !== null) this.highlight(a.partition, a.offset);
  }

  /** The form: partition, where from, filters, format; it submits to the route. */
  form() {
    const a = this.asked;
    /** @type {HTMLSelectElement | HTMLInputElement} */
    let partition;
    if (this.partitions.length <= SELECT_MAX) {
      partition = h("select", { name: "partition" },
        this.partitions.length > 1 ? h("option", { value: "" }, "all partitions") : null,
        this.partitions.map((p) => h("option", { value: p.partition, selected: a.partition === p.partition },
          `${p.partition} (offsets ${p.log_start_offset}–${p.high_watermark})`)));
    } else {
      partition = h("input", { name: "partition", type: "number", min: 0,
                               max: this.partitions.length - 1, placeholder: "all",
                               value: a.partition ?? "" });
    }
    const from = h("select", { name: "from" },
      [["end", "the end (newest)"], ["start", "the start"], ["offset", "an offset"], ["time", "a time"]]
        .map(([v, label]) => h("option", { value: v, selected: a.from === v }, label)));
    const offset = h("input", { name: "offset", type: "number", min: 0, value: a.offset ?? "", class: "short" });
    const time = h("input", { name: "time", type: "datetime-local", step: 0.001,
                              value: a.time !== null ? localInput(a.time) : "" });
    const key = h("input", { name: "key", type: "search", value: a.filter.key, placeholder: "exact key",
                             autocomplete: "off" });
    const text = h("input", { name: "q", type: "search", value: a.filter.text,
                              placeholder: "text in the value", autocomplete: "off" });
    const format = h("select", { name: "format" },
      FORMATS.map((f) => h("option", { value: f, selected: a.format === f }, f)));
    const limit = h("select", { name: "limit" },
      LIMITS.map((n) => h("option", { value: n, selected: a.limit === n }, `${n} records`)));
    const offsetField = field("Offset", offset);
    const timeField = field("Time (local)", time);
    const shown = () => {
      offsetField.hidden = from.value !== "offset";
      timeField.hidden = from.value !== "time";
    };
    from.addEventListener("change", shown);
    shown();
    // The format changes only how the rows read: no new read, the address follows.
    format.addEventListener("change", () => {
      this.asked.format = /** @type {Format} */ (format.value);
      this.render();
      history.replaceState(null, "", `#/messages/${encodeURIComponent(this.topic)}?${queryOf(this.asked)}`);
    });
    const form = h("form", { class: "card row msgform", "data-testid": "messages-form" },
      field("Partition", partition), field("From", from), offsetField, timeField,
      field("Key", key), field("Value contains", text), field("Format", format), field("Show", limit),
      h("div", { class: "field" }, h("span", null, "\u00a0"), h("button", { type: "submit", name: "read" }, "Read")),
      h("div", { class: "field" }, h("span", null, "\u00a0"), this.tailButton));
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      const p = partition.value.trim() === "" ? null : Number(partition.value);
      const at = time.value ? new Date(time.value).getTime() : null;
      /** @type {View} */
      const next = {
        partition: p !== null && Number.isSafeInteger(p) && p >= 0 ? p : null,
        from: /** @type {From} */ (from.value),
        offset: offset.value === "" ? null : Math.max(0, Math.floor(Number(offset.value))),
        time: at !== null && Number.isFinite(at) ? at : null,
        filter: { key: key.value, text: text.value },
        format: /** @type {Format} */ (format.value),
        limit: Number(limit.value),
        tail: this.tail !== null,
      };
      const hash = `#/messages/${encodeURIComponent(this.topic)}?${queryOf(next)}`;
      if (location.hash === hash) this.ctx.reload();
      else this.ctx.go(hash);
    });
    return form;
  }

  /** Where the first read starts, per partition. */
  async startOffsets() {
    const a = this.asked;
    /** @type {Map<number, number>} */
    const from = new Map();
    for (const p of this.reading) {
      const s = /** @type {PartitionState} */ (this.state.get(p));
      if (a.from === "start") {
        from.set(p, s.log_start_offset);
      } else if (a.from === "offset") {
        const o = a.offset ?? 0;
        if (o < s.log_start_offset && this.reading.length === 1) {
          this.note(`Offset ${o} is before partition ${p}'s log start (${s.log_start_offset}): retention removed it.`);
        }
        from.set(p, Math.min(Math.max(o, s.log_start_offset), s.high_watermark + 1));
      } else if (a.from === "end") {
        // The last ``limit`` records of each partition (a scan's worth, spread over the
        // partitions, with a filter): the merge keeps the newest.
        from.set(p, Math.max(s.log_start_offset, s.high_watermark - this.span() + 1));
      }
    }
    if (a.from === "time") {
      for (let i = 0; i < this.reading.length; i += CHUNK) {
        const chunk = this.reading.slice(i, i + CHUNK);
        const answer = await api("/offsets", { method: "POST", signal: this.ctx.signal, body: {
          topic_partitions: chunk.map((p) => ({ topic: this.topic, partition: p, timestamp_ms: a.time })) } });
        for (const r of answer.results) {
          if (r.ok) from.set(r.partition, r.offset);
          else this.note(`Partition ${r.partition}: ${r.error_type}: ${r.error}`);
        }
      }
    }
    for (const [p, o] of from) {
      this.lo.set(p, o);
      this.hi.set(p, o);
    }
    return from;
  }

  /**
   * Read forward through the ranges, bounded (bytes per request, records, requests), and
   * keep ``want`` matches: the first ones, or the last.
   * @param {Scan} scan
   * @returns {Promise<Scanned>}
   */
  async scan(scan) {
    const first = await this.scanOnce(scan);
    if (scan.keep !== "last" || !first.more) return first;
    // Kept from the end, but a bound stopped the read short of it: what it kept are not
    // the last records. Read again from nearer the end, by as many records of each
    // partition as the bounds let this read take (a fifth fewer: sizes differ).
    const from = new Map(scan.from);
    for (const [p, [, next]] of first.covered) {
      const start = scan.from.get(p) ?? next;
      const end = Math.min(scan.until.get(p) ?? Infinity,
                           (this.state.get(p)?.high_watermark ?? 0) + 1);
      if (next < end) from.set(p, Math.max(start, end - Math.max(1, Math.floor((next - start) * 0.8))));
    }
    const again = await this.scanOnce({ ...scan, from });
    const notes = [...first.notes, ...again.notes];
    if (again.more) {
      notes.push(`The read's bounds (${MAX_REQUESTS} reads of ${MAX_BYTES / 1048576} MiB, `
        + `${count(SCAN_MAX)} records) stopped short of the newest records: Newer reads on.`);
    }
    return { ...again, scanned: first.scanned + again.scanned, notes };
  }

  /**
   * One bounded read of ``scan``'s ranges.
   * @param {Scan} scan
   * @returns {Promise<Scanned>}
   */
  async scanOnce(scan) {
    const filter = this.asked.filter;
    const pos = new Map(scan.from);
    /** @type {Map<number, number>} */
    const hw = new Map([...pos.keys()].map((p) => [p, this.state.get(p)?.high_watermark ?? 0]));
    /** @type {PRec[]} */
    const read = [];
    /** @type {string[]} */
    const notes = [];
    /** @type {Set<number>} partitions that failed: read no further */
    const failed = new Set();
    const open = () => [...pos.keys()].filter((p) => !failed.has(p)
      && (pos.get(p) ?? 0) < (scan.until.get(p) ?? Infinity) && (pos.get(p) ?? 0) <= (hw.get(p) ?? 0));
    let matched = 0;
    let requests = 0;
    let turn = 0;
    let active = open();
    // Forward, a scan stops once it has its matches; the last ones need the whole range.
    const enough = () => scan.keep === "first" && matched >= scan.want;
    while (active.length && requests < MAX_REQUESTS && read.length < SCAN_MAX && !enough()) {
      // Rotate which partitions go first: the budget is spent in request order.
      const start = turn % active.length;
      const chunk = [...active.slice(start), ...active.slice(0, start)].slice(0, CHUNK);
      turn += CHUNK;
      const per = Math.max(16384, Math.ceil(MAX_BYTES / chunk.length));
      const answer = await api("/consume", { method: "POST", signal: this.ctx.signal, body: {
        topic_partitions: chunk.map((p) => ({ topic: this.topic, partition: p,
                                               fetch_offset: pos.get(p), partition_max_bytes: per })),
        max_wait_ms: 0, max_bytes: MAX_BYTES } });
      requests += 1;
      for (const r of answer.results) {
        const p = r.partition;
        if (!r.ok) {
          if (r.error_type === "OffsetOutOfRange" && typeof r.log_start_offset === "number"
              && (pos.get(p) ?? 0) < r.log_start_offset) {
            pos.set(p, r.log_start_offset); // retention moved the start while we read
            continue;
          }
          failed.add(p);
          notes.push(`Partition ${p}: ${r.error_type}: ${r.error}`);
          continue;
        }
        hw.set(p, r.high_watermark);
        const until = scan.until.get(p) ?? Infinity;
        for (const rec of /** @type {Rec[]} */ (r.records)) {
          if (rec.offset >= until) break;
          read.push({ ...rec, partition: p });
          if (matches(rec, filter)) matched += 1;
        }
        pos.set(p, Math.min(r.next_offset, until));
      }
      active = open();
    }
    read.sort(byAppendTime);
    let kept = read;
    if (scan.keep === "first") {
      // Merging partitions: a partition not read to its end may still hold records
      // older than another's last one read; keep only what is certainly in order.
      /** @type {Map<number, number>} each partition's last append time read */
      const lastTime = new Map();
      for (const r of read) lastTime.set(r.partition, r.append_time_ms ?? 0);
      let cutoff = Infinity;
      for (const p of active) {
        const t = lastTime.get(p);
        if (t !== undefined) cutoff = Math.min(cutoff, t);
      }
      let n = 0;
      let end = kept.length;
      for (let i = 0; i < kept.length; i += 1) {
        if ((kept[i].append_time_ms ?? 0) > cutoff) {
          end = i;
          break;
        }
        if (matches(kept[i], filter) && ++n >= scan.want) {
          end = i + 1;
          break;
        }
      }
      const dropped = kept.slice(end);
      kept = kept.slice(0, end);
      // What was read past the kept ones is read again next time.
      for (const r of dropped) pos.set(r.partition, Math.min(pos.get(r.partition) ?? r.offset, r.offset));
    } else {
      let n = 0;
      let begin = 0;
      for (let i = kept.length - 1; i >= 0; i -= 1) {
        if (matches(kept[i], filter) && ++n >= scan.want) {
          begin = i;
          break;
        }
      }
      kept = kept.slice(begin);
    }
    /** @type {Map<number, [number, number]>} */
    const covered = new Map();
    const readFrom = new Set(read.map((r) => r.partition));
    for (const p of scan.from.keys()) {
      let first = scan.from.get(p) ?? 0;
      if (scan.keep === "last") {
        // From the first record kept; a partition whose records were all older than
        // the ones kept covers nothing (Older reads them).
        const mine = kept.find((r) => r.partition === p);
        if (mine) first = mine.offset;
        else if (readFrom.has(p)) first = pos.get(p) ?? first;
      }
      covered.set(p, [first, pos.get(p) ?? first]);
    }
    for (const [p, w] of hw) {
      const s = this.state.get(p);
      if (s) s.high_watermark = w;
    }
    return {
      shown: kept.filter((r) => matches(r, filter)),
      scanned: kept.length,
      covered,
      more: open().length > 0,
      notes,
    };
  }

  /**
   * Put a scan's result in the page.
   * @param {Scanned} result
   * @param {"replace" | "append" | "prepend"} how
   */
  take(result, how) {
    for (const [p, [first, next]] of result.covered) {
      if (how !== "append") this.lo.set(p, Math.min(this.lo.get(p) ?? first, first));
      if (how === "replace" && this.asked.from === "end") this.lo.set(p, first);
      if (how !== "prepend") this.hi.set(p, next);
    }
    if (how === "replace") this.rows = result.shown;
    else if (how === "append") this.rows = [...this.rows, ...result.shown];
    else this.rows = [...result.shown, ...this.rows];
    if (how !== "replace") this.trim(how);
    this.scanned += result.scanned;
    this.last = { ...result, how };
    for (const n of result.notes) this.note(n);
    this.render();
  }

  /**
   * Keep at most MAX_ROWS rows: those furthest from what was just read go, and the
   * range shown shrinks to match (Older or Newer reads them again).
   * @param {"append" | "prepend"} how
   */
  trim(how) {
    const over = this.rows.length - MAX_ROWS;
    if (over <= 0) return;
    if (how === "append") {
      for (const r of this.rows.slice(0, over)) {
        this.lo.set(r.partition, Math.max(this.lo.get(r.partition) ?? 0, r.offset + 1));
      }
      this.rows = this.rows.slice(over);
    } else {
      for (const r of this.rows.slice(MAX_ROWS)) {
        this.hi.set(r.partition, Math.min(this.hi.get(r.partition) ?? Infinity, r.offset));
      }
      this.rows = this.rows.slice(0, MAX_ROWS);
    }
    this.note(`The page keeps the ${count(MAX_ROWS)} records nearest to the last read; `
      + `${how === "append" ? "older" : "newer"} ones were let go.`);
  }

  /** The rows and what they cover. */
  render() {
    const rows = document.createDocumentFragment();
    for (const r of this.rows) rows.appendChild(recordRow(this.topic, r, this.asked.format));
    fill(this.body, rows);
    if (!this.rows.length) {
      this.body.appendChild(h("tr", { class: "empty" }, h("td", { colspan: 5, class: "muted" },
        filtering(this.asked.filter) ? "No record matched." : "No records here.")));
    }
    const olderLeft = this.reading.some((p) => (this.lo.get(p) ?? 0) > (this.state.get(p)?.log_start_offset ?? 0));
    this.olderButton.disabled = !olderLeft;
    this.newerButton.textContent = this.reading.some((p) => (this.hi.get(p) ?? 0) <= (this.state.get(p)?.high_watermark ?? 0))
      ? "Newer" : "Newer (check again)";
    fill(this.summary, this.describeCoverage());
  }

  /** "scanned X records to offset Y, Z matched — Scan further", and the ranges. */
  describeCoverage() {
    const filtered = filtering(this.asked.filter);
    const ranges = this.reading
      .filter((p) => (this.hi.get(p) ?? 0) > (this.lo.get(p) ?? 0))
      .map((p) => `${p}: ${this.lo.get(p)}–${(this.hi.get(p) ?? 1) - 1}`);
    const where = this.reading.length === 1
      ? (ranges.length ? `partition ${ranges[0].replace(": ", ", offsets ")}` : `partition ${this.reading[0]}`)
      : `${ranges.length} of ${this.reading.length} partitions${ranges.length && ranges.length <= 8 ? ` (${ranges.join(", ")})` : ""}`;
    const parts = [];
    if (filtered) {
      const to = this.reading.length === 1 ? ` to offset ${(this.hi.get(this.reading[0]) ?? 1) - 1}` : "";
      parts.push(h("span", null, `scanned ${count(this.scanned)} records${to}, `,
        h("strong", { "data-testid": "match-count" }, count(this.rows.length)), " matched; ", where));
      if (this.last?.more) {
        parts.push(" — ", h("button", { type: "button", class: "quiet", name: "scan-further",
          onclick: () => void this.step(this.direction) },
        "Scan further"));
      }
    } else {
      parts.push(h("span", null, h("strong", null, count(this.rows.length)), " records; ", where));
    }
    return parts;
  }

  /**
   * Read the next page, older or newer than what is shown.
   * @param {"older" | "newer"} direction
   */
  async step(direction) {
    const a = this.asked;
    this.olderButton.disabled = true;
    this.newerButton.disabled = true;
    try {
      if (direction === "newer") {
        const until = new Map(this.reading.map((p) => [p, Infinity]));
        await this.refreshWatermarks();
        this.take(await this.scan({ from: new Map(this.hi), until, keep: "first", want: a.limit }), "append");
      } else {
        const span = this.span();
        /** @type {Map<number, number>} */
        const from = new Map();
        /** @type {Map<number, number>} */
        const until = new Map();
        for (const p of this.reading) {
          const lo = this.lo.get(p) ?? 0;
          const start = this.state.get(p)?.log_start_offset ?? 0;
          if (lo <= start) continue;
          from.set(p, Math.max(start, lo - span));
          until.set(p, lo);
        }
        const result = await this.scan({ from, until, keep: "last", want: a.limit });
        for (const [p, [first]] of result.covered) this.lo.set(p, first);
        this.take(result, "prepend");
      }
    } catch (err) {
      if (!this.ctx.signal.aborted) fill(this.problems, errorPanel(err, "reading records"));
    } finally {
      this.newerButton.disabled = false;
      this.render();
    }
  }

  /**
   * How far back from a partition's end (or from what is shown) a backward read starts:
   * a page's worth, or a scan's worth with a filter, spread over the partitions read so
   * one read stays within {@link SCAN_MAX} records.
   */
  span() {
    const n = this.reading.length;
    const spread = Math.max(1, Math.floor(SCAN_MAX / n));
    return filtering(this.asked.filter) ? spread : Math.min(this.asked.limit, spread);
  }

  /** The high watermarks now (a Newer that found nothing may find records later). */
  async refreshWatermarks() {
    if (this.reading.length > DESCRIBE_PAGE) return;
    const fresh = await describe(this.topic, this.ctx.signal);
    for (const p of fresh) this.state.set(p.partition, p);
  }

  /** @param {string} text */
  note(text) {
    this.problems.appendChild(h("div", { class: "badge warn" }, text));
    // The newest few: a long session of Older/Newer must not pile notes up.
    while (this.problems.childElementCount > MAX_NOTES) this.problems.firstElementChild?.remove();
  }

  /**
   * @param {number} partition
   * @param {number} offset
   */
  highlight(partition, offset) {
    const row = this.body.querySelector(`[data-testid="record-${partition}-${offset}"]`);
    if (!row) {
      this.note(`No record at partition ${partition}, offset ${offset} (yet).`);
      return;
    }
    row.classList.add("hit");
    row.scrollIntoView({ block: "center" });
  }

  /** Start or stop the live tail over the partitions read (the first 256 of them). */
  toggleTail() {
    if (this.tail) {
      this.tail.stop();
      this.tail = null;
      fill(this.tailSlot);
      this.tailButton.textContent = "Live tail";
      return;
    }
    const partitions = this.reading.slice(0, STREAM_MAX_PARTITIONS);
    this.tail = new Tail({
      topic: this.topic, partitions, who: this.ctx.who, filter: this.asked.filter,
      format: this.asked.format,
      next: new Map(partitions.map((p) => [p, (this.state.get(p)?.high_watermark ?? 0) + 1])),
    });
    fill(this.tailSlot, this.tail.element,
      this.reading.length > partitions.length
        ? h("p", { class: "muted" }, `The tail follows the first ${partitions.length} partitions of ${this.reading.length} (a stream's bound).`)
        : null);
    this.tailButton.textContent = "Stop tail";
    void this.tail.start();
  }
}
