// A queue's dead letters: a page at a time, with reason and attempts; inspect a payload,
// redrive or delete one, or all of them. Lists are asked for without payloads
// (`payload=false`: a page of them at the size limit would be tens of megabytes); Inspect
// fetches the one task.

import { get, json, post, seg } from "./api.js";
import { count, h, link, pretty, row, table, time } from "./dom.js";

const PAGE = 50;
/** Redrive-all and delete-all stop after this many, however many there are (press again for
 * more). */
const ALL_MAX = 10000;
/** Dead letters named in one bulk request (the server's limit). */
const BULK_MAX = 1000;
/** Dead letters listed a request by redrive-all. The answer has no payloads, but the server
 * still reads each listed task whole from its store: a page of 1,000 at the payload limit
 * would be a gigabyte of reads. */
const LIST_PAGE = 100;

export async function showDead(ctx) {
  const name = ctx.params.args[0];
  const base = `/v1/queues/${seg(name)}/dead`;
  const list = h("div", { id: "dead-list" });
  const inspect = h("div", { id: "inspect" });
  const pages = [""];
  let next = null;

  // The list has no payloads: Inspect fetches the one task, payload and all.
  const inspectTask = async (id) => {
    try {
      const t = await get(`/v1/queues/${seg(name)}/tasks/${seg(id)}`);
      if (ctx.alive()) showTask(inspect, t);
    } catch (e) {
      ctx.fail(e);
    }
  };

  const load = async () => {
    const after = pages[pages.length - 1];
    const page = await get(`${base}?payload=false&limit=${PAGE}` +
      (after ? `&after=${seg(after)}` : ""));
    if (!ctx.alive()) return;
    next = page.next_after ?? null;
    prev.disabled = pages.length <= 1;
    more.disabled = !next;
    list.replaceChildren(deadTable(page.tasks,
      { inspect: (t) => inspectTask(t.id), redrive, remove }));
  };

  // Deleting is final: the first click arms the row's button, a second within 5 s deletes.
  const remove = async (task, button) => {
    if (!button.dataset.armed) {
      button.dataset.armed = "1";
      button.textContent = "Click again to delete";
      setTimeout(() => { delete button.dataset.armed; button.textContent = "Delete"; }, 5000);
      return;
    }
    button.disabled = true;
    try {
      await json("DELETE", `${base}/${seg(task.id)}`);
      ctx.note(`Dead letter ${task.id} deleted.`);
      await load();
    } catch (e) {
      button.disabled = false;
      ctx.fail(e);
    }
  };

  const redrive = async (task, button) => {
    button.disabled = true;
    try {
      const t = await post(`${base}/${seg(task.id)}/redrive`);
      ctx.note(`Task ${t.id} redriven: ${t.state}, due ${time(t.due_at_ms)}.`);
      await load();
    } catch (e) {
      button.disabled = false;
      ctx.fail(e);
    }
  };

  const prev = h("button", { type: "button", disabled: true,
    onclick: () => { pages.pop(); load().catch(ctx.fail); } }, "← Previous");
  const more = h("button", { type: "button", disabled: true,
    onclick: () => { if (next) { pages.push(next); load().catch(ctx.fail); } } }, "Next →");
  const reload = async () => { pages.splice(1); await load(); };
  const redriveAll = allButton(ctx, base, REDRIVE_ALL, reload);
  const deleteAll = allButton(ctx, base, DELETE_ALL, reload);

  ctx.main.append(
    h("h1", {}, "Dead letters of ", link(`#/queue/${seg(name)}`, name)),
    h("div", { class: "actions" }, redriveAll, deleteAll),
    list,
    h("div", { class: "pager" }, prev, more),
    inspect,
  );
  await load();
}

