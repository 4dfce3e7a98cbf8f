//! `mgpu history`: finished jobs, like Slurm's `sacct`: those still in the live bucket and
//! those the scheduler moved to the history stream after `keep_finished`, filtered by user
//! (yours unless told otherwise), state, when they ended, node and name; a table, or with
//! `--json` one job per line.

use std::io::{BufWriter, Write};
use std::process::ExitCode;

use anyhow::Result;
use clap::Args;
use mgpu_protocol::Timestamp;
use mgpu_protocol::duration::format_duration;
use mgpu_protocol::job::{JobRecord, JobSummary};
use serde::Serialize;

use crate::client::session::{ConnectionArgs, Session};
use crate::human;
use crate::model::accounting;
use crate::model::history::{self, HistoryFilter};
use crate::parse;
use crate::tables::Table;

/// The states a finished job can be in.
const FINISHED_STATES: [&str; 5] = [
    "succeeded",
    "failed",
    "cancelled",
    "timed_out",
    "node_failed",
];

#[derive(Debug, Args)]
pub struct HistoryArgs {
    /// Whose jobs (default: yours).
    #[arg(long, value_name = "USER", conflicts_with = "all_users")]
    pub user: Option<String>,

    /// Everyone's jobs.
    #[arg(long)]
    pub all_users: bool,

    /// Only jobs that ended in these states: succeeded, failed, cancelled, timed_out,
    /// node_failed (comma-separated).
    #[arg(long, value_name = "STATE[,STATE]", value_delimiter = ',', value_parser = finished_state)]
    pub state: Vec<String>,

    /// Only jobs that ended at or after this time: a date (2026-11-01), a date and time
    /// (2026-11-01T08:00:00Z, `2026-11-01 08:00`), an age (3d, 12h), today or yesterday
    /// (midnight UTC, or with a time: `yesterday 18:00`).
    #[arg(long, value_name = "WHEN", value_parser = parse::point_in_time)]
    pub since: Option<Timestamp>,

    /// Only jobs that ended before this time (same forms as --since).
    #[arg(long, value_name = "WHEN", value_parser = parse::point_in_time)]
    pub until: Option<Timestamp>,

    /// Only jobs that ran on this node (any of their nodes).
    #[arg(long, value_name = "NODE")]
    pub node: Option<String>,

    /// Only jobs whose name matches this pattern (`*` and `?` wildcards: 'bert-*').
    #[arg(long, value_name = "GLOB")]
    pub name: Option<String>,

    /// At most this many jobs: the ones that ended last.
    #[arg(long, value_name = "N")]
    pub limit: Option<usize>,

    /// One JSON object per job and line (the summary `mgpu show --json` prints, plus
    /// `gpu_hours`), oldest first.
    #[arg(long)]
    pub json: bool,
}

fn finished_state(text: &str) -> Result<String, String> {
    let state = text.trim().to_ascii_lowercase();
    if FINISHED_STATES.contains(&state.as_str()) {
        Ok(state)
    } else {
        Err(format!(
            "`{text}` is not the state of a finished job: {}",
            FINISHED_STATES.join(", ")
        ))
    }
}

/// One job as `--json` prints it.
#[derive(Debug, Serialize)]
struct HistoryJob {
    #[serde(flatten)]
    summary: JobSummary,
    gpu_hours: f64,
}

