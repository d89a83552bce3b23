// @ts-check
/**
 * The live tail: new records of a topic's partitions as they arrive, over the broker's
 * event stream (GET /topics/{topic}/stream), in a window of fixed size.
 *
 * Why it never freezes the tab: records that arrive are only queued (the queue is cut to
 * the window, since older ones would be dropped from the table anyway) and the table is
 * changed once per animation frame, so 1,000 records/s cost a few row inserts per frame,
 * and a hidden tab (no frames) holds at most a window of records.
 *
 * With access control on, a browser's EventSource cannot send the bearer header: the
 * tail asks for a single-use stream ticket first, and since a ticket is spent once used,
 * it reconnects itself (a new ticket, a new EventSource) when the connection drops,
 * resuming every partition where the last event left it (``from`` as an event's id).
 */

import { ApiError, UNAUTHENTICATED, api } from "./api.js";
import { count, errorPanel, fill, h } from "./dom.js";
import { matches, recordRow, recordsTable } from "./records.js";

/**
 * @typedef {import("./records.js").Rec} Rec
 * @typedef {import("./records.js").PRec} PRec
 * @typedef {import("./records.js").Format} Format
 * @typedef {import("./records.js").Filter} Filter
 * @typedef {import("./api.js").Who} Who
 *
 * @typedef {object} TailOptions
 * @property {string} topic
 * @property {number[]} partitions at most {@link STREAM_MAX_PARTITIONS}
 * @property {Map<number, number>} next each partition's next offset when the tail starts
 *   (high watermark + 1): where a reconnect resumes before any event came
 * @property {Who} who
 * @property {Filter} filter
 * @property {Format} format
 * @property {number} [window] rows kept in the table
 */

/** The event stream's bound on partitions per stream (docs/http-api.md). */
export const STREAM_MAX_PARTITIONS = 256;
export const TAIL_WINDOW = 500;
// However slow a paint, the table is brought up to date at least this often.
const MAX_PAINT_GAP_MS = 500;
// Reconnect delays: a broker that drains or lost a slot is retried, not hammered.
const BACKOFF_MS = [500, 1000, 2000, 5000, 10000];

export class Tail {
  /** @param {TailOptions} options */
  constructor(options) {
    this.options = options;
    this.window = options.window ?? TAIL_WINDOW;
    /** @type {PRec[]} arrived, not yet in the table */
    this.queue = [];
    this.received = 0;
    this.shown = 0;
    this.paused = false;
    this.stopped = false;
    this.next = new Map(options.next);
    /** @type {EventSource | null} */
    this.source = null;
    this.frame = 0;
    this.timer = 0;
    this.lastPaint = 0;
    /** The id of the last event: every partition's next offset. */
    this.lastId = "";
    /** Why the stream started again from the newest record (said when it is live). */
    this.restarted = "";
    this.gapMs = 0;
    this.failures = 0;
    this.opened = false;
    /** @type {number | undefined} */
    this.retryTimer = undefined;
    // Per-second arrivals over the last 5 s: the rate shown.
    /** @type {[number, number][]} */
    this.samples = [];

    this.table = recordsTable("tail");
    this.body = /** @type {HTMLTableSectionElement} */ (this.table.tBodies[0]);
    this.countLabel = h("strong", { "data-testid": "tail-count" }, "0");
    this.rateLabel = h("span", { class: "muted" }, "0/s");
    this.status = h("span", { class: "badge", "data-testid": "tail-status" }, "connecting");
    this.problem = h("div");
    this.pauseButton = h("button", { type: "button", class: "quiet", name: "pause",
                                     onclick: () => this.toggle() }, "Pause");
    const partitions = options.partitions.length === 1 ? `partition ${options.partitions[0]}`
      : `${options.partitions.length} partitions`;
    this.element = h("div", { class: "card tail-card" },
      h("div", { class: "head" },
        h("h2", null, "Live tail"), this.status,
        h("span", null, this.countLabel, " received"), this.rateLabel,
        h("span", { class: "muted" }, `${partitions}; newest first; the last ${count(this.window)} kept`),
        h("span", { class: "actions" }, this.pauseButton)),
      this.problem,
      h("div", { class: "tail" }, this.table));
    this.ticker = window.setInterval(() => this.showRate(), 1000);
  }