function deadTable(tasks, on) {
  const rows = tasks.map((t) => row({ dataset: { task: t.id } }, [
    h("code", {}, t.id),
    { num: count(t.attempts) },
    t.dead_reason ?? "—",
    time(t.due_at_ms),
    h("span", { class: "actions" },
      h("button", { type: "button", class: "inspect", onclick: () => on.inspect(t) }, "Inspect"),
      h("button", { type: "button", class: "redrive primary",
        onclick: (e) => on.redrive(t, e.target) }, "Redrive"),
      h("button", { type: "button", class: "delete danger",
        onclick: (e) => on.remove(t, e.target) }, "Delete")),
  ]));
  if (rows.length === 0) {
    rows.push(h("tr", {}, h("td", { colSpan: 5, class: "muted" }, "No dead letters.")));
  }
  return table(["Task", { num: "Attempts" }, "Reason", "Was due", ""], rows, { id: "dead" });
}

function showTask(container, t) {
  const body = t.payload_base64 !== undefined
    ? [h("p", { class: "muted" }, "Payload (bytes, base64):"), h("pre", {}, t.payload_base64)]
    : [h("p", { class: "muted" }, "Payload (JSON):"), h("pre", {}, pretty(t.payload))];
  container.replaceChildren(
    h("h2", {}, "Task ", h("code", {}, t.id)),
    ...body,
    h("p", { class: "muted" }, "Headers:"),
    h("pre", {}, pretty(t.headers ?? {})),
  );
}

/** What the two all-buttons do: their id, label, route (after `…/dead`), and the words of
 * their progress and note. */
const REDRIVE_ALL = { id: "redrive-all", label: "Redrive all", route: ":redrive",
  doing: "Redriving", done: "Redrove", count: "redriven" };
const DELETE_ALL = { id: "delete-all", label: "Delete all", route: ":delete",
  doing: "Deleting", done: "Deleted", count: "deleted" };

/**
 * Redrives or deletes, after a second click, every dead letter there was when it was pressed,
 * each once, up to 1,000 per request.
 *
 * It lists the ids first, paging forward with `after`, and only then acts on them. A task
 * redriven to a target that still refuses it is a dead letter again within milliseconds, under
 * the same id: going back to the first page after each round would find it again and again,
 * and send the broken receiver thousands of deliveries.
 */
function allButton(ctx, base, kind, reload) {
  let armed = null;
  const button = h("button", { type: "button", id: kind.id, class: "danger" }, kind.label);
  button.addEventListener("click", async () => {
    if (!armed) {
      button.textContent = `Click again to ${kind.label.toLowerCase()} dead letters`;
      armed = setTimeout(() => { armed = null; button.textContent = kind.label; }, 5000);
      return;
    }
    clearTimeout(armed);
    armed = null;
    button.disabled = true;
    try {
      const { ids, more } = await deadIds(base, () => ctx.alive());
      let done = 0, gone = 0;
      for (let i = 0; i < ids.length && ctx.alive(); i += BULK_MAX) {
        const answer = await post(`${base}${kind.route}`, { ids: ids.slice(i, i + BULK_MAX) });
        // Redriven or deleted by someone else since it was listed: nothing left to do.
        done += answer[kind.count];
        gone += answer.not_dead.length + answer.not_found.length;
        button.textContent = `${kind.doing}… ${done + gone} of ${ids.length}`;
      }
      ctx.note(`${kind.done} ${done} dead letters.` +
        (gone ? ` ${gone} were no longer dead letters.` : "") +
        (more ? ` Stopped at ${ALL_MAX}: press again for the rest.` : ""));
      await reload();
    } catch (e) {
      ctx.fail(e);
    } finally {
      button.disabled = false;
      button.textContent = kind.label;
    }
  });
  return button;
}

/** The ids of the dead letters now, in id order, up to `ALL_MAX`; `more` when there
 * are others past those. */
async function deadIds(base, alive) {
  const ids = [];
  let after = null;
  while (alive()) {
    const page = await get(`${base}?payload=false&limit=${LIST_PAGE}` +
      (after ? `&after=${seg(after)}` : ""));
    for (const t of page.tasks) {
      if (ids.length === ALL_MAX) return { ids, more: true };
      ids.push(t.id);
    }
    after = page.next_after ?? null;
    if (!after) break;
  }
  return { ids, more: false };
}
