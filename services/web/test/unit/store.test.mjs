import { test } from "node:test";
import assert from "node:assert/strict";
import {
  applyClusterKey, applyHeartbeat, applyJob, emptyStore, expectedStartsOf, filterJobs,
  isOffline, jobsByGpu, jobsLoaded, waitReason,
} from "../../src/store.js";

const running = (id, user, node, gpus, peers = []) => ({
  id, user, spec: { name: id, command: ["sleep"] }, submitted_at: "2026-11-28T08:00:00Z",
  state: "running", placement: { node, gpus: gpus.map((index) => ({ index })), peers },
});

test("every change bumps the version and the time of the last update", () => {
  const store = emptyStore();
  applyHeartbeat(store, { node: "n1", sent_at: "2026-11-28T08:00:00Z", gpus: [] }, 5);
  applyJob(store, "a", running("a", "alice", "n1", [0]), 7);
  assert.equal(store.version, 2);
  assert.equal(store.jobsVersion, 1, "a heartbeat is no change of the jobs");
  assert.equal(store.lastUpdateMs, 7);
  applyJob(store, "a", null, 9);
  assert.equal(store.jobs.size, 0);
  applyHeartbeat(store, { nonsense: true }, 11);
  assert.equal(store.version, 3, "what is not a heartbeat changes nothing");
});

test("records first read are kept quietly, then drawn at once", () => {
  const store = emptyStore();
  applyHeartbeat(store, { node: "n1", sent_at: "2026-11-28T08:00:00Z", gpus: [] }, 1);
  applyHeartbeat(store, { node: "n2", sent_at: "2026-11-28T08:00:00Z", gpus: [] }, 1);
  store.dirtyNodes.clear();
  applyJob(store, "a", running("a", "alice", "n1", [0]), 2, true);
  applyJob(store, "b", running("b", "bob", "n2", [0]), 3, true);
  assert.equal(store.jobs.size, 2);
  assert.equal(store.jobsVersion, 0, "no redraw while loading");
  assert.equal(store.dirtyNodes.size, 0);
  jobsLoaded(store, 4);
  assert.equal(store.jobsVersion, 1);
  assert.deepEqual([...store.dirtyNodes].sort(), ["n1", "n2"]);
  applyJob(store, "a", null, 5);
  assert.equal(store.jobsVersion, 2, "a change after the first reading is drawn");
});

test("a node is offline after three missed heartbeats", () => {
  const sent = Date.parse("2026-11-28T08:00:00Z");
  const beat = { sent_at: "2026-11-28T08:00:00Z", interval_ms: 2000 };
  assert.equal(isOffline(beat, sent + 6000), false);
  assert.equal(isOffline(beat, sent + 6001), true);
  assert.equal(isOffline({ sent_at: "garbage" }, sent), true);
});

test("the GPUs of a multi-node job are found on every node", () => {
  const store = emptyStore();
  applyJob(store, "a", running("a", "alice", "n1", [0, 1], [{ node: "n2", gpus: [{ index: 3 }] }]), 1);
  const byGpu = jobsByGpu(store);
  assert.deepEqual([...byGpu.keys()].sort(), ["n1/0", "n1/1", "n2/3"]);
});

test("node marks and the plan come from the cluster bucket", () => {
  const store = emptyStore();
  applyClusterKey(store, "node.n1", { drained: { by: "admin", at: "x" }, paused_gpus: {} }, 1);
  applyClusterKey(store, "plan", { computed_at: "x", jobs: { a: { at: "2026-11-28T09:00:00Z", nodes: [] } } }, 2);
  applyClusterKey(store, "usage", { whatever: 1 }, 3);
  assert.ok(store.nodeAdmin.get("n1").drained);
  assert.equal(store.expectedStarts.get("a"), "2026-11-28T09:00:00Z");
  assert.equal(store.version, 2, "keys the page does not show change nothing");
  applyClusterKey(store, "node.n1", null, 4);
  assert.equal(store.nodeAdmin.size, 0);
  assert.equal(expectedStartsOf(null).size, 0);
});

test("queue filters and wait reasons", () => {
  const queued = { id: "q", user: "bob", spec: { name: "sweep" }, state: "queued", reason: "Held" };
  const jobs = [running("a", "alice", "n1", [0]), queued];
  assert.deepEqual(filterJobs(jobs, { user: "bob" }).map((j) => j.id), ["q"]);
  assert.deepEqual(filterJobs(jobs, { state: "running" }).map((j) => j.id), ["a"]);
  assert.deepEqual(filterJobs(jobs, { node: "n1" }).map((j) => j.id), ["a"]);
  assert.deepEqual(filterJobs(jobs, { name: "swe" }).map((j) => j.id), ["q"]);
  assert.match(waitReason(queued), /^held/);
});
