//! `mgpu node drain|resume` and `mgpu gpu pause|resume`: take a node or one GPU out of
//! service (running jobs finish, nothing new starts there) and put it back. Admins only.
//!
//! The request goes to `admin.requests` on the request path ([`crate::client::request`]),
//! which only admin credentials may publish. The server drops anyone else's publish with a
//! "Permissions Violation" error on the connection and no JetStream acknowledgement ever comes,
//! so that error is watched for and raced against the acknowledgement (and its retries). Once
//! stored, the command waits (up to [`WAIT`]) for the scheduler to write the change to the
//! cluster bucket, where `mgpu nodes` reads it.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Result, anyhow, bail};
use async_nats::jetstream::kv;
use clap::{Args, Subcommand};
use futures::StreamExt;
use mgpu_nats::records;
use mgpu_protocol::node::{AdminMark, NodeAdmin};
use mgpu_protocol::node_admin::AdminRequest;
use mgpu_protocol::subjects;

use crate::client::request::{self, Request};
use crate::client::session::{ConnectionArgs, Session};
use crate::console::{self, println};
use crate::errors::plain;
use crate::parse::{self, NodeGpu};

/// How long to wait for the scheduler to apply the change.
const WAIT: Duration = Duration::from_secs(10);

#[derive(Debug, Args)]
pub struct NodeArgs {
    #[command(subcommand)]
    pub command: NodeCommand,
}

#[derive(Debug, Subcommand)]
pub enum NodeCommand {
    /// Drain a node: its running jobs finish, no new job starts there.
    Drain {
        /// The node, as `mgpu nodes` lists it.
        #[arg(value_name = "NODE", value_parser = parse::node_name)]
        node: String,
        /// Why, shown by `mgpu nodes`.
        #[arg(long, value_name = "TEXT")]
        reason: Option<String>,
    },
    /// Let new jobs start on a drained node again.
    Resume {
        /// The node, as `mgpu nodes` lists it.
        #[arg(value_name = "NODE", value_parser = parse::node_name)]
        node: String,
    },
}

#[derive(Debug, Args)]
pub struct GpuArgs {
    #[command(subcommand)]
    pub command: GpuCommand,
}

#[derive(Debug, Subcommand)]
pub enum GpuCommand {
    /// Pause one GPU: jobs on it finish, no new job starts on it.
    Pause {
        /// The GPU: node name and GPU index, like node001:3.
        #[arg(value_name = "NODE:IDX", value_parser = parse::node_gpu)]
        gpu: NodeGpu,
        /// Why, shown by `mgpu nodes`.
        #[arg(long, value_name = "TEXT")]
        reason: Option<String>,
    },
    /// Let new jobs start on a paused GPU again.
    Resume {
        /// The GPU: node name and GPU index, like node001:3.
        #[arg(value_name = "NODE:IDX", value_parser = parse::node_gpu)]
        gpu: NodeGpu,
    },
}

/// One administrative change, whichever command asked for it.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Change {
    Drain {
        node: String,
        reason: Option<String>,
    },
    ResumeNode {
        node: String,
    },
    Pause {
        gpu: NodeGpu,
        reason: Option<String>,
    },
    ResumeGpu {
        gpu: NodeGpu,
    },
}

impl Change {
    fn node(&self) -> &str {
        match self {
            Change::Drain { node, .. } | Change::ResumeNode { node } => node,
            Change::Pause { gpu, .. } | Change::ResumeGpu { gpu } => &gpu.node,
        }
    }

    fn request(&self, by: &str) -> AdminRequest {
        let by = by.to_owned();
        match self.clone() {
            Change::Drain { node, reason } => AdminRequest::DrainNode { node, by, reason },
            Change::ResumeNode { node } => AdminRequest::ResumeNode { node, by },
            Change::Pause { gpu, reason } => AdminRequest::PauseGpu {
                node: gpu.node,
                index: gpu.index,
                by,
                reason,
            },
            Change::ResumeGpu { gpu } => AdminRequest::ResumeGpu {
                node: gpu.node,
                index: gpu.index,
                by,
            },
        }
    }

