// One queue: its configuration, pause, resume and purge, in-flight and rate-limit state, the
// forecast of tasks falling due (uPlot), and its lateness distribution (from /metrics).

import { get, metricsText, post, seg } from "./api.js";
import { count, duration, h, link, rate, row, seconds, table, time } from "./dom.js";
import { bucketCounts, latenessBuckets, parse, quantile } from "./metrics.js";

const HORIZONS = [
  ["1 hour", 3600000, 60000],
  ["6 hours", 21600000, 300000],
  ["24 hours", 86400000, 900000],
  ["7 days", 604800000, 3600000],
];

export async function showQueue(ctx) {
  const name = ctx.params.args[0];
  const state = h("div", { id: "queue-state" });
  const config = h("div", { id: "queue-config" });
  const lateness = h("div", { id: "lateness" });
  const chart = h("div", { id: "forecast", class: "chart" });
  const horizon = h("select", { id: "horizon", onchange: () => drawForecast().catch(ctx.fail) },
    HORIZONS.map(([label], i) => h("option", { value: String(i), selected: i === 1 }, label)));
  const buttons = actions(ctx, name, () => load());

  ctx.main.append(
    h("h1", {}, "Queue ", name),
    h("div", { class: "actions" }, buttons.pause, buttons.resume, buttons.purge,
      link(`#/queue/${seg(name)}/tasks`, "Tasks →"),
      link(`#/queue/${seg(name)}/dead`, "Dead letters →")),
    h("div", { class: "grid" },
      h("div", {}, h("h2", {}, "State"), state, h("h2", {}, "Configuration"), config),
      h("div", {},
        h("h2", {}, "Forecast: tasks falling due ", horizon), chart,
        h("h2", {}, "Lateness since the server started"), lateness)),
  );

  const load = async () => {
    const [q, text] = await Promise.all([get(`/v1/queues/${seg(name)}`), metricsText()]);
    if (!ctx.alive()) return;
    buttons.pause.disabled = q.paused;
    buttons.resume.disabled = !q.paused;
    state.replaceChildren(stateTable(q));
    config.replaceChildren(configTable(q));
    lateness.replaceChildren(latenessView(latenessBuckets(parse(text)).get(name)));
  };

  let plot = null;
  const drawForecast = async () => {
    const [, horizonMs, stepMs] = HORIZONS[Number(horizon.value)];
    const f = await get(`/v1/queues/${seg(name)}/forecast?horizon_ms=${horizonMs}&step_ms=${stepMs}`);
    if (!ctx.alive()) return;
    plot?.destroy();
    chart.replaceChildren();
    plot = forecastChart(chart, f);
  };

  await Promise.all([ctx.live(load), drawForecast()]);
}

function actions(ctx, name, reload) {
  const act = (verb) => async (event) => {
    event.target.disabled = true;
    try {
      const q = await post(`/v1/queues/${seg(name)}/${verb}`);
      ctx.note(`Queue ${q.name} is ${q.paused ? "paused" : "running"}.`);
      await reload();
    } catch (e) {
      event.target.disabled = false;
      ctx.fail(e);
    }
  };
  return {
    pause: h("button", { type: "button", id: "pause", class: "danger", onclick: act("pause") },
      "Pause"),
    resume: h("button", { type: "button", id: "resume", class: "primary",
      onclick: act("resume") }, "Resume"),
    purge: purgeButton(ctx, name, reload),
  };
}

/** Drops every task of the queue after a second click within 5 s: there is no undo. */
function purgeButton(ctx, name, reload) {
  let armed = null;
  const label = "Purge all tasks";
  const button = h("button", { type: "button", id: "purge", class: "danger" }, label);
  button.addEventListener("click", async () => {
    if (!armed) {
      button.textContent = "Click again to drop every task (no undo)";
      armed = setTimeout(() => { armed = null; button.textContent = label; }, 5000);
      return;
    }
    clearTimeout(armed);
    armed = null;
    button.disabled = true;
    try {
      const { purged } = await post(`/v1/queues/${seg(name)}/purge`);
      ctx.note(`Queue ${name} purged: ${count(purged.pending)} scheduled, ` +
        `${count(purged.in_flight)} in flight and ${count(purged.dead)} dead tasks dropped.`);
      await reload();
    } catch (e) {
      ctx.fail(e);
    } finally {
      button.disabled = false;
      button.textContent = label;
    }
  });
  return button;
}

function fields(pairs, id) {
  return h("table", { class: "fields", id },
    h("tbody", {}, pairs.map(([k, v]) => h("tr", {}, h("th", {}, k), h("td", {}, v)))));
}

/**
 * What bounds a queue's tasks in flight when its `max_in_flight` is 0, by its delivery
 * (docs/api.md): the server's settings are not in the queue's JSON, so they are named. The
 * CLI's `queue get` words it the same.
 */
const IN_FLIGHT_UNSET = {
  pull: "no limit",
  webhook: "server default (webhooks.in_flight_default)",
  stream: "no per-queue limit, only the server's dispatch budgets",
};

/** `3 of 8`, `3 of server default (…)`, `3 (no limit)`. */
function inFlightText(q) {
  const now = count(q.in_flight);
  if (q.max_in_flight > 0) return `${now} of ${count(q.max_in_flight)}`;
  const type = q.delivery?.type ?? "pull";
  if (type === "webhook") return `${now} of ${IN_FLIGHT_UNSET.webhook}`;
  return `${now} (${IN_FLIGHT_UNSET[type === "pull" ? "pull" : "stream"]})`;
}

