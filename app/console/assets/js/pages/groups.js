// @ts-check
/**
 * Consumer groups: GET /groups a page at a time (``?after=`` in the address, the API's
 * own cursor), read again every few seconds while shown.
 */

import { ago, count, fill, h, when } from "../dom.js";
import { api } from "../api.js";

/**
 * @typedef {import("../main.js").Ctx} Ctx
 * @typedef {import("../main.js").Route} Route
 *
 * @typedef {object} GroupSummary
 * @property {string} group
 * @property {number} generation
 * @property {number} members
 * @property {string[]} topics
 * @property {number} created_at_ms
 * @property {number} updated_at_ms
 */

const LIMIT = 100;
const REFRESH_MS = 5000;

/**
 * @param {HTMLElement} view
 * @param {Route} route
 * @param {Ctx} ctx
 */
export async function render(view, route, ctx) {
  const after = route.query.get("after") ?? "";
  const read = async () => /** @type {{groups: GroupSummary[], next_after: string | null}} */ (
    await api("/groups", { query: { after, limit: LIMIT }, signal: ctx.signal }));
  const body = h("tbody");
  const pager = h("div", { class: "pager" });
  const summary = h("span", { class: "muted" });
  const show = (/** @type {{groups: GroupSummary[], next_after: string | null}} */ page) => {
    fill(body, page.groups.map(groupRow));
    if (!page.groups.length) {
      fill(body, h("tr", null, h("td", { colspan: 6, class: "muted" },
        after ? "No more groups." : "No consumer groups yet (a group is made by its first join or commit).")));
    }
    summary.textContent = `${count(page.groups.length)} groups${after || page.next_after ? " on this page" : ""}`;
    fill(pager,
      after ? h("a", { class: "button quiet", href: "#/groups" }, "← First page") : null,
      page.next_after ? h("a", { class: "button quiet",
        href: `#/groups?after=${encodeURIComponent(page.next_after)}` }, "Next page →") : null);
  };
  show(await read());
  ctx.every(REFRESH_MS, async () => show(await read()));
  fill(view,
    h("div", { class: "head" }, h("h1", null, "Consumer groups"), summary),
    h("div", { class: "card flush" }, h("table", { "data-testid": "groups" },
      h("thead", null, h("tr", null, h("th", null, "Group"), h("th", null, "State"),
        h("th", { class: "num" }, "Members"), h("th", { class: "num" }, "Generation"),
        h("th", null, "Topics"), h("th", null, "Changed"))),
      body)),
    pager);
}

/** @param {GroupSummary} g */
function groupRow(g) {
  return h("tr", { "data-testid": `group-${g.group}` },
    h("td", null, h("a", { href: `#/groups/${encodeURIComponent(g.group)}` }, g.group)),
    h("td", null, g.members
      ? h("span", { class: "badge ok" }, "active")
      : h("span", { class: "badge" }, "empty")),
    h("td", { class: "num" }, count(g.members)),
    h("td", { class: "num" }, count(g.generation)),
    h("td", null, g.topics.length ? g.topics.join(", ") : h("span", { class: "muted" }, "–")),
    h("td", { title: when(g.updated_at_ms) }, ago(g.updated_at_ms)));
}
