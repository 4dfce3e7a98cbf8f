// Where the page's data comes from, all of it read from the bus as any NATS tool reads it:
// the jobs bucket and the cluster bucket watched (every value, then each change), and each
// node's last heartbeat from the MGPU_NODES stream, then every new one. Each feed keeps
// going across reconnects; a feed the server refuses says so.

import { DeliverPolicy } from "@nats-io/jetstream";
import { applyClusterKey, applyHeartbeat, applyJob, jobsLoaded } from "./store.js";

/** Starts every feed into `store`; `changed()` is called after each change, `problem(text)`
 * when a feed cannot be read. */
export function startFeeds(conn, store, changed, problem) {
  // The heartbeats first: the cluster view, shown first, is drawn from them.
  followHeartbeats(conn, store, changed, problem);
  // The records first read are kept quietly, then drawn at once (see `applyJob`).
  let loading = true;
  watchBucket(conn, "mgpu-jobs", (key, value, isUpdate) => {
    if (loading && isUpdate) {
      loading = false;
      jobsLoaded(store, Date.now());
    }
    applyJob(store, key, value, Date.now(), loading);
  }, changed, problem);
  watchBucket(
    conn,
    "mgpu-cluster",
    (key, value) => applyClusterKey(store, key, value, Date.now()),
    changed,
    problem,
  );
}

/** Watches every key of `bucket`: `apply(key, value or null, isUpdate)` for each, where
 * `isUpdate` is false for the values the watch first read and true from its last one on. */
async function watchBucket(conn, bucket, apply, changed, problem) {
  try {
    const kv = await conn.kvm.open(bucket);
    const watch = await kv.watch({ key: ">" });
    for await (const entry of watch) {
      let value = null;
      if (entry.operation === "PUT") {
        try {
          value = entry.json();
        } catch {
          continue; // not JSON: not ours to show
        }
      }
      apply(entry.key, value, entry.isUpdate);
      changed();
    }
  } catch (error) {
    problem(`cannot read the bucket ${bucket}: ${error.message}`);
  }
}

async function followHeartbeats(conn, store, changed, problem) {
  try {
    const consumer = await conn.js.consumers.get("MGPU_NODES", {
      filter_subjects: "nodes.heartbeat.*",
      deliver_policy: DeliverPolicy.LastPerSubject,
    });
    // Large pulls: a thousand nodes' last heartbeats arrive in one or two.
    const messages = await consumer.consume({ max_messages: 1000 });
    for await (const message of messages) {
      try {
        applyHeartbeat(store, message.json(), Date.now());
      } catch {
        continue;
      }
      changed();
    }
  } catch (error) {
    problem(`cannot read the nodes' heartbeats: ${error.message}`);
  }
}

/**
 * Follows a job's output from its first chunk: `onMessage(header, payload)` for each, until
 * `stop()` is called. The subject is the job's public output, or its owner's private one.
 */
export async function followOutput(conn, subject, onMessage, problem) {
  let stopped = false;
  let messages = null;
  const stop = () => {
    stopped = true;
    if (messages) messages.stop();
  };
  (async () => {
    try {
      const consumer = await conn.js.consumers.get("MGPU_OUTPUT", {
        filter_subjects: subject,
        deliver_policy: DeliverPolicy.All,
      });
      if (stopped) return;
      messages = await consumer.consume();
      for await (const message of messages) {
        const header = (name) => (message.headers ? message.headers.get(name) : "");
        onMessage(header, message.data);
      }
    } catch (error) {
      if (!stopped) problem(`cannot read this job's output: ${error.message}`);
    }
  })();
  return stop;
}

/**
 * Reads the finished jobs' records in MGPU_HISTORY stored since `sinceIso`, under `filter`
 * (`history.>` for an admin, `history.<own key>.>` for a user): `onRecord(record)` for each,
 * then resolves with how many there were. Rejects with the server's answer (a viewer, or a
 * user asking for everyone's, is refused).
 */
export async function readHistory(conn, filter, sinceIso, onRecord) {
  const consumer = await conn.js.consumers.get("MGPU_HISTORY", {
    filter_subjects: filter,
    deliver_policy: DeliverPolicy.StartTime,
    opt_start_time: sinceIso,
  });
  const info = await consumer.info(true);
  let left = info.num_pending;
  let count = 0;
  if (left === 0) return 0;
  const messages = await consumer.consume();
  for await (const message of messages) {
    try {
      onRecord(message.json());
      count += 1;
    } catch {
      // Not a record this page can read: left out, as `mgpu report` does.
    }
    left -= 1;
    if (left <= 0 || message.info.pending === 0) break;
  }
  messages.stop();
  return count;
}
