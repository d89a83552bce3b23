// @ts-check
/**
 * One consumer group (GET /groups/{group}), read again every {@link REFRESH_MS}: its
 * members (client, session, what each holds), the generation, and per partition the
 * committed offset and the lag behind the high watermark. A person holding ``group`` on
 * it may reset its offsets (POST /groups/{group}/reset-offsets), which the broker allows
 * only while no member is live: the dialog says so in words when it is refused.
 */

import { ApiError, api, holds } from "../api.js";
import { ago, count, duration, errorPanel, field, fill, h, when } from "../dom.js";

/**
 * @typedef {import("../main.js").Ctx} Ctx
 * @typedef {import("../main.js").Route} Route
 *
 * @typedef {object} Member
 * @property {string} member_id
 * @property {string | null} client_id
 * @property {string[]} topics
 * @property {number} session_timeout_ms
 * @property {number} joined_at_ms
 * @property {number | null} expires_at_ms
 * @property {{topic: string, partitions: number[]}[]} assignment
 *
 * @typedef {object} GroupPartition
 * @property {string} topic
 * @property {number} partition
 * @property {string | null} owner
 * @property {number | null} committed_offset
 * @property {number | null} committed_generation
 * @property {number | null} committed_at_ms
 * @property {number} log_start_offset
 * @property {number} high_watermark
 * @property {number | null} lag
 *
 * @typedef {object} Group
 * @property {string} group
 * @property {number} generation
 * @property {number} created_at_ms
 * @property {number} updated_at_ms
 * @property {Member[]} members
 * @property {GroupPartition[]} partitions
 *
 * @typedef {{topic: string, partition?: number}} Scope a partition, or every partition of a topic
 */

const REFRESH_MS = 2000;

/**
 * @param {HTMLElement} view
 * @param {Route} route
 * @param {Ctx} ctx
 */
export async function render(view, route, ctx) {
  const name = route.parts[0];
  const path = `/groups/${encodeURIComponent(name)}`;
  const read = async () => /** @type {Group} */ (await api(path, { signal: ctx.signal }));
  let group = await read();

  const tiles = h("div", { class: "tiles" });
  const members = h("div");
  const offsets = h("div");
  const refreshed = h("span", { class: "muted", "data-testid": "refreshed" });
  const show = () => {
    fill(tiles, tilesOf(group));
    fill(members, membersOf(group));
    fill(offsets, offsetsOf(group));
    refreshed.textContent = `refreshed ${when(Date.now()).slice(11)}, every ${REFRESH_MS / 1000} s`;
  };
  const refresh = async () => {
    group = await read();
    show();
  };
  show();
  ctx.every(REFRESH_MS, refresh);

  fill(view,
    h("div", { class: "head" },
      h("h1", null, h("a", { href: "#/groups", class: "muted" }, "Consumer groups"), " / ", name),
      refreshed,
      h("div", { class: "actions" },
        holds(ctx.who, "group", name)
          ? h("button", { type: "button", "data-testid": "reset-offsets",
                          onclick: () => resetDialog(view, group, ctx, refresh).showModal() },
              "Reset offsets…")
          : null)),
    tiles, members, offsets);
}

/** @param {Group} g */
function tilesOf(g) {
  const lag = g.partitions.reduce((sum, p) => sum + (p.lag ?? 0), 0);
  const uncommitted = g.partitions.filter((p) => p.committed_offset === null).length;
  const tile = (/** @type {string} */ label, /** @type {string} */ value, /** @type {string} */ id,
                /** @type {string | null} */ note = null) =>
    h("div", { class: "tile", "data-testid": `fact-${id}` },
      h("div", { class: "label" }, label), h("div", { class: "value" }, value),
      note ? h("div", { class: "label" }, note) : null);
  return [
    tile("State", g.members.length ? "active" : "empty", "state"),
    tile("Members", count(g.members.length), "members"),
    tile("Generation", count(g.generation), "generation"),
    tile("Total lag", count(lag), "lag"),
    tile("Partitions", count(g.partitions.length), "partitions",
      uncommitted ? `${count(uncommitted)} without a committed offset` : null),
    tile("Changed", ago(g.updated_at_ms), "changed"),
  ];
}

