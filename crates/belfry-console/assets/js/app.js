// The console's shell: hash routing, the login form, the error banner, live refresh.

import { ApiError, AuthError, NetworkError, setToken, token } from "./api.js";
import { showOverview } from "./overview.js";
import { showQueue } from "./queue.js";
import { showDead } from "./dead.js";
import { showTasks } from "./tasks.js";
import { showTask } from "./task.js";
import { showSchedules } from "./schedules.js";
import { showReminders } from "./reminders.js";

const REFRESH_MS = 3000;
/** The longest a refresh waits after the server asked the console to slow down. */
const BACKOFF_MAX_MS = 60000;
const $ = (id) => document.getElementById(id);

/** [pattern, page, nav]: the first pattern matching the hash path shows its page. */
const ROUTES = [
  [/^\/?$/, showOverview, "overview"],
  [/^\/queue\/([^/]+)$/, showQueue, "overview"],
  [/^\/queue\/([^/]+)\/dead$/, showDead, "overview"],
  [/^\/queue\/([^/]+)\/tasks$/, showTasks, "overview"],
  [/^\/task$/, showTask, "task"],
  [/^\/schedules$/, showSchedules, "schedules"],
  [/^\/reminders$/, showReminders, "reminders"],
];

let generation = 0;
let timers = [];
/** Whether a refused token opened the login form (rather than the operator). */
let loginForRefusal = false;

/** Local wall time as HH:MM:SS. */
const clock = (date) => date.toTimeString().slice(0, 8);

/** Shows an error: an auth refusal also opens the login form. `refresh` marks an error of a
 * live refresh, which the next successful refresh takes down again. */
function fail(error, refresh = false) {
  const banner = $("banner");
  banner.className = "";
  banner.dataset.refresh = refresh ? "yes" : "";
  if (error instanceof AuthError) {
    const what = error.status === 401
      ? "The server wants a valid token (401 unauthorized)"
      : "This token may not do that (403 forbidden)";
    banner.textContent = `${what}: ${error.message}`;
    loginForRefusal = true;
    showLogin(true);
  } else {
    banner.textContent = `Error: ${error?.message ?? error}`;
  }
  banner.hidden = false;
}

/** A short note in the banner (an action's outcome). */
function note(text) {
  const banner = $("banner");
  banner.className = "info";
  banner.dataset.refresh = "";
  banner.textContent = text;
  banner.hidden = false;
}

/** Takes down the banner if it shows a live refresh's error: the server answers again. */
function refreshed() {
  if ($("banner").dataset.refresh === "yes") $("banner").hidden = true;
}

function showLogin(open) {
  $("login").hidden = !open;
  if (open) $("token").focus();
}

function showWho() {
  $("who").textContent = token() ? "token set" : "no token";
}

/** How long a refresh waits after `error`, having been slowed down `failures` times in a row
 * before: a rate limit (`429`) or an overloaded server (`503`) is left alone for longer each
 * time (at least its `Retry-After`); other errors are retried at the usual pace. */
function backoffMs(error, failures) {
  if (!(error instanceof ApiError) || (error.status !== 429 && error.status !== 503)) return 0;
  const doubled = Math.min(REFRESH_MS * 2 ** (failures + 1), BACKOFF_MAX_MS);
  return Math.max(doubled, (error.retryAfterS ?? 0) * 1000);
}

/** What a page gets: where to draw, whether it is still shown, and helpers. */
function context(main, gen, params) {
  const alive = () => gen === generation;
  return {
    main,
    params,
    alive,
    fail: (e) => alive() && fail(e),
    note: (t) => alive() && note(t),
    navigate: (hash) => { location.hash = hash; },
    /** Runs `fn` now and every few seconds while the page is shown, never two at once. */
    live(fn) {
      let running = false;
      let shownAt = null; // when the data on screen was fetched
      let slowed = 0; // refreshes slowed down in a row
      let waitUntil = 0;
      const tick = async () => {
        if (running || !alive() || Date.now() < waitUntil) return;
        running = true;
        try {
          await fn();
          shownAt = new Date();
          slowed = 0;
          if (alive()) refreshed();
        } catch (e) {
          if (!alive()) return;
          // A refused token stays refused: stop polling until the operator logs in again.
          if (e instanceof AuthError) stopTimers();
          const wait = backoffMs(e, slowed);
          slowed = wait > 0 ? slowed + 1 : 0;
          waitUntil = Date.now() + wait;
          fail(e, true);
          if (wait > 0) $("banner").textContent += `; refreshing again in ${Math.round(wait / 1000)} s`;
          if (shownAt && !(e instanceof AuthError)) {
            $("banner").textContent += `; showing data from ${clock(shownAt)}`;
          }
        } finally {
          running = false;
        }
      };
      timers.push(setInterval(tick, REFRESH_MS));
      return tick();
    },
  };
}

function stopTimers() {
  timers.forEach(clearInterval);
  timers = [];
}

async function render() {
  generation += 1;
  stopTimers();
  $("banner").hidden = true;
  // A form a refusal opened closes on another page: the token may do what that page does
  // (a read token refused a pause may still look), and a refusal there opens it again.
  if (loginForRefusal) {
    loginForRefusal = false;
    showLogin(false);
  }
  const raw = location.hash.replace(/^#/, "");
  const [path, query = ""] = raw.split("?");
  const main = $("main");
  main.replaceChildren();
  for (const [pattern, page, nav] of ROUTES) {
    const m = path.match(pattern);
    if (!m) continue;
    for (const a of document.querySelectorAll("header nav a")) {
      a.classList.toggle("active", a.dataset.nav === nav);
    }
    const args = decodeArgs(m.slice(1));
    if (!args) {
      main.textContent = "No such page.";
      fail(new Error(`the page address ${path} has a malformed %-escape`));
      return;
    }
    const params = { args, query: new URLSearchParams(query) };
    const ctx = context(main, generation, params);
    try {
      await page(ctx);
    } catch (e) {
      ctx.fail(e);
    }
    return;
  }
  main.textContent = "No such page.";
}

/** The route's segments, percent-decoded; `null` when one is not valid (`%`, `%E0%A4%A`). */
function decodeArgs(segments) {
  try {
    return segments.map(decodeURIComponent);
  } catch {
    return null;
  }
}

function start() {
  $("login-form").addEventListener("submit", (event) => {
    event.preventDefault();
    setToken($("token").value.trim());
    $("token").value = "";
    showLogin(false);
    showWho();
    render();
  });
  $("logout").addEventListener("click", () => {
    setToken("");
    showWho();
    render();
  });
  $("login-open").addEventListener("click", () => {
    loginForRefusal = false;
    showLogin($("login").hidden);
  });
  window.addEventListener("hashchange", render);
  showWho();
  render();
}

start();
