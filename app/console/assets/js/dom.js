// @ts-check
/**
 * Building the page: elements from plain values (text is always set as text, never as
 * HTML, so a record's value cannot become markup), the figures' formats, and how a
 * refusal is shown to a person.
 */

import { ApiError } from "./api.js";

/**
 * @typedef {string | number | Node | null | undefined | false} Child
 * @typedef {Record<string, string | number | boolean | null | undefined | EventListener>} Attrs
 */

/**
 * An element: ``attrs`` become attributes (``on*`` functions listeners; ``false``, null
 * and undefined leave the attribute out), children are nodes or text.
 * @template {keyof HTMLElementTagNameMap} K
 * @param {K} tag
 * @param {Attrs | null} [attrs]
 * @param {...(Child | Child[])} children
 * @returns {HTMLElementTagNameMap[K]}
 */
export function h(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs ?? {})) {
    if (value === false || value === null || value === undefined) continue;
    if (typeof value === "function") {
      node.addEventListener(name.slice(2), value);
    } else {
      node.setAttribute(name, value === true ? "" : String(value));
    }
  }
  append(node, children);
  return node;
}

/**
 * @param {Node} node
 * @param {(Child | Child[])[]} children
 */
export function append(node, children) {
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.appendChild(typeof child === "object" ? child : document.createTextNode(String(child)));
  }
}

/**
 * Replace ``node``'s children.
 * @param {Node} node
 * @param {...(Child | Child[])} children
 */
export function fill(node, ...children) {
  while (node.firstChild) node.removeChild(node.firstChild);
  append(node, children);
}

const UNITS = ["B", "KiB", "MiB", "GiB", "TiB"];

/** @param {number | null | undefined} n */
export function bytes(n) {
  if (n === null || n === undefined) return "–";
  let value = n;
  let unit = 0;
  while (value >= 1024 && unit < UNITS.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return `${unit === 0 ? value : value.toFixed(value < 10 ? 2 : 1)} ${UNITS[unit]}`;
}

/** @param {number | null | undefined} n */
export function count(n) {
  return n === null || n === undefined ? "–" : n.toLocaleString("en-US");
}

/**
 * A time as the console shows it everywhere: local, to the millisecond.
 * @param {number | null | undefined} ms Unix milliseconds
 */
export function when(ms) {
  if (ms === null || ms === undefined || ms <= 0) return "–";
  const d = new Date(ms);
  const pad = (/** @type {number} */ v, n = 2) => String(v).padStart(n, "0");
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} `
    + `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}.${pad(d.getMilliseconds(), 3)}`;
}

/**
 * How long ago, roughly.
 * @param {number | null | undefined} ms Unix milliseconds
 */
export function ago(ms) {
  if (ms === null || ms === undefined || ms <= 0) return "never";
  const s = Math.max(0, (Date.now() - ms) / 1000);
  if (s < 60) return `${Math.round(s)} s ago`;
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  if (s < 86400) return `${(s / 3600).toFixed(1)} h ago`;
  return `${(s / 86400).toFixed(1)} days ago`;
}

/** @param {number | null | undefined} ms */
export function duration(ms) {
  if (ms === null || ms === undefined) return "forever";
  if (ms % 86_400_000 === 0) return `${ms / 86_400_000} d`;
  if (ms % 3_600_000 === 0) return `${ms / 3_600_000} h`;
  if (ms % 60_000 === 0) return `${ms / 60_000} min`;
  return `${ms} ms`;
}

/**
 * What a person should read when a call was refused: what is missing or wrong, in
 * words, with the API's own message and error type beside it (never a stack trace).
 * @param {unknown} err
 * @returns {{title: string, text: string, type: string}}
 */
export function explain(err) {
  if (!(err instanceof ApiError)) {
    return { title: "Something went wrong in the page", text: String(err), type: "PageError" };
  }
  const titles = /** @type {Record<number, string>} */ ({
    0: "The broker cannot be reached",
    400: "The broker refused the request as invalid",
    401: "A token is needed",
    403: "Not allowed",
    404: "Not found",
    409: "Refused: it conflicts with the current state",
    413: "Too large",
    429: "Over the quota: try again shortly",
    503: "The broker cannot serve this now",
  });
  let title = titles[err.status] ?? `The broker answered ${err.status}`;
  if (err.type === "GroupNotEmpty") title = "The group has live members";
  let text = err.message;
  if (err.details.length) text += ": " + err.details.map((d) => `${d.loc}: ${d.msg}`).join("; ");
  if (err.retryAfterS !== null) text += ` (retry after ${err.retryAfterS} s)`;
  return { title, text, type: err.type };
}

/**
 * A refusal as a panel in the page.
 * @param {unknown} err
 * @param {string} [doing] what the person was doing ("deleting topic orders")
 */
export function errorPanel(err, doing) {
  const { title, text, type } = explain(err);
  return h("div", { class: "error", role: "alert", "data-error-type": type },
    h("strong", null, title), doing ? ` while ${doing}` : null,
    h("p", null, text, " ", h("code", { class: "muted" }, type)));
}

/**
 * A field with its label.
 * @param {string} label
 * @param {HTMLElement} control
 * @param {string} [hint]
 */
export function field(label, control, hint) {
  return h("label", { class: "field" }, h("span", null, label), control,
    hint ? h("small", { class: "muted" }, hint) : null);
}

/**
 * A table: header names and rows of cells.
 * @param {string[]} head
 * @param {(Child | Child[])[][]} rows
 * @param {Attrs} [attrs]
 */
export function table(head, rows, attrs) {
  return h("table", attrs ?? null,
    h("thead", null, h("tr", null, head.map((name) => h("th", null, name)))),
    h("tbody", null, rows.map((cells) => h("tr", null, cells.map((c) => h("td", null, c))))));
}
