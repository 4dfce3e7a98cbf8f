//! The node-name lease: one agent at a time runs as a node name, cluster-wide. The key
//! `<node>` of the `mgpu-node-leases` bucket names the agent holding it (host, pid, a fresh id
//! per start); it expires [`NODE_LEASE_TTL_SECS`] after its last renewal. A second agent
//! started under the same name finds the key renewed while it waits and refuses to start;
//! an agent restarted after a crash on the same host finds its predecessor's process gone and
//! takes the key over at once; one on another host waits for the key to expire.
//!
//! Where the bucket does not exist yet (no scheduler has set up its streams), the agent makes
//! it: the lease must be taken before the agent runs anything, whoever starts first. Where
//! the bucket cannot be used at all, the agent starts without the lease and says so; the
//! renewal loop takes it once it can.

use std::time::{Duration, Instant};

use anyhow::anyhow;
use async_nats::jetstream::{self, kv};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use mgpu_protocol::subjects::{NODE_LEASE_BUCKET, NODE_LEASE_TTL_SECS};

use crate::shutdown::Signal;

/// How often a held lease is renewed: several times within its time to live.
const RENEW_EVERY: Duration = Duration::from_secs(NODE_LEASE_TTL_SECS / 4);
/// How often a starting agent looks at a lease someone else holds.
const LOOK_EVERY: Duration = Duration::from_millis(250);

/// Who holds a node name: what the key's value says.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holder {
    pub host: String,
    pub pid: u32,
    /// Fresh at every start, so a restarted agent on the same host and pid is told apart.
    pub instance: String,
}

impl Holder {
    /// This agent.
    pub fn this_agent(host: String) -> Holder {
        Holder {
            host,
            pid: std::process::id(),
            instance: uuid::Uuid::new_v4().simple().to_string(),
        }
    }

    fn encode(&self) -> Bytes {
        Bytes::from(serde_json::to_vec(self).unwrap_or_default())
    }
}

/// What a starting agent decides about a lease someone else holds.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    /// Its holder is gone: take the key over now.
    TakeOver,
    /// Look again: renewed since first seen means alive.
    Watch,
}

/// Pure: a key held by `other`, seen by `me`. A holder on this host whose process is gone (or
/// is no agent any more) is a crashed predecessor; anyone else may be alive.
fn judge(other: &Holder, me: &Holder, process_is_agent: impl Fn(u32) -> bool) -> Verdict {
    if other.host == me.host && !process_is_agent(other.pid) {
        Verdict::TakeOver
    } else {
        Verdict::Watch
    }
}

/// Whether `pid` is a running `mgpu-node`.
fn is_agent_process(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .is_ok_and(|comm| comm.trim().starts_with("mgpu-node"))
}

/// A held lease, renewed until dropped or released.
pub struct NodeLease {
    store: kv::Store,
    node: String,
    holder: Holder,
    revision: u64,
}

/// Takes the lease of `node` for `holder`. An error when a live agent holds it (the agent
/// must not start); None when the bucket cannot be used yet (the agent starts without it).
pub async fn acquire(
    js: &jetstream::Context,
    node: &str,
    holder: &Holder,
    replicas: usize,
) -> anyhow::Result<Option<NodeLease>> {
    let store = match js.get_key_value(NODE_LEASE_BUCKET).await {
        Ok(store) => store,
        Err(_) => match js
            .create_key_value(mgpu_nats::streams::node_lease_bucket_config(replicas))
            .await
        {
            Ok(store) => store,
            Err(err) => {
                warn!(
                    "starting without the node-name lease (no bucket: {err}); taken once it can be"
                );
                return Ok(None);
            }
        },
    };
    let deadline = Instant::now() + Duration::from_secs(NODE_LEASE_TTL_SECS + 2);
    let mut first_seen: Option<u64> = None;
    loop {
        match store.create(node, holder.encode()).await {
            Ok(revision) => return Ok(Some(NodeLease::held(store, node, holder, revision))),
            Err(err) if err.kind() == kv::CreateErrorKind::AlreadyExists => {}
            Err(err) => {
                warn!("starting without the node-name lease: {err}");
                return Ok(None);
            }
        }
        let entry = match store.entry(node).await {
            Ok(Some(entry)) => entry,
            // Expired or deleted since: create it again.
            Ok(None) => continue,
            Err(err) if Instant::now() > deadline => {
                warn!("starting without the node-name lease: {err}");
                return Ok(None);
            }
            Err(_) => {
                tokio::time::sleep(LOOK_EVERY).await;
                continue;
            }
        };
        let other: Option<Holder> = serde_json::from_slice(&entry.value).ok();
        let verdict = other.as_ref().map_or(Verdict::TakeOver, |other| {
            judge(other, holder, is_agent_process)
        });
        if verdict == Verdict::TakeOver
            && let Ok(revision) = store.update(node, holder.encode(), entry.revision).await
        {
            info!(previous = ?other, "took over the node-name lease of a stopped agent");
            return Ok(Some(NodeLease::held(store, node, holder, revision)));
        }
        let renewed = *first_seen.get_or_insert(entry.revision) != entry.revision;
        if renewed || Instant::now() > deadline {
            let who = other.map_or_else(
                || "another agent".to_owned(),
                |o| format!("the agent on host {} (pid {})", o.host, o.pid),
            );
            return Err(anyhow!(
                "node name `{node}` is taken: {who} runs as it and renews its lease. Stop that \
                 agent first, or give this one a name of its own (--node)"
            ));
        }
        tokio::time::sleep(LOOK_EVERY).await;
    }
}