/**
 * A member's client id, else its id shortened (ids are 32 hex digits).
 * @param {Group} g
 * @param {string | null} id
 */
function memberName(g, id) {
  if (id === null) return null;
  const m = g.members.find((x) => x.member_id === id);
  return m?.client_id ? `${m.client_id} (${id.slice(0, 8)})` : id.slice(0, 8);
}

/** @param {Group} g */
function membersOf(g) {
  if (!g.members.length) {
    return [h("h2", null, "Members"),
      h("p", { class: "muted", "data-testid": "no-members" },
        "No live members: the group's offsets can be reset.")];
  }
  const now = Date.now();
  const rows = g.members.map((m) => {
    // The broker extends a member's session to a heartbeat's time plus its timeout: the
    // last heartbeat is when that lease was renewed.
    const beat = m.expires_at_ms === null ? null : m.expires_at_ms - m.session_timeout_ms;
    const left = m.expires_at_ms === null ? null : m.expires_at_ms - now;
    return h("tr", { "data-testid": `member-${m.member_id}` },
      h("td", { class: "mono", title: m.member_id }, m.member_id.slice(0, 8)),
      h("td", null, m.client_id ?? h("span", { class: "muted" }, "–")),
      h("td", null, m.assignment.length
        ? m.assignment.map((a) => h("div", null, `${a.topic}: ${ranges(a.partitions)}`))
        : h("span", { class: "muted" }, "nothing")),
      h("td", { title: when(beat) }, beat === null ? "–" : ago(beat)),
      h("td", null, left === null ? "–"
        : left > 0 ? `in ${Math.ceil(left / 1000)} s (timeout ${seconds(m.session_timeout_ms)})`
          : h("span", { class: "badge warn" }, "expired")),
      h("td", { title: when(m.joined_at_ms) }, ago(m.joined_at_ms)));
  });
  return [h("h2", null, `Members (${count(g.members.length)})`),
    h("div", { class: "card flush" }, h("table", { "data-testid": "group-members" },
      h("thead", null, h("tr", null, ["Member", "Client", "Assignment", "Last heartbeat",
        "Session ends", "Joined"].map((label) => h("th", null, label)))),
      h("tbody", null, rows)))];
}

/** @param {number} ms */
function seconds(ms) {
  return ms % 1000 === 0 ? `${ms / 1000} s` : duration(ms);
}

/**
 * ``[0, 1, 2, 5]`` as ``0–2, 5``: a member of a large topic holds long runs.
 * @param {number[]} partitions
 */
export function ranges(partitions) {
  const sorted = [...partitions].sort((a, b) => a - b);
  /** @type {string[]} */
  const out = [];
  for (let i = 0; i < sorted.length;) {
    let j = i;
    while (j + 1 < sorted.length && sorted[j + 1] === sorted[j] + 1) j += 1;
    out.push(j > i ? `${sorted[i]}–${sorted[j]}` : String(sorted[i]));
    i = j + 1;
  }
  return out.join(", ");
}