pub async fn run(connection: &ConnectionArgs, args: &HistoryArgs) -> Result<ExitCode> {
    let session = Session::connect(connection).await?;
    let mine = session.key.public_key();
    let filter = HistoryFilter {
        // Yours by your key; another user's (admins only) by name among everyone's.
        owner: (args.user.is_none() && !args.all_users).then(|| mine.clone()),
        user: args.user.clone().filter(|_| !args.all_users),
        states: args.state.clone(),
        since: args.since,
        until: args.until,
        node: args.node.clone(),
        name: args.name.clone(),
    };
    if filter.owner.as_ref() != Some(&mine) && !history::may_read(&session.js, &filter).await {
        return Err(anyhow::anyhow!(
            "only admins may read other users' history; yours is `mgpu history`"
        ));
    }
    let mut jobs = history::read(&session.js, &filter).await?;
    if let Some(limit) = args.limit {
        let skip = jobs.len().saturating_sub(limit);
        jobs.drain(..skip);
    }
    let mut out = BufWriter::new(std::io::stdout().lock());
    if args.json {
        for job in &jobs {
            let line = HistoryJob {
                summary: job.summary(),
                gpu_hours: round3(gpu_hours(job)),
            };
            serde_json::to_writer(&mut out, &line)?;
            out.write_all(b"\n")?;
        }
    } else {
        table(&jobs, mgpu_protocol::now()).write_to(&mut out)?;
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

fn round3(value: f64) -> f64 {
    (value * 1000.0).round() / 1000.0
}

/// GPU-hours a finished job used (see [`accounting::gpu_seconds`]).
fn gpu_hours(job: &JobRecord) -> f64 {
    accounting::gpu_seconds(job) / 3600.0
}

fn table(jobs: &[JobRecord], now: Timestamp) -> Table {
    let mut table = Table::new([
        "ID",
        "NAME",
        "USER",
        "STATE",
        "EXIT",
        "NODES",
        "GPUS",
        "SUBMITTED",
        "STARTED",
        "RAN",
        "GPU-H",
        "REASON",
    ])
    .with_capacity(jobs.len());
    for job in jobs {
        let end = job.state.ending();
        let placement = end.and_then(|e| e.placement.as_ref());
        let started = end.and_then(|e| e.started_at);
        let ran = match (started, end) {
            (Some(started), Some(end)) => format_duration(human::elapsed(started, end.ended_at)),
            _ => "-".to_owned(),
        };
        table.row(vec![
            job.id.short().to_owned(),
            job.spec.display_name(),
            job.user.clone(),
            job.state.name().to_owned(),
            job.exit_code().map_or("-".to_owned(), |c| c.to_string()),
            placement.map_or("-".to_owned(), |p| p.node_names().join(",")),
            placement.map_or("-".to_owned(), |p| human::index_list(&p.gpu_indices())),
            human::age(job.submitted_at, now),
            started.map_or("-".to_owned(), |s| human::age(s, now)),
            ran,
            format!("{:.2}", gpu_hours(job)),
            end.and_then(|e| e.reason.clone()).unwrap_or_default(),
        ]);
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_are_the_finished_ones_and_a_typo_names_them() {
        assert_eq!(finished_state("Failed"), Ok("failed".to_owned()));
        let err = finished_state("running").err().unwrap_or_default();
        assert!(
            err.contains("succeeded, failed, cancelled, timed_out, node_failed"),
            "{err}"
        );
    }

    #[test]
    fn gpu_hours_are_gpus_times_hours_run() {
        let mut job = crate::fixtures::job("train", crate::fixtures::finished(7200), 0, 9000);
        assert_eq!(gpu_hours(&job), 0.0, "no placement, no GPU time");
        if let mgpu_protocol::job::JobState::Succeeded(end) = &mut job.state {
            let gpus = vec![
                mgpu_protocol::job::GpuShare {
                    index: 0,
                    amount: mgpu_protocol::gpu_amount::GpuAmount::ONE,
                    mem_mib: 0,
                },
                mgpu_protocol::job::GpuShare {
                    index: 1,
                    amount: mgpu_protocol::gpu_amount::GpuAmount::ONE,
                    mem_mib: 0,
                },
            ];
            end.placement = Some(mgpu_protocol::job::Placement::single("n1", gpus));
            end.started_at = Some(end.ended_at - chrono::Duration::minutes(90));
        }
        assert!((gpu_hours(&job) - 3.0).abs() < 1e-9, "{}", gpu_hours(&job));
    }
}
