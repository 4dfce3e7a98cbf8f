//! Subject, stream, bucket and consumer names: the wire contract, written down once.
//!
//! | subject | from → to |
//! | --- | --- |
//! | `jobs.submit` | CLI → scheduler (stream `MGPU_REQUESTS`) |
//! | `jobs.<id>.cancel` | CLI → scheduler (stream `MGPU_REQUESTS`) |
//! | `jobs.<id>.hold`, `jobs.<id>.release` | CLI → scheduler (stream `MGPU_REQUESTS`) |
//! | `admin.requests` | admin CLI → scheduler (stream `MGPU_REQUESTS`): drain, pause, … |
//! | `reservations.requests` | CLI → scheduler (stream `MGPU_REQUESTS`): book, cancel |
//! | `jobs.<id>.events` | scheduler, agent → anyone (stream `MGPU_EVENTS`) |
//! | `jobs.<id>.output` | agent → anyone (stream `MGPU_OUTPUT`) |
//! | `jobs.<id>.input` | CLI → agent (core NATS) |
//! | `nodes.heartbeat.<node>` | agent → anyone (stream `MGPU_NODES`, last message per node kept) |
//! | `nodes.assign.<node>` | scheduler → agent (stream `MGPU_ASSIGN`) |
//! | `nodes.control.<node>` | scheduler → agent (stream `MGPU_ASSIGN`) |

use crate::ids::JobId;

pub const SUBMIT: &str = "jobs.submit";
pub const ALL_CANCELS: &str = "jobs.*.cancel";
pub const ALL_HOLDS: &str = "jobs.*.hold";
pub const ALL_RELEASES: &str = "jobs.*.release";
/// Node drain/resume and GPU pause/resume; only admins may publish it.
pub const ADMIN_REQUESTS: &str = "admin.requests";
/// Reservations booked and cancelled (`mgpu reserve`); any user may publish it.
pub const RESERVATION_REQUESTS: &str = "reservations.requests";
pub const ALL_EVENTS: &str = "jobs.*.events";
/// Audit records: `audit.<action>` (submit, cancel, hold, release, admin), written by the
/// scheduler with the identity that signed each request.
pub const ALL_AUDIT: &str = "audit.>";
pub const ALL_OUTPUT: &str = "jobs.*.output";
/// Every job's output that only its owner and admins may read (`mgpu submit --private`):
/// `users.<owner key>.jobs.<id>.output`.
pub const ALL_PRIVATE_OUTPUT: &str = "users.*.jobs.*.output";
pub const ALL_HEARTBEATS: &str = "nodes.heartbeat.*";
pub const ALL_ASSIGNMENTS: &str = "nodes.assign.*";
pub const ALL_CONTROLS: &str = "nodes.control.*";

/// Stream holding submissions and cancellations until the scheduler has handled them.
pub const REQUESTS_STREAM: &str = "MGPU_REQUESTS";
/// Stream holding every job's state transitions.
pub const EVENTS_STREAM: &str = "MGPU_EVENTS";
/// Stream holding the audit records (who asked for what, accepted or refused).
pub const AUDIT_STREAM: &str = "MGPU_AUDIT";

