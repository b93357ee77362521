// The console's shell: hash routing, the login form, the error banner, live refresh.

import { AuthError, setToken, token } from "./api.js";
import { showOverview } from "./overview.js";
import { showQueue } from "./queue.js";
import { showDead } from "./dead.js";
import { showTask } from "./task.js";
import { showSchedules } from "./schedules.js";
import { showReminders } from "./reminders.js";

const REFRESH_MS = 3000;
const $ = (id) => document.getElementById(id);

/** [pattern, page, nav]: the first pattern matching the hash path shows its page. */
const ROUTES = [
  [/^\/?$/, showOverview, "overview"],
  [/^\/queue\/([^/]+)$/, showQueue, "overview"],
  [/^\/queue\/([^/]+)\/dead$/, showDead, "overview"],
  [/^\/task$/, showTask, "task"],
  [/^\/schedules$/, showSchedules, "schedules"],
  [/^\/reminders$/, showReminders, "reminders"],
];

let generation = 0;
let timers = [];

/** Shows an error: an auth refusal also opens the login form. */
function fail(error) {
  const banner = $("banner");
  banner.className = "";
  if (error instanceof AuthError) {
    const what = error.status === 401
      ? "The server wants a valid token (401 unauthorized)"
      : "This token may not do that (403 forbidden)";
    banner.textContent = `${what}: ${error.message}`;
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
  banner.textContent = text;
  banner.hidden = false;
}

function showLogin(open) {
  $("login").hidden = !open;
  if (open) $("token").focus();
}

function showWho() {
  $("who").textContent = token() ? "token set" : "no token";
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
      const tick = async () => {
        if (running || !alive()) return;
        running = true;
        try {
          await fn();
        } catch (e) {
          if (!alive()) return;
          // A refused token stays refused: stop polling until the operator logs in again.
          if (e instanceof AuthError) stopTimers();
          fail(e);
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
    const params = { args: m.slice(1).map(decodeURIComponent), query: new URLSearchParams(query) };
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
  $("login-open").addEventListener("click", () => showLogin($("login").hidden));
  window.addEventListener("hashchange", render);
  showWho();
  render();
}

start();
