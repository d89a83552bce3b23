// @ts-check
/**
 * The console's shell: who is signed in, the hash router, and the life of a page.
 *
 * Every route is a page module (``pages/{name}.js``) exporting
 * ``render(view, route, ctx)``. A page renders into a fresh element of its own, so a page
 * still loading when the person moves on writes only into an element no longer shown;
 * ``ctx.signal`` is aborted then, and ``ctx.every`` timers and ``ctx.onLeave`` hooks end.
 * When its first render is done ``main#page`` carries ``data-ready="{page}"`` (and
 * ``data-error="{error_type}"`` when it failed): what the browser tests and the bench
 * wait for.
 */

import { ApiError, UNAUTHENTICATED, clearToken, setToken, token, whoami } from "./api.js";
import { errorPanel, field, fill, h } from "./dom.js";

/**
 * @typedef {import("./api.js").Who} Who
 *
 * @typedef {object} Route
 * @property {string} page the page's name (its module's)
 * @property {string[]} parts what follows the page in the path, decoded
 * @property {URLSearchParams} query
 *
 * @typedef {object} Ctx
 * @property {Who} who the principal and its rights (GET /whoami)
 * @property {AbortSignal} signal aborted when the page is left
 * @property {(ms: number, fn: () => (Promise<void> | void)) => void} every run ``fn``
 *   every ``ms`` while the page is shown and the tab visible, never two at once
 * @property {(fn: () => void) => void} onLeave run ``fn`` when the page is left
 * @property {(text: string, kind?: "ok" | "error") => void} notify a passing message
 * @property {(hash: string) => void} go navigate (``#/topics/orders``)
 * @property {() => void} reload render the page again
 *
 * @typedef {{render: (view: HTMLElement, route: Route, ctx: Ctx) => Promise<void>}} Page
 */

// The path's first part -> the page; a part after it picks the detail page.
const PAGES = /** @type {Record<string, [string, string]>} */ ({
  "": ["overview", "overview"],
  topics: ["topics", "topic"],
  messages: ["messages", "messages"],
  produce: ["produce", "produce"],
  groups: ["groups", "group"],
});

const root = /** @type {HTMLElement} */ (document.getElementById("page"));
/** @type {Who | null} */
let who = null;
/** @type {AbortController | null} */
let leaving = null;
/** @type {(() => void)[]} */
let hooks = [];