/// The audit subject of one action.
pub fn audit(action: &str) -> String {
    format!("audit.{action}")
}
/// Stream holding every job's output, bounded by age and size.
pub const OUTPUT_STREAM: &str = "MGPU_OUTPUT";
/// Stream holding finished jobs' records once they left the live bucket (after the
/// scheduler's `keep_finished`), one message per job, bounded by age and size.
pub const HISTORY_STREAM: &str = "MGPU_HISTORY";
pub const ALL_HISTORY: &str = "history.>";
/// Kept this long in history, and at most [`HISTORY_MAX_BYTES`].
pub const HISTORY_MAX_AGE_SECS: u64 = 365 * 24 * 3600;
pub const HISTORY_MAX_BYTES: i64 = 10 * 1024 * 1024 * 1024;
/// The history subject of one job, under its owner: the public key that signed its
/// submission (the server's permissions let that key read its own history only, whatever
/// Unix account the user runs under); a record without one goes under the user's name.
pub fn history(owner: &str, job: &JobId) -> String {
    format!("history.{owner}.{job}")
}
/// Who a record is filed under in history: its signer's public key, else its user's name.
pub fn history_owner(record: &crate::job::JobRecord) -> &str {
    record.user_key.as_deref().unwrap_or(&record.user)
}
/// Every history subject a job id could be under (its user unknown).
pub fn history_of(job: &JobId) -> String {
    format!("history.*.{job}")
}
/// Stream holding the last heartbeat of every node.
pub const NODES_STREAM: &str = "MGPU_NODES";
/// Stream holding assignments and control messages until each node's agent has taken them.
pub const ASSIGN_STREAM: &str = "MGPU_ASSIGN";
/// KV bucket of job records, written by the active scheduler only.
pub const JOBS_BUCKET: &str = "mgpu-jobs";
/// The stream behind [`JOBS_BUCKET`] (JetStream's naming rule for KV buckets).
pub const JOBS_BUCKET_STREAM: &str = "KV_mgpu-jobs";
/// KV bucket of cluster-wide state written by the scheduler: node and GPU administration
/// (`node.<name>`), the scheduling policy in force (`policy`) and users' usage (`usage`).
pub const CLUSTER_BUCKET: &str = "mgpu-cluster";
pub const CLUSTER_BUCKET_STREAM: &str = "KV_mgpu-cluster";
pub const POLICY_KEY: &str = "policy";
/// KV bucket holding the active scheduler's lease; entries expire after
/// [`LEADER_LEASE_TTL_SECS`], so a standby takes over when the active one stops renewing.
pub const LEADER_BUCKET: &str = "mgpu-leader";
pub const LEADER_KEY: &str = "scheduler";
pub const LEADER_LEASE_TTL_SECS: u64 = 3;
/// KV bucket of node-name leases: key `<node>` is held by the one agent running as that node,
/// renewed well within [`NODE_LEASE_TTL_SECS`], so a second agent under the same name refuses
/// to start.
pub const NODE_LEASE_BUCKET: &str = "mgpu-node-leases";
pub const NODE_LEASE_BUCKET_STREAM: &str = "KV_mgpu-node-leases";
pub const NODE_LEASE_TTL_SECS: u64 = 10;
/// The subject a node's lease is written on (the KV's own naming).
pub fn node_lease(node: &str) -> String {
    format!("$KV.{NODE_LEASE_BUCKET}.{node}")
}
pub const USAGE_KEY: &str = "usage";
/// Key of the cluster bucket holding the expected starts of waiting jobs ([`crate::plan`]).
pub const PLAN_KEY: &str = "plan";
/// KV bucket of the environments captured at submit, out of the job records every user
/// reads: key `<owner key>.<job id>`, written by the owner (or by the scheduler for a
/// submission that carried it inline), read by the owner, admins and the scheduler, which
/// puts it in the job's assignments.
pub const JOB_ENV_BUCKET: &str = "mgpu-job-env";
pub const JOB_ENV_BUCKET_STREAM: &str = "KV_mgpu-job-env";
/// KV bucket of the request nonces the scheduler saw lately (key: the nonce's hex), each kept
/// [`NONCE_TTL_SECS`]: a request copied and sent again after a scheduler restart is still known.
pub const NONCE_BUCKET: &str = "mgpu-nonces";
pub const NONCE_BUCKET_STREAM: &str = "KV_mgpu-nonces";
/// Twice the signature's allowed skew (2 minutes), and a minute more: a copy can pass the skew
/// check only within that long of the original's storing.
pub const NONCE_TTL_SECS: u64 = 5 * 60;
/// The key of a job's environment in [`JOB_ENV_BUCKET`].
pub fn job_env_key(owner: &str, job: &JobId) -> String {
    format!("{owner}.{job}")
}
/// The subject a job's environment is written on (the KV's own naming).
pub fn job_env(owner: &str, job: &JobId) -> String {
    format!("$KV.{JOB_ENV_BUCKET}.{}", job_env_key(owner, job))
}
pub fn node_admin_key(node: &str) -> String {
    format!("node.{node}")
}

/// Where reservation `name` is kept in the cluster bucket.
pub fn reservation_key(name: &str) -> String {
    format!("{RESERVATION_KEY_PREFIX}{name}")
}
/// The cluster bucket's keys of reservations start so.
pub const RESERVATION_KEY_PREFIX: &str = "reservation.";

/// Durable consumer through which the scheduler takes submissions and cancellations.
pub const SCHEDULER_REQUESTS_CONSUMER: &str = "scheduler-requests";
/// Durable consumer through which the scheduler learns what agents report about jobs.
pub const SCHEDULER_EVENTS_CONSUMER: &str = "scheduler-events";

/// Name of the scheduler's NATS micro service (`$SRV.PING` answers with it).
pub const SCHEDULER_SERVICE: &str = "mgpu-scheduler";
/// Request/reply endpoint answering with the scheduler's counters (queued, running, nodes).
pub const SCHEDULER_STATUS: &str = "mgpu.scheduler.status";
/// Where `mgpu why` asks the active scheduler about one job (a signed request; [`crate::why`]).
pub const SCHEDULER_WHY: &str = "mgpu.scheduler.why";
/// Every endpoint of the scheduler's micro service.
pub const SCHEDULER_ENDPOINTS: &str = "mgpu.scheduler.>";

