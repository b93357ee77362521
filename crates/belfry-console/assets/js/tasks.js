// A queue's live tasks, scheduled and leased: a page at a time in the store's order (not due
// order: the queue's forecast shows when they fall due), with their due time, attempts, a
// clipped payload and, for a leased one, its lease; cancel a scheduled one, or open one whole
// in the task view.
//
// Each listed task comes with its payload: the list clips it, but the server sends it whole
// (a page of 50 at the 1 MiB limit is 50 MB). So pages stay small, and the page is not
// refreshed by itself: Refresh asks again.

import { ApiError, get, json, seg } from "./api.js";
import { count, h, link, row, table, when } from "./dom.js";

/** Page sizes offered, and the one a page starts with. */
const SIZES = [10, 25, 50];
const DEFAULT_SIZE = 25;
/** Characters of a payload shown in the list. */
const CLIP = 80;
/** A cancel refused because the task is no longer scheduled (leased, finished, dead) or no
 * longer known. */
const NOT_CANCELLED = ["task_not_scheduled", "task_not_found"];
const COLUMNS = 6;

export async function showTasks(ctx) {
  const name = ctx.params.args[0];
  const base = `/v1/queues/${seg(name)}/tasks`;
  const asked = Number(ctx.params.query.get("limit"));
  const limit = SIZES.includes(asked) ? asked : DEFAULT_SIZE;
  const list = h("div", { id: "tasks-list" });
  const label = h("span", { class: "muted", id: "tasks-page" });
  // `after` of each page shown so far: the last is the current page's.
  const pages = [""];
  let next = null;

  const load = async () => {
    const after = pages[pages.length - 1];
    const page = await get(`${base}?limit=${limit}` + (after ? `&after=${seg(after)}` : ""));
    if (!ctx.alive()) return;
    next = page.next_after ?? null;
    first.disabled = pages.length <= 1;
    prev.disabled = pages.length <= 1;
    more.disabled = !next;
    label.textContent = `page ${pages.length}, ${count(page.tasks.length)} tasks`;
    list.replaceChildren(tasksTable(name, page.tasks, cancel));
  };

  // Cancelling is final: the first click arms the row's button, a second within 5 s cancels.
  const cancel = async (task, button) => {
    if (!button.dataset.armed) {
      button.dataset.armed = "1";
      button.textContent = "Click again to cancel";
      setTimeout(() => { delete button.dataset.armed; button.textContent = "Cancel"; }, 5000);
      return;
    }
    button.disabled = true;
    try {
      await json("DELETE", `${base}/${seg(task.id)}`);
      ctx.note(`Task ${task.id} cancelled.`);
      await load();
    } catch (e) {
      if (!(e instanceof ApiError) || !NOT_CANCELLED.includes(e.code)) {
        button.disabled = false;
        ctx.fail(e);
        return;
      }
      // Leased, finished or forgotten since the page was listed: say what it is now, and show
      // its row as it is.
      await refused(task, button);
    }
  };

  const refused = async (task, button) => {
    let now = null;
    try {
      now = await get(`${base}/${seg(task.id)}`);
    } catch (e) {
      if (!(e instanceof ApiError) || e.status !== 404) {
        button.disabled = false;
        ctx.fail(e);
        return;
      }
    }
    if (!ctx.alive()) return;
    const what = now ? `it is ${now.state} now` : "the server no longer knows it";
    ctx.fail(new Error(`task ${task.id} was not cancelled: ${what}, and only a scheduled ` +
      "task can be cancelled."));
    button.closest("tr").replaceWith(now ? taskRow(name, now, cancel) : goneRow(task));
  };

  const go = (change) => () => { change(); load().catch(ctx.fail); };
  const first = h("button", { type: "button", id: "tasks-first", disabled: true,
    onclick: go(() => pages.splice(1)) }, "⇤ First page");
  const prev = h("button", { type: "button", id: "tasks-prev", disabled: true,
    onclick: go(() => pages.pop()) }, "← Previous");
  const more = h("button", { type: "button", id: "tasks-next", disabled: true,
    onclick: go(() => { if (next) pages.push(next); }) }, "Next page →");
  const refresh = h("button", { type: "button", id: "tasks-refresh", onclick: go(() => {}) },
    "Refresh");
  const size = h("select", { id: "tasks-limit", onchange: () =>
    ctx.navigate(`#/queue/${seg(name)}/tasks?limit=${size.value}`) },
  SIZES.map((n) => h("option", { value: String(n), selected: n === limit }, `${n} a page`)));

  ctx.main.append(
    h("h1", {}, "Tasks of ", link(`#/queue/${seg(name)}`, name)),
    h("p", { class: "muted" }, "Scheduled and leased tasks, in the store's order (not due ",
      "order: the queue's forecast shows when they fall due). Finished tasks are not listed; ",
      "dead letters have their own page."),
    h("div", { class: "actions" }, refresh, size,
      link(`#/queue/${seg(name)}/dead`, "Dead letters →")),
    list,
    h("div", { class: "pager" }, first, prev, more, label),
  );
  await load();
}

function tasksTable(queue, tasks, cancel) {
  const rows = tasks.map((t) => taskRow(queue, t, cancel));
  if (rows.length === 0) {
    rows.push(h("tr", {}, h("td", { colSpan: COLUMNS, class: "muted" },
      "No scheduled or leased tasks.")));
  }
  return table(["Task", "State", "Due", { num: "Attempts" }, "Payload", ""], rows,
    { id: "tasks" });
}

/** A task's row: its id links to the task view, which shows every field. */
function taskRow(queue, t, cancel) {
  const whole = new URLSearchParams({ queue, by: "id", value: t.id });
  const state = t.state === "leased" && t.lease_until_ms != null
    ? [h("span", { class: "state" }, "leased"), ` until ${when(t.lease_until_ms)}`]
    : h("span", { class: "state" }, t.state);
  return row({ dataset: { task: t.id, state: t.state } }, [
    [h("a", { href: `#/task?${whole}`, class: "view" }, h("code", {}, t.id)),
      t.idempotency_key != null ? h("div", { class: "muted" }, "key ", t.idempotency_key) : null],
    state,
    when(t.due_at_ms),
    { num: count(t.attempts) },
    h("code", { class: "payload" }, clipped(t)),
    t.state === "scheduled"
      ? h("button", { type: "button", class: "cancel danger",
        onclick: (e) => cancel(t, e.target) }, "Cancel")
      : null,
  ]);
}

/** The row of a task the server no longer knows (finished and forgotten). */
function goneRow(t) {
  return row({ dataset: { task: t.id, state: "gone" } }, [
    h("code", {}, t.id), h("span", { class: "state" }, "gone"), "—", "—", "—", null,
  ]);
}

/** The payload as compact JSON (bytes as base64), cut after `CLIP` characters. */
function clipped(t) {
  let text;
  if (t.payload !== undefined) text = JSON.stringify(t.payload);
  else if (t.payload_base64 !== undefined) text = `bytes, base64: ${t.payload_base64}`;
  else return "—";
  if (text.length <= CLIP) return text;
  // Not half a character: a cut between the two halves of a surrogate pair drops the first.
  return text.slice(0, CLIP).replace(/[\uD800-\uDBFF]$/, "") + "…";
}