    /// Whether the node's administrative state shows the change: out of service (with the
    /// reason given, if one was) or back in service.
    fn shown_in(&self, admin: &NodeAdmin) -> bool {
        let marked = |mark: Option<&AdminMark>, reason: &Option<String>| {
            mark.is_some_and(|m| reason.is_none() || m.reason == *reason)
        };
        match self {
            Change::Drain { reason, .. } => marked(admin.drained.as_ref(), reason),
            Change::ResumeNode { .. } => admin.drained.is_none(),
            Change::Pause { gpu, reason } => marked(admin.paused_gpus.get(&gpu.index), reason),
            Change::ResumeGpu { gpu } => !admin.paused_gpus.contains_key(&gpu.index),
        }
    }

    /// What the change means, once made.
    fn done(&self) -> String {
        match self {
            Change::Drain { node, .. } => {
                format!("Node {node} drained: running jobs finish, nothing new starts there")
            }
            Change::ResumeNode { node } => {
                format!("Node {node} resumed: new jobs can start there")
            }
            Change::Pause { gpu, .. } => format!(
                "GPU {} of {} paused: jobs on it finish, nothing new starts on it",
                gpu.index, gpu.node
            ),
            Change::ResumeGpu { gpu } => format!(
                "GPU {} of {} resumed: new jobs can start on it",
                gpu.index, gpu.node
            ),
        }
    }

    /// What to say when the state already showed the change before we asked.
    fn already(&self, admin: &NodeAdmin) -> String {
        let by = |mark: Option<&AdminMark>| match mark {
            Some(AdminMark {
                by,
                reason: Some(reason),
                ..
            }) => format!(" (by {by}: {reason})"),
            Some(mark) => format!(" (by {})", mark.by),
            None => String::new(),
        };
        match self {
            Change::Drain { node, .. } => {
                format!(
                    "Node {node} was already drained{}",
                    by(admin.drained.as_ref())
                )
            }
            Change::ResumeNode { node } => format!("Node {node} is not drained"),
            Change::Pause { gpu, .. } => format!(
                "GPU {} of {} was already paused{}",
                gpu.index,
                gpu.node,
                by(admin.paused_gpus.get(&gpu.index))
            ),
            Change::ResumeGpu { gpu } => {
                format!("GPU {} of {} is not paused", gpu.index, gpu.node)
            }
        }
    }
}

pub async fn run_node(connection: &ConnectionArgs, args: &NodeArgs) -> Result<ExitCode> {
    let change = match &args.command {
        NodeCommand::Drain { node, reason } => Change::Drain {
            node: node.clone(),
            reason: reason.clone(),
        },
        NodeCommand::Resume { node } => Change::ResumeNode { node: node.clone() },
    };
    apply(connection, &change).await
}

pub async fn run_gpu(connection: &ConnectionArgs, args: &GpuArgs) -> Result<ExitCode> {
    let change = match &args.command {
        GpuCommand::Pause { gpu, reason } => Change::Pause {
            gpu: gpu.clone(),
            reason: reason.clone(),
        },
        GpuCommand::Resume { gpu } => Change::ResumeGpu { gpu: gpu.clone() },
    };
    apply(connection, &change).await
}

async fn apply(connection: &ConnectionArgs, change: &Change) -> Result<ExitCode> {
    let session = Session::connect(connection).await?;
    let node = change.node();
    let before = records::node_admin(&session.js)
        .await
        .map_err(plain)?
        .remove(node)
        .unwrap_or_default();

    // Nothing to change: asking again would only replace who did it, when and why.
    if change.shown_in(&before) {
        println(&change.already(&before))?;
        return Ok(ExitCode::SUCCESS);
    }

    let asked = Request::fresh(subjects::ADMIN_REQUESTS, &change.request(&session.user))?;
    // A refused publish is never acknowledged: the refusal ends the tries at once, in the
    // words of what was refused.
    tokio::select! {
        biased;
        _ = session.publish_refused(&[subjects::ADMIN_REQUESTS]) => {
            bail!("permission denied: only admins may drain nodes and pause GPUs");
        }
        acked = request::publish(&session, &asked) => { acked?; }
    }
    // A node that never reported may be a typo; the change is still made, since an admin
    // may well drain a machine before its agent first starts.
    if let Ok(nodes) = records::list_nodes(&session.js).await
        && !nodes.iter().any(|n| n.node == node)
    {
        console::stderr_line(&format!(
            "warning: node {node} has never reported; the change applies once it does"
        ));
    }

    wait_until_shown(&session, change).await?;
    println(&change.done())?;
    Ok(ExitCode::SUCCESS)
}