pub fn cancel(job: &JobId) -> String {
    format!("jobs.{job}.cancel")
}
pub fn hold(job: &JobId) -> String {
    format!("jobs.{job}.hold")
}
pub fn release(job: &JobId) -> String {
    format!("jobs.{job}.release")
}
pub fn events(job: &JobId) -> String {
    format!("jobs.{job}.events")
}
pub fn output(job: &JobId) -> String {
    format!("jobs.{job}.output")
}
/// The output subject of a job with private output, under its owner's public key: a user's
/// permissions can name exactly their own (`users.<their key>.>`).
pub fn private_output(owner_key: &str, job: &JobId) -> String {
    format!("users.{owner_key}.jobs.{job}.output")
}
/// Where the scheduler tells the user whose key is `owner_key` about their jobs (idle
/// warnings and reclaims): only they may subscribe to it.
pub fn notices(owner_key: &str) -> String {
    format!("users.{owner_key}.notices")
}
/// Every user's notices subject (the scheduler publishes on it).
pub const ALL_NOTICES: &str = "users.*.notices";
/// Every private output subject of the user whose key is `owner_key`.
pub fn private_outputs_of(owner_key: &str) -> String {
    format!("users.{owner_key}.jobs.*.output")
}
/// Where `record`'s output goes: its owner's private subject for a job with private output
/// (and a known owner key), else the public `jobs.<id>.output`.
pub fn output_of(record: &crate::job::JobRecord) -> String {
    match (&record.user_key, record.spec.private_output) {
        (Some(key), true) => private_output(key, &record.id),
        _ => output(&record.id),
    }
}
pub fn input(job: &JobId) -> String {
    format!("jobs.{job}.input")
}
pub fn heartbeat(node: &str) -> String {
    format!("nodes.heartbeat.{node}")
}
pub fn assign(node: &str) -> String {
    format!("nodes.assign.{node}")
}
pub fn control(node: &str) -> String {
    format!("nodes.control.{node}")
}
/// The one filter of a node's consumer on the assignment stream: `nodes.*.<node>`, which
/// in that stream (it holds `nodes.assign.*` and `nodes.control.*` only) is the node's
/// assignments and controls. A single filter is named in the consumer's create request
/// subject, so the server's permissions can pin a node to its own (two filters are not).
pub fn node_assignment_filter(node: &str) -> String {
    format!("nodes.*.{node}")
}
/// The durable consumer a node's agent reads its assignments and controls through.
pub fn node_consumer(node: &str) -> String {
    format!("node-{node}")
}

/// The job id in `jobs.<id>.<kind>`, if the subject has that shape.
pub fn job_id_of(subject: &str) -> Option<&str> {
    let mut parts = subject.split('.');
    match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some("jobs"), Some(id), Some(_), None) => Some(id),
        _ => None,
    }
}

/// The node name in `nodes.<kind>.<node>`, if the subject has that shape.
pub fn node_of(subject: &str) -> Option<&str> {
    let mut parts = subject.split('.');
    match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some("nodes"), Some(_), Some(node), None) => Some(node),
        _ => None,
    }
}

/// Whether the NATS subject pattern `filter` (with `*` and `>` wildcards) takes `subject`.
pub fn subject_matches(filter: &str, subject: &str) -> bool {
    let mut wanted = subject.split('.');
    for token in filter.split('.') {
        match (token, wanted.next()) {
            (">", Some(_)) => return true,
            ("*", Some(_)) => {}
            (token, Some(got)) if token == got => {}
            _ => return false,
        }
    }
    wanted.next().is_none()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_come_back_out_of_subjects() {
        assert_eq!(job_id_of("jobs.abc.cancel"), Some("abc"));
        assert_eq!(job_id_of("jobs.submit"), None);
        assert_eq!(node_of("nodes.heartbeat.node001"), Some("node001"));
        assert_eq!(node_of("nodes.heartbeat"), None);
    }

    #[test]
    fn a_nodes_filter_takes_its_assignments_and_controls_only() {
        let filter = node_assignment_filter("node001");
        assert!(subject_matches(&filter, &assign("node001")));
        assert!(subject_matches(&filter, &control("node001")));
        assert!(!subject_matches(&filter, &assign("node002")));
        assert!(!subject_matches(&filter, "nodes.assign.node001.x"));
        assert!(subject_matches("history.>", "history.U.1"));
        assert!(!subject_matches("history.>", "history"));
    }
}
