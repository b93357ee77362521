// Schedules: their next firing in their own time zone, the next few on demand, pause and
// resume.

import { get, post, seg } from "./api.js";
import { h, row, table } from "./dom.js";

const NEXT = 10;

export async function showSchedules(ctx) {
  const list = h("div", { id: "schedules-list" });
  ctx.main.append(h("h1", {}, "Schedules"), list);

  const load = async () => {
    const answer = await get("/v1/schedules");
    if (!ctx.alive()) return;
    list.replaceChildren(schedulesTable(ctx, answer.schedules, load));
  };
  await load();
}

function schedulesTable(ctx, schedules, reload) {
  const rows = [];
  for (const s of schedules) {
    const next = h("td", { colSpan: 7, class: "next-fires" });
    const nextRow = h("tr", { hidden: true }, next);
    const toggle = async (event) => {
      if (!nextRow.hidden) {
        nextRow.hidden = true;
        return;
      }
      event.target.disabled = true;
      try {
        const n = await get(`/v1/schedules/${seg(s.id)}/next?n=${NEXT}`);
        next.replaceChildren(h("strong", {}, `Next ${n.fire_times.length} in ${n.timezone ?? "UTC"}: `),
          h("ol", { class: "fire-times" }, n.fire_times.map((t) => h("li", {}, t.local ?? t.at))));
        nextRow.hidden = false;
      } catch (e) {
        ctx.fail(e);
      } finally {
        event.target.disabled = false;
      }
    };
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
    rows.push(row({ dataset: { schedule: s.id } }, [
      s.id,
      s.queue + (s.queue_missing ? " (missing)" : ""),
      s.cron ? `${s.cron} (${s.timezone ?? "UTC"})` : `every ${s.every_ms / 1000} s`,
      s.paused ? h("span", { class: "paused" }, "paused") : (s.next_fire_local ?? s.next_fire_at ?? "—"),
      s.shard_count > 1 ? `${s.shard_count} shards` : "1",
      s.misfire,
      h("span", { class: "actions" },
        h("button", { type: "button", class: "next", onclick: toggle }, `Next ${NEXT}`),
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
