// The queue view: running and waiting jobs with why they wait and when the scheduler expects
// them to start, filtered by user, state, node and name; the signed-in user's own jobs get
// cancel, hold and release buttons. At most ROWS rows are drawn (10 000 queued jobs would
// freeze the tab); the count says how many matched. A row is made again only when what it
// shows changed (else only its age is updated) and rows are moved, not rebuilt, when the order
// changes: a click never lands on a row being replaced.

import { ago, gpusOf, h, jobTitle, shortId } from "../dom.js";
import { filterJobs, stateOf, waitReason } from "../store.js";

export const ROWS = 500;

export class QueueView {
  constructor(root, store, { openJob, act, isMine }) {
    this.store = store;
    this.openJob = openJob;
    this.act = act;
    this.isMine = isMine;
    this.filter = { user: "", state: "", node: "", name: "" };
    this.count = h("p.summary");
    this.body = h("tbody");
    const input = (field, label) =>
      h("label", {}, label, h("input", {
        name: field, type: "search", placeholder: "any",
        oninput: (e) => { this.filter[field] = e.target.value.trim(); this.lastVersion = -1; },
      }));
    const states = h("select", {
      name: "state",
      onchange: (e) => { this.filter.state = e.target.value; this.lastVersion = -1; },
    }, ["", "running", "queued"].map((s) => h("option", { value: s }, s || "running and queued")));
    root.replaceChildren(h("section.view.queue", {},
      h("form.filters", { onsubmit: (e) => e.preventDefault() },
        input("user", "user "), h("label", {}, "state ", states), input("node", "node "), input("name", "name ")),
      this.count,
      h("table.jobs", {},
        h("thead", {}, h("tr", {}, ["job", "name", "user", "state", "GPUs", "node or reason", "expected start", "since", ""]
          .map((t) => h("th", { scope: "col" }, t)))),
        this.body)));
    this.lastVersion = -1;
    this.rows = new Map(); // job id -> {element, signature, since (its age cell)}
  }

  render(nowMs) {
    if (this.store.jobsVersion === this.lastVersion && nowMs - (this.drawnAt || 0) < 5000) return;
    this.lastVersion = this.store.jobsVersion;
    this.drawnAt = nowMs;
    const live = [...this.store.jobs.values()].filter((r) => ["running", "queued"].includes(stateOf(r)));
    const matched = filterJobs(live, this.filter).sort(queueOrder);
    const shown = matched.slice(0, ROWS);
    this.count.textContent = matched.length > ROWS
      ? `${matched.length} jobs match; the first ${ROWS} are shown: narrow the filter`
      : `${matched.length} jobs`;
    const rows = new Map();
    const elements = shown.map((record) => {
      const shows = this.shows(record);
      let row = this.rows.get(record.id);
      if (!row || row.signature !== shows.signature) row = this.row(record, shows);
      const age = shows.since ? ago(nowMs - Date.parse(shows.since)) : "";
      if (row.since.textContent !== age) row.since.textContent = age;
      rows.set(record.id, row);
      return row.element;
    });
    this.rows = rows;
    // Moved into place one by one: rows that stay where they were are not touched.
    elements.forEach((element, position) => {
      const there = this.body.children[position];
      if (there !== element) this.body.insertBefore(element, there || null);
    });
    while (this.body.children.length > elements.length) this.body.lastElementChild.remove();
  }

  /** What a job's row shows, but its age: the cells' texts, and their signature. */
  shows(record) {
    const state = stateOf(record);
    const placement = record.placement;
    const expected = this.store.expectedStarts.get(record.id);
    const cells = {
      state,
      label: state === "queued" && record.reason === "Held" ? "held" : state,
      title: jobTitle(record),
      gpus: gpusOf(record.spec),
      where: state === "running"
        ? [placement.node, ...(placement.peers || []).map((p) => p.node)].join(", ")
        : waitReason(record),
      expected: expected && state === "queued" ? new Date(expected).toLocaleString() : "",
      mine: this.isMine(record),
    };
    const since = state === "running" ? record.started_at || record.assigned_at : record.submitted_at;
    return { ...cells, since, signature: JSON.stringify([cells, record.user, since]) };
  }

  row(record, shows) {
    const since = h("td", {}, "");
    const element = h(`tr.${shows.state}`, { "data-job": record.id },
      h("td", {}, h("a", { href: `#job/${record.id}`, onclick: (e) => { e.preventDefault(); this.openJob(record.id); } }, shortId(record.id))),
      h("td.name", {}, shows.title),
      h("td", {}, record.user),
      h("td.state", {}, shows.label),
      h("td", {}, shows.gpus),
      h("td.where", {}, shows.where),
      h("td", {}, shows.expected),
      since,
      h("td.actions", {}, shows.mine ? actionButtons(record, this.act).filter(Boolean) : null));
    return { element, signature: shows.signature, since };
  }
}

/** Cancel, and hold or release, for a job of the signed-in user's. */
export function actionButtons(record, act) {
  const state = stateOf(record);
  const held = state === "queued" && record.reason === "Held";
  const button = (action, label) =>
    h("button", { type: "button", "data-action": action, onclick: () => act(record, action) }, label);
  return [
    button("cancel", "Cancel"),
    state === "queued" ? (held ? button("release", "Release") : button("hold", "Hold")) : null,
  ];
}

function queueOrder(a, b) {
  const rank = (r) => (stateOf(r) === "running" ? 0 : 1);
  // RFC 3339 times in UTC compare as strings; `localeCompare` would cost seconds on 10 000.
  const [x, y] = [String(a.submitted_at), String(b.submitted_at)];
  return rank(a) - rank(b) || (x < y ? -1 : x > y ? 1 : 0);
}
