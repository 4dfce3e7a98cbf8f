//! Scenario 10, durability: what JetStream's `sync_interval: always` costs. Every nats-server
//! configuration mgpu writes sets it (the server writes each message to disk before it
//! acknowledges it); nats-server's default flushes every two minutes, which loses
//! acknowledged writes on a power failure or an OS crash. Each setting gets its own cluster
//! (one agent with 8 declared GPUs), and on it:
//!
//! - `durability_drain_rate_sync_*`: scenario 3's drain, `mgpu submit -- true` run by the CLI
//!   loop, from the first submit to the latest `ended_at` once all succeeded (every job is
//!   several stored messages: the request, its record's writes, the assignment, the agent's
//!   reports);
//! - `durability_submit_rate_sync_*`: submissions stored per second when a program publishes
//!   them with a window of acknowledgements in flight, the node drained so they only queue,
//!   until the scheduler has recorded them all (`durability_recorded_sync_*`: that last
//!   figure against the 5 s);
//! - `durability_array_recorded_sync_*`: `mgpu submit --array 0-N -- true` by the CLI to
//!   the drained node, from the command's start until the scheduler recorded every task; and
//!   how many of the jobs queued then are stored without their real wait reason (still
//!   "waiting for the scheduler to look at it": must be 0).
//!
//! Each line says which filesystem held the JetStream directory: on a tmpfs a sync costs
//! nothing, so the comparison means something only on a disk.

use std::collections::HashSet;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use mgpu_tests::{Cluster, JetStreamSync, NodeSpec};
use serde_json::json;

use crate::cli::{submit_loop, wait_drained};
use crate::common::*;

pub fn run(ctx: &Run) -> Result<()> {
    let (drain_jobs, submissions) = if ctx.quick {
        (300, 2000)
    } else {
        (1000, 10_000)
    };
    for sync in [JetStreamSync::Always, JetStreamSync::Default] {
        let (suffix, setting) = match sync {
            JetStreamSync::Always => ("sync_always", "always"),
            JetStreamSync::Default => ("sync_default", "default (2m)"),
        };
        progress(&format!(
            "cluster: one agent, 8 GPUs, JetStream sync_interval {setting}"
        ));
        let cluster = Cluster::start_with_sync(&[NodeSpec::new("node001", "8x24GiB")], sync);
        let store = filesystem_of(&cluster.dir.path().join("jetstream"));
        let setup = Setup {
            suffix,
            setting,
            store: &store,
        };
        drain(ctx, &cluster, drain_jobs, &setup)?;
        submit_rate(ctx, &cluster, submissions, &setup)?;
        array_recorded(ctx, &cluster, submissions, &setup)?;
    }
    Ok(())
}

/// The setting one cluster runs with, as the lines name it.
struct Setup<'a> {
    suffix: &'a str,
    setting: &'a str,
    store: &'a str,
}

/// Scenario 3's drain under this setting.
fn drain(ctx: &Run, cluster: &Cluster, jobs: usize, setup: &Setup) -> Result<()> {
    progress(&format!(
        "(10) drain: {jobs} x `mgpu submit -- true` to 8 GPUs"
    ));
    let first_submit = chrono::Utc::now();
    let (ids, durations, submit_wall) = submit_loop(cluster, jobs)?;
    let ids: HashSet<String> = ids.into_iter().collect();
    let last_end = wait_drained(cluster, &ids)?;
    let span = (last_end - first_submit)
        .to_std()
        .context("the last job ended before the first submit")?;
    ctx.report(
        &format!("durability_drain_rate_{}", setup.suffix),
        ids.len() as f64 / span.as_secs_f64(),
        "jobs/s",
        Target::AtLeast(250.0),
        true,
        None,
        &summarize(&durations)?,
        "ms per submit process (while jobs run)",
        json!({
            "sync_interval": setup.setting,
            "jetstream_fs": setup.store,
            "jobs": ids.len(),
            "gpus": 8,
            "span_s": round3(span.as_secs_f64()),
            "submit_wall_s": round3(submit_wall.as_secs_f64()),
        }),
    );
    Ok(())
}

