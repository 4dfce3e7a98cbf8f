//! Scenario 8, history: what a year of finished jobs costs once they left the live bucket.
//! One agent with its one GPU busy, 1 000 jobs waiting; then finished records written into
//! the history stream as the scheduler moves them there (many users' jobs, each with a
//! typical environment). Measured, each against the same with no history:
//! - `queue_latency_with_history`: `mgpu queue` with 1 000 waiting and 100 000 in history;
//! - `history_query_1m`: alice's `mgpu history --since 1d` (her jobs of the last day, one in a
//!   hundred) with 1 000 000 in history (`--quick`: 100 000);
//! - `restart_with_history`: the scheduler SIGKILLed and started again, from taking the lease
//!   to its first decision, and its memory then, with that history against none.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use chrono::Utc;
use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::{Ending, JobRecord, JobSpec, JobState};
use mgpu_protocol::principals::Role;
use mgpu_protocol::subjects;
use mgpu_tests::Cluster;
use serde_json::json;

use crate::common::*;

/// Users the history records are spread over.
const USERS: usize = 100;
/// Writes in flight at once.
const WINDOW: usize = 256;

pub fn run(ctx: &Run) -> Result<()> {
    let (for_queue, total, samples) = if ctx.quick {
        (20_000, 100_000, 5)
    } else {
        (100_000, 1_000_000, 20)
    };
    progress(&format!(
        "history: 1 000 waiting, then {total} finished jobs in history"
    ));
    let mut cluster = one_busy_gpu()?;
    submit_waiting_jobs(&cluster, 1000)?;
    let queue_before = median_ms(&cluster, &["queue"], samples)?;
    let (restart_before, rss_before) = restart(&mut cluster)?;

    let written = write_history(&cluster, 0, for_queue)?;
    let queue_after = median_ms(&cluster, &["queue"], samples)?;
    ctx.report(
        "queue_latency_with_history",
        queue_after.median,
        "ms",
        Target::AtMost(15.0),
        true,
        None,
        &queue_after,
        "ms per `mgpu queue` (1 000 waiting)",
        json!({"history_jobs": for_queue, "without_history_ms": round3(queue_before.median),
               "write_s": round3(written.as_secs_f64())}),
    );

    let written = write_history(&cluster, for_queue, total)?;
    let query = ["history", "--since", "1d"];
    let history_query = median_ms(&cluster, &query, samples.min(5))?;
    let listed = run_mgpu(&cluster, &query)?
        .lines()
        .count()
        .saturating_sub(1);
    ctx.report(
        if ctx.quick {
            "history_query_100k"
        } else {
            "history_query_1m"
        },
        history_query.median,
        "ms",
        Target::AtMost(1000.0),
        true,
        None,
        &history_query,
        "ms per alice's `mgpu history --since 1d`",
        json!({"history_jobs": total, "jobs_listed": listed,
               "write_s": round3(written.as_secs_f64())}),
    );

    let (restart_after, rss_after) = restart(&mut cluster)?;
    keep_log(&cluster, "scheduler", "history");
    ctx.report(
        "restart_with_history",
        restart_after,
        "ms",
        Target::AtMost(restart_before * 1.2 + 50.0),
        rss_after <= rss_before * 1.2 + 8.0,
        Some("as fast as without history (within 20 % + 50 ms), memory within 20 % + 8 MiB".into()),
        &summarize(&[restart_after])?,
        "ms from taking the lease to the first pass done",
        json!({"history_jobs": total, "jobs_waiting": 1000,
               "without_history_ms": round3(restart_before),
               "rss_mib": round3(rss_after), "without_history_rss_mib": round3(rss_before)}),
    );
    Ok(())
}

/// `mgpu ARGS` run `samples` times; their wall times in ms.
fn median_ms(cluster: &Cluster, args: &[&str], samples: usize) -> Result<Summary> {
    let mut times = Vec::with_capacity(samples);
    for _ in 0..samples {
        let started = Instant::now();
        run_mgpu(cluster, args)?;
        times.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    summarize(&times)
}

/// Writes finished records `from..to` into the history stream, as the scheduler moves them
/// there: user `user<N % 100>` (user 7 is alice, with her key), ended a minute ago, with a
/// typical environment.
fn write_history(cluster: &Cluster, from: usize, to: usize) -> Result<Duration> {
    progress(&format!("  writing history records {from}..{to}"));
    let env = crate::queue::environment();
    let alice = user_key(&cluster.user_creds("alice"))?.public_key();
    let creds = cluster.creds(Role::Scheduler, "scheduler");
    cluster.with_nats(&creds, |client| async move {
        let js = async_nats::jetstream::new(client);
        let started = Instant::now();
        let mut in_flight = std::collections::VecDeque::with_capacity(WINDOW);
        for index in from..to {
            if in_flight.len() >= WINDOW
                && let Some(ack) = in_flight.pop_front()
            {
                let ack: async_nats::jetstream::context::PublishAckFuture = ack;
                ack.await.context("a history record was not stored")?;
            }
            let (user, key) = match index % USERS {
                7 => ("alice".to_owned(), Some(alice.clone())),
                n => (format!("user{n:03}"), None),
            };
            let mut spec = JobSpec::new(vec!["python".into(), "train.py".into()], "/home/x");
            spec.env = env.clone();
            let ended_at = Utc::now() - chrono::Duration::minutes(1);
            let record = JobRecord {
                id: JobId::random(),
                user: user.clone(),
                user_key: key,
                spec,
                submitted_at: ended_at - chrono::Duration::hours(1),
                attempt: 1,
                state: JobState::Succeeded(Ending {
                    placement: None,
                    started_at: Some(ended_at - chrono::Duration::minutes(50)),
                    ended_at,
                    exit_code: Some(0),
                    signal: None,
                    reason: None,
                    usage: None,
                }),
                last_request: None,
                preemptions: Vec::new(),
            };
            let subject = subjects::history(subjects::history_owner(&record), &record.id);
            in_flight.push_back(
                js.publish(subject, serde_json::to_vec(&record)?.into())
                    .await?,
            );
            if (index + 1) % 100_000 == 0 {
                progress(&format!("  {} written", index + 1));
            }
        }
        while let Some(ack) = in_flight.pop_front() {
            ack.await.context("a history record was not stored")?;
        }
        let took = started.elapsed();
        // Measured once the server has settled after the burst of writes: 3 s was not enough
        // (`mgpu queue` measured 1 to 6 ms slower then), 15 s was.
        tokio::time::sleep(Duration::from_secs(15)).await;
        Ok(took)
    })
}

/// The scheduler SIGKILLed and started again: ms from taking the lease to its first pass,
/// and its resident memory (MiB) then.
fn restart(cluster: &mut Cluster) -> Result<(f64, f64)> {
    cluster.kill_scheduler();
    let killed_at = Utc::now();
    cluster.start_scheduler();
    let (lease_at, ready_at) = crate::recovery::wait_for_log_times(cluster, killed_at)?;
    let pid = cluster.scheduler_pid("scheduler");
    let rss_kib: f64 = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|line| line.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0.0);
    let ready_ms = (ready_at - lease_at).num_milliseconds() as f64;
    progress(&format!(
        "  restart: first decision {ready_ms} ms after taking the lease, {:.1} MiB resident",
        rss_kib / 1024.0
    ));
    Ok((ready_ms, rss_kib / 1024.0))
}
