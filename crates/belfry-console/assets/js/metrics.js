// Reading belfry's `/metrics` (Prometheus text) in the browser: the delivered counters become
// rates between two scrapes, the lateness histogram's buckets a p50/p99 estimate.

export const DELIVERED = "belfry_tasks_delivered_total";
export const LATENESS = "belfry_firing_lateness_seconds";

/** Parses `name{l="v",...} value` lines: a Map from name to [{labels, value}]. */
export function parse(text) {
  const samples = new Map();
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const brace = line.indexOf("{");
    const space = line.lastIndexOf(" ");
    if (space < 0) continue;
    let name, labels = {};
    if (brace >= 0 && brace < space) {
      name = line.slice(0, brace);
      labels = parseLabels(line.slice(brace + 1, line.lastIndexOf("}")));
    } else {
      name = line.slice(0, space).trim();
    }
    const value = Number(line.slice(space + 1));
    if (!samples.has(name)) samples.set(name, []);
    samples.get(name).push({ labels, value });
  }
  return samples;
}

function parseLabels(text) {
  const labels = {};
  const pattern = /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g;
  for (const m of text.matchAll(pattern)) {
    labels[m[1]] = m[2].replace(/\\(.)/g, (_, c) => (c === "n" ? "\n" : c));
  }
  return labels;
}

/** One value per queue of a per-queue metric. */
export function byQueue(samples, name) {
  const out = new Map();
  for (const s of samples.get(name) ?? []) {
    if (s.labels.queue !== undefined) out.set(s.labels.queue, s.value);
  }
  return out;
}

/** Each queue's lateness buckets, cumulative, sorted: [{le, count}], `le` Infinity last. */
export function latenessBuckets(samples) {
  const out = new Map();
  for (const s of samples.get(`${LATENESS}_bucket`) ?? []) {
    const queue = s.labels.queue;
    if (queue === undefined) continue;
    const le = s.labels.le === "+Inf" ? Infinity : Number(s.labels.le);
    if (!out.has(queue)) out.set(queue, []);
    out.get(queue).push({ le, count: s.value });
  }
  for (const buckets of out.values()) buckets.sort((a, b) => a.le - b.le);
  return out;
}

/**
 * The q-quantile of cumulative buckets, interpolated linearly inside the bucket that holds it
 * (as Prometheus' histogram_quantile does); null with no observations, Infinity when it falls
 * in the last, unbounded bucket.
 */
export function quantile(buckets, q) {
  if (!buckets || buckets.length === 0) return null;
  const total = buckets[buckets.length - 1].count;
  if (!(total > 0)) return null;
  const rank = q * total;
  let lower = 0, below = 0;
  for (const b of buckets) {
    if (b.count >= rank) {
      if (b.le === Infinity) return Infinity;
      const inside = b.count - below;
      return inside > 0 ? lower + (b.le - lower) * ((rank - below) / inside) : b.le;
    }
    lower = b.le;
    below = b.count;
  }
  return Infinity;
}

/** Per-bucket (not cumulative) counts: [{from, le, count}]. */
export function bucketCounts(buckets) {
  let lower = 0, below = 0;
  return (buckets ?? []).map((b) => {
    const out = { from: lower, le: b.le, count: b.count - below };
    lower = b.le;
    below = b.count;
    return out;
  });
}

/**
 * Rates of the delivered counters between scrapes: `next(samples)` returns a Map queue →
 * tasks per second since the previous scrape (null on the first; a queue is absent after a
 * counter reset).
 */
export class Rates {
  constructor() {
    this.previous = null;
  }

  next(samples, now = performance.now()) {
    const counters = byQueue(samples, DELIVERED);
    const previous = this.previous;
    this.previous = { at: now, counters };
    if (!previous) return null;
    const rates = new Map();
    const dt = (now - previous.at) / 1000;
    for (const [queue, value] of counters) {
      const before = previous.counters.get(queue) ?? 0;
      if (dt > 0 && value >= before) rates.set(queue, (value - before) / dt);
    }
    return rates;
  }
}
