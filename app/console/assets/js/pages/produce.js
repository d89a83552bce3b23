// @ts-check
/**
 * Produce: one record to a topic (POST /produce), with a partition or by key, a key, a
 * value (text, or base64 for bytes) and headers; the answer (partition and offset, or the
 * entry's error) shown in the page with a link to the record in Messages.
 *
 * The form keeps its values for the next record, across visits too (in this module,
 * for the tab's life): producing is often "the same again, one field changed".
 */

import { ApiError, api, holds, holdsAny } from "../api.js";
import { errorPanel, field, fill, h } from "../dom.js";
import { isBase64, permalink } from "../records.js";

/**
 * @typedef {import("../main.js").Ctx} Ctx
 * @typedef {import("../main.js").Route} Route
 *
 * @typedef {object} Draft what the form holds
 * @property {string} topic
 * @property {string} partition empty: by key
 * @property {string} key
 * @property {string} value
 * @property {boolean} base64 the value is base64 of bytes
 * @property {{name: string, value: string}[]} headers
 */

/** @type {Draft} */
const draft = { topic: "", partition: "", key: "", value: "", base64: false, headers: [] };

/**
 * @param {HTMLElement} view
 * @param {Route} route
 * @param {Ctx} ctx
 */
export async function render(view, route, ctx) {
  const title = h("div", { class: "head" }, h("h1", null, "Produce"));
  if (!holdsAny(ctx.who, "produce")) {
    fill(view, title, errorPanel(new ApiError(403, "Forbidden",
      `${ctx.who.principal ?? "this principal"} holds no produce right on any topic`), "producing"));
    return;
  }
  const asked = route.query.get("topic");
  if (asked !== null && asked !== "" && !holds(ctx.who, "produce", asked)) {
    fill(view, title, errorPanel(new ApiError(403, "Forbidden",
      `${ctx.who.principal ?? "this principal"} holds no produce right on topic ${asked}`),
      `producing to ${asked}`), h("p", null, h("a", { href: "#/produce" }, "Pick another topic")));
    return;
  }
  if (asked) draft.topic = asked;
  const { topics } = /** @type {{topics: {topic: string, partitions: number, status?: string}[]}} */ (
    await api("/topics", { signal: ctx.signal }));
  const mine = topics.filter((t) => holds(ctx.who, "produce", t.topic) && t.status !== "deleting")
    .sort((a, b) => a.topic.localeCompare(b.topic));
  fill(view, title, produceForm(mine, ctx));
}

/**
 * @param {{topic: string, partitions: number}[]} topics the topics the principal may produce to
 * @param {Ctx} ctx
 */
function produceForm(topics, ctx) {
  const partitionsOf = new Map(topics.map((t) => [t.topic, t.partitions]));
  const list = h("datalist", { id: "produce-topics" },
    topics.map((t) => h("option", { value: t.topic }, `${t.partitions} partitions`)));
  const topic = h("input", { name: "topic", required: true, list: "produce-topics", value: draft.topic,
                             autocomplete: "off", placeholder: "topic", pattern: "[A-Za-z0-9._\\-]{1,249}" });
  const partition = h("input", { name: "partition", type: "number", min: 0, value: draft.partition,
                                 placeholder: "by key", class: "short" });
  const key = h("input", { name: "key", value: draft.key, autocomplete: "off", placeholder: "none" });
  const value = h("textarea", { name: "value", rows: 6, spellcheck: "false" });
  value.value = draft.value;
  const base64 = h("input", { name: "base64", type: "checkbox", checked: draft.base64 });
  const headers = h("div", { class: "headers" });
  const topicNote = h("small", { class: "muted" });
  const problem = h("div");
  const result = h("div", { "data-testid": "produce-result-slot" });
  const send = h("button", { type: "submit", name: "send" }, "Produce");

  /** @param {string} name @param {string} text */
  const headerRow = (name, text) => {
    const row = h("div", { class: "row header-row" },
      h("input", { name: "header-name", value: name, placeholder: "name", autocomplete: "off" }),
      h("input", { name: "header-value", value: text, placeholder: "value", autocomplete: "off", class: "grow" }),
      h("button", { type: "button", class: "quiet", title: "remove this header",
                    onclick: () => { row.remove(); remember(); } }, "×"));
    headers.appendChild(row);
  };
  for (const hd of draft.headers) headerRow(hd.name, hd.value);

  const remember = () => {
    draft.topic = topic.value.trim();
    draft.partition = partition.value;
    draft.key = key.value;
    draft.value = value.value;
    draft.base64 = base64.checked;
    draft.headers = [...headers.querySelectorAll(".header-row")].map((row) => {
      const [n, v] = /** @type {NodeListOf<HTMLInputElement>} */ (row.querySelectorAll("input"));
      return { name: n.value, value: v.value };
    });
  };
  // What the topic allows: only topics the principal may produce to get a send button.
  const checkTopic = () => {
    const name = topic.value.trim();
    const allowed = name === "" || holds(ctx.who, "produce", name);
    send.disabled = !allowed;
    const n = partitionsOf.get(name);
    topicNote.textContent = !allowed ? `you may not produce to ${name}`
      : n !== undefined ? `${n} partition${n === 1 ? "" : "s"} (0–${n - 1})`
      : name ? "a new topic (created on first produce when the broker allows it)" : "";
    topicNote.className = allowed ? "muted" : "bad";
  };
  topic.addEventListener("input", checkTopic);
  checkTopic();

  const topicField = field("Topic", topic);
  topicField.append(topicNote);
  const form = h("form", { class: "card", "data-testid": "produce-form" },
    list,
    h("div", { class: "row top" },
      h("div", { class: "grow" }, topicField),
      field("Partition", partition, "empty: the broker picks it from the key"),
      h("div", { class: "grow" }, field("Key", key))),
    field("Value", value),
    h("label", { class: "check" }, base64, " value is base64 (bytes)"),
    h("h2", null, "Headers"),
    headers,
    h("button", { type: "button", class: "quiet", name: "add-header",
                  onclick: () => headerRow("", "") }, "Add header"),
    h("div", { class: "row submit" }, send),
    problem);
  form.addEventListener("input", remember);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    remember();
    fill(problem);
    let body;
    try {
      body = requestOf(draft);
    } catch (err) {
      fill(problem, h("div", { class: "error", role: "alert" }, String(/** @type {Error} */ (err).message)));
      return;
    }
    send.disabled = true;
    fill(result, h("p", { class: "muted" }, "Producing…"));
    try {
      const answer = await postProduce(body, ctx.signal);
      fill(result, shownResult(answer.results[0], draft.topic));
    } catch (err) {
      if (ctx.signal.aborted) return;
      fill(result, h("div", { "data-testid": "produce-result" }, errorPanel(err, `producing to ${draft.topic}`)));
    } finally {
      send.disabled = false;
      checkTopic();
    }
  });
  return h("div", null, form, result);
}

