import { test } from "node:test";
import assert from "node:assert/strict";
import { daysBetween, gpusByNode, usageOf } from "../../src/usage.js";

const finished = (id, user, start, end, placement) => ({
  id, user, state: "succeeded", started_at: start, ended_at: end, placement,
});

test("GPU-hours are GPUs times run time, split by node, user and day", () => {
  const gang = { node: "n1", gpus: [{ index: 0, amount: 1 }, { index: 1, amount: 1 }],
    peers: [{ node: "n2", gpus: [{ index: 0, amount: 1 }] }] };
  const half = { node: "n2", gpus: [{ index: 1, amount: 0.5 }] };
  const records = [
    finished("a", "alice", "2026-11-27T10:00:00Z", "2026-11-27T12:00:00Z", gang),
    finished("b", "bob", "2026-11-28T00:00:00Z", "2026-11-28T04:00:00Z", half),
    finished("c", "bob", undefined, "2026-11-28T05:00:00Z", null), // never started
    finished("a", "alice", "2026-11-27T10:00:00Z", "2026-11-27T12:00:00Z", gang), // seen twice
  ];
  const usage = usageOf(records, Date.parse("2026-11-27T00:00:00Z"), Date.parse("2026-11-29T00:00:00Z"));
  assert.equal(usage.jobs, 3);
  assert.equal(usage.byUser.get("alice"), 6);
  assert.equal(usage.byUser.get("bob"), 2);
  assert.equal(usage.byNode.get("n1"), 4);
  assert.equal(usage.byNode.get("n2"), 4);
  assert.equal(usage.byDay.get("2026-11-27"), 6);
  assert.equal(usage.byDay.get("2026-11-28"), 2);
});

test("jobs outside the range are left out", () => {
  const one = finished("a", "alice", "2026-11-01T00:00:00Z", "2026-11-01T01:00:00Z", { node: "n1", gpus: [{ amount: 1 }] });
  const usage = usageOf([one], Date.parse("2026-11-02T00:00:00Z"), Date.parse("2026-11-03T00:00:00Z"));
  assert.equal(usage.jobs, 0);
});

test("multi-node GPUs are summed per node", () => {
  const byNode = gpusByNode({ node: "a", gpus: [{ amount: 1 }], peers: [{ node: "a", gpus: [{ amount: 2 }] }] });
  assert.equal(byNode.get("a"), 3);
});

test("every day of a range is listed", () => {
  assert.deepEqual(daysBetween(Date.parse("2026-11-27T15:00:00Z"), Date.parse("2026-11-29T01:00:00Z")),
    ["2026-11-27", "2026-11-28", "2026-11-29"]);
});
