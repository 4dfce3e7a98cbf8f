//! `mgpu queue`: the jobs and the nodes, read straight from JetStream (works while the
//! scheduler is down).
//!
//! Built to list 100 000 waiting jobs in well under two seconds: records are decoded as they
//! arrive and without the parts of the spec no listing shows; sorting compares keys computed
//! once per job; and both the table and `--json` are written through one buffered handle on
//! stdout, `--json` one job per line as it is serialised, never as one document in memory.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufWriter, Write};
use std::process::ExitCode;

use anyhow::Result;
use async_nats::jetstream;
use clap::Args;
use mgpu_nats::error::StateError;
use mgpu_nats::records;
use mgpu_protocol::Timestamp;
use mgpu_protocol::duration::format_duration;
use mgpu_protocol::job::{JobRecord, JobState, JobSummary};
use mgpu_protocol::node::{GpuSource, NodeAdmin, NodeHeartbeat, NodeLiveness};
use mgpu_protocol::priority::{Policy, UsageBook, effective_priority};
use serde::Serialize;

use crate::errors::plain;
use crate::human;
use crate::session::ConnectionArgs;
use crate::session::Session;
use crate::tables::Table;

#[derive(Debug, Args)]
pub struct QueueArgs {
    /// Also list finished jobs.
    #[arg(short, long)]
    pub all: bool,

    /// Print `{"jobs": […], "nodes": […]}` for scripts, one job per line, written as the
    /// listing is produced.
    #[arg(long)]
    pub json: bool,
}

/// What the scheduler keeps in the cluster bucket, read once per command: the policy and
/// usage that effective priorities are computed from, and drained nodes and paused GPUs.
#[derive(Debug, Default)]
pub struct Cluster {
    pub policy: Policy,
    pub usage: UsageBook,
    pub admin: BTreeMap<String, NodeAdmin>,
}

impl Cluster {
    /// A server set up before the cluster bucket existed has none of it yet: defaults apply
    /// (no node drained, nobody's usage counted), as the scheduler would assume.
    pub async fn read(js: &jetstream::Context) -> Result<Cluster> {
        fn missing_is_default<T: Default>(read: Result<T, StateError>) -> Result<T> {
            match read {
                Ok(value) => Ok(value),
                Err(StateError::NotSetUp) => Ok(T::default()),
                Err(err) => Err(plain(err)),
            }
        }
        // Independent reads: their round trips overlap.
        let (policy, usage, admin) = tokio::join!(
            records::policy(js),
            records::usage(js),
            records::node_admin(js)
        );
        Ok(Cluster {
            policy: missing_is_default(policy)?,
            usage: missing_is_default(usage)?,
            admin: missing_is_default(admin)?,
        })
    }

    /// The jobs in the order `mgpu queue` lists them (finished ones only if `finished`), each
    /// queued one with its effective priority.
    pub fn listing(&self, records: Vec<JobRecord>, finished: bool, now: Timestamp) -> Listing {
        // A user's usage is the same for each of their jobs: worked out once per user, not
        // once per job (a map lookup and a power each).
        let mut usage: BTreeMap<&str, f64> = BTreeMap::new();
        let mut effective = Vec::with_capacity(records.len());
        // Records are large: sorting (key, index) pairs moves 24 bytes per swap, not a record.
        let mut keyed: Vec<(SortKey, u32)> = Vec::with_capacity(records.len());
        for (index, record) in records.iter().enumerate() {
            let priority = matches!(record.state, JobState::Queued(_)).then(|| {
                let used = *usage.entry(record.user.as_str()).or_insert_with(|| {
                    self.usage
                        .gpu_hours(&record.user, now, self.policy.half_life_secs)
                });
                effective_priority(
                    record.spec.priority,
                    queued_at(record),
                    used,
                    &self.policy,
                    now,
                )
            });
            effective.push(priority);
            if finished || !record.state.is_finished() {
                // Records are never near 4 billion: the index fits.
                let index = u32::try_from(index).unwrap_or(u32::MAX);
                keyed.push((sort_key(record, priority), index));
            }
        }
        let id = |index: u32| records.get(index as usize).map(|r| r.id.as_str());
        // The id settles ties, so the order is total and an unstable sort gives the same.
        keyed.sort_unstable_by(|a, b| a.0.cmp(&b.0).then_with(|| id(a.1).cmp(&id(b.1))));
        Listing {
            order: keyed.into_iter().map(|(_, index)| index).collect(),
            records,
            effective,
        }
    }
}

