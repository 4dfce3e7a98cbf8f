// GPU-hours of finished jobs, summed by user, by node and by day, by the rules of
// `mgpu report` (services/cli/src/model/accounting.rs): a job's GPU-seconds are its GPUs (on
// every node it held) times the time from its start to its end; by node, each node counts the
// GPUs it held; by day, the day (UTC) the job ended. Pure; views/usage.js draws the sums.

/** The GPUs a placement holds on each node: Map(node -> GPUs). */
export function gpusByNode(placement) {
  const byNode = new Map();
  const add = (node, gpus) => {
    const total = (gpus || []).reduce((sum, gpu) => sum + Number(gpu.amount ?? 1), 0);
    byNode.set(node, (byNode.get(node) || 0) + total);
  };
  if (!placement) return byNode;
  add(placement.node, placement.gpus);
  for (const peer of placement.peers || []) add(peer.node, peer.gpus);
  return byNode;
}

/** The seconds a finished record ran (0 for one that never started). */
export function runSeconds(record) {
  if (!record.started_at || !record.ended_at || !record.placement) return 0;
  return Math.max(0, Date.parse(record.ended_at) - Date.parse(record.started_at)) / 1000;
}

/**
 * Sums `records` (finished job records) that ended in [since, until) (ms since the epoch):
 * {byUser, byNode, byDay} as Maps of GPU-hours, and the number of jobs counted.
 */
export function usageOf(records, since, until) {
  const byUser = new Map();
  const byNode = new Map();
  const byDay = new Map();
  const add = (map, key, hours) => map.set(key, (map.get(key) || 0) + hours);
  let jobs = 0;
  const seen = new Set();
  for (const record of records) {
    if (!record.ended_at || seen.has(record.id)) continue;
    const ended = Date.parse(record.ended_at);
    if (!(ended >= since && ended < until)) continue;
    seen.add(record.id);
    jobs += 1;
    const seconds = runSeconds(record);
    let total = 0;
    for (const [node, gpus] of gpusByNode(record.placement)) {
      const hours = (gpus * seconds) / 3600;
      total += hours;
      if (seconds > 0) add(byNode, node, hours);
    }
    add(byUser, record.user, total);
    add(byDay, new Date(ended).toISOString().slice(0, 10), total);
  }
  return { byUser, byNode, byDay, jobs };
}

/** The days from `since` to `until` (UTC dates), so a chart shows the empty ones too. */
export function daysBetween(since, until) {
  const days = [];
  for (let t = Date.UTC(...utcParts(since)); t < until; t += 86_400_000) {
    days.push(new Date(t).toISOString().slice(0, 10));
  }
  return days;
}

function utcParts(ms) {
  const d = new Date(ms);
  return [d.getUTCFullYear(), d.getUTCMonth(), d.getUTCDate()];
}
