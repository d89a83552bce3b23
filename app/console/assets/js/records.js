// @ts-check
/**
 * Records as the Messages and Produce pages show them: a value's bytes in the format the
 * person picks (JSON pretty-printed, text, hex, base64), the key/text filter, and a
 * record's permalink. Every value is set as text (dom.js ``h``), never as markup: a
 * record's bytes are the one thing in the console an outsider fully controls.
 */

import { h, when } from "./dom.js";

/**
 * A record as POST /consume and the event stream answer it (``value`` or ``base64``,
 * ``key`` or ``key_base64``).
 * @typedef {object} Rec
 * @property {number} offset
 * @property {string} [value]
 * @property {string} [base64]
 * @property {string} [key]
 * @property {string} [key_base64]
 * @property {{name: string, value?: string, base64?: string}[]} [headers]
 * @property {number} [timestamp_ms] the producer's time
 * @property {number} [append_time_ms] the broker's append time
 *
 * A record with the partition it came from (consume answers carry it per result).
 * @typedef {Rec & {partition: number}} PRec
 *
 * @typedef {"auto" | "json" | "text" | "hex" | "base64"} Format
 */

export const FORMATS = /** @type {Format[]} */ (["auto", "json", "text", "hex", "base64"]);

// A value longer than this is cut in the table (the whole of it one click away): a page
// of 500 rows of 1 MiB values would otherwise stall layout.
const SHOWN_CHARS = 4096;

/**
 * @param {string} b64 standard base64 with padding
 * @returns {Uint8Array}
 */
export function fromBase64(b64) {
  const raw = atob(b64);
  const out = new Uint8Array(raw.length);
  for (let i = 0; i < raw.length; i += 1) out[i] = raw.charCodeAt(i);
  return out;
}

/**
 * @param {Uint8Array} data
 * @returns {string}
 */
export function toBase64(data) {
  let raw = "";
  // Chunks: String.fromCharCode(...big) overflows the argument stack.
  for (let i = 0; i < data.length; i += 0x8000) {
    raw += String.fromCharCode(...data.subarray(i, i + 0x8000));
  }
  return btoa(raw);
}

/** Whether ``text`` is valid standard base64 (what the API takes). */
export function isBase64(/** @type {string} */ text) {
  const t = text.replace(/\s+/g, "");
  if (t.length % 4 !== 0 || !/^[A-Za-z0-9+/]*={0,2}$/.test(t)) return false;
  try {
    atob(t);
    return true;
  } catch {
    return false;
  }
}

/**
 * The value's bytes, whichever way the broker sent them.
 * @param {{value?: string, base64?: string}} part
 */
function bytesOf(part) {
  return part.base64 !== undefined ? fromBase64(part.base64)
    : new TextEncoder().encode(part.value ?? "");
}

/** @param {Uint8Array} data */
function hex(data) {
  const out = [];
  for (let i = 0; i < data.length; i += 1) {
    out.push(data[i].toString(16).padStart(2, "0"));
    if (i % 32 === 31) out.push("\n");
    else if (i % 4 === 3) out.push(" ");
  }
  return out.join("").trimEnd();
}

/**
 * The value in ``format``: ``auto`` is the text as it came, one record to a line or so
 * (marked json when it parses as an object or an array), and hex for bytes that are not
 * text; ``json`` pretty-prints it.
 * @param {{value?: string, base64?: string}} part
 * @param {Format} format
 * @returns {{text: string, kind: string}} ``kind`` names what was shown (json, text,
 *   hex, base64, or "text (not JSON)" when JSON was asked and the value is not)
 */
export function formatValue(part, format) {
  if (format === "hex") return { text: hex(bytesOf(part)), kind: "hex" };
  if (format === "base64") {
    return { text: part.base64 ?? toBase64(bytesOf(part)), kind: "base64" };
  }
  if (part.value === undefined) {
    // Bytes that are not UTF-8 text: as text they would be replacement characters.
    return format === "text"
      ? { text: new TextDecoder().decode(bytesOf(part)), kind: "text (lossy: bytes)" }
      : { text: hex(bytesOf(part)), kind: "hex" };
  }
  if (format === "text") return { text: part.value, kind: "text" };
  const trimmed = part.value.trimStart();
  if (format === "json" || trimmed.startsWith("{") || trimmed.startsWith("[")) {
    try {
      const parsed = JSON.parse(part.value);
      // auto keeps the record dense (a table of records scans by line); pretty on ask.
      return { text: format === "json" ? JSON.stringify(parsed, null, 2) : part.value,
               kind: "json" };
    } catch {
      return { text: part.value, kind: format === "json" ? "text (not JSON)" : "text" };
    }
  }
  return { text: part.value, kind: "text" };
}

