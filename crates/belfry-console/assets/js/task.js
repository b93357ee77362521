// Looking a task up by id or idempotency key, and showing every field the API returns.

import { ApiError, get, seg } from "./api.js";
import { duration, h, pretty, time } from "./dom.js";

export async function showTask(ctx) {
  const q = ctx.params.query;
  const queue = h("input", { id: "lookup-queue", required: true, value: q.get("queue") ?? "",
    placeholder: "queue" });
  const by = h("select", { id: "lookup-by" },
    h("option", { value: "id", selected: q.get("by") !== "key" }, "task id"),
    h("option", { value: "key", selected: q.get("by") === "key" }, "idempotency key"));
  const value = h("input", { id: "lookup-value", required: true, value: q.get("value") ?? "",
    size: 40 });
  const result = h("div", { id: "task-result" });
  const form = h("form", { id: "lookup-form", class: "inline", onsubmit: (event) => {
    event.preventDefault();
    const params = new URLSearchParams({ queue: queue.value.trim(), by: by.value,
      value: value.value.trim() });
    ctx.navigate(`#/task?${params}`);
  } },
  h("label", {}, "Queue", queue), h("label", {}, "By", by), h("label", {}, "Value", value),
  h("button", { type: "submit", class: "primary" }, "Look up"));

  ctx.main.append(h("h1", {}, "Task lookup"), form, result);
  if (!q.get("queue") || !q.get("value")) return;

  const kind = q.get("by") === "key" ? "keys" : "tasks";
  try {
    const task = await get(`/v1/queues/${seg(q.get("queue"))}/${kind}/${seg(q.get("value"))}`);
    if (ctx.alive()) result.replaceChildren(taskFields(task));
  } catch (e) {
    if (!(e instanceof ApiError)) throw e;
    result.replaceChildren(h("p", { class: "paused", id: "task-missing" }, e.message));
  }
}

/** Fields ending in `_ms` that are lengths of time, not instants. */
const DURATIONS = ["late_after_ms"];

/** Every field of the task: instants as UTC, durations in words, objects as JSON, the rest
 * as text. */
function taskFields(task) {
  const rows = Object.entries(task).map(([k, v]) => {
    let shown;
    if (DURATIONS.includes(k) && typeof v === "number") shown = `${duration(v)} (${v} ms)`;
    else if (k.endsWith("_ms") && typeof v === "number") shown = `${time(v)} (${v})`;
    else if (v !== null && typeof v === "object") shown = h("pre", {}, pretty(v));
    else if (k === "payload") shown = h("pre", {}, pretty(v));
    else shown = String(v);
    return h("tr", { dataset: { field: k } }, h("th", {}, k), h("td", {}, shown));
  });
  return h("table", { class: "fields", id: "task-fields" }, h("tbody", {}, rows));
}