function stateTable(q) {
  const limit = q.rate_per_s > 0 ? `${rate(q.rate_per_s)} per second, burst ${count(q.burst)}`
    : "unlimited";
  return fields([
    ["Status", q.paused ? h("span", { class: "paused" }, "paused") : "running"],
    ["Pending", count(q.pending)],
    ["Due now", q.oldest_due_ms == null ? count(q.due)
      : `${count(q.due)}, the oldest waiting ${duration(Math.max(0, Date.now() - q.oldest_due_ms))}`],
    ["In flight", inFlightText(q)],
    ["Dead letters", count(q.dead)],
    ["Rate limit", limit],
  ], "state-fields");
}

/** Delivery fields never shown, should a server ever send them: the server already leaves
 * out the webhook's `secret` (only `secret_set`), its fixed `headers` (only their names, in
 * `headers_set`) and the URL's credentials and query. Whole names only: a Kafka queue's `key`
 * (which header keys its messages) is not a secret. */
const SECRET_FIELDS = ["secret", "previous_secret", "headers", "token", "password"];

/** The delivery spec without anything secret. A secret row only when the answer has
 * `secret_set`: a stream delivery takes no secret. */
function deliveryText(delivery) {
  if (!delivery) return "pull";
  const shown = [];
  for (const [k, v] of Object.entries(delivery)) {
    if (SECRET_FIELDS.includes(k)) continue;
    if (k === "secret_set") shown.push(`secret: ${v ? "set (hidden)" : "none"}`);
    else if (k === "previous_secret_set") shown.push("previous secret: set (hidden), rotating");
    else if (k === "headers_set") shown.push(`headers: ${v.join(", ")} (values hidden)`);
    else shown.push(`${k}: ${typeof v === "object" ? JSON.stringify(v) : v}`);
  }
  return shown.join(", ");
}

/** The queue's late policy as the CLI words it: `deliver however late`, `skip past 1m late`,
 * `dead letter past 1h late`. */
function lateText(policy, afterMs) {
  const past = (what) => afterMs === undefined || afterMs === null ? what
    : `${what} past ${duration(afterMs)} late`;
  switch (policy ?? "fire") {
    case "fire": return "deliver however late";
    case "skip": return past("skip");
    case "dead": return past("dead letter");
    default: return past(policy);
  }
}

function configTable(q) {
  // A push queue's last look at its target: "reachable", "unreachable: why", "refused: why"
  // (tasks dead-letter until the target or the connection is fixed) or "unknown".
  const health = q.delivery_health ? [["Delivery health", q.delivery_health]] : [];
  return fields([
    ["Delivery", deliveryText(q.delivery)],
    ...health,
    ["Max attempts", count(q.retry?.max_attempts)],
    ["Backoff", `${count(q.retry?.backoff_initial_ms)} ms doubling, up to ` +
      `${count(q.retry?.backoff_max_ms)} ms`],
    ["Late policy", lateText(q.late_policy, q.late_after_ms)],
  ], "config-fields");
}

function latenessView(buckets) {
  const parts = bucketCounts(buckets).filter((b) => b.count > 0);
  if (parts.length === 0) return h("p", { class: "muted" }, "No deliveries measured yet.");
  const total = buckets[buckets.length - 1].count;
  const most = Math.max(...parts.map((b) => b.count));
  const rows = parts.map((b) => {
    const bar = h("div", { class: "bar" });
    bar.style.width = `${Math.max(1, (100 * b.count) / most)}%`;
    const range = b.le === Infinity ? `over ${seconds(b.from)}` : `${seconds(b.from)} – ${seconds(b.le)}`;
    return row({}, [range, { num: count(b.count) }, bar]);
  });
  return h("div", {},
    h("p", {}, `${count(total)} deliveries; p50 ${seconds(quantile(buckets, 0.5))}, ` +
      `p99 ${seconds(quantile(buckets, 0.99))}`),
    table(["Late by", { num: "Deliveries" }, ""], rows, { id: "lateness-table" }));
}

function forecastChart(container, f) {
  const xs = f.steps.map((s) => s.start_ms / 1000);
  const tasks = f.steps.map((s) => s.tasks);
  const firings = f.steps.map((s) => s.firings);
  const total = f.steps.map((s) => s.total);
  const sum = total.reduce((a, b) => a + b, 0);
  container.append(h("p", { class: "muted" }, `${count(sum)} tasks in the next ` +
    `${f.horizon_ms / 3600000} h from ${time(f.from_ms)}, in steps of ${f.step_ms / 60000} min ` +
    "(scheduled tasks, and the firings of the queue's active schedules)."));
  const width = Math.max(300, container.clientWidth - 20);
  const stepped = uPlot.paths.stepped({ align: 1 });
  const opts = {
    width,
    height: 220,
    scales: { x: { time: true }, y: { range: (u, min, max) => [0, Math.max(1, max)] } },
    series: [
      {},
      { label: "total", stroke: "#2f5fb3", fill: "rgba(47,95,179,0.12)", paths: stepped },
      { label: "scheduled tasks", stroke: "#1e7b34", paths: stepped },
      { label: "schedule firings", stroke: "#b36b00", paths: stepped },
    ],
    axes: [{}, { label: "tasks per step" }],
  };
  return new uPlot(opts, [xs, total, tasks, firings], container);
}