/** @param {Group} g */
function offsetsOf(g) {
  const parts = [...g.partitions].sort((a, b) => a.topic.localeCompare(b.topic) || a.partition - b.partition);
  const rows = parts.map((p) => h("tr", {
    "data-testid": `lag-${p.topic}-${p.partition}`, "data-lag": p.lag ?? "",
    "data-committed": p.committed_offset ?? "" },
    h("td", null, h("a", { href: `#/topics/${encodeURIComponent(p.topic)}` }, p.topic)),
    h("td", { class: "num" }, String(p.partition)),
    h("td", null, memberName(g, p.owner) ?? h("span", { class: "muted" }, "unassigned")),
    h("td", { class: "num" }, count(p.log_start_offset)),
    h("td", { class: "num" }, count(p.high_watermark)),
    h("td", { class: "num", "data-col": "committed" }, p.committed_offset === null
      ? h("span", { class: "muted" }, "none") : count(p.committed_offset)),
    h("td", { class: p.lag ? "num lag behind" : "num lag", "data-col": "lag" },
      p.lag === null ? h("span", { class: "muted", title: "nothing committed" }, "–") : count(p.lag)),
    h("td", { title: when(p.committed_at_ms) }, p.committed_at_ms === null ? "–" : ago(p.committed_at_ms))));
  return [h("h2", null, "Offsets and lag"),
    h("div", { class: "card flush" }, h("table", { "data-testid": "group-offsets" },
      h("thead", null, h("tr", null, h("th", null, "Topic"), h("th", { class: "num" }, "Partition"),
        h("th", null, "Owner"), h("th", { class: "num" }, "Log start"),
        h("th", { class: "num" }, "High watermark"), h("th", { class: "num" }, "Committed"),
        h("th", { class: "num" }, "Lag"), h("th", null, "Committed at"))),
      h("tbody", null, rows.length ? rows : h("tr", null, h("td", { colspan: 8, class: "muted" },
        "No partitions: the group has no topics with partitions and no committed offsets.")))))];
}

/**
 * Every scope a reset can name: all partitions of each topic, then each partition.
 * @param {Group} g
 * @returns {Scope[]}
 */
function scopesOf(g) {
  const topics = [...new Set([...g.partitions.map((p) => p.topic),
    ...g.members.flatMap((m) => m.topics)])].sort();
  /** @type {Scope[]} */
  const out = topics.map((topic) => ({ topic }));
  for (const p of [...g.partitions].sort((a, b) => a.topic.localeCompare(b.topic) || a.partition - b.partition)) {
    out.push({ topic: p.topic, partition: p.partition });
  }
  return out;
}

/**
 * What the person reads when the broker refuses a reset because members are live.
 * @param {ApiError} err
 * @param {number} known members seen in the last read, if the message has no count
 */
export function liveMembersText(err, known) {
  const n = Number(/has (\d+) live member/.exec(err.message)?.[1] ?? known);
  return `The group has ${plural(n, "live member")}; stop ${n === 1 ? "it" : "them"} `
    + `(or wait for ${n === 1 ? "its session" : "their sessions"} to expire) and reset again.`;
}

/**
 * @param {number} n
 * @param {string} noun
 */
function plural(n, noun) {
  return `${count(n)} ${noun}${n === 1 ? "" : "s"}`;
}

/**
 * The reset dialog: which partitions, and where to (earliest, latest, an offset, a
 * time). The whole request is checked by the broker before anything is written.
 * @param {HTMLElement} view
 * @param {Group} g the group as last read
 * @param {Ctx} ctx
 * @param {() => Promise<void>} refresh
 */
