import { test } from "node:test";
import assert from "node:assert/strict";
import { OutputLog } from "../../src/output.js";

const enc = new TextEncoder();
function message(seq, text, { stream = "stdout", rank = 0, attempt = 1, exit } = {}) {
  const headers = {
    "Mgpu-Stream": stream,
    "Mgpu-Seq": String(seq),
    "Mgpu-Rank": String(rank),
    "Mgpu-Attempt": String(attempt),
  };
  if (exit !== undefined) headers["Mgpu-Exit-Code"] = String(exit);
  return [(name) => headers[name], enc.encode(text)];
}

test("chunks are put in order by their sequence and repeats dropped", () => {
  const log = new OutputLog();
  log.accept(...message(2, "two\n"));
  assert.deepEqual(log.lines, [], "waits for chunk 1");
  log.accept(...message(1, "one\n"));
  log.accept(...message(2, "two\n"));
  log.accept(...message(3, "thr"));
  log.accept(...message(4, "ee\n"));
  assert.deepEqual(log.lines.map((l) => l.text), ["one", "two", "three"]);
});

test("a partial last line is kept until the end of the attempt", () => {
  const log = new OutputLog();
  log.accept(...message(1, "no newline"));
  assert.equal(log.lines.length, 0);
  assert.equal(log.finished(), false);
  log.accept(...message(2, "", { stream: "eof", exit: 0 }));
  assert.deepEqual(log.lines.map((l) => l.text), ["no newline"]);
  assert.equal(log.finished(), true);
});

test("only the last lines are kept, and the dropped ones counted", () => {
  const log = new OutputLog({ maxLines: 100 });
  for (let i = 1; i <= 1000; i++) log.accept(...message(i, `line ${i}\n`));
  assert.ok(log.lines.length <= 125);
  assert.equal(log.lines.at(-1).text, "line 1000");
  assert.equal(log.dropped + log.lines.length, 1000);
});

test("a multi-byte character split across chunks is decoded whole", () => {
  const log = new OutputLog();
  const bytes = enc.encode("é\n");
  log.accept((n) => ({ "Mgpu-Seq": "1" })[n], bytes.slice(0, 1));
  log.accept((n) => ({ "Mgpu-Seq": "2" })[n], bytes.slice(1));
  assert.deepEqual(log.lines.map((l) => l.text), ["é"]);
});
