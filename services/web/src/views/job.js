// One job: its record (state, owner, command, GPUs, where, usage), the owner's actions, and
// its output following live with ANSI colours, the last lines only (output.js keeps a bounded
// buffer; `mgpu logs` has the rest).

import { AnsiUp } from "ansi_up";
import { ago, gpusOf, h, jobTitle, mib, shortId } from "../dom.js";
import { followOutput } from "../feeds.js";
import { OutputLog } from "../output.js";
import { isFinished, stateOf, waitReason } from "../store.js";
import { actionButtons } from "./queue.js";

/** The output subject of a record (`subjects::output_of`). */
export function outputSubject(record) {
  return record.spec && record.spec.private_output && record.user_key
    ? `users.${record.user_key}.jobs.${record.id}.output`
    : `jobs.${record.id}.output`;
}

export class JobView {
  constructor(root, store, id, { conn, act, isMine, problem }) {
    this.store = store;
    this.id = id;
    this.conn = conn;
    this.act = act;
    this.isMine = isMine;
    this.problem = problem;
    this.log = new OutputLog();
    this.ansi = new AnsiUp();
    this.ansi.use_classes = true;
    this.details = h("dl.record");
    this.actions = h("div.actions");
    this.dropped = h("p.dropped", { hidden: true });
    this.lines = h("pre.output", { "aria-live": "off", tabindex: "0" });
    this.pending = [];
    root.replaceChildren(h("section.view.job", {},
      h("h2", {}, "job ", h("code", {}, shortId(id))),
      this.details, this.actions,
      h("h3", {}, "output"), this.dropped, this.lines));
    this.stopOutput = null;
    this.lastVersion = -1;
  }

  render(nowMs) {
    const record = this.store.jobs.get(this.id);
    if (record && !this.stopOutput) this.startOutput(record);
    if (this.store.jobsVersion !== this.lastVersion) {
      this.lastVersion = this.store.jobsVersion;
      this.showRecord(record, nowMs);
    }
    this.flushLines();
  }

  startOutput(record) {
    this.stopOutput = true; // started below, once
    followOutput(this.conn, outputSubject(record), (header, payload) => {
      this.pending.push(...this.log.accept(header, payload));
    }, this.problem).then((stop) => { this.stopOutput = stop; });
  }

  /** Appends the lines that arrived since the last frame, trimming the oldest. */
  flushLines() {
    if (!this.pending.length) return;
    const stick = this.lines.scrollHeight - this.lines.scrollTop - this.lines.clientHeight < 40;
    const fragment = document.createDocumentFragment();
    for (const line of this.pending.splice(0)) {
      const element = document.createElement("div");
      element.className = line.stream === "stderr" ? "line stderr" : "line";
      element.innerHTML = this.ansi.ansi_to_html(line.text) || "\u200b";
      fragment.append(element);
    }
    this.lines.append(fragment);
    const extra = this.lines.childElementCount - this.log.maxLines;
    for (let i = 0; i < extra; i++) this.lines.firstElementChild.remove();
    const hidden = this.log.dropped + Math.max(0, this.log.lines.length - this.lines.childElementCount);
    if (extra > 0 || hidden > 0) {
      this.dropped.hidden = false;
      this.dropped.textContent =
        `earlier output is not shown here (only the last ${this.log.maxLines} lines are kept): mgpu logs ${shortId(this.id)}`;
    }
    if (stick) this.lines.scrollTop = this.lines.scrollHeight;
  }

  showRecord(record, nowMs) {
    if (!record) {
      this.details.replaceChildren(h("dd", {}, "no such job in the live bucket (finished jobs move to history: mgpu history)"));
      this.actions.replaceChildren();
      return;
    }
    const state = stateOf(record);
    const placement = record.placement;
    const usage = record.usage;
    const rows = [
      ["state", state === "queued" ? `queued: ${waitReason(record)}` : state + exitText(record)],
      ["name", jobTitle(record)],
      ["user", record.user],
      ["GPUs", gpusOf(record.spec)],
      ["attempt", String(record.attempt)],
      ["submitted", `${new Date(record.submitted_at).toLocaleString()} (${ago(nowMs - Date.parse(record.submitted_at))} ago)`],
      placement ? ["on", [placement.node, ...(placement.peers || []).map((p) => p.node)].join(", ") +
        ` GPUs ${(placement.gpus || []).map((g) => g.index).join(", ")}`] : null,
      record.started_at ? ["started", new Date(record.started_at).toLocaleString()] : null,
      usage ? ["used", usageText(usage)] : null,
      record.reason && state !== "queued" ? ["why", record.reason] : null,
    ].filter(Boolean);
    this.details.replaceChildren(...rows.flatMap(([term, value]) => [h("dt", {}, term), h("dd", { "data-field": term }, value)]));
    const buttons = this.isMine(record) && !isFinished(record) ? actionButtons(record, this.act) : [];
    this.actions.replaceChildren(...buttons.filter(Boolean));
  }

  close() {
    if (typeof this.stopOutput === "function") this.stopOutput();
  }
}

/** What an attempt used, as `mgpu show` words it. */
function usageText(usage) {
  const parts = [];
  if (usage.peak_mem_host_bytes) parts.push(`peak memory ${mib(Math.round(usage.peak_mem_host_bytes / 1048576))}`);
  if (usage.cpu_time_ms) parts.push(`CPU time ${ago(usage.cpu_time_ms)}`);
  for (const gpu of usage.gpu_peak_mem || []) parts.push(`GPU ${gpu.index} peak ${mib(gpu.peak_mib)}`);
  if (usage.idle_gpu_secs) parts.push(`GPUs idle ${ago(usage.idle_gpu_secs * 1000)}`);
  return parts.join(", ");
}

function exitText(record) {
  const code = record.exit_code;
  return code !== undefined && code !== null ? ` (exit ${code})` : "";
}