/**
 * The key as text (base64 keys as ``base64:…``), or null.
 * @param {Rec} record
 */
export function keyText(record) {
  if (record.key !== undefined) return record.key;
  if (record.key_base64 !== undefined) return `base64:${record.key_base64}`;
  return null;
}

/**
 * @typedef {object} Filter
 * @property {string} key exact key wanted (empty: any)
 * @property {string} text a substring of the value, case-insensitive (empty: any)
 */

/** @param {Filter} filter */
export function filtering(filter) {
  return filter.key !== "" || filter.text !== "";
}

/**
 * Whether ``record`` passes ``filter``. Binary values are searched in their base64 form
 * (what the person sees and can paste).
 * @param {Rec} record
 * @param {Filter} filter
 */
export function matches(record, filter) {
  if (filter.key !== "" && keyText(record) !== filter.key) return false;
  if (filter.text !== "") {
    const hay = record.value ?? record.base64 ?? "";
    if (!hay.toLowerCase().includes(filter.text.toLowerCase())) return false;
  }
  return true;
}

/**
 * The console's address of one record: Messages opened on it, highlighted.
 * @param {string} topic
 * @param {number} partition
 * @param {number} offset
 */
export function permalink(topic, partition, offset) {
  return `#/messages/${encodeURIComponent(topic)}?partition=${partition}&offset=${offset}`;
}

/**
 * The order records of several partitions are shown in: append time, then partition and
 * offset (append times tie within one append).
 * @param {PRec} a
 * @param {PRec} b
 */
export function byAppendTime(a, b) {
  return (a.append_time_ms ?? 0) - (b.append_time_ms ?? 0) || a.partition - b.partition
    || a.offset - b.offset;
}

/**
 * The cell of a value: its text, cut when long, with what format it is in.
 * @param {{value?: string, base64?: string}} part
 * @param {Format} format
 */
function valueCell(part, format) {
  const { text, kind } = formatValue(part, format);
  const size = part.base64 !== undefined ? Math.floor(part.base64.length * 3 / 4)
    : new TextEncoder().encode(part.value ?? "").length;
  const pre = h("pre", null, text.length > SHOWN_CHARS ? text.slice(0, SHOWN_CHARS) : text);
  const more = text.length > SHOWN_CHARS
    ? h("button", { type: "button", class: "quiet small", onclick: (event) => {
        pre.textContent = text;
        /** @type {HTMLElement} */ (event.currentTarget).remove();
      } }, `show all ${size.toLocaleString("en-US")} bytes`)
    : null;
  const note = kind === "text" ? null : h("span", { class: "badge" }, kind);
  return h("td", { class: "value" }, note, pre, more);
}

/**
 * @param {Rec["headers"]} headers
 */
function headersCell(headers) {
  if (!headers?.length) return h("td", { class: "muted" }, "–");
  return h("td", { class: "hdrs" }, headers.map((hd) => h("div", null,
    h("span", { class: "muted" }, `${hd.name}: `),
    hd.value ?? h("span", null, h("span", { class: "badge" }, "b64"), " ", hd.base64 ?? ""))));
}

export const RECORD_HEAD = ["Partition · offset", "Time", "Key", "Headers", "Value"];

/**
 * One record's row: its permalink, both times (the broker's append time; the producer's
 * timestamp under it when it gave one), key, headers, value.
 * @param {string} topic
 * @param {PRec} record
 * @param {Format} format
 */
export function recordRow(topic, record, format) {
  const key = keyText(record);
  const link = permalink(topic, record.partition, record.offset);
  return h("tr", { "data-testid": `record-${record.partition}-${record.offset}` },
    h("td", { class: "num" }, h("a", { href: link, title: "permalink to this record" },
      `${record.partition} · ${record.offset}`)),
    h("td", { class: "time" },
      h("div", { title: "append time (the broker's)" }, when(record.append_time_ms)),
      record.timestamp_ms !== undefined
        ? h("div", { class: "muted", title: "record timestamp (the producer's)" },
            "ts ", when(record.timestamp_ms))
        : null),
    h("td", { class: key === null ? "muted" : "key" }, key ?? "–"),
    headersCell(record.headers),
    valueCell(record, format));
}

/**
 * The records' table head (the body is filled by the caller).
 * @param {string} testid
 */
export function recordsTable(testid) {
  return h("table", { class: "records", "data-testid": testid },
    h("thead", null, h("tr", null, RECORD_HEAD.map((name) => h("th", null, name)))),
    h("tbody"));
}