/// The jobs `mgpu queue` lists, in its order: every record read, with the order kept as
/// indices so that sorting never moves a record.
pub struct Listing {
    pub records: Vec<JobRecord>,
    /// The effective priority of each record (queued ones only), by index.
    effective: Vec<Option<i64>>,
    /// Indices of the listed records, in listing order.
    order: Vec<u32>,
}

impl Listing {
    pub fn len(&self) -> usize {
        self.order.len()
    }

    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// The listed jobs in order, each with its effective priority.
    pub fn iter(&self) -> impl Iterator<Item = (&JobRecord, Option<i64>)> {
        self.order.iter().filter_map(|&index| {
            let index = index as usize;
            let record = self.records.get(index)?;
            Some((record, self.effective.get(index).copied().flatten()))
        })
    }
}

/// Group (running, queued, finished), then within the group: running jobs by start (longest
/// running first), queued ones in the order the scheduler considers them (higher effective
/// priority, then earlier queue time), finished ones by end time.
type SortKey = (u8, Reverse<i64>, Option<Timestamp>);

fn sort_key(record: &JobRecord, effective: Option<i64>) -> SortKey {
    match &record.state {
        JobState::Running(run) => (
            0,
            Reverse(0),
            Some(run.started_at.unwrap_or(run.assigned_at)),
        ),
        JobState::Queued(_) => (
            1,
            Reverse(effective.unwrap_or_default()),
            Some(queued_at(record)),
        ),
        finished => (2, Reverse(0), finished.ending().map(|e| e.ended_at)),
    }
}

/// When a queued job (re-)entered the queue: a requeued job waits from its requeue.
pub fn queued_at(job: &JobRecord) -> Timestamp {
    match &job.state {
        JobState::Queued(waiting) => waiting.enqueued_at.unwrap_or(job.submitted_at),
        _ => job.submitted_at,
    }
}

/// One job as `--json` prints it: the shared summary plus what only the queue knows.
#[derive(Debug, Serialize)]
struct QueueJob<'a> {
    #[serde(flatten)]
    summary: JobSummary,
    /// Null unless queued.
    effective_priority: Option<i64>,
    held_by: Option<&'a str>,
}

fn held_by(job: &JobRecord) -> Option<&str> {
    match &job.state {
        JobState::Queued(waiting) => waiting.held_by.as_deref(),
        _ => None,
    }
}

pub async fn run(connection: &ConnectionArgs, args: &QueueArgs) -> Result<ExitCode> {
    let session = Session::connect(connection).await?;
    let js = &session.js;
    // Three independent reads: their round trips overlap.
    let (jobs, nodes, cluster) = tokio::try_join!(
        async { records::list_jobs_for_listing(js).await.map_err(plain) },
        async { records::list_nodes(js).await.map_err(plain) },
        Cluster::read(js),
    )?;
    let now = mgpu_protocol::now();

    // Node usage counts every running job, shown or not. Only running jobs hold GPUs, so the
    // nodes are matched against those few rather than against every record.
    let running: Vec<JobRecord> = jobs
        .iter()
        .filter(|job| matches!(job.state, JobState::Running(_)))
        .cloned()
        .collect();
    let node_rows: Vec<NodeRow> = nodes
        .iter()
        .map(|n| {
            let admin = cluster.admin.get(&n.node);
            node_row(n, &running, admin, now, cluster.policy.missed_heartbeats)
        })
        .collect();
    let listed = cluster.listing(jobs, args.all, now);

    // One buffered handle on stdout for everything: Rust's stdout alone flushes every line.
    let mut out = BufWriter::with_capacity(1 << 16, std::io::stdout().lock());
    if args.json {
        write_json(&mut out, &listed, &node_rows)?;
    } else {
        write_tables(&mut out, &listed, &node_rows, args.all, now)?;
    }
    out.flush()?;
    // Freeing 100 000 records one by one takes a noticeable moment; the process is about to
    // exit, and exiting returns the memory at once.
    std::mem::forget(listed);
    Ok(ExitCode::SUCCESS)
}

