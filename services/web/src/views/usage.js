// The usage view: GPU-hours by user, by node and by day over the last 7, 30 or 90 days, as
// bar charts, from the same records as `mgpu report`: finished jobs still in the live bucket
// and those in MGPU_HISTORY (everyone's for an admin, the signed-in user's own otherwise; the
// server decides which, and says so to a viewer, who has none).

import { h } from "../dom.js";
import { readHistory } from "../feeds.js";
import { isFinished } from "../store.js";
import { daysBetween, usageOf } from "../usage.js";

const RANGES = [7, 30, 90];
const BARS = 20;

export class UsageView {
  constructor(root, store, { conn }) {
    this.store = store;
    this.conn = conn;
    this.days = 30;
    this.history = new Map(); // id -> record read from MGPU_HISTORY
    this.note = h("p.summary", {}, "reading history…");
    this.charts = h("div.charts");
    const range = h("select", {
      name: "range",
      onchange: (e) => { this.days = Number(e.target.value); this.load(); },
    }, RANGES.map((d) => h("option", { value: d, selected: d === this.days }, `last ${d} days`)));
    root.replaceChildren(h("section.view.usage", {},
      h("form.filters", { onsubmit: (e) => e.preventDefault() }, h("label", {}, "range ", range)),
      this.note, this.charts));
    this.load();
  }

  /** Reads the history of the range: everyone's where the server allows it, else one's own. */
  async load() {
    const since = Date.now() - this.days * 86_400_000;
    const sinceIso = new Date(since).toISOString();
    const key = this.conn.publicKey;
    this.history.clear();
    this.scope = null;
    const keep = (record) => this.history.set(record.id, record);
    for (const [filter, scope] of [["history.>", "everyone's"], [`history.${key}.>`, "your own"]]) {
      try {
        await readHistory(this.conn, filter, sinceIso, keep);
        this.scope = scope;
        break;
      } catch (error) {
        this.refusal = String(error.message || error);
      }
    }
    this.drawnVersion = -1;
    this.render(Date.now());
  }

  render(nowMs) {
    if (this.drawnVersion === this.store.jobsVersion && this.drawnDays === this.days) return;
    this.drawnVersion = this.store.jobsVersion;
    this.drawnDays = this.days;
    const since = nowMs - this.days * 86_400_000;
    const live = [...this.store.jobs.values()].filter(isFinished);
    const usage = usageOf([...live, ...this.history.values()], since, nowMs);
    const total = [...usage.byUser.values()].reduce((a, b) => a + b, 0);
    this.note.textContent = this.scope
      ? `${usage.jobs} finished jobs, ${hours(total)} GPU-hours (history: ${this.scope}, and the finished jobs everyone may see)`
      : `the server gives this principal no history (${this.refusal || "refused"}); only the finished jobs still in the live bucket are counted: ${usage.jobs} jobs, ${hours(total)} GPU-hours`;
    const byDay = new Map(daysBetween(since, nowMs).map((day) => [day, usage.byDay.get(day) || 0]));
    this.charts.replaceChildren(
      chart("GPU-hours by user", top(usage.byUser), "by-user"),
      chart("GPU-hours by node", top(usage.byNode), "by-node"),
      chart("GPU-hours by day (UTC)", [...byDay], "by-day"),
    );
  }
}

/** GPU-hours with the decimals that make a short job visible. */
export function hours(value) {
  if (value === 0) return "0";
  if (value >= 10) return value.toFixed(1);
  if (value >= 0.01) return value.toFixed(2);
  return value.toPrecision(2);
}

/** The largest BARS entries of a map, largest first. */
function top(map) {
  return [...map].sort((a, b) => b[1] - a[1]).slice(0, BARS);
}

/** A horizontal bar chart (SVG), one bar per [label, value], with the values written. */
function chart(title, entries, id) {
  const svgNs = "http://www.w3.org/2000/svg";
  const row = 18;
  const width = 520;
  const labelWidth = 120;
  const max = Math.max(...entries.map(([, v]) => v), 1e-9);
  const svg = document.createElementNS(svgNs, "svg");
  svg.setAttribute("viewBox", `0 0 ${width} ${Math.max(1, entries.length) * row}`);
  svg.setAttribute("width", String(width));
  svg.setAttribute("role", "img");
  svg.setAttribute("aria-label", title);
  entries.forEach(([label, value], i) => {
    const add = (tag, attributes, text) => {
      const element = document.createElementNS(svgNs, tag);
      for (const [name, v] of Object.entries(attributes)) element.setAttribute(name, String(v));
      if (text !== undefined) element.textContent = text;
      svg.append(element);
    };
    const y = i * row;
    add("text", { x: 0, y: y + 13, class: "chart-label" }, String(label).slice(0, 18));
    add("rect", { x: labelWidth, y: y + 3, height: row - 6, width: ((width - labelWidth - 70) * value) / max, class: "chart-bar" });
    add("text", { x: width - 65, y: y + 13, class: "chart-value" }, hours(value));
  });
  return h("figure.chart", { "data-chart": id }, h("figcaption", {}, title),
    entries.length ? svg : h("p.summary", {}, "nothing in this range"));
}
