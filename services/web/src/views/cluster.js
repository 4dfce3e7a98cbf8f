// The cluster view: every node a card, every GPU a tile showing its type, utilisation,
// memory, temperature and the jobs on it; offline, drained and paused shown in words and
// patterns as well as colours (a blue-to-orange scale readable with any colour vision).
// Redraws only the nodes that changed (the store marks them), and every node once a second,
// so 1 000 nodes × 8 GPUs stay fluid.

import { h, mib, shortId } from "../dom.js";
import { isOffline, jobsByGpu } from "../store.js";

export class ClusterView {
  constructor(root, store, { openJob }) {
    this.root = root;
    this.store = store;
    this.openJob = openJob;
    this.cards = new Map(); // node -> {element, signature}
    this.grid = h("div.cluster-grid", { role: "list", "aria-label": "nodes" });
    this.summary = h("p.summary");
    root.replaceChildren(h("section.view.cluster", {}, this.summary, this.grid));
  }

  /** Draws the nodes that changed; every node once a second (offline is a matter of time)
   * and when nodes came or went. */
  render(nowMs) {
    if (this.jobsDrawn !== this.store.jobsVersion) {
      this.byGpu = jobsByGpu(this.store);
      this.jobsDrawn = this.store.jobsVersion;
    }
    // Nodes that came or went make the order change: a full render, but at most five a
    // second while a thousand heartbeats arrive at sign-in.
    const sinceFull = nowMs - (this.fullAt || 0);
    const full = !(sinceFull < 1000) || (this.store.nodes.size !== this.cards.size && sinceFull >= 200);
    if (!full) {
      // A node without a card yet waits for the full render (it has to find its place).
      for (const name of this.store.dirtyNodes) {
        if (this.cards.has(name)) this.draw(name, this.cards.get(name), nowMs);
      }
      this.store.dirtyNodes.clear();
      return;
    }
    this.fullAt = nowMs;
    this.store.dirtyNodes.clear();
    this.renderAll(nowMs);
  }

  /** Redraws node `name`'s card in place if what it shows changed; its card. */
  draw(name, card, nowMs) {
    const heartbeat = this.store.nodes.get(name);
    if (!heartbeat) return card;
    const admin = this.store.nodeAdmin.get(name);
    const down = isOffline(heartbeat, nowMs);
    const tiles = (heartbeat.gpus || []).map((gpu) => ({ gpu, jobs: this.byGpu.get(`${name}/${gpu.index}`) || [] }));
    const signature = JSON.stringify([down, admin, tiles.map(tileSignature)]);
    if (card && card.signature === signature) return card;
    const element = this.card(name, heartbeat, admin, down, tiles);
    if (card) card.element.replaceWith(element);
    const drawn = { element, signature, down, tiles };
    this.cards.set(name, drawn);
    return drawn;
  }

  renderAll(nowMs) {
    // The store only ever adds nodes, so a count that did not change is an order that did not.
    if (!this.names || this.names.length !== this.store.nodes.size) {
      this.names = [...this.store.nodes.keys()].sort(naturalOrder);
    }
    const names = this.names;
    let gpus = 0;
    let busy = 0;
    let offline = 0;
    const seen = new Set();
    names.forEach((name, position) => {
      seen.add(name);
      const card = this.draw(name, this.cards.get(name), nowMs);
      if (card.down) offline += 1;
      for (const { jobs } of card.tiles) {
        gpus += 1;
        if (jobs.length) busy += 1;
      }
      if (this.grid.children[position] !== card.element) {
        this.grid.insertBefore(card.element, this.grid.children[position] || null);
      }
    });
    for (const [name, card] of this.cards) {
      if (!seen.has(name)) {
        card.element.remove();
        this.cards.delete(name);
      }
    }
    this.summary.textContent =
      `${names.length} nodes (${offline} offline), ${gpus} GPUs, ${busy} of them running mgpu jobs`;
  }

  card(name, heartbeat, admin, down, tiles) {
    const marks = [];
    if (down) marks.push("offline");
    if (admin && admin.drained) marks.push("drained");
    const paused = new Set(Object.keys((admin && admin.paused_gpus) || {}).map(Number));
    const state = marks.join(" ") || "online";
    return h(
      "article.node",
      { role: "listitem", "data-node": name, "data-state": state, title: heartbeat.gpu_note || "" },
      h("header", {}, h("span.node-name", {}, name), h("span.node-state", {}, state)),
      h("div.gpus", {}, tiles.map(({ gpu, jobs }) => this.tile(name, gpu, jobs, paused.has(gpu.index)))),
    );
  }

  tile(node, gpu, jobs, paused) {
    const util = Math.min(100, gpu.utilization_pct || 0);
    const memory = gpu.memory_total_mib ? (100 * gpu.memory_used_mib) / gpu.memory_total_mib : 0;
    const foreign = (gpu.foreign_processes || []).length > 0;
    const classes = ["tile", `util-${Math.min(9, Math.floor(util / 10))}`];
    if (paused) classes.push("paused");
    if (foreign) classes.push("foreign");
    if (jobs.length) classes.push("busy");
    const who = jobs.map((job) =>
      h("a.job", { href: `#job/${job.id}`, onclick: (e) => this.follow(e, job.id) }, `${job.user} ${shortId(job.id)}`),
    );
    return h(
      `div.${classes.join(".")}`,
      {
        "data-gpu": `${node}/${gpu.index}`,
        title: `${node} GPU ${gpu.index}: ${gpu.name}, ${util}% busy, ${mib(gpu.memory_used_mib)} of ${mib(gpu.memory_total_mib)}` +
          (foreign ? ", used outside mgpu" : "") + (paused ? ", paused" : ""),
      },
      h("div.tile-head", {}, h("b", {}, String(gpu.index)), " ", gpu.gpu_type || shortType(gpu.name)),
      h("div.bar.util", { style: `--fill:${util}%`, "aria-label": `utilisation ${util}%` }),
      h("div.bar.mem", { style: `--fill:${memory.toFixed(0)}%`, "aria-label": `memory ${memory.toFixed(0)}%` }),
      h("div.tile-foot", {}, `${util}%`, gpu.temperature_c !== undefined && gpu.temperature_c !== null ? ` ${gpu.temperature_c}°C` : "",
        paused ? " paused" : "", foreign ? " foreign" : ""),
      who.length ? h("div.tile-jobs", {}, who) : null,
    );
  }

  follow(event, id) {
    event.preventDefault();
    this.openJob(id);
  }
}

function tileSignature({ gpu, jobs }) {
  return [
    gpu.index, gpu.utilization_pct, gpu.memory_used_mib, gpu.temperature_c,
    (gpu.foreign_processes || []).length, jobs.map((j) => j.id),
  ];
}

/** "NVIDIA H100 80GB HBM3" -> "H100". */
function shortType(name) {
  const word = String(name || "").replace(/^NVIDIA\s+/, "").split(/\s+/)[0];
  return word || "GPU";
}

/** node2 before node10 (a collator: `localeCompare` builds one on every call). */
const NATURAL = new Intl.Collator(undefined, { numeric: true });
export function naturalOrder(a, b) {
  return NATURAL.compare(a, b);
}