/// `--json`: `{"jobs": [...], "nodes": [...]}`, one job per line, each written as soon as it
/// is serialised so the first jobs reach a reader while the rest are still being written.
/// The jobs are sorted, so none can be written before every record has been read.
fn write_json(out: &mut impl Write, listed: &Listing, nodes: &[NodeRow]) -> std::io::Result<()> {
    out.write_all(b"{\"jobs\": [")?;
    for (index, (record, effective)) in listed.iter().enumerate() {
        out.write_all(if index == 0 { b"\n" } else { b",\n" })?;
        let item = QueueJob {
            summary: record.summary(),
            effective_priority: effective,
            held_by: held_by(record),
        };
        serde_json::to_writer(&mut *out, &item)?;
    }
    out.write_all(b"\n],\n\"nodes\": ")?;
    serde_json::to_writer(&mut *out, nodes)?;
    out.write_all(b"}\n")
}

/// The human listing: the jobs' table, a blank line, the nodes' table.
fn write_tables(
    out: &mut impl Write,
    listed: &Listing,
    node_rows: &[NodeRow],
    all: bool,
    now: Timestamp,
) -> std::io::Result<()> {
    if listed.is_empty() {
        writeln!(
            out,
            "{}",
            if all {
                "No jobs."
            } else {
                "No queued or running jobs (mgpu queue --all lists finished ones too)."
            }
        )?;
    } else {
        let mut table = Table::new([
            "ID",
            "USER",
            "NAME",
            "STATE",
            "PRIO",
            "GPUS",
            "NODE:GPUS",
            "TIME",
            "REASON",
        ])
        .with_capacity(listed.len());
        for (record, effective) in listed.iter() {
            table.row(job_cells(record, effective, now));
        }
        table.write_to(out)?;
        // As above: the process exits soon after.
        std::mem::forget(table);
    }
    writeln!(out)?;
    if node_rows.is_empty() {
        writeln!(out, "No nodes have reported yet.")?;
    } else {
        let mut table = Table::new(["NODE", "STATE", "GPUS", "MEM (MiB)", "SOURCE"]);
        for row in node_rows {
            let paused = match row.gpus_paused {
                0 => String::new(),
                n => format!(", {n} paused"),
            };
            table.row(vec![
                row.node.clone(),
                node_state_name(row),
                format!("{}/{} free{paused}", row.gpus_free, row.gpus_total),
                human::mib_pair(row.mem_used_mib, row.mem_total_mib),
                source_name(row.gpu_source).to_owned(),
            ]);
        }
        table.write_to(out)?;
    }
    Ok(())
}