function resetDialog(view, g, ctx, refresh) {
  const scopes = scopesOf(g);
  const scope = h("select", { name: "scope" },
    scopes.map((s, i) => h("option", { value: i },
      s.partition === undefined ? `${s.topic}: every partition` : `${s.topic} / ${s.partition}`)));
  const radio = (/** @type {string} */ value, /** @type {string} */ label, /** @type {boolean} */ checked,
                 /** @type {HTMLElement | null} */ extra = null) =>
    h("div", { class: "choice" }, h("label", null,
      h("input", { type: "radio", name: "to", value, checked }), " ", label), extra);
  const offset = h("input", { type: "number", name: "offset", min: 0, step: 1, placeholder: "41" });
  const time = h("input", { type: "datetime-local", name: "timestamp", step: 1 });
  const problem = h("div", { "data-testid": "reset-problem" });
  const submit = h("button", { type: "submit", "data-testid": "reset-submit",
                               disabled: !scopes.length }, "Reset offsets");
  const dialog = h("dialog", { "data-testid": "reset-dialog" });
  const form = h("form", { method: "dialog" },
    h("h2", null, `Reset the offsets of ${g.group}`),
    g.members.length ? h("p", { class: "warn" }, `${plural(g.members.length, "live member")}: `
      + "the broker refuses a reset until none is live (they leave, or their sessions end).")
      : null,
    scopes.length ? field("Partitions", scope)
      : h("p", { class: "muted" }, "The group has no partitions to reset."),
    h("fieldset", { class: "targets" }, h("legend", null, "To"),
      radio("earliest", "earliest: read from the log start next", true),
      radio("latest", "latest: read only what is written next", false),
      radio("offset", "offset (the last processed):", false, offset),
      radio("timestamp", "time: from the first record appended at or after", false, time)),
    problem,
    h("div", { class: "row" }, submit,
      h("button", { type: "button", class: "quiet", onclick: () => dialog.close() }, "Cancel")));
  // Typing an offset or a time picks its target.
  offset.addEventListener("input", () => check(form, "offset"));
  time.addEventListener("input", () => check(form, "timestamp"));

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    fill(problem);
    const picked = scopes[Number(scope.value)];
    const to = /** @type {HTMLInputElement | null} */ (form.querySelector("input[name=to]:checked"))?.value;
    /** @type {Record<string, unknown>} */
    const entry = { topic: picked.topic };
    if (picked.partition !== undefined) entry.partition = picked.partition;
    if (to === "offset") {
      if (offset.value.trim() === "") return say(problem, "Give the offset to set.");
      entry.offset = Number(offset.value);
    } else if (to === "timestamp") {
      const ms = new Date(time.value).getTime();
      if (!Number.isFinite(ms)) return say(problem, "Give the time to read from.");
      entry.timestamp_ms = ms;
    } else {
      entry.to = to;
    }
    submit.disabled = true;
    try {
      const { results } = await api(`/groups/${encodeURIComponent(g.group)}/reset-offsets`,
        { method: "POST", body: { topic_partitions: [entry] }, signal: ctx.signal });
      dialog.close();
      ctx.notify(`Offsets of ${g.group} reset: ${results.map(
        (/** @type {{topic: string, partition: number, offset: number}} */ r) =>
          `${r.topic}/${r.partition} → ${r.offset}`).join(", ")}`);
      await refresh();
    } catch (err) {
      if (ctx.signal.aborted) return;
      if (err instanceof ApiError && err.type === "GroupNotEmpty") {
        fill(problem, h("div", { class: "error", role: "alert", "data-error-type": err.type,
                                 "data-testid": "reset-refused" },
          h("strong", null, "Refused: the group has live members"),
          h("p", null, liveMembersText(err, g.members.length))));
      } else if (err instanceof ApiError && Array.isArray(err.body?.results)) {
        // Partly refused (a member joined while it ran): say which partitions moved.
        fill(problem, h("div", { class: "error", role: "alert", "data-testid": "reset-refused" },
          h("strong", null, "Only part of the reset was written"),
          h("ul", null, err.body.results.map(
            (/** @type {{topic: string, partition: number, ok: boolean, offset?: number, error_type?: string, error?: string}} */ r) =>
              h("li", null, `${r.topic}/${r.partition}: `, r.ok ? `reset to ${r.offset}`
                : `${r.error_type}: ${r.error}`)))));
        await refresh();
      } else {
        fill(problem, errorPanel(err, `resetting the offsets of ${g.group}`));
      }
    } finally {
      submit.disabled = false;
    }
  });
  dialog.append(form);
  dialog.addEventListener("close", () => dialog.remove());
  view.append(dialog);
  return dialog;
}

/**
 * @param {HTMLFormElement} form
 * @param {string} value
 */
function check(form, value) {
  const input = /** @type {HTMLInputElement | null} */ (form.querySelector(`input[name=to][value=${value}]`));
  if (input) input.checked = true;
}

/**
 * @param {HTMLElement} where
 * @param {string} text
 */
function say(where, text) {
  fill(where, h("p", { class: "error" }, text));
}
