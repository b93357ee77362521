// Schedules: a page at a time, refreshed every few seconds, with their next firing in their
// own time zone, the next few on demand, pause, resume and run now.

import { get, post, seg } from "./api.js";
import { h, row, table } from "./dom.js";

const PAGE = 100;
const NEXT = 10;

export async function showSchedules(ctx) {
  const list = h("div", { id: "schedules-list" });
  const pages = [""];
  let next = null;
  // The next fire times shown, by schedule id: they stay open across refreshes.
  const opened = new Map();
  const prev = h("button", { type: "button", id: "schedules-prev", disabled: true,
    onclick: () => { pages.pop(); load().catch(ctx.fail); } }, "← Previous");
  const more = h("button", { type: "button", id: "schedules-next", disabled: true,
    onclick: () => { if (next) { pages.push(next); load().catch(ctx.fail); } } }, "Next →");

  ctx.main.append(
    h("h1", {}, "Schedules"),
    h("p", { class: "muted" }, "Refreshed every few seconds."),
    list,
    h("div", { class: "pager" }, prev, more),
  );

  const load = async () => {
    const after = pages[pages.length - 1];
    const answer = await get(`/v1/schedules?limit=${PAGE}` + (after ? `&after=${seg(after)}` : ""));
    if (!ctx.alive()) return;
    next = answer.next_after ?? null;
    prev.disabled = pages.length <= 1;
    more.disabled = !next;
    list.replaceChildren(schedulesTable(ctx, answer.schedules, opened, load));
  };
  await ctx.live(load);
}

/** The "Next 10" row of schedule `s`, filled from `opened` and toggled by its button. */
function nextFires(ctx, s, opened) {
  const cell = h("td", { colSpan: 7, class: "next-fires" });
  const nextRow = h("tr", { hidden: true }, cell);
  const fill = (n) => {
    cell.replaceChildren(h("strong", {}, `Next ${n.fire_times.length} in ${n.timezone ?? "UTC"}: `),
      h("ol", { class: "fire-times" }, n.fire_times.map((t) => h("li", {}, t.local ?? t.at))));
    nextRow.hidden = false;
  };
  if (opened.has(s.id)) fill(opened.get(s.id));
  const toggle = async (event) => {
    if (!nextRow.hidden) {
      nextRow.hidden = true;
      opened.delete(s.id);
      return;
    }
    event.target.disabled = true;
    try {
      const n = await get(`/v1/schedules/${seg(s.id)}/next?n=${NEXT}`);
      opened.set(s.id, n);
      fill(n);
    } catch (e) {
      ctx.fail(e);
    } finally {
      event.target.disabled = false;
    }
  };
  return { nextRow, toggle };
}

function schedulesTable(ctx, schedules, opened, reload) {
  const rows = [];
  for (const s of schedules) {
    const { nextRow, toggle } = nextFires(ctx, s, opened);
    const act = (verb) => async (event) => {
      event.target.disabled = true;
      try {
        await post(`/v1/schedules/${seg(s.id)}/${verb}`);
        ctx.note(`Schedule ${s.id} ${verb}d.`);
        await reload();
      } catch (e) {
        event.target.disabled = false;
        ctx.fail(e);
      }
    };
    const runNow = async (event) => {
      event.target.disabled = true;
      try {
        const run = await post(`/v1/schedules/${seg(s.id)}/run`);
        const made = run.tasks.filter((t) => !t.duplicate).length;
        ctx.note(`Schedule ${s.id} ran now: ${made} task${made === 1 ? "" : "s"} in ${run.queue}.`);
      } catch (e) {
        ctx.fail(e);
      } finally {
        event.target.disabled = false;
      }
    };
    rows.push(row({ dataset: { schedule: s.id } }, [
      s.id,
      s.queue + (s.queue_missing ? " (missing)" : ""),
      s.cron ? `${s.cron} (${s.timezone ?? "UTC"})` : `every ${s.every_ms / 1000} s`,
      s.paused ? h("span", { class: "paused" }, "paused") : (s.next_fire_local ?? s.next_fire_at ?? "—"),
      s.shard_count > 1 ? `${s.shard_count} shards` : "1",
      s.misfire,
      h("span", { class: "actions" },
        h("button", { type: "button", class: "next", onclick: toggle }, `Next ${NEXT}`),
        h("button", { type: "button", class: "run", onclick: runNow }, "Run now"),
        s.paused
          ? h("button", { type: "button", class: "resume primary", onclick: act("resume") }, "Resume")
          : h("button", { type: "button", class: "pause danger", onclick: act("pause") }, "Pause")),
    ]), nextRow);
  }
  if (rows.length === 0) {
    rows.push(h("tr", {}, h("td", { colSpan: 7, class: "muted" }, "No schedules.")));
  }
  return table(["Schedule", "Queue", "When", "Next firing (its time zone)", "Tasks per firing",
    "Misfire", ""], rows, { id: "schedules" });
}