/// Keeps the lease from start to `stop`: `first` when it was taken at start, else taken once
/// the bucket can be used (an agent started before any scheduler).
pub async fn hold(
    js: jetstream::Context,
    (node, replicas): (String, usize),
    holder: Holder,
    first: Option<NodeLease>,
    stop: Signal,
) {
    let mut lease = first;
    while lease.is_none() {
        tokio::select! {
            () = stop.fired() => return,
            () = tokio::time::sleep(RENEW_EVERY) => {}
        }
        match acquire(&js, &node, &holder, replicas).await {
            Ok(taken) => lease = taken,
            Err(err) => {
                warn!("{err:#}");
                return;
            }
        }
    }
    if let Some(lease) = lease {
        info!(node, "holding the node-name lease");
        lease.keep(stop).await;
    }
}

impl NodeLease {
    fn held(store: kv::Store, node: &str, holder: &Holder, revision: u64) -> NodeLease {
        NodeLease {
            store,
            node: node.to_owned(),
            holder: holder.clone(),
            revision,
        }
    }

    /// Renews the lease until `stop` fires, then gives it up. A renewal refused because
    /// someone else wrote the key is logged loudly: two agents then run as one node.
    async fn keep(mut self, stop: Signal) {
        loop {
            tokio::select! {
                () = stop.fired() => break,
                () = tokio::time::sleep(RENEW_EVERY) => {}
            }
            match self
                .store
                .update(&self.node, self.holder.encode(), self.revision)
                .await
            {
                Ok(revision) => self.revision = revision,
                Err(err) if err.kind() == kv::UpdateErrorKind::WrongLastRevision => {
                    warn!(
                        node = self.node,
                        "another agent took this node's name: two agents run as one node; stop one"
                    );
                    if let Ok(Some(entry)) = self.store.entry(self.node.as_str()).await {
                        self.revision = entry.revision;
                    }
                }
                Err(err) => warn!(node = self.node, "cannot renew the node-name lease: {err}"),
            }
        }
        let _ = self
            .store
            .delete_expect_revision(&self.node, Some(self.revision))
            .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holder(host: &str, pid: u32) -> Holder {
        Holder {
            host: host.into(),
            pid,
            instance: "x".into(),
        }
    }

    #[test]
    fn a_crashed_predecessor_on_this_host_is_taken_over_and_anyone_else_watched() {
        let me = holder("gpu01", 20);
        let alive = |_: u32| true;
        let gone = |_: u32| false;
        assert_eq!(judge(&holder("gpu01", 10), &me, gone), Verdict::TakeOver);
        assert_eq!(judge(&holder("gpu01", 10), &me, alive), Verdict::Watch);
        // Another host's process cannot be looked at: only its renewals tell.
        assert_eq!(judge(&holder("gpu02", 10), &me, gone), Verdict::Watch);
    }

    #[test]
    fn this_process_is_an_agent_only_if_it_is_named_so() {
        // The test binary is not `mgpu-node`; pid 0 is no process.
        assert!(!is_agent_process(std::process::id()));
        assert!(!is_agent_process(0));
    }
}
