// What the page knows of the cluster: the last heartbeat of every node, every job record,
// the administrators' marks on nodes, and when anything last arrived. Plain data changed by
// pure functions (apply*), so the views and the unit tests see the same rules; feeds.js fills
// it from the bus.

/** An empty store. */
export function emptyStore() {
  return {
    nodes: new Map(), // name -> NodeHeartbeat JSON
    jobs: new Map(), // job id -> JobRecord JSON
    nodeAdmin: new Map(), // name -> NodeAdmin JSON from the cluster bucket
    expectedStarts: new Map(), // job id -> ISO time, where the scheduler published one
    lastUpdateMs: null, // when anything last arrived (the page's clock)
    version: 0, // bumped on every change, so a view redraws only when needed
    jobsVersion: 0, // bumped when a job record or the plan changed (not on heartbeats)
    dirtyNodes: new Set(), // nodes changed since the cluster view last drew them
  };
}

function touched(store, nowMs) {
  store.lastUpdateMs = nowMs;
  store.version += 1;
}

/** A heartbeat arrived. */
export function applyHeartbeat(store, heartbeat, nowMs) {
  if (!heartbeat || typeof heartbeat.node !== "string") return;
  store.nodes.set(heartbeat.node, heartbeat);
  store.dirtyNodes.add(heartbeat.node);
  touched(store, nowMs);
}

/** A job record was written (`record`), or deleted or purged (`record` null). While the
 * bucket's first reading is still under way (`loading`), the record is only kept: nothing is
 * redrawn for it until `jobsLoaded`, so ten thousand records cost one redraw, not one for
 * every node each of them lands on. */
export function applyJob(store, id, record, nowMs, loading = false) {
  if (loading) {
    if (record) store.jobs.set(id, record);
    else store.jobs.delete(id);
    store.lastUpdateMs = nowMs;
    return;
  }
  for (const placed of [store.jobs.get(id), record]) {
    for (const share of placementShares(placed && placed.placement)) store.dirtyNodes.add(share.node);
  }
  if (record) store.jobs.set(id, record);
  else store.jobs.delete(id);
  store.jobsVersion += 1;
  touched(store, nowMs);
}

/** The jobs bucket's first reading is done: every node is drawn again with its jobs. */
export function jobsLoaded(store, nowMs) {
  for (const name of store.nodes.keys()) store.dirtyNodes.add(name);
  store.jobsVersion += 1;
  touched(store, nowMs);
}

/** A key of the cluster bucket changed: node marks (`node.<name>`) and expected starts. */
export function applyClusterKey(store, key, value, nowMs) {
  if (key.startsWith("node.")) {
    const name = key.slice("node.".length);
    store.dirtyNodes.add(name);
    if (value) store.nodeAdmin.set(name, value);
    else store.nodeAdmin.delete(name);
  } else if (key === "plan") {
    store.expectedStarts = expectedStartsOf(value);
    store.jobsVersion += 1;
  } else {
    return;
  }
  touched(store, nowMs);
}

/** Job id -> expected start (ISO time) from the plan the scheduler publishes under the
 * cluster bucket's key `plan` (`PlanSnapshot`: {"computed_at", "jobs": {id: {"at", …}}}). */
export function expectedStartsOf(plan) {
  const starts = new Map();
  for (const [id, expected] of Object.entries((plan && plan.jobs) || {})) {
    if (expected && typeof expected.at === "string") starts.set(id, expected.at);
  }
  return starts;
}

/** A node counts as offline after this many missed heartbeats, as `mgpu nodes` shows it. */
export const MISSED_BEATS_OFFLINE = 3;

/** Whether a node's last heartbeat is too old to believe (its age over three intervals). */
export function isOffline(heartbeat, nowMs) {
  const sent = Date.parse(heartbeat.sent_at);
  if (Number.isNaN(sent)) return true;
  const interval = heartbeat.interval_ms || 2000;
  return nowMs - sent > MISSED_BEATS_OFFLINE * interval;
}

/** The state name of a record ("queued", "running", "succeeded", …): a record carries its
 * state's name under `state` and the state's fields (placement, reason, …) beside it. */
export function stateOf(record) {
  return (record && typeof record.state === "string" && record.state) || "unknown";
}

export function isFinished(record) {
  return !["queued", "running", "unknown"].includes(stateOf(record));
}

/** Which job runs on each GPU: "node/index" -> [record, …] (shared GPUs list several). */
export function jobsByGpu(store) {
  const byGpu = new Map();
  for (const record of store.jobs.values()) {
    if (stateOf(record) !== "running") continue;
    const placement = record.placement;
    for (const share of placementShares(placement)) {
      const key = `${share.node}/${share.index}`;
      if (!byGpu.has(key)) byGpu.set(key, []);
      byGpu.get(key).push(record);
    }
  }
  return byGpu;
}

/** Every (node, GPU index) a placement holds, its peers' too (multi-node jobs). */
function placementShares(placement) {
  if (!placement) return [];
  const shares = (placement.gpus || []).map((g) => ({ node: placement.node, index: g.index }));
  for (const peer of placement.peers || []) {
    for (const g of peer.gpus || []) shares.push({ node: peer.node, index: g.index });
  }
  return shares;
}

/** Why a queued job waits, in the words `mgpu queue` uses (`WaitReason::describe`). */
const WAIT_REASONS = {
  Submitted: "waiting for the scheduler to look at it",
  Resources: "waiting for GPUs to become free",
  NoNodes: "waiting for a node to come online",
  Priority: "waiting behind a higher-priority job's reservation",
  Dependency: "waiting for the jobs it depends on",
  Held: "held: release lets it run",
  GpusPaused: "waiting: the GPUs it could use are paused or drained",
  GpusBusy: "waiting: the GPUs it could use are busy with work outside mgpu",
  ArrayLimit: "waiting: its array runs as many tasks as allowed",
  UserLimit: "waiting: its owner runs as many GPUs as their max_gpus_running limit allows",
  Fencing: "waiting until its lost node has surely stopped the previous attempt",
  PreferredType: "waiting a while for a GPU of a type it prefers, expected free soon",
  ReservationWindow: "waiting for its reservation's window to open",
  Reserved: "waiting: the GPUs it could use are booked by a reservation",
};

export function waitReason(record) {
  const reason = record.reason;
  if (!reason) return "";
  return WAIT_REASONS[reason] || String(reason);
}

/** Jobs matching a filter {user, state, node, name} (empty fields match everything). */
export function filterJobs(records, filter) {
  const wanted = (value, field) => !value || String(field || "").includes(value);
  return records.filter((record) => {
    const placement = record.placement;
    return (
      wanted(filter.user, record.user) &&
      (!filter.state || stateOf(record) === filter.state) &&
      wanted(filter.node, placement && placement.node) &&
      wanted(filter.name, record.spec && (record.spec.name || record.spec.command?.join(" ")))
    );
  });
}