/// Watches the node's entry in the cluster bucket until it shows the change.
async fn wait_until_shown(session: &Session, change: &Change) -> Result<()> {
    let bucket = records::cluster_bucket(&session.js).await.map_err(plain)?;
    // The current value comes first, so a change made before the watch started is seen.
    let key = subjects::node_admin_key(change.node());
    let mut watch = records::create_reader("watching the node's state", || {
        bucket.watch_with_history(key.as_str())
    })
    .await
    .map_err(plain)?;
    let wait = async {
        while let Some(entry) = watch.next().await {
            let entry = entry.map_err(plain)?;
            let admin = match entry.operation {
                kv::Operation::Put => serde_json::from_slice::<NodeAdmin>(&entry.value)
                    .map_err(|e| anyhow!("node {}'s state is not valid: {e}", change.node()))?,
                kv::Operation::Delete | kv::Operation::Purge => NodeAdmin::default(),
            };
            if change.shown_in(&admin) {
                return Ok(());
            }
        }
        bail!("lost the watch on node {}'s state", change.node())
    };
    tokio::time::timeout(WAIT, wait).await.unwrap_or_else(|_| {
        Err(anyhow!(
            "the scheduler has not applied the change within {} s: it may be down (the \
             request waits for it in JetStream)",
            WAIT.as_secs()
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(index: u32) -> NodeGpu {
        NodeGpu {
            node: "node001".into(),
            index,
        }
    }

    fn mark() -> AdminMark {
        AdminMark {
            by: "root".into(),
            at: mgpu_protocol::now(),
            reason: Some("fan".into()),
        }
    }

    #[test]
    fn requests_carry_who_asks_and_why() {
        let drain = Change::Drain {
            node: "node001".into(),
            reason: Some("maintenance".into()),
        };
        let value = serde_json::to_value(drain.request("root")).unwrap_or_default();
        assert_eq!(
            value,
            serde_json::json!({"action": "drain_node", "node": "node001", "by": "root",
                               "reason": "maintenance"})
        );
        let resume = Change::ResumeGpu { gpu: gpu(3) };
        let value = serde_json::to_value(resume.request("root")).unwrap_or_default();
        assert_eq!(
            value,
            serde_json::json!({"action": "resume_gpu", "node": "node001", "index": 3, "by": "root"})
        );
    }

    #[test]
    fn the_state_shows_each_change() {
        let mut admin = NodeAdmin::default();
        let pause = Change::Pause {
            gpu: gpu(2),
            reason: None,
        };
        let drain = Change::Drain {
            node: "node001".into(),
            reason: None,
        };
        assert!(!pause.shown_in(&admin));
        assert!(!drain.shown_in(&admin));
        assert!(
            Change::ResumeNode {
                node: "node001".into()
            }
            .shown_in(&admin)
        );
        admin.paused_gpus.insert(2, mark());
        admin.drained = Some(mark());
        assert!(pause.shown_in(&admin));
        assert!(drain.shown_in(&admin));
        assert!(!Change::ResumeGpu { gpu: gpu(2) }.shown_in(&admin));
        assert!(Change::ResumeGpu { gpu: gpu(1) }.shown_in(&admin));
        assert_eq!(
            drain.already(&admin),
            "Node node001 was already drained (by root: fan)"
        );
        // A new reason is a change to make; the same one is not.
        let fan = Change::Drain {
            node: "node001".into(),
            reason: Some("fan".into()),
        };
        let disk = Change::Drain {
            node: "node001".into(),
            reason: Some("disk".into()),
        };
        assert!(fan.shown_in(&admin));
        assert!(!disk.shown_in(&admin));
        assert_eq!(
            drain.done(),
            "Node node001 drained: running jobs finish, nothing new starts there"
        );
    }
}