/**
 * The produce request for the form's record; throws what is wrong with it.
 * @param {Draft} d
 */
function requestOf(d) {
  if (!d.topic) throw new Error("Name a topic.");
  /** @type {Record<string, unknown>} */
  const record = {};
  if (d.base64) {
    const b64 = d.value.replace(/\s+/g, "");
    if (!isBase64(b64)) throw new Error("The value is not valid base64 (standard alphabet, with padding).");
    record.value = { base64: b64 };
  } else {
    record.value = d.value;
  }
  if (d.key !== "") record.key = d.key;
  const headers = d.headers.filter((hd) => hd.name !== "" || hd.value !== "");
  if (headers.some((hd) => hd.name === "")) throw new Error("Every header needs a name.");
  if (headers.length) record.headers = headers.map((hd) => ({ name: hd.name, value: hd.value }));
  /** @type {Record<string, unknown>} */
  const entry = { topic: d.topic, records: [record] };
  if (d.partition.trim() !== "") {
    const p = Number(d.partition);
    if (!Number.isSafeInteger(p) || p < 0) throw new Error("The partition is a whole number from 0.");
    entry.partition = p;
  } else if (d.key === "") {
    throw new Error("Give a partition, or a key for the broker to pick the partition by.");
  }
  return { topic_partitions: [entry] };
}

/**
 * POST /produce, keeping the answer's results when it is a 409 or 503 (an entry failed:
 * the body is the results, not an error body).
 * @param {unknown} body
 * @param {AbortSignal} signal
 * @returns {Promise<{results: any[]}>}
 */
async function postProduce(body, signal) {
  try {
    return await api("/produce", { method: "POST", body, signal });
  } catch (err) {
    // Refused as a whole (409, 503) the answer still says, per entry, what happened.
    if (err instanceof ApiError && Array.isArray(err.body?.results)) return err.body;
    throw err;
  }
}

/**
 * The entry's result: where the record went and a link to it, or the entry's error.
 * @param {any} r
 * @param {string} topic
 */
function shownResult(r, topic) {
  if (!r.ok) {
    const err = new ApiError(409, r.error_type, r.error);
    return h("div", { "data-testid": "produce-result", "data-ok": "false" },
      errorPanel(err, `producing to ${topic}`),
      r.retriable ? h("p", { class: "muted" }, "Retriable: sending it again may succeed.") : null,
      r.maybe_written ? h("p", { class: "muted" }, "It may have been written anyway (in doubt).") : null);
  }
  const link = permalink(r.topic, r.partition, r.start_offset);
  return h("div", { class: "ok", "data-testid": "produce-result", "data-ok": "true",
                    "data-partition": r.partition, "data-offset": r.start_offset },
    h("strong", null, r.duplicate ? "Already written " : "Written "),
    `to ${r.topic} partition `, h("strong", null, String(r.partition)),
    " at offset ", h("strong", null, String(r.start_offset)),
    r.end_offset !== r.start_offset ? `–${r.end_offset}` : null,
    " · ", h("a", { href: link, "data-testid": "produce-permalink" }, "view in Messages"));
}