  /** Open the stream (with a ticket when access control is on). */
  async start() {
    if (this.stopped) return;
    const { topic, partitions, who } = this.options;
    const from = this.resumeFrom();
    const url = new URL(`/topics/${encodeURIComponent(topic)}/stream`, location.origin);
    url.searchParams.set("partitions", partitions.join(","));
    url.searchParams.set("from", from);
    if (who.auth) {
      try {
        const answer = await api(`/topics/${encodeURIComponent(topic)}/stream/tickets`,
                                 { method: "POST" });
        url.searchParams.set("ticket", answer.ticket);
      } catch (err) {
        this.fail(err, false);
        return;
      }
    }
    if (this.stopped) return;
    const source = new EventSource(url);
    this.source = source;
    source.addEventListener("open", () => {
      this.failures = 0;
      this.setStatus(this.paused ? "paused" : "live", "ok");
      // Said once, where the connection's problems show: why it starts anew.
      fill(this.problem, this.restarted ? h("div", { class: "badge warn" }, this.restarted) : null);
      this.restarted = "";
    });
    source.addEventListener("records", (event) => this.arrived(/** @type {MessageEvent} */ (event)));
    source.addEventListener("end", () => this.reconnect());
    source.addEventListener("error", (event) => this.broken(event));
  }

  /**
   * Where a new stream starts: latest on the first; then where the last event left
   * every partition (its id, ``0:17,1:4``, given as ``from``: a new EventSource cannot
   * send Last-Event-ID), or before any event, where each partition's log ended when the
   * tail began: no partition is read again from another's offset, none skips a record.
   */
  resumeFrom() {
    if (!this.opened) {
      this.opened = true;
      return "latest";
    }
    if (this.lastId) return this.lastId;
    const { partitions } = this.options;
    return partitions.every((p) => this.next.has(p))
      ? partitions.map((p) => `${p}:${this.next.get(p)}`).join(",") : "latest";
  }

  /** @param {MessageEvent} event */
  arrived(event) {
    if (event.lastEventId) this.lastId = event.lastEventId;
    /** @type {{partition: number, next_offset: number, records: Rec[]}} */
    const data = JSON.parse(event.data);
    const seen = this.next.get(data.partition) ?? 0;
    let fresh = 0;
    for (const record of data.records) {
      if (record.offset < seen) continue; // again, after a reconnect
      fresh += 1;
      if (matches(record, this.options.filter)) {
        this.queue.push({ ...record, partition: data.partition });
      }
    }
    this.next.set(data.partition, Math.max(seen, data.next_offset));
    this.received += fresh;
    this.note(fresh);
    // Older queued records would fall out of the window at once: never hold more.
    if (this.queue.length > this.window) this.queue.splice(0, this.queue.length - this.window);
    this.schedule();
  }

  /** @param {number} n */
  note(n) {
    const second = Math.floor(performance.now() / 1000);
    const last = this.samples[this.samples.length - 1];
    if (last && last[0] === second) last[1] += n;
    else this.samples.push([second, n]);
    while (this.samples.length && this.samples[0][0] < second - 5) this.samples.shift();
  }

  schedule() {
    if (this.frame || this.timer || this.paused || this.stopped) return;
    // Painting takes at most about a fifth of the main thread: the next paint waits four
    // times as long as the last one took (at least a frame). At a high rate each paint
    // then carries more records (never more than the window), and the tab stays usable.
    const wait = this.lastPaint + this.gapMs - performance.now();
    if (wait > 0) {
      this.timer = window.setTimeout(() => {
        this.timer = 0;
        this.schedule();
      }, wait);
      return;
    }
    this.frame = requestAnimationFrame(() => this.flush());
  }

  /** Put the queued records in the table, newest first, and cut it to the window. */
  flush() {
    this.frame = 0;
    if (this.paused || this.stopped) return;
    const started = performance.now();
    const batch = this.queue.splice(0);
    const rows = document.createDocumentFragment();
    for (let i = batch.length - 1; i >= 0; i -= 1) {
      rows.appendChild(recordRow(this.options.topic, batch[i], this.options.format));
    }
    this.body.insertBefore(rows, this.body.firstChild);
    while (this.body.rows.length > this.window) this.body.deleteRow(-1);
    this.shown += batch.length;
    this.countLabel.textContent = count(this.received);
    this.lastPaint = performance.now();
    this.gapMs = Math.min(MAX_PAINT_GAP_MS, 4 * (this.lastPaint - started));
  }

  showRate() {
    const now = Math.floor(performance.now() / 1000);
    // Whole seconds only: the current one is still filling.
    const full = this.samples.filter(([s]) => s < now && s >= now - 5);
    const span = Math.min(5, Math.max(1, now - (this.samples[0]?.[0] ?? now)));
    const total = full.reduce((sum, [, n]) => sum + n, 0);
    this.rateLabel.textContent = `${count(Math.round(total / span))}/s`;
    this.countLabel.textContent = count(this.received);
  }