/** @returns {Route} */
export function currentRoute() {
  const raw = location.hash.replace(/^#\/?/, "");
  const [path, search = ""] = raw.split("?", 2);
  const [first = "", ...rest] = path.split("/").filter((p, i) => i === 0 || p !== "");
  const pages = PAGES[first] ?? PAGES[""];
  const parts = rest.map(decoded);
  return { page: parts.length ? pages[1] : pages[0], parts, query: new URLSearchParams(search) };
}

/**
 * A path part as typed: percent-escapes decoded, or the part as it is when they are
 * malformed (a hand-edited address must still show a page, not freeze the last one).
 * @param {string} part
 */
function decoded(part) {
  try {
    return decodeURIComponent(part);
  } catch {
    return part;
  }
}

function leave() {
  leaving?.abort();
  for (const hook of hooks.splice(0)) {
    try {
      hook();
    } catch (err) {
      console.warn("leaving the page:", err);
    }
  }
}

async function show() {
  leave();
  const controller = new AbortController();
  leaving = controller;
  const route = currentRoute();
  root.removeAttribute("data-ready");
  root.removeAttribute("data-error");
  for (const link of document.querySelectorAll("#nav a")) {
    const nav = /** @type {HTMLElement} */ (link).dataset.nav ?? "";
    link.classList.toggle("current", route.page === nav || route.page === nav.replace(/s$/, ""));
  }
  // The page's module loads while the broker is asked who the person is, not after.
  /** @type {Promise<Page>} */
  const loading = import(`./pages/${route.page}.js`);
  loading.catch(() => {});  // awaited below; never an unhandled rejection meanwhile
  if (who === null && !(await signIn(controller.signal))) return;
  const view = h("section", { class: "view", "data-view": route.page });
  fill(root, view);
  const ctx = context(controller, /** @type {Who} */ (who));
  try {
    const page = await loading;
    await page.render(view, route, ctx);
  } catch (err) {
    if (controller.signal.aborted) return;
    if (err instanceof ApiError && err.status === 401) {
      who = null;
      await signIn(controller.signal, err);
      return;
    }
    fill(view, errorPanel(err));
    root.dataset.error = err instanceof ApiError ? err.type : "PageError";
    if (!(err instanceof ApiError)) console.error(err);
  }
  if (!controller.signal.aborted) root.dataset.ready = route.page;
}

/**
 * @param {AbortController} controller
 * @param {Who} person
 * @returns {Ctx}
 */
function context(controller, person) {
  const { signal } = controller;
  return {
    who: person,
    signal,
    every(ms, fn) {
      /** @type {number | undefined} */
      let timer;
      const tick = async () => {
        if (signal.aborted) return;
        if (!document.hidden) {
          try {
            await fn();
          } catch (err) {
            if (!signal.aborted) notify(errorText(err), "error");
          }
        }
        if (!signal.aborted) timer = window.setTimeout(tick, ms);
      };
      timer = window.setTimeout(tick, ms);
      signal.addEventListener("abort", () => window.clearTimeout(timer));
    },
    onLeave(fn) {
      hooks.push(fn);
    },
    notify,
    go(hash) {
      location.hash = hash;
    },
    reload() {
      void show();
    },
  };
}

/** @param {unknown} err */
function errorText(err) {
  return err instanceof ApiError ? `${err.type}: ${err.message}` : String(err);
}

/** @type {number | undefined} */
let noticeTimer;

/**
 * @param {string} text
 * @param {"ok" | "error"} [kind]
 */
function notify(text, kind = "ok") {
  const notice = /** @type {HTMLElement} */ (document.getElementById("notice"));
  notice.textContent = text;
  notice.className = kind;
  notice.hidden = false;
  window.clearTimeout(noticeTimer);
  noticeTimer = window.setTimeout(() => { notice.hidden = true; }, kind === "error" ? 8000 : 4000);
}

/**
 * Learn who the person is (GET /whoami); with access control on and no valid token,
 * ask for one. Resolves true once someone is known.
 * @param {AbortSignal} signal
 * @param {ApiError} [why] the refusal that sent us here
 * @returns {Promise<boolean>}
 */
async function signIn(signal, why) {
  if (!why) {
    try {
      known(await whoami());
      return true;
    } catch (err) {
      if (!(err instanceof ApiError) || err.status !== 401) {
        fill(root, errorPanel(err, "asking the broker who you are"));
        root.dataset.error = err instanceof ApiError ? err.type : "PageError";
        root.dataset.ready = "error";
        return false;
      }
      why = err;
    }
  }
  if (signal.aborted) return false;
  showWho();
  const input = h("textarea", { name: "token", rows: 3, required: true, autocomplete: "off",
                                spellcheck: "false", placeholder: "an API key or a JWT" });
  const problem = h("div");
  if (token()) problem.append(errorPanel(why, "using the token this tab had"));
  const form = h("form", { class: "card narrow", id: "sign-in" },
    h("h1", null, "Sign in"),
    h("p", null, "This broker has access control on. Give an API key or a JWT: it is kept ",
      "in this tab's session storage only, sent to this broker as a bearer token, and ",
      "forgotten when the tab closes."),
    problem,
    field("Token", input),
    h("button", { type: "submit" }, "Sign in"));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    setToken(input.value.trim());
    try {
      known(await whoami());
    } catch (err) {
      clearToken();
      fill(problem, errorPanel(err, "checking the token"));
      return;
    }
    void show();
  });
  clearToken();
  fill(root, form);
  root.dataset.ready = "sign-in";
  return false;
}

/** @type {number | undefined} */
let expiryTimer;
const EXPIRY_RECHECK_MS = 10_000;

/**
 * The person is known: show who, and ask again for a token when a JWT's time is up
 * (rather than let every call fail).
 * @param {Who} person
 */
function known(person) {
  who = person;
  showWho();
  window.clearTimeout(expiryTimer);
  if (person.expires_at_ms !== null) {
    // The broker just took the token, so a time already past says this browser's clock
    // runs ahead of the broker's: look again later, never at once in a loop.
    const left = person.expires_at_ms - Date.now();
    expiryTimer = window.setTimeout(signedOut,
      Math.min(left > 0 ? left : EXPIRY_RECHECK_MS, 2 ** 31 - 1));
  }
}

/** The token stopped working: back to the sign-in form, whatever page is shown. */
function signedOut() {
  if (who === null) return;
  who = null;
  window.clearTimeout(expiryTimer);
  void show();
}

function showWho() {
  const label = /** @type {HTMLElement} */ (document.getElementById("who"));
  const out = /** @type {HTMLButtonElement} */ (document.getElementById("sign-out"));
  if (who === null) {
    label.textContent = "";
    out.hidden = true;
  } else if (!who.auth) {
    label.textContent = "access control off";
    out.hidden = true;
  } else {
    label.textContent = `${who.principal} (${who.method})`;
    out.hidden = false;
  }
}

/** @type {HTMLButtonElement} */ (document.getElementById("sign-out")).addEventListener(
  "click", () => {
    clearToken();
    // A fresh page: nothing the last person typed or read stays in the tab's memory.
    location.hash = "#/";
    location.reload();
  });
window.addEventListener(UNAUTHENTICATED, signedOut);

window.addEventListener("hashchange", () => void show());
void show();
