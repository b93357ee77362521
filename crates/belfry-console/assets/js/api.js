// Calls to belfry's public HTTP API, with the operator's bearer token.

const KEY = "belfry.console.token";

export function token() {
  return sessionStorage.getItem(KEY) ?? "";
}

export function setToken(value) {
  if (value) sessionStorage.setItem(KEY, value);
  else sessionStorage.removeItem(KEY);
}

/** A refusal of the token (401) or of its scope (403): the login form is shown. */
export class AuthError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

/** Any other error answer, with the API's stable `code`, and its `Retry-After` in seconds
 * when it has one (a `429` or `503` says when to ask again). */
export class ApiError extends Error {
  constructor(status, code, message, retryAfterS = null) {
    super(message);
    this.status = status;
    this.code = code;
    this.retryAfterS = retryAfterS;
  }
}

/** No answer at all: the server is down or unreachable (the browser says only "Failed to
 * fetch"). */
export class NetworkError extends Error {}

async function send(method, path, body) {
  const headers = {};
  const t = token();
  if (t) headers.Authorization = `Bearer ${t}`;
  const init = { method, headers, cache: "no-store" };
  if (body !== undefined) init.body = JSON.stringify(body);
  let response;
  try {
    response = await fetch(path, init);
  } catch (e) {
    throw new NetworkError(`cannot reach the server (${e?.message ?? e})`);
  }
  if (response.ok) return response;
  let code = "", message = `${response.status} ${response.statusText}`;
  try {
    const answer = await response.json();
    code = answer?.error?.code ?? "";
    message = answer?.error?.message ?? message;
  } catch {
    // Not our JSON error body: keep the status line.
  }
  if (response.status === 401 || response.status === 403) {
    throw new AuthError(response.status, code, message);
  }
  const retryAfter = Number.parseInt(response.headers.get("Retry-After") ?? "", 10);
  throw new ApiError(response.status, code, message,
    Number.isNaN(retryAfter) ? null : retryAfter);
}

/** A JSON answer. */
export async function json(method, path, body) {
  const response = await send(method, path, body);
  return response.status === 204 ? null : response.json();
}

export const get = (path) => json("GET", path);
export const post = (path, body) => json("POST", path, body);

/** The Prometheus text of `/metrics`. */
export async function metricsText() {
  return (await send("GET", "/metrics")).text();
}

/** A path segment (queue names, ids, keys). */
export const seg = (s) => encodeURIComponent(s);
