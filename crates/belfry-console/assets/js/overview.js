// Every queue with its counts, delivery rate and lateness: one page of queues and one
// `/metrics` scrape per refresh, however many queues there are.

import { get, metricsText } from "./api.js";
import { count, h, link, rate, row, seconds, table } from "./dom.js";
import { latenessBuckets, parse, quantile, Rates } from "./metrics.js";

const PAGE = 100;

export async function showOverview(ctx) {
  const body = h("div", { id: "queues-table" });
  const label = h("span", { class: "muted", id: "page-label" });
  // `after` of each page shown so far: the last is the current page's.
  const pages = [""];
  const rates = new Rates();
  let next = null;

  const prev = h("button", {
    type: "button", id: "prev-page", disabled: true,
    onclick: () => { pages.pop(); load().catch(ctx.fail); },
  }, "← Previous");
  const more = h("button", {
    type: "button", id: "next-page", disabled: true,
    onclick: () => { if (next) { pages.push(next); load().catch(ctx.fail); } },
  }, "Next →");

  ctx.main.append(
    h("h1", {}, "Queues"),
    h("p", { class: "muted" },
      "Refreshed every few seconds. Delivered/s is measured between refreshes; lateness is ",
      "the delivery start minus the due time, over all deliveries since the server started."),
    body,
    h("div", { class: "pager" }, prev, more, label),
  );

  const load = async () => {
    const after = pages[pages.length - 1];
    const query = `limit=${PAGE}` + (after ? `&after=${encodeURIComponent(after)}` : "");
    const [page, text] = await Promise.all([get(`/v1/queues?${query}`), metricsText()]);
    if (!ctx.alive()) return;
    const samples = parse(text);
    const delivered = rates.next(samples);
    const lateness = latenessBuckets(samples);
    next = page.next_after ?? null;
    prev.disabled = pages.length <= 1;
    more.disabled = !next;
    label.textContent = `page ${pages.length}, ${page.queues.length} queues`;
    body.replaceChildren(queuesTable(page.queues, delivered, lateness));
  };
  await ctx.live(load);
}

function queuesTable(queues, delivered, lateness) {
  const rows = queues.map((q) => {
    const buckets = lateness.get(q.name);
    // No rate before the second scrape; a queue with no counter yet delivered nothing.
    const r = delivered ? delivered.get(q.name) ?? 0 : null;
    return row({ dataset: { queue: q.name } }, [
      link(`#/queue/${encodeURIComponent(q.name)}`, q.name),
      q.paused ? h("span", { class: "paused" }, "paused") : "active",
      q.delivery?.type ?? "pull",
      { num: q.pending > 0 ? link(`#/queue/${encodeURIComponent(q.name)}/tasks`, count(q.pending))
        : "0" },
      { num: count(q.due) },
      { num: count(q.in_flight) },
      { num: q.dead > 0 ? link(`#/queue/${encodeURIComponent(q.name)}/dead`, count(q.dead)) : "0" },
      { num: rate(r) },
      { num: seconds(quantile(buckets, 0.5)) },
      { num: seconds(quantile(buckets, 0.99)) },
    ]);
  });
  if (rows.length === 0) {
    rows.push(h("tr", {}, h("td", { colSpan: 10, class: "muted" }, "No queues.")));
  }
  return table(["Queue", "State", "Delivery", { num: "Pending" }, { num: "Due" },
    { num: "In flight" }, { num: "Dead" }, { num: "Delivered/s" }, { num: "Lateness p50" },
    { num: "p99" }], rows, { id: "queues" });
}
