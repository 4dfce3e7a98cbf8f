//! `mgpu show`'s lines about where the job is in its life: where it runs or ran, why it
//! waits, how long it has run (and whether its GPUs sit idle under a warning), how it ended
//! and what its last attempt used.

use std::time::Duration;

use mgpu_protocol::Timestamp;
use mgpu_protocol::duration::format_duration;
use mgpu_protocol::host::{JobUsage, format_mib};
use mgpu_protocol::job::{Ending, JobRecord, Placement, Run, Waiting};
use mgpu_protocol::plan::ExpectedStart;

use super::Line;
use crate::human;

/// Where the job runs or ran: each rank's node and GPUs, or the one node and its GPU shares.
pub(super) fn placement_lines(placement: &Placement, lines: &mut Vec<Line>) {
    if placement.node_count() > 1 {
        for (rank, node, shares) in placement.ranks() {
            let gpus: Vec<u32> = shares.iter().map(|g| g.index).collect();
            lines.push((
                "rank",
                format!("{rank}: {node}, GPUs {}", human::index_list(&gpus)),
            ));
        }
        if let Some(launch) = &placement.launch {
            lines.push((
                "master",
                format!(
                    "{}:{}",
                    launch.addresses.first().map_or("-", String::as_str),
                    launch.master_port
                ),
            ));
        }
        return;
    }
    lines.push(("node", placement.node.clone()));
    let gpus = placement
        .gpus
        .iter()
        .map(|g| {
            if g.amount.is_whole() {
                g.index.to_string()
            } else {
                format!("{} ({} of it)", g.index, g.amount)
            }
        })
        .collect::<Vec<_>>()
        .join(", ");
    lines.push(("gpus", if gpus.is_empty() { "none".into() } else { gpus }));
    if placement.cpus > 0 {
        lines.push(("cpus", format!("{} booked", placement.cpus)));
    }
    if placement.mem_host_mib > 0 {
        lines.push((
            "host memory",
            format!("{} limit", format_mib(placement.mem_host_mib)),
        ));
    }
}

pub(super) fn waiting_lines(
    waiting: &Waiting,
    record: &JobRecord,
    now: Timestamp,
    lines: &mut Vec<Line>,
) {
    let queued_at = waiting.enqueued_at.unwrap_or(record.submitted_at);
    if waiting.enqueued_at.is_some() {
        lines.push(("enqueued", human::time_with_age(queued_at, now)));
    }
    lines.push(("waiting", format_duration(human::elapsed(queued_at, now))));
    lines.push(("reason", waiting.reason.describe().to_owned()));
    if let Some(by) = &waiting.held_by {
        lines.push(("held by", by.clone()));
    }
}

/// When a waiting job is expected to start, with what the time assumes.
pub(super) fn expected_start(start: Option<&ExpectedStart>, now: Timestamp) -> String {
    match start {
        None => "unknown (the scheduler's last pass could not date it: it waits for something \
                 other than GPUs, or sits too far back in the queue; mgpu why says more)"
            .to_owned(),
        Some(ExpectedStart {
            at: None, nodes, ..
        }) => format!(
            "unknown (a job without a time limit holds the GPUs it waits for on {})",
            nodes.join(", ")
        ),
        Some(ExpectedStart {
            at: Some(at),
            nodes,
            reserved,
        }) => {
            let when = match *at <= now {
                true => "now (its GPUs are free; the next pass places it)".to_owned(),
                false => format!(
                    "{} (in {}, if the jobs running and ahead of it end by their time limits)",
                    human::time_with_age(*at, now)
                        .split(" (")
                        .next()
                        .unwrap_or_default(),
                    format_duration(human::elapsed(now, *at))
                ),
            };
            let held = match reserved {
                true => "reserved for it",
                false => "counted on",
            };
            format!("{when}; on {}, GPUs {held}", nodes.join(", "))
        }
    }
}

pub(super) fn running_lines(run: &Run, now: Timestamp, lines: &mut Vec<Line>) {
    lines.push(("assigned", human::time_with_age(run.assigned_at, now)));
    if let Some(started) = run.started_at {
        lines.push(("started", human::time_with_age(started, now)));
        lines.push(("running for", format_duration(human::elapsed(started, now))));
    }
    if let Some(pid) = run.pid {
        lines.push(("pid", pid.to_string()));
    }
    if let Some(by) = &run.cancel_requested_by {
        lines.push(("cancel requested by", by.clone()));
    }
    if let Some(warning) = &run.idle_warning {
        lines.push(("idle", human::idle_warning(warning, now)));
    }
}

pub(super) fn ending_lines(end: &Ending, now: Timestamp, lines: &mut Vec<Line>) {
    if let Some(started) = end.started_at {
        lines.push(("started", human::time_with_age(started, now)));
    }
    lines.push(("ended", human::time_with_age(end.ended_at, now)));
    if let Some(started) = end.started_at {
        let ran: Duration = human::elapsed(started, end.ended_at);
        lines.push(("ran for", format_duration(ran)));
    }
    if let Some(code) = end.exit_code {
        lines.push(("exit code", code.to_string()));
    }
    if let Some(signal) = end.signal {
        lines.push(("signal", signal.to_string()));
    }
    if let Some(reason) = &end.reason {
        lines.push(("reason", reason.clone()));
    }
    if let Some(usage) = &end.usage {
        usage_lines(usage, lines);
    }
}

/// What the job's last attempt used, as its node measured it.
fn usage_lines(usage: &JobUsage, lines: &mut Vec<Line>) {
    if let Some(bytes) = usage.peak_mem_host_bytes {
        lines.push(("peak host memory", format_mib(bytes.div_ceil(1024 * 1024))));
    }
    if let Some(ms) = usage.cpu_time_ms {
        lines.push(("cpu time", format!("{:.2} s", ms as f64 / 1000.0)));
    }
    for gpu in &usage.gpu_peak_mem {
        lines.push((
            "peak gpu memory",
            format!("GPU {}: {}", gpu.index, format_mib(gpu.peak_mib)),
        ));
    }
    if let Some(secs) = usage.idle_gpu_secs {
        lines.push(("idle GPU time", format_duration(Duration::from_secs(secs))));
    }
}
