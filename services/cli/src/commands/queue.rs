//! `mgpu queue`: the jobs and the nodes, read straight from JetStream (works while the
//! scheduler is down); the reading and ordering are the read model's ([`crate::model`]). A
//! waiting job's START is when the scheduler's last pass expects it to start (stored in the
//! cluster bucket by the scheduler), `unknown` where the pass could not date it.
//!
//! Built to list 100 000 waiting jobs in well under two seconds: records are decoded as they
//! arrive and without the parts of the spec no listing shows; sorting compares keys computed
//! once per job; and both the table and `--json` are written through one buffered handle on
//! stdout, `--json` one job per line as it is serialised, never as one document in memory.

use std::io::{BufWriter, Write};
use std::process::ExitCode;

use anyhow::Result;
use clap::Args;
use mgpu_protocol::Timestamp;
use mgpu_protocol::duration::format_duration;
use mgpu_protocol::job::{JobRecord, JobState, JobSummary};
use mgpu_protocol::plan::{ExpectedStart, PlanSnapshot, start_cell};
use serde::Serialize;

use crate::client::session::{ConnectionArgs, Session};
use crate::human;
use crate::model::jobs::{Listing, queued_at};
use crate::model::nodes::NodeRow;
use crate::model::snapshot::Snapshot;
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

/// One job as `--json` prints it: the shared summary plus what only the queue knows.
#[derive(Debug, Serialize)]
struct QueueJob<'a> {
    #[serde(flatten)]
    summary: JobSummary,
    /// Null unless queued.
    effective_priority: Option<i64>,
    held_by: Option<&'a str>,
    /// When the scheduler expects it to start; null unless queued and dated by its plan.
    expected_start: Option<Timestamp>,
    /// The reservation it runs in (`--reservation`); absent when none.
    #[serde(skip_serializing_if = "Option::is_none")]
    reservation: Option<&'a str>,
}

fn held_by(job: &JobRecord) -> Option<&str> {
    match &job.state {
        JobState::Queued(waiting) => waiting.held_by.as_deref(),
        _ => None,
    }
}

pub async fn run(connection: &ConnectionArgs, args: &QueueArgs) -> Result<ExitCode> {
    let session = Session::connect(connection).await?;
    let snapshot = Snapshot::read(&session.js).await?;
    let now = mgpu_protocol::now();
    let node_rows = snapshot.node_rows(now);
    let listed = Listing::new(snapshot.jobs, &snapshot.cluster, args.all, now);

    // One buffered handle on stdout for everything: Rust's stdout alone flushes every line.
    let mut out = BufWriter::with_capacity(1 << 16, std::io::stdout().lock());
    let plan = &snapshot.cluster.plan;
    if args.json {
        write_json(&mut out, &listed, &node_rows, plan)?;
    } else {
        write_tables(&mut out, &listed, &node_rows, plan, args.all, now)?;
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
fn write_json(
    out: &mut impl Write,
    listed: &Listing,
    nodes: &[NodeRow],
    plan: &PlanSnapshot,
) -> std::io::Result<()> {
    out.write_all(b"{\"jobs\": [")?;
    for (index, (record, effective)) in listed.iter().enumerate() {
        out.write_all(if index == 0 { b"\n" } else { b",\n" })?;
        let item = QueueJob {
            summary: record.summary(),
            effective_priority: effective,
            held_by: held_by(record),
            expected_start: queued_start(record, plan).and_then(|s| s.at),
            reservation: record.spec.reservation.as_deref(),
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
    plan: &PlanSnapshot,
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
            "START",
            "REASON",
        ])
        .with_capacity(listed.len());
        for (record, effective) in listed.iter() {
            table.row(job_cells(record, effective, plan, now));
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
                human::node_state(row),
                format!("{}/{} free{paused}", row.gpus_free, row.gpus_total),
                human::mib_pair(row.mem_used_mib, row.mem_total_mib),
                human::gpu_source(row.gpu_source).to_owned(),
            ]);
        }
        table.write_to(out)?;
    }
    Ok(())
}

/// A queued job's expected start, where the scheduler's plan dated it.
fn queued_start<'a>(job: &JobRecord, plan: &'a PlanSnapshot) -> Option<&'a ExpectedStart> {
    match job.state {
        JobState::Queued(_) => plan.jobs.get(&job.id),
        _ => None,
    }
}

fn job_cells(
    job: &JobRecord,
    effective: Option<i64>,
    plan: &PlanSnapshot,
    now: Timestamp,
) -> Vec<String> {
    let start = match &job.state {
        JobState::Queued(_) => start_cell(queued_start(job, plan), now, &chrono::Local),
        _ => "-".to_owned(),
    };
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
        start,
        reason,
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{job, queued, running};
    use mgpu_protocol::gpu_amount::GpuAmount;
    use mgpu_protocol::job::WaitReason;

    #[test]
    fn rows_show_placement_start_and_reason() {
        let queued_job = job("train", queued(), 0, 90);
        let now = mgpu_protocol::now();
        let none = PlanSnapshot::default();
        let cells = job_cells(&queued_job, Some(2), &none, now);
        assert_eq!(cells[4], "2");
        assert_eq!(cells[6], "-");
        assert_eq!(cells[7], "1m30s");
        assert_eq!(cells[8], "unknown");
        assert_eq!(cells[9], "waiting for GPUs to become free");
        let mut plan = PlanSnapshot::default();
        plan.jobs.insert(
            queued_job.id.clone(),
            ExpectedStart {
                at: Some(now - chrono::Duration::seconds(1)),
                nodes: vec!["node001".into()],
                reserved: true,
            },
        );
        assert_eq!(job_cells(&queued_job, Some(2), &plan, now)[8], "now");
        let mut held = job("train", queued(), 0, 1);
        if let JobState::Queued(waiting) = &mut held.state {
            waiting.reason = WaitReason::Held;
            waiting.held_by = Some("bob".into());
        }
        assert_eq!(job_cells(&held, Some(0), &none, now)[9], "held by bob");
        let running_job = job(
            "train",
            running("node001", &[(0, GpuAmount::ONE), (1, GpuAmount::ONE)]),
            0,
            1,
        );
        let cells = job_cells(&running_job, None, &plan, now);
        assert_eq!(
            (cells[4].as_str(), cells[6].as_str(), cells[8].as_str()),
            ("-", "node001:0,1", "-")
        );
    }
}
