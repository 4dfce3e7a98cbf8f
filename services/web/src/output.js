// A job's output as the page shows it: chunks from `jobs.<id>.output` put in order per rank by
// their `Mgpu-Seq` (a chunk sent again is dropped), cut into lines, and only the last
// MAX_LINES kept, so a job printing without end never grows the tab: the rest is one
// `mgpu logs` away. Pure; views/job.js draws what it returns.

export const MAX_LINES = 5000;
/** A line longer than this is cut (a progress bar without newlines, a binary dump). */
export const MAX_LINE_CHARS = 4000;

export class OutputLog {
  constructor({ maxLines = MAX_LINES } = {}) {
    this.maxLines = maxLines;
    this.lines = []; // {text, stream, rank}
    this.dropped = 0; // lines no longer kept
    this.ranks = new Map(); // "attempt/rank" -> {next, pending: Map(seq -> chunk), partial: {stdout, stderr}, decoders}
    this.ended = new Map(); // attempt -> exit code of rank 0's eof, as text
    this.attempt = 0;
  }

  /**
   * A message of the output stream: its headers (a get(name) function) and payload bytes.
   * Returns the lines it completed, in order (also kept in this.lines).
   */
  accept(header, payload) {
    const kind = header("Mgpu-Stream") || "stdout";
    const seq = Number(header("Mgpu-Seq") || "0");
    const rank = Number(header("Mgpu-Rank") || "0");
    const attempt = Number(header("Mgpu-Attempt") || "1");
    if (attempt > this.attempt) this.attempt = attempt;
    const key = `${attempt}/${rank}`;
    let state = this.ranks.get(key);
    if (!state) {
      state = { next: 1, pending: new Map(), partial: { stdout: "", stderr: "" }, decoders: {} };
      this.ranks.set(key, state);
    }
    if (seq < state.next || state.pending.has(seq)) return []; // sent again
    state.pending.set(seq, { kind, payload, exit: header("Mgpu-Exit-Code") });
    const completed = [];
    while (state.pending.has(state.next)) {
      const chunk = state.pending.get(state.next);
      state.pending.delete(state.next);
      state.next += 1;
      completed.push(...this.take(state, chunk, rank, attempt));
    }
    // Numbering with gaps (an agent restarted mid-attempt): don't wait forever on a hole.
    if (seq === 0 || state.pending.size > 256) {
      const seqs = [...state.pending.keys()].sort((a, b) => a - b);
      for (const s of seqs) {
        const chunk = state.pending.get(s);
        state.pending.delete(s);
        state.next = s + 1;
        completed.push(...this.take(state, chunk, rank, attempt));
      }
    }
    return completed;
  }

  take(state, chunk, rank, attempt) {
    if (chunk.kind === "eof") {
      const lines = [];
      for (const stream of ["stdout", "stderr"]) {
        if (state.partial[stream]) {
          lines.push(this.keep(state.partial[stream], stream, rank));
          state.partial[stream] = "";
        }
      }
      if (rank === 0) this.ended.set(attempt, chunk.exit ?? "");
      return lines;
    }
    const stream = chunk.kind === "stderr" ? "stderr" : "stdout";
    if (!state.decoders[stream]) state.decoders[stream] = new TextDecoder("utf-8");
    const text = state.partial[stream] + state.decoders[stream].decode(chunk.payload, { stream: true });
    const pieces = text.split("\n");
    state.partial[stream] = pieces.pop();
    if (state.partial[stream].length > MAX_LINE_CHARS) {
      pieces.push(state.partial[stream]);
      state.partial[stream] = "";
    }
    return pieces.map((line) => this.keep(line, stream, rank));
  }

  keep(text, stream, rank) {
    const line = {
      text: text.length > MAX_LINE_CHARS ? `${text.slice(0, MAX_LINE_CHARS)} …` : text,
      stream,
      rank,
    };
    this.lines.push(line);
    if (this.lines.length > this.maxLines * 1.25) {
      const extra = this.lines.length - this.maxLines;
      this.lines.splice(0, extra);
      this.dropped += extra;
    }
    return line;
  }

  /** Whether rank 0 of the latest attempt has ended (its eof arrived). */
  finished() {
    return this.ended.has(this.attempt);
  }
}
