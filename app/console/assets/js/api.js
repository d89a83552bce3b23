// @ts-check
/**
 * The broker's HTTP API as the console calls it: JSON in and out, the person's token as
 * the bearer header, and every refusal turned into an {@link ApiError} that says what the
 * API said (its error_type and message), never a bare status.
 *
 * The token lives in the tab's session storage only: it is gone when the tab closes and
 * other tabs never see it.
 */

const TOKEN_KEY = "llog.console.token";

/** A refusal or failure of an API call, as the API described it. */
export class ApiError extends Error {
  /**
   * @param {number} status HTTP status (0: the broker could not be reached)
   * @param {string} type the API's error_type (docs/http-api.md, Errors)
   * @param {string} message the API's human-readable summary
   * @param {{loc: string, msg: string}[]} [details] per-field problems of a 400
   * @param {number | null} [retryAfterS] Retry-After, for 429 and 503
   * @param {any} [body] the answer's JSON as it came (a produce refused as a whole
   *   still carries its per-entry results)
   */
  constructor(status, type, message, details = [], retryAfterS = null, body = null) {
    super(message);
    this.name = "ApiError";
    this.status = status;
    this.type = type;
    this.details = details;
    this.retryAfterS = retryAfterS;
    this.body = body;
  }
}

/** @returns {string | null} */
export function token() {
  return sessionStorage.getItem(TOKEN_KEY);
}

/** @param {string} value */
export function setToken(value) {
  sessionStorage.setItem(TOKEN_KEY, value);
}

export function clearToken() {
  sessionStorage.removeItem(TOKEN_KEY);
}

/**
 * @typedef {object} CallOptions
 * @property {string} [method]
 * @property {unknown} [body] sent as JSON
 * @property {Record<string, string | number | undefined>} [query]
 * @property {AbortSignal} [signal]
 * @property {Record<string, string>} [headers]
 */

/**
 * Call the API; resolves to the answer's JSON.
 * @param {string} path an absolute path of the API (`/topics`)
 * @param {CallOptions} [options]
 * @returns {Promise<any>}
 */
export async function api(path, options = {}) {
  const url = new URL(path, location.origin);
  for (const [name, value] of Object.entries(options.query ?? {})) {
    if (value !== undefined && value !== "") url.searchParams.set(name, String(value));
  }
  /** @type {Record<string, string>} */
  const headers = { accept: "application/json", ...(options.headers ?? {}) };
  const bearer = token();
  if (bearer) headers.authorization = `Bearer ${bearer}`;
  /** @type {RequestInit} */
  const init = { method: options.method ?? "GET", headers, signal: options.signal,
                 cache: "no-store" };
  if (options.body !== undefined) {
    headers["content-type"] = "application/json";
    init.body = JSON.stringify(options.body);
  }
  for (let attempt = 0; ; attempt += 1) {
    let answer;
    try {
      answer = await fetch(url, init);
    } catch (err) {
      if (err instanceof DOMException && err.name === "AbortError") throw err;
      throw new ApiError(0, "Unreachable", "the broker could not be reached (is it running?)");
    }
    if (answer.ok) return answer.status === 204 ? null : answer.json();
    const refused = await refusal(answer);
    // A read over the principal's request quota waits as the broker asks and goes again
    // (a page's burst of reads must not fail where a moment's wait would do); a write
    // is never repeated behind the person's back.
    if (refused.status === 429 && init.method === "GET" && attempt < QUOTA_RETRIES
        && refused.retryAfterS !== null && refused.retryAfterS <= QUOTA_WAIT_MAX_S) {
      await pause(Math.max(refused.retryAfterS, 0.2) * 1000, options.signal);
      continue;
    }
    if (refused.status === 401 && bearer) {
      // The token stopped working (revoked, expired): the shell asks for another.
      window.dispatchEvent(new CustomEvent(UNAUTHENTICATED, { detail: refused }));
    }
    throw refused;
  }
}

/** The event ``api`` sends on a 401 to a call that carried a token. */
export const UNAUTHENTICATED = "llog:unauthenticated";
const QUOTA_RETRIES = 3;
const QUOTA_WAIT_MAX_S = 5;

/**
 * @param {number} ms
 * @param {AbortSignal} [signal]
 * @returns {Promise<void>}
 */
function pause(ms, signal) {
  return new Promise((resolve, reject) => {
    const timer = window.setTimeout(resolve, ms);
    signal?.addEventListener("abort", () => {
      window.clearTimeout(timer);
      reject(new DOMException("aborted", "AbortError"));
    }, { once: true });
  });
}

/**
 * @param {Response} answer
 * @returns {Promise<ApiError>}
 */
async function refusal(answer) {
  /** @type {any} */
  let body = null;
  try {
    body = await answer.json();
  } catch {
    // not the API's error body (a proxy's page): the status says what there is to say
  }
  const retry = answer.headers.get("retry-after");
  return new ApiError(answer.status, body?.error_type ?? `HTTP ${answer.status}`,
                      body?.error ?? answer.statusText, body?.details ?? [],
                      retry === null ? null : Number(retry), body);
}

/**
 * @typedef {object} Who
 * @property {boolean} auth whether access control is on
 * @property {string | null} principal
 * @property {string | null} method
 * @property {number | null} expires_at_ms
 * @property {Record<string, string[]>} rights patterns per right: names, `prefix*`, `*`
 */

/** @returns {Promise<Who>} */
export function whoami() {
  return api("/whoami");
}

/**
 * Whether ``who`` holds ``right`` on ``name`` (a topic; a group for "group"), by the
 * broker's own rule: an exact name, or a pattern ending in `*` that is its prefix.
 * @param {Who} who
 * @param {"produce" | "consume" | "group" | "admin"} right
 * @param {string} name
 */
export function holds(who, right, name) {
  return (who.rights[right] ?? []).some(
    (p) => (p.endsWith("*") ? name.startsWith(p.slice(0, -1)) : p === name));
}

/**
 * Whether ``who`` holds ``right`` on some name at all (for offering a form before the
 * name is typed).
 * @param {Who} who
 * @param {"produce" | "consume" | "group" | "admin"} right
 */
export function holdsAny(who, right) {
  return (who.rights[right] ?? []).length > 0;
}