  toggle() {
    this.paused = !this.paused;
    this.pauseButton.textContent = this.paused ? "Resume" : "Pause";
    if (this.source?.readyState === EventSource.OPEN) {
      this.setStatus(this.paused ? "paused" : "live", this.paused ? "warn" : "ok");
    }
    // Paused, records are still received and counted (the queue keeps the newest
    // window of them): resuming shows where the topic is now.
    if (!this.paused) this.schedule();
  }

  /**
   * An ``error`` event: the broker's (with data: the stream ended on an error the
   * reader must act on) or the connection's.
   * @param {Event} event
   */
  broken(event) {
    if (this.stopped) return;
    if (event instanceof MessageEvent && typeof event.data === "string" && event.data) {
      /** @type {{error_type?: string, error?: string, retriable?: boolean}} */
      let body = {};
      try {
        body = JSON.parse(event.data);
      } catch {
        // not the broker's error body
      }
      if (body.error_type === "OffsetOutOfRange") {
        // Where it was is gone (retention, a topic made anew): follow from now on.
        this.lastId = "";
        this.next.clear();
        this.opened = false;
        this.restarted = `OffsetOutOfRange: ${body.error ?? "a position is gone"}; `
          + "following from the newest record on";
        this.reconnect();
        return;
      }
      const status = body.error_type === "Forbidden" ? 403
        : body.error_type === "Unauthenticated" ? 401 : 409;
      const refused = new ApiError(status, body.error_type ?? "StreamError", body.error ?? event.data);
      this.fail(refused, body.retriable === true);
      // The token stopped working (revoked, expired): the shell asks for another.
      if (status === 401) window.dispatchEvent(new CustomEvent(UNAUTHENTICATED, { detail: refused }));
      return;
    }
    if (this.source?.readyState === EventSource.CONNECTING && !this.options.who.auth
        && this.lastId) {
      // The browser reconnects by itself, resuming with Last-Event-ID (before any event
      // it would send none, and its address says "latest": we reconnect ourselves).
      this.setStatus("reconnecting", "warn");
      return;
    }
    // Closed (an answer that was not a stream), or a ticket that cannot be used again:
    // find out why before trying again.
    void this.diagnose();
  }

  async diagnose() {
    this.closeSource();
    this.setStatus("reconnecting", "warn");
    try {
      await api(`/topics/${encodeURIComponent(this.options.topic)}`,
                { query: { max_partitions: 1 } });
    } catch (err) {
      if (err instanceof ApiError && [401, 403, 404].includes(err.status)) {
        this.fail(err, false);
        return;
      }
    }
    this.reconnect();
  }

  reconnect() {
    this.closeSource();
    if (this.stopped) return;
    const delay = BACKOFF_MS[Math.min(this.failures, BACKOFF_MS.length - 1)];
    this.failures += 1;
    this.setStatus("reconnecting", "warn");
    this.retryTimer = window.setTimeout(() => void this.start(), delay);
  }

  /**
   * @param {unknown} err
   * @param {boolean} retriable
   */
  fail(err, retriable) {
    if (this.stopped) return;
    fill(this.problem, errorPanel(err, "following the topic"));
    if (retriable) {
      this.reconnect();
      return;
    }
    this.closeSource();
    this.setStatus("stopped", "bad");
    fill(this.problem, errorPanel(err, "following the topic"),
      h("button", { type: "button", class: "quiet", onclick: () => {
        fill(this.problem);
        this.failures = 0;
        void this.start();
      } }, "Reconnect"));
  }

  /**
   * @param {string} text
   * @param {"ok" | "warn" | "bad"} [kind]
   */
  setStatus(text, kind) {
    this.status.textContent = text;
    this.status.className = `badge ${kind ?? ""}`;
  }

  closeSource() {
    this.source?.close();
    this.source = null;
  }

  /** End everything the tail started (the page is left, or the tail is closed). */
  stop() {
    this.stopped = true;
    this.closeSource();
    window.clearTimeout(this.retryTimer);
    window.clearInterval(this.ticker);
    if (this.frame) cancelAnimationFrame(this.frame);
    window.clearTimeout(this.timer);
    this.frame = 0;
    this.timer = 0;
    this.queue = [];
    this.setStatus("stopped");
  }
}