fn job_cells(job: &JobRecord, effective: Option<i64>, now: Timestamp) -> Vec<String> {
    let placement = job
        .state
        .placement()
        .map(|p| {
            p.ranks()
                .map(|(_, node, shares)| {
                    let gpus: Vec<u32> = shares.iter().map(|g| g.index).collect();
                    match gpus.as_slice() {
                        // A CPU-only job holds no GPU there.
                        [] => node.to_owned(),
                        gpus => format!("{node}:{}", human::index_list(gpus)),
                    }
                })
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_else(|| "-".to_owned());
    let (time, reason) = match &job.state {
        JobState::Queued(waiting) => (
            human::elapsed(queued_at(job), now),
            match &waiting.held_by {
                Some(by) => format!("held by {by}"),
                None => waiting.reason.describe().to_owned(),
            },
        ),
        JobState::Running(run) => (
            run.started_at
                .map(|s| human::elapsed(s, now))
                .unwrap_or_default(),
            match (&run.cancel_requested_by, run.started_at) {
                (Some(_), _) => "cancelling".to_owned(),
                // Its time slice ended while others wait: it goes back to the queue.
                (None, _) if run.preempt_requested => "time slice over: requeueing".to_owned(),
                (None, None) => "starting".to_owned(),
                (None, Some(_)) => String::new(),
            },
        ),
        JobState::Succeeded(end)
        | JobState::Failed(end)
        | JobState::Cancelled(end)
        | JobState::TimedOut(end)
        | JobState::NodeFailed(end) => (
            end.started_at
                .map(|s| human::elapsed(s, end.ended_at))
                .unwrap_or_default(),
            match (&end.reason, end.exit_code) {
                (Some(reason), _) => reason.clone(),
                (None, Some(code)) => format!("exit {code}"),
                (None, None) => String::new(),
            },
        ),
    };
    vec![
        job.id.short().to_owned(),
        job.user.clone(),
        job.spec.display_name(),
        job.state.name().to_owned(),
        effective
            .map(|p| p.to_string())
            .unwrap_or_else(|| "-".to_owned()),
        job.spec.gpus.to_string(),
        placement,
        format_duration(time),
        reason,
    ]
}

/// One node as the queue shows it, and as `--json` prints it.
#[derive(Debug, PartialEq, Eq, Serialize)]
pub struct NodeRow {
    pub node: String,
    pub state: NodeState,
    pub last_heartbeat: Timestamp,
    pub gpus_total: usize,
    /// GPUs no running job holds and no admin paused.
    pub gpus_free: usize,
    pub gpus_paused: usize,
    /// Jobs running there (by the records and the node's own report).
    pub jobs_running: usize,
    /// Drained or not, paused GPUs: what `mgpu node` and `mgpu gpu` set.
    pub admin: NodeAdmin,
    #[serde(skip)]
    pub mem_used_mib: u64,
    #[serde(skip)]
    pub mem_total_mib: u64,
    pub gpu_source: GpuSource,
}

/// GPUs of `node` on which a running job holds any share: a shared GPU is not free.
pub fn busy_gpus(node: &str, jobs: &[JobRecord]) -> BTreeSet<u32> {
    jobs.iter()
        .filter_map(|job| match &job.state {
            JobState::Running(run) => run.placement.gpus_on(node),
            _ => None,
        })
        .flat_map(|gpus| gpus.iter().map(|g| g.index))
        .collect()
}

/// A node as listings show it. `missed_heartbeats` is the scheduler's policy: the node is
/// offline once that many heartbeats are overdue, exactly when the scheduler gives up on it.
pub fn node_row(
    beat: &NodeHeartbeat,
    jobs: &[JobRecord],
    admin: Option<&NodeAdmin>,
    now: Timestamp,
    missed_heartbeats: u32,
) -> NodeRow {
    let busy = busy_gpus(&beat.node, jobs);
    let admin = admin.cloned().unwrap_or_default();
    let recorded = jobs
        .iter()
        .filter(
            |job| matches!(&job.state, JobState::Running(run) if run.placement.uses_node(&beat.node)),
        )
        .count();
    let jobs_running = recorded.max(beat.running.len());
    let liveness = beat.liveness_after(now, missed_heartbeats);
    NodeRow {
        node: beat.node.clone(),
        state: NodeState::of(liveness, admin.drained.is_some(), jobs_running),
        last_heartbeat: beat.sent_at,
        gpus_total: beat.gpus.len(),
        gpus_free: beat
            .gpus
            .iter()
            .filter(|g| !busy.contains(&g.index) && !admin.paused_gpus.contains_key(&g.index))
            .count(),
        gpus_paused: beat
            .gpus
            .iter()
            .filter(|g| admin.paused_gpus.contains_key(&g.index))
            .count(),
        jobs_running,
        admin,
        mem_used_mib: beat.gpus.iter().map(|g| g.memory_used_mib).sum(),
        mem_total_mib: beat.gpus.iter().map(|g| g.memory_total_mib).sum(),
        gpu_source: beat.gpu_source,
    }
}

/// What listings say a node is doing: liveness first (an offline node runs nothing that can be
/// seen), then the admin's drain mark.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeState {
    /// Heartbeats arrive and new jobs may start there.
    Online,
    /// Drained by an admin, but jobs still run there.
    Draining,
    /// Drained by an admin and idle.
    Drained,
    /// More heartbeats missed than the scheduler's policy allows (`missed_heartbeats`).
    Offline,
}

impl NodeState {
    pub fn of(liveness: NodeLiveness, drained: bool, jobs_running: usize) -> NodeState {
        match (liveness, drained) {
            (NodeLiveness::Offline, _) => NodeState::Offline,
            (NodeLiveness::Online, true) if jobs_running > 0 => NodeState::Draining,
            (NodeLiveness::Online, true) => NodeState::Drained,
            (NodeLiveness::Online, false) => NodeState::Online,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            NodeState::Online => "online",
            NodeState::Draining => "draining",
            NodeState::Drained => "drained",
            NodeState::Offline => "offline",
        }
    }
}

/// The state as the tables show it: an offline node that is also drained says both, since
/// the drain outlives the outage.
pub fn node_state_name(row: &NodeRow) -> String {
    match (row.state, row.admin.drained.is_some()) {
        (NodeState::Offline, true) => "offline, drained".to_owned(),
        (state, _) => state.name().to_owned(),
    }
}

pub fn source_name(source: GpuSource) -> &'static str {
    match source {
        GpuSource::Nvml => "nvml",
        GpuSource::Declared => "declared",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Duration;
    use mgpu_protocol::gpu_amount::GpuAmount;
    use mgpu_protocol::ids::JobId;
    use mgpu_protocol::job::{Ending, GpuShare, JobSpec, Placement, Run, WaitReason, Waiting};
    use mgpu_protocol::node::{AdminMark, DEFAULT_THRESHOLD, GpuStatus};

    fn job(name: &str, state: JobState, priority: i32, submitted_secs_ago: i64) -> JobRecord {
        let mut spec = JobSpec::new(vec![name.to_owned()], "/tmp");
        spec.priority = priority;
        JobRecord {
            id: JobId::random(),
            user: "alice".into(),
            user_key: None,
            spec,
            submitted_at: mgpu_protocol::now() - Duration::seconds(submitted_secs_ago),
            attempt: 1,
            state,
        }
    }

    fn queued() -> JobState {
        JobState::Queued(Waiting::new(WaitReason::Resources))
    }

    fn placement(node: &str, gpus: &[(u32, GpuAmount)]) -> Placement {
        Placement::single(
            node,
            gpus.iter()
                .map(|&(index, amount)| GpuShare {
                    index,
                    amount,
                    mem_mib: 0,
                })
                .collect(),
        )
    }

    fn running(node: &str, gpus: &[(u32, GpuAmount)]) -> JobState {
        let mut run = Run::assigned(placement(node, gpus), mgpu_protocol::now());
        run.started_at = Some(mgpu_protocol::now());
        run.pid = Some(1);
        JobState::Running(run)
    }

    fn finished(secs_ago: i64) -> JobState {
        JobState::Succeeded(Ending {
            placement: None,
            started_at: None,
            ended_at: mgpu_protocol::now() - Duration::seconds(secs_ago),
            exit_code: Some(0),
            signal: None,
            reason: None,
        })
    }

    #[test]
    fn running_then_queued_by_priority_and_age_then_finished_by_end() {
        let jobs = vec![
            job("done-late", finished(10), 0, 100),
            job("low-old", queued(), 0, 50),
            job("high-new", queued(), 5, 1),
            job("done-early", finished(60), 0, 100),
            job("low-new", queued(), 0, 5),
            job("run", running("n1", &[(0, GpuAmount::ONE)]), -3, 200),
        ];
        let now = mgpu_protocol::now();
        let listing = Cluster::default().listing(jobs, true, now);
        let names: Vec<String> = listing
            .iter()
            .map(|(record, _)| record.spec.display_name())
            .collect();
        assert_eq!(
            names,
            [
                "run",
                "high-new",
                "low-old",
                "low-new",
                "done-early",
                "done-late"
            ]
        );
    }

    #[test]
    fn fair_share_and_requeues_reorder_equal_priorities() {
        let now = mgpu_protocol::now();
        let mut heavy = job("heavy", queued(), 0, 3_600);
        heavy.user = "bob".into();
        let light = job("light", queued(), 0, 60);
        // Requeued a minute ago after waiting two hours: its wait counts from the requeue.
        let mut requeued = job("requeued", queued(), 0, 7_200);
        if let JobState::Queued(waiting) = &mut requeued.state {
            waiting.enqueued_at = Some(now - Duration::seconds(30));
        }
        let mut cluster = Cluster::default();
        let half_life = cluster.policy.half_life_secs;
        cluster.usage.add("bob", 36_000.0, now, half_life);
        let listing = cluster.listing(vec![heavy, requeued, light], false, now);
        let names: Vec<String> = listing
            .iter()
            .map(|(record, _)| record.spec.display_name())
            .collect();
        assert_eq!(names, ["light", "requeued", "heavy"]);
        let heavy_priority = listing
            .iter()
            .nth(2)
            .and_then(|(_, e)| e)
            .unwrap_or_default();
        // 10 GPU-hours × 100 points taken, one hour × 100 points given.
        assert_eq!(heavy_priority, -900);
    }

    fn heartbeat(node: &str, gpus: u32) -> NodeHeartbeat {
        NodeHeartbeat {
            node: node.into(),
            sent_at: mgpu_protocol::now(),
            interval_ms: 2_000,
            gpu_source: GpuSource::Declared,
            gpu_note: None,
            gpus: (0..gpus)
                .map(|index| GpuStatus {
                    index,
                    uuid: format!("GPU-{index}"),
                    name: "Fake".into(),
                    memory_total_mib: 1_000,
                    memory_used_mib: 100 * u64::from(index),
                    utilization_pct: 0,
                    foreign_processes: vec![],
                })
                .collect(),
            running: vec![],
            address: "127.0.0.1".into(),
            runs_jobs_as: "mgpu".into(),
            agent_version: "0".into(),
            mem_threshold: DEFAULT_THRESHOLD,
            load_threshold: DEFAULT_THRESHOLD,
            labels: Default::default(),
            fence_after_ms: None,
            kill_grace_ms: 0,
        }
    }

    #[test]
    fn a_gpu_is_busy_when_any_running_job_holds_a_share_of_it() {
        let half = GpuAmount::from_units(5_000);
        let jobs = vec![
            job("a", running("n1", &[(0, half)]), 0, 1),
            job(
                "b",
                running("n1", &[(2, GpuAmount::ONE), (3, GpuAmount::ONE)]),
                0,
                1,
            ),
            // Other nodes, queued and finished jobs hold nothing here.
            job("c", running("n2", &[(1, GpuAmount::ONE)]), 0, 1),
            job("d", queued(), 0, 1),
            job("e", finished(1), 0, 1),
        ];
        let row = node_row(&heartbeat("n1", 4), &jobs, None, mgpu_protocol::now(), 3);
        assert_eq!((row.gpus_free, row.gpus_total), (1, 4));
        assert_eq!((row.mem_used_mib, row.mem_total_mib), (600, 4_000));
        assert_eq!(row.state, NodeState::Online);
        assert_eq!(row.jobs_running, 2);
        assert_eq!(busy_gpus("n1", &jobs), BTreeSet::from([0, 2, 3]));
    }

    #[test]
    fn drained_nodes_and_paused_gpus_show() {
        let mark = AdminMark {
            by: "root".into(),
            at: mgpu_protocol::now(),
            reason: None,
        };
        let mut admin = NodeAdmin::default();
        admin.paused_gpus.insert(1, mark.clone());
        let now = mgpu_protocol::now();
        let row = node_row(&heartbeat("n1", 4), &[], Some(&admin), now, 3);
        assert_eq!((row.gpus_free, row.gpus_paused), (3, 1));
        assert_eq!(node_state_name(&row), "online");
        admin.drained = Some(mark);
        let idle = node_row(&heartbeat("n1", 4), &[], Some(&admin), now, 3);
        assert_eq!(node_state_name(&idle), "drained");
        let busy = vec![job("a", running("n1", &[(0, GpuAmount::ONE)]), 0, 1)];
        let draining = node_row(&heartbeat("n1", 4), &busy, Some(&admin), now, 3);
        assert_eq!(node_state_name(&draining), "draining");
        let json = serde_json::to_value(&draining).unwrap_or_default();
        assert_eq!(json["state"], "draining");
        assert_eq!(json["admin"]["drained"]["by"], "root");
        assert_eq!(json["gpus_paused"], 1);
    }

    #[test]
    fn a_silent_node_is_offline_after_the_policys_missed_heartbeats() {
        let now = mgpu_protocol::now();
        let mut beat = heartbeat("n1", 1);
        // Interval 2 s, last heard 5 s ago: two and a half heartbeats missed.
        beat.sent_at = now - Duration::milliseconds(5_000);
        assert_eq!(node_row(&beat, &[], None, now, 3).state, NodeState::Online);
        assert_eq!(node_row(&beat, &[], None, now, 2).state, NodeState::Offline);
        // Offline wins over a drain, which the table still mentions.
        let admin = NodeAdmin {
            drained: Some(AdminMark {
                by: "root".into(),
                at: now,
                reason: None,
            }),
            ..NodeAdmin::default()
        };
        let row = node_row(&beat, &[], Some(&admin), now, 2);
        assert_eq!(row.state, NodeState::Offline);
        assert_eq!(node_state_name(&row), "offline, drained");
        let json = serde_json::to_value(&row).unwrap_or_default();
        assert_eq!(json["state"], "offline");
    }

    #[test]
    fn rows_show_placement_and_reason() {
        let queued_job = job("train", queued(), 0, 90);
        let cells = job_cells(&queued_job, Some(2), mgpu_protocol::now());
        assert_eq!(cells[4], "2");
        assert_eq!(cells[6], "-");
        assert_eq!(cells[7], "1m30s");
        assert_eq!(cells[8], "waiting for GPUs to become free");
        let mut held = job("train", queued(), 0, 1);
        if let JobState::Queued(waiting) = &mut held.state {
            waiting.reason = WaitReason::Held;
            waiting.held_by = Some("bob".into());
        }
        assert_eq!(
            job_cells(&held, Some(0), mgpu_protocol::now())[8],
            "held by bob"
        );
        let running_job = job(
            "train",
            running("node001", &[(0, GpuAmount::ONE), (1, GpuAmount::ONE)]),
            0,
            1,
        );
        let cells = job_cells(&running_job, None, mgpu_protocol::now());
        assert_eq!((cells[4].as_str(), cells[6].as_str()), ("-", "node001:0,1"));
    }
}
