// Building the page from data without ever parsing it as HTML: every text goes into a text
// node or a property, never into innerHTML.

/** An element: `attrs` are properties (`class`, `onclick` listeners, `dataset`, others). */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs ?? {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") el.className = value;
    else if (key === "dataset") Object.assign(el.dataset, value);
    else if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else if (key in el) el[key] = value;
    else el.setAttribute(key, String(value));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

/** A table from header cells and rows of cells (each a node, text, or `{num: value}`). */
export function table(headers, rows, attrs = {}) {
  const cell = (tag, c) => {
    if (c && typeof c === "object" && !(c instanceof Node) && "num" in c) {
      return h(tag, { class: "num" }, c.num);
    }
    return h(tag, {}, c);
  };
  return h("table", attrs,
    h("thead", {}, h("tr", {}, headers.map((c) => cell("th", c)))),
    h("tbody", {}, rows));
}

/** A `<tr>` with cells as in `table`. */
export function row(attrs, cells) {
  return h("tr", attrs, cells.map((c) => {
    if (c && typeof c === "object" && !(c instanceof Node) && "num" in c) {
      return h("td", { class: "num" }, c.num);
    }
    return h("td", {}, c);
  }));
}

/** Unix milliseconds as a UTC time, to the second. */
export function time(ms) {
  if (ms === undefined || ms === null) return "—";
  return new Date(ms).toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC");
}

export function count(n) {
  return n === undefined || n === null ? "—" : Number(n).toLocaleString("en-US");
}

/** Seconds as a short duration (`850 ms`, `2.5 s`). */
export function seconds(s) {
  if (s === null || s === undefined || Number.isNaN(s)) return "—";
  if (s === Infinity) return "> 5 min";
  if (s < 1) return `${(s * 1000).toFixed(s < 0.01 ? 1 : 0)} ms`;
  return `${s.toFixed(s < 10 ? 2 : 0)} s`;
}

/** Milliseconds in their two largest units, as the CLI shows them: `250ms`, `1.5s`, `1m`,
 * `4m 10s`, `2h 5m`, `3d 4h`. */
export function duration(ms) {
  if (ms === undefined || ms === null) return "—";
  if (ms < 1000) return `${ms}ms`;
  if (ms < 60000) {
    const tenths = Math.floor((ms % 1000) / 100);
    const whole = Math.floor(ms / 1000);
    return tenths === 0 || ms >= 10000 ? `${whole}s` : `${whole}.${tenths}s`;
  }
  const units = [[86400000, "d"], [3600000, "h"], [60000, "m"], [1000, "s"]];
  const first = units.findIndex(([size]) => ms >= size);
  const [big, bigName] = units[first];
  const [small, smallName] = units[Math.min(first + 1, units.length - 1)];
  const rest = Math.floor((ms % big) / small);
  const head = `${Math.floor(ms / big)}${bigName}`;
  return rest === 0 ? head : `${head} ${rest}${smallName}`;
}

/** How far an instant is from now, in `duration`'s words: `in 4m 10s`, `2h 5m ago`, `now`. */
export function relative(ms, now = Date.now()) {
  if (ms === undefined || ms === null) return "—";
  const d = ms - now;
  if (Math.abs(d) < 1000) return "now";
  return d > 0 ? `in ${duration(d)}` : `${duration(-d)} ago`;
}

/** Unix milliseconds as a UTC time and how far from now: `2026-01-01 10:00:00 UTC (in 1h)`. */
export function when(ms) {
  if (ms === undefined || ms === null) return "—";
  return `${time(ms)} (${relative(ms)})`;
}

/** A per-second rate. */
export function rate(r) {
  if (r === null || r === undefined) return "—";
  return r < 10 ? r.toFixed(2) : r.toFixed(0);
}

/** Pretty JSON of a server value, as text. */
export function pretty(value) {
  return JSON.stringify(value, null, 2);
}

/** A link to a hash route. */
export function link(href, text) {
  return h("a", { href }, text);
}
