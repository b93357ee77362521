// A queue's dead letters: a page at a time, with reason and attempts; inspect a payload,
// redrive one, or all of them.

import { get, post, seg } from "./api.js";
import { count, h, link, pretty, row, table, time } from "./dom.js";

const PAGE = 50;
/** Redrive-all stops after this many, however many there are (press it again for more). */
const REDRIVE_ALL_MAX = 10000;

export async function showDead(ctx) {
  const name = ctx.params.args[0];
  const base = `/v1/queues/${seg(name)}/dead`;
  const list = h("div", { id: "dead-list" });
  const inspect = h("div", { id: "inspect" });
  const pages = [""];
  let next = null;

  const load = async () => {
    const after = pages[pages.length - 1];
    const page = await get(`${base}?limit=${PAGE}` + (after ? `&after=${seg(after)}` : ""));
    if (!ctx.alive()) return;
    next = page.next_after ?? null;
    prev.disabled = pages.length <= 1;
    more.disabled = !next;
    list.replaceChildren(deadTable(page.tasks, { inspect: (t) => show(inspect, t), redrive }));
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
  const all = redriveAllButton(ctx, base, async () => { pages.splice(1); await load(); });

  ctx.main.append(
    h("h1", {}, "Dead letters of ", link(`#/queue/${seg(name)}`, name)),
    h("div", { class: "actions" }, all),
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
        onclick: (e) => on.redrive(t, e.target) }, "Redrive")),
  ]));
  if (rows.length === 0) {
    rows.push(h("tr", {}, h("td", { colSpan: 5, class: "muted" }, "No dead letters.")));
  }
  return table(["Task", { num: "Attempts" }, "Reason", "Was due", ""], rows, { id: "dead" });
}

function show(container, t) {
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

/** Redrives every dead letter after a second click: pages from the start until none is left. */
function redriveAllButton(ctx, base, reload) {
  let armed = null;
  const button = h("button", { type: "button", id: "redrive-all", class: "danger" },
    "Redrive all");
  button.addEventListener("click", async () => {
    if (!armed) {
      button.textContent = "Click again to redrive every dead letter";
      armed = setTimeout(() => { armed = null; button.textContent = "Redrive all"; }, 5000);
      return;
    }
    clearTimeout(armed);
    armed = null;
    button.disabled = true;
    let done = 0;
    try {
      while (done < REDRIVE_ALL_MAX && ctx.alive()) {
        const page = await get(`${base}?limit=100`);
        if (page.tasks.length === 0) break;
        for (const t of page.tasks) {
          await post(`${base}/${seg(t.id)}/redrive`);
          done += 1;
          button.textContent = `Redriving… ${done}`;
        }
      }
      ctx.note(`Redrove ${done} dead letters.`);
      await reload();
    } catch (e) {
      ctx.fail(e);
    } finally {
      button.disabled = false;
      button.textContent = "Redrive all";
    }
  });
  return button;
}