/// Submissions a program stores per second (a window of 256 acknowledgements in flight),
/// the node drained so that the jobs only queue, until the scheduler recorded every one.
fn submit_rate(ctx: &Run, cluster: &Cluster, count: usize, setup: &Setup) -> Result<()> {
    progress(&format!(
        "(10) {count} submissions, pipelined, to a drained node"
    ));
    let drained = cluster
        .mgpu_command(&cluster.admin_creds(), &["node", "drain", "node001"])
        .output()
        .context("running mgpu node drain")?;
    if !drained.status.success() {
        bail!(
            "mgpu node drain failed: {}",
            String::from_utf8_lossy(&drained.stderr)
        );
    }
    let key = user_key(&cluster.user_creds("alice"))?;
    let (stored, recorded) = cluster.with_nats(&cluster.admin_creds(), |client| async move {
        let js = async_nats::jetstream::new(client.clone());
        let before = wait_for_status("the scheduler", Duration::from_secs(30), &client, |_| true)
            .await?
            .0["jobs_total"]
            .as_u64()
            .unwrap_or(0);
        let specs = (0..count)
            .map(|_| mgpu_protocol::job::JobSpec::new(vec!["true".into()], "/tmp"))
            .collect();
        let started = std::time::Instant::now();
        let (_, stored) = submit_pipelined(&js, &key, "alice", specs, 256).await?;
        wait_for_status(
            "every submission recorded",
            Duration::from_secs(600),
            &client,
            |s| s["jobs_total"].as_u64().unwrap_or(0) >= before + count as u64,
        )
        .await?;
        anyhow::Ok((stored, started.elapsed()))
    })?;
    let rate = count as f64 / stored.as_secs_f64();
    ctx.report(
        &format!("durability_submit_rate_{}", setup.suffix),
        rate,
        "submissions/s",
        Target::AtLeast(1000.0),
        true,
        Some(">= 1000 submissions/s stored (no target in the issue)".into()),
        &summarize(&[rate])?,
        "submissions/s over the whole run",
        json!({
            "sync_interval": setup.setting,
            "jetstream_fs": setup.store,
            "submissions": count,
            "window": 256,
            "stored_s": round3(stored.as_secs_f64()),
            "recorded_s": round3(recorded.as_secs_f64()),
            "recorded_per_s": round3(count as f64 / recorded.as_secs_f64()),
        }),
    );
    ctx.report(
        &format!("durability_recorded_{}", setup.suffix),
        recorded.as_secs_f64(),
        "s",
        Target::AtMost(5.0),
        true,
        Some(format!(
            "{count} submissions recorded <= 5 s after the first"
        )),
        &summarize(&[recorded.as_secs_f64()])?,
        "s from the first submission to the last recorded",
        json!({
            "sync_interval": setup.setting,
            "jetstream_fs": setup.store,
            "submissions": count,
            "window": 256,
        }),
    );
    Ok(())
}

/// `mgpu submit --array 0-{count - 1} -- true` by the CLI, to the node drained by
/// [`submit_rate`]: from the command's start until the scheduler recorded every task, and
/// the queued jobs then stored without their real wait reason.
fn array_recorded(ctx: &Run, cluster: &Cluster, count: usize, setup: &Setup) -> Result<()> {
    progress(&format!("(10) mgpu submit --array 0-{} -- true", count - 1));
    let range = format!("0-{}", count - 1);
    let creds = cluster.user_creds("alice");
    let recorded_before = cluster.with_nats(&cluster.admin_creds(), |client| async move {
        let (status, _) =
            wait_for_status("the scheduler", Duration::from_secs(30), &client, |_| true).await?;
        anyhow::Ok(status["jobs_total"].as_u64().unwrap_or(0))
    })?;
    let started = std::time::Instant::now();
    let mut command = cluster.mgpu_command(&creds, &["submit", "--array", &range, "--", "true"]);
    command
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    let child = command.spawn().context("running mgpu submit --array")?;
    // The command's own end, timed apart: it may end before or after the last record.
    let waiter = std::thread::spawn(move || {
        let output = child.wait_with_output();
        (output, started.elapsed())
    });
    let recorded = cluster.with_nats(&cluster.admin_creds(), |client| async move {
        wait_for_status(
            "every task recorded",
            Duration::from_secs(600),
            &client,
            |s| s["jobs_total"].as_u64().unwrap_or(0) >= recorded_before + count as u64,
        )
        .await?;
        anyhow::Ok(started.elapsed())
    })?;
    let (output, exited) = waiter
        .join()
        .map_err(|_| anyhow::anyhow!("the thread waiting for mgpu submit panicked"))?;
    let output = output.context("waiting for mgpu submit --array")?;
    if !output.status.success() {
        bail!(
            "mgpu submit --array failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let unreasoned = queued_without_reason(cluster)?;
    ctx.report(
        &format!("durability_array_recorded_{}", setup.suffix),
        recorded.as_secs_f64(),
        "s",
        Target::AtMost(5.0),
        unreasoned == 0,
        Some(format!(
            "{count} tasks recorded <= 5 s after the command started, each with its reason"
        )),
        &summarize(&[recorded.as_secs_f64()])?,
        "s from the command's start to the last task recorded",
        json!({
            "sync_interval": setup.setting,
            "jetstream_fs": setup.store,
            "tasks": count,
            "command_exited_s": round3(exited.as_secs_f64()),
            "queued_without_reason": unreasoned,
        }),
    );
    Ok(())
}

/// How many queued jobs `mgpu queue --json` shows still waiting for the scheduler's first
/// look (the reason a record has before a pass gave it its own).
fn queued_without_reason(cluster: &Cluster) -> Result<usize> {
    let output = cluster
        .mgpu_command(&cluster.admin_creds(), &["queue", "--json"])
        .output()
        .context("running mgpu queue --json")?;
    if !output.status.success() {
        bail!(
            "mgpu queue --json failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let queue: serde_json::Value =
        serde_json::from_slice(&output.stdout).context("reading mgpu queue --json")?;
    let first_look = mgpu_protocol::job::WaitReason::Submitted.describe();
    Ok(queue["jobs"]
        .as_array()
        .map(|jobs| {
            jobs.iter()
                .filter(|job| job["state"] == "queued")
                .filter(|job| job["reason"].as_str().is_none_or(|r| r == first_look))
                .count()
        })
        .unwrap_or(0))
}

/// The type of the filesystem holding `path` (`ext4`, `tmpfs`, …), from /proc/self/mounts:
/// the longest mount point that is a prefix of it.
fn filesystem_of(path: &Path) -> String {
    let path = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    mounts
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let (_, point, kind) = (fields.next()?, fields.next()?, fields.next()?);
            path.starts_with(point)
                .then(|| (point.len(), kind.to_owned()))
        })
        .max_by_key(|(len, _)| *len)
        .map(|(_, kind)| kind)
        .unwrap_or_else(|| "unknown".into())
}
