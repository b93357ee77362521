// Reminders: a page at a time, each with its subscriber count and the progress of a fan-out
// in progress (`fanout`: chunks made of the firing's chunks). One list call per refresh: the
// list answer carries both, so a token with a low request rate can watch it too.

import { get, seg } from "./api.js";
import { count, h, row, table, time } from "./dom.js";

const PAGE = 25;

export async function showReminders(ctx) {
  const list = h("div", { id: "reminders-list" });
  const pages = [""];
  let next = null;
  const prev = h("button", { type: "button", disabled: true,
    onclick: () => { pages.pop(); load().catch(ctx.fail); } }, "← Previous");
  const more = h("button", { type: "button", disabled: true,
    onclick: () => { if (next) { pages.push(next); load().catch(ctx.fail); } } }, "Next →");

  ctx.main.append(
    h("h1", {}, "Reminders"),
    h("p", { class: "muted" }, "Refreshed every few seconds. A fan-out cuts a firing's ",
      "subscribers into chunks, one task each, at the reminder's pace."),
    list,
    h("div", { class: "pager" }, prev, more),
  );

  const load = async () => {
    const after = pages[pages.length - 1];
    const page = await get(`/v1/reminders?limit=${PAGE}` + (after ? `&after=${seg(after)}` : ""));
    if (!ctx.alive()) return;
    next = page.next_after ?? null;
    prev.disabled = pages.length <= 1;
    more.disabled = !next;
    list.replaceChildren(remindersTable(page.reminders));
  };
  await ctx.live(load);
}

function fanout(f) {
  if (!f) return h("span", { class: "muted" }, "idle");
  const done = Math.min(f.chunk ?? 0, f.chunks ?? 0);
  return h("span", { class: "fanout" },
    h("progress", { max: Math.max(1, f.chunks ?? 0), value: done }),
    ` chunk ${count(done)} of ${count(f.chunks)} (${count(f.users)} users, firing ${time(f.firing_ms)})`);
}

function remindersTable(reminders) {
  const rows = reminders.map((r) => row({ dataset: { reminder: r.id } }, [
    r.id,
    r.queue,
    r.cron ? `${r.cron} (${r.timezone ?? "UTC"})` : `once at ${time(r.run_at_ms)}`,
    r.next_fire_ms ? time(r.next_fire_ms) : "fired",
    r.priority,
    { num: count(r.subscribers) },
    { num: count(r.firings) },
    `${count(r.chunk_size)} users` + (r.users_per_second ? `, ${count(r.users_per_second)}/s` : ""),
    fanout(r.fanout),
  ]));
  if (rows.length === 0) {
    rows.push(h("tr", {}, h("td", { colSpan: 9, class: "muted" }, "No reminders.")));
  }
  return table(["Reminder", "Queue", "When", "Next firing", "Priority", { num: "Subscribers" },
    { num: "Firings" }, "Chunks of", "Fan-out"], rows, { id: "reminders" });
}
