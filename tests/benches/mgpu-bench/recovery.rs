//! Scenario 7, recovery: the scheduler is SIGKILLed with 10 000 jobs waiting, and a new one is
//! started at once. Measured from the new scheduler's log (its own clock, millisecond
//! timestamps): from taking the scheduler lease to "scheduler ready", which it logs right after
//! its first scheduling pass — loading every record, reading the reports it missed and making
//! its first decisions. The lease the killed scheduler held expires by itself after
//! `LEADER_LEASE_TTL_SECS`; the time from the kill to the first decision, that wait included,
//! is reported beside the figure.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use chrono::{DateTime, Utc};
use mgpu_tests::{Cluster, without_colours};
use serde_json::json;

use crate::common::*;

pub fn run(ctx: &Run) -> Result<()> {
    let (jobs, samples) = if ctx.quick { (10_000, 2) } else { (10_000, 5) };
    progress(&format!(
        "recovery: {jobs} jobs waiting, {samples} restarts"
    ));
    let mut cluster = one_busy_gpu()?;
    submit_waiting_jobs(&cluster, jobs)?;
    progress(&format!("  {jobs} jobs recorded"));

    let mut ready_ms = Vec::new();
    let mut since_kill_ms = Vec::new();
    for round in 0..samples {
        cluster.kill_scheduler();
        let killed_at = Utc::now();
        let spawned = Instant::now();
        cluster.start_scheduler();
        let (lease_at, ready_at) = wait_for_log_times(&cluster, killed_at)?;
        let ready = (ready_at - lease_at).num_milliseconds() as f64;
        let total = (ready_at - killed_at).num_milliseconds() as f64;
        progress(&format!(
            "  restart {}: first decision {ready} ms after taking the lease, {total} ms after the kill ({:.0} ms after spawning)",
            round + 1,
            spawned.elapsed().as_secs_f64() * 1000.0
        ));
        ready_ms.push(ready);
        since_kill_ms.push(total);
    }
    keep_log(&cluster, "scheduler", "recovery");
    let summary = summarize(&ready_ms)?;
    let since_kill = summarize(&since_kill_ms)?;
    ctx.report(
        "recovery_first_decision",
        summary.median,
        "ms",
        Target::AtMost(2000.0),
        true,
        Some("<= 2000 ms (median, from taking over to the first decision)".into()),
        &summary,
        "ms from taking the lease to the first pass done",
        json!({
            "jobs_waiting": jobs,
            "since_kill_ms": {
                "min": round3(since_kill.min),
                "median": round3(since_kill.median),
                "max": round3(since_kill.max),
            },
            "lease_ttl_s": mgpu_protocol::subjects::LEADER_LEASE_TTL_SECS,
        }),
    );
    Ok(())
}

/// The times, after `since`, at which the scheduler log says it took the lease and that it is
/// ready (its first pass done).
pub fn wait_for_log_times(
    cluster: &Cluster,
    since: DateTime<Utc>,
) -> Result<(DateTime<Utc>, DateTime<Utc>)> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let log = std::fs::read_to_string(cluster.log_path("scheduler"))
            .context("reading the scheduler log")?;
        let lease = last_time_of(&log, "holding the scheduler lease", since);
        let ready = last_time_of(&log, "scheduler ready", since);
        if let (Some(lease), Some(ready)) = (lease, ready) {
            return Ok((lease, ready));
        }
        if Instant::now() > deadline {
            return Err(anyhow!("no \"scheduler ready\" in the log within 60 s"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The timestamp of the last log line containing `text`, if it is after `since`.
fn last_time_of(log: &str, text: &str, since: DateTime<Utc>) -> Option<DateTime<Utc>> {
    log.lines()
        .rev()
        .filter(|l| l.contains(text))
        .find_map(|line| {
            // Lines start with an RFC 3339 time, possibly wrapped in colour codes.
            let plain = without_colours(line);
            let stamp = plain.split_whitespace().next()?;
            let at = DateTime::parse_from_rfc3339(stamp)
                .ok()?
                .with_timezone(&Utc);
            (at >= since).then_some(at)
        })
}
