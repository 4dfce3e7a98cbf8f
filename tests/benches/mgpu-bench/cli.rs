//! Scenarios 1 to 4, driven through the `mgpu` CLI as separate processes, the way a user or a
//! shell script submits:
//! 1. `cli_submit_rate`: `mgpu submit -- true` run one after another as separate processes.
//! 4. `queue_latency` / `queue_json_latency`: `mgpu queue` (and `--json`) with the jobs of 1
//!    waiting behind a one-GPU node that a `sleep` job keeps busy (measured on the same cluster).
//! 2. `submit_to_start_latency`: from just before the CLI is spawned to the job's first
//!    instruction (`date +%s%N`, written by the job), on an idle node with 8 GPUs.
//! 3. `drain_rate`: one-GPU `true` jobs submitted by the CLI loop of 1 to one agent with 8
//!    declared GPUs, from the first submit to the latest `ended_at` once all succeeded.
//!
//! 5. `queue_vs_tsp` and `drain_vs_tsp`: `tsp -l` with as many waiting, and task-spooler's
//!    drain of as many `true` jobs on 8 slots, run in the same sitting (`tsp.rs`): mgpu's
//!    ratio to it (the targets: a listing at most 2× `tsp -l`, a drain at least half of it).
//!
//! 2 and 3 run twice: with the agent's default containment (a cgroup per job where it may
//! make cgroups, guards kept waiting in cgroups of their own) and with `--cgroup off`
//! (`*_uncontained`); each reports the containment it ran under and the CPU the agent side
//! spent per job (the agent, and the guards and jobs it reaped), so the cost of a job's cgroup
//! is the difference. 2 runs a third time contained with `--guard-pool 0`
//! (`*_unpooled`): every guard moves into its job's cgroup as the job starts.

use std::collections::HashSet;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use mgpu_tests::{Cluster, NodeSpec};
use serde_json::{Value, json};

use crate::common::*;

/// Scenarios 1 to 4 at the run's size.
pub fn run(ctx: &Run) -> Result<()> {
    let sizes = if ctx.quick {
        Sizes::quick()
    } else {
        Sizes::full()
    };
    submit_and_queue(ctx, &sizes)?;
    latency_and_drain(ctx, &sizes)
}

/// Sizes of one run.
struct Sizes {
    submits: usize,
    latency_samples: usize,
    drain_jobs: usize,
    queue_samples: usize,
}

impl Sizes {
    fn full() -> Sizes {
        Sizes {
            submits: 1000,
            latency_samples: 200,
            drain_jobs: 1000,
            queue_samples: 50,
        }
    }

    fn quick() -> Sizes {
        Sizes {
            submits: 1000,
            latency_samples: 50,
            drain_jobs: 300,
            queue_samples: 20,
        }
    }
}

/// `mgpu submit -- true`, as the issue writes it; returns the job id.
fn submit_true(cluster: &Cluster) -> Result<String> {
    let out = run_mgpu(cluster, &["submit", "--", "true"])?;
    out.split_whitespace()
        .last()
        .map(str::to_owned)
        .ok_or_else(|| anyhow!("submit printed no id: {out:?}"))
}

/// The submit loop of scenarios 1 and 3: `count` CLI processes one after another. Returns the
/// ids, each run's duration in ms, and the loop's wall time.
pub(crate) fn submit_loop(
    cluster: &Cluster,
    count: usize,
) -> Result<(Vec<String>, Vec<f64>, Duration)> {
    let mut ids = Vec::with_capacity(count);
    let mut durations = Vec::with_capacity(count);
    let start = Instant::now();
    for i in 0..count {
        let t = Instant::now();
        ids.push(submit_true(cluster)?);
        durations.push(t.elapsed().as_secs_f64() * 1000.0);
        if (i + 1) % 200 == 0 {
            progress(&format!("  {} submitted", i + 1));
        }
    }
    Ok((ids, durations, start.elapsed()))
}

/// `mgpu queue --all --json`'s jobs.
fn all_jobs(cluster: &Cluster) -> Result<Vec<Value>> {
    let out = run_mgpu(cluster, &["queue", "--all", "--json"])?;
    let queue: Value = serde_json::from_str(&out).context("queue --all --json is not JSON")?;
    Ok(queue["jobs"].as_array().cloned().unwrap_or_default())
}

/// Scenarios 1 and 4 on one cluster: a node with one GPU kept busy by a `sleep` job, so every
/// submitted job waits; then `mgpu queue` with all of them waiting.
fn submit_and_queue(ctx: &Run, sizes: &Sizes) -> Result<()> {
    let cluster = one_busy_gpu()?;

    progress(&format!(
        "(1) {} x `mgpu submit -- true`, one after another",
        sizes.submits
    ));
    let (_, durations, wall) = submit_loop(&cluster, sizes.submits)?;
    let rate = sizes.submits as f64 / wall.as_secs_f64();
    ctx.report(
        "cli_submit_rate",
        rate,
        "jobs/s",
        Target::AtLeast(300.0),
        true,
        None,
        &summarize(&durations)?,
        "ms per submit process",
        json!({"jobs": sizes.submits, "wall_s": round3(wall.as_secs_f64())}),
    );

    // Every submission seen by the scheduler (no job left "waiting for the scheduler").
    let waiting = wait_until(
        "the scheduler to look at every job",
        Duration::from_secs(120),
        Duration::from_millis(500),
        || {
            let jobs = all_jobs(&cluster)?;
            let queued: Vec<&Value> = jobs.iter().filter(|j| j["state"] == "queued").collect();
            let unseen = queued
                .iter()
                .any(|j| j["reason"] == "waiting for the scheduler to look at it");
            Ok((queued.len() >= sizes.submits && !unseen).then_some(queued.len()))
        },
    )?;

    let mut queue_median = None;
    for (scenario, args) in [
        ("queue_latency", vec!["queue"]),
        ("queue_json_latency", vec!["queue", "--json"]),
    ] {
        progress(&format!(
            "(4) {} x `mgpu {}` with {waiting} jobs waiting",
            sizes.queue_samples,
            args.join(" ")
        ));
        // Whether the scheduler was still busy (with the submissions' passes, events and
        // audit records) while the queue was read: its CPU time over the samples.
        let scheduler = cluster.scheduler_pids().first().copied();
        let cpu_before = scheduler.map(cpu_ms_with_children).transpose()?;
        let mut samples = Vec::with_capacity(sizes.queue_samples);
        for _ in 0..sizes.queue_samples {
            let t = Instant::now();
            let out = run_mgpu(&cluster, &args)?;
            samples.push(t.elapsed().as_secs_f64() * 1000.0);
            if out.is_empty() {
                bail!("mgpu {args:?} printed nothing");
            }
        }
        let cpu_after = scheduler.map(cpu_ms_with_children).transpose()?;
        let scheduler_cpu_ms = cpu_before
            .zip(cpu_after)
            .map(|(before, after)| round3(after - before));
        let summary = summarize(&samples)?;
        if scenario == "queue_latency" {
            queue_median = Some(summary.median);
        }
        ctx.report(
            scenario,
            summary.median,
            "ms",
            Target::AtMost(50.0),
            // Fewer waiting than the 1 000 cannot pass.
            waiting >= 1000,
            Some(format!(
                "<= 50 ms with 1000 waiting (median); {waiting} waiting here"
            )),
            &summary,
            "ms per queue process",
            json!({"jobs_waiting": waiting, "scheduler_cpu_ms_meanwhile": scheduler_cpu_ms}),
        );
    }
    if let Some(mgpu) = queue_median {
        queue_against_tsp(ctx, mgpu, waiting, sizes.queue_samples)?;
    }
    Ok(())
}

/// `queue_vs_tsp`: `mgpu queue`'s median against `tsp -l`'s with as many jobs waiting.
fn queue_against_tsp(ctx: &Run, mgpu_ms: f64, waiting: usize, samples: usize) -> Result<()> {
    progress(&format!(
        "(5) {samples} x `tsp -l` with {waiting} jobs waiting"
    ));
    let Some((tsp, tsp_waiting)) = crate::tsp::list_latency(waiting, samples)? else {
        return Ok(());
    };
    let summary = summarize(&tsp)?;
    ctx.report(
        "queue_vs_tsp",
        mgpu_ms / summary.median,
        "x tsp -l",
        Target::AtMost(2.0),
        true,
        Some("mgpu queue at most 2x tsp -l (median)".into()),
        &summary,
        "ms per tsp -l process",
        json!({
            "jobs_waiting": waiting,
            "tsp_jobs_waiting": tsp_waiting,
            "mgpu_queue_median_ms": round3(mgpu_ms),
            "tsp_list_median_ms": round3(summary.median),
        }),
    );
    Ok(())
}

/// Scenarios 2 and 3 on one cluster (one agent with 8 declared GPUs), once with the agent's
/// default containment and once with `--cgroup off`.
fn latency_and_drain(ctx: &Run, sizes: &Sizes) -> Result<()> {
    // (suffix, agent flags, whether the drain runs too)
    let setups: [(&'static str, &[&str], bool); 3] = [
        ("", &[], true),
        ("_unpooled", &["--guard-pool", "0"], false),
        ("_uncontained", &["--cgroup", "off"], true),
    ];
    for (suffix, args, drains) in setups {
        progress(&format!("cluster: one agent, 8 GPUs, agent flags {args:?}"));
        let cluster = Cluster::start(&[NodeSpec::new("node001", "8x24GiB").agent_args(args)]);
        cluster.wait_nodes_online(1);
        let setup = Containment {
            suffix,
            described: containment_of(&cluster),
            agent: cluster.agent_pid("node001"),
        };
        let marks = cluster.dir.path().join("marks");
        std::fs::create_dir_all(&marks).with_context(|| format!("creating {}", marks.display()))?;
        submit_to_start(ctx, &cluster, &marks, sizes.latency_samples, &setup)?;
        if !drains {
            continue;
        }
        let rate = drain(ctx, &cluster, sizes.drain_jobs, &setup)?;
        if suffix.is_empty() {
            drain_against_tsp(ctx, rate, sizes.drain_jobs)?;
        }
    }
    Ok(())
}

/// `drain_vs_tsp`: mgpu's drain rate (contained) against task-spooler's of as many jobs.
fn drain_against_tsp(ctx: &Run, mgpu_rate: f64, jobs: usize) -> Result<()> {
    progress(&format!("(5) drain: {jobs} x `tsp true` on 8 slots"));
    let Some(tsp_rate) = crate::tsp::drain_rate(jobs)? else {
        return Ok(());
    };
    ctx.report(
        "drain_vs_tsp",
        mgpu_rate / tsp_rate,
        "x tsp",
        Target::AtLeast(0.5),
        true,
        Some("mgpu's drain at least half of task-spooler's".into()),
        &summarize(&[tsp_rate])?,
        "tsp jobs/s",
        json!({"jobs": jobs, "mgpu_jobs_per_s": round3(mgpu_rate), "tsp_jobs_per_s": round3(tsp_rate)}),
    );
    Ok(())
}

/// How the agent of a run of scenarios 2 and 3 contains its jobs.
struct Containment {
    /// Appended to the scenario names: ``, `_unpooled` (contained, no guards kept waiting)
    /// or `_uncontained`.
    suffix: &'static str,
    /// What the node announces (`mgpu nodes`: `containment: …`).
    described: String,
    agent: u32,
}

fn containment_of(cluster: &Cluster) -> String {
    run_mgpu(cluster, &["nodes"])
        .ok()
        .and_then(|out| {
            out.lines()
                .find_map(|line| line.trim().strip_prefix("containment: "))
                .map(str::to_owned)
        })
        .unwrap_or_default()
}

/// CPU time of every process a drain runs, in ms: the nats-server, the schedulers, the agent
/// with the guards and jobs it reaped, and the `mgpu` processes this benchmark ran and reaped.
struct CpuSplit {
    nats: f64,
    scheduler: f64,
    agent: f64,
    cli: f64,
}

impl CpuSplit {
    fn read(cluster: &Cluster, agent: u32) -> Result<Self> {
        let nats = match cluster.nats_pid() {
            Some(pid) => cpu_ms_with_children(pid)?,
            None => 0.0,
        };
        let mut scheduler = 0.0;
        for pid in cluster.scheduler_pids() {
            scheduler += cpu_ms_with_children(pid)?;
        }
        Ok(CpuSplit {
            nats,
            scheduler,
            agent: cpu_ms_with_children(agent)?,
            cli: reaped_children_cpu_ms()?,
        })
    }

    /// What each part spent since `before`, per job of `jobs`.
    fn since(&self, before: &CpuSplit, jobs: usize) -> CpuSplit {
        let per_job = |now: f64, then: f64| round3((now - then) / jobs.max(1) as f64);
        CpuSplit {
            nats: per_job(self.nats, before.nats),
            scheduler: per_job(self.scheduler, before.scheduler),
            agent: per_job(self.agent, before.agent),
            cli: per_job(self.cli, before.cli),
        }
    }

    fn json(&self) -> serde_json::Value {
        json!({
            "nats_server": self.nats,
            "scheduler": self.scheduler,
            "agent_guards_and_jobs": self.agent,
            "cli": self.cli,
            "total": round3(self.nats + self.scheduler + self.agent + self.cli),
        })
    }
}

/// CPU time of the processes this benchmark ran and reaped (the `mgpu` commands), in ms.
fn reaped_children_cpu_ms() -> Result<f64> {
    stat_cpu_ms("self", 13..15)
}

/// CPU time of `pid` and of the children it reaped (the guards and their jobs), in ms.
fn cpu_ms_with_children(pid: u32) -> Result<f64> {
    stat_cpu_ms(&pid.to_string(), 11..15)
}

/// The CPU times in `/proc/<pid>/stat` at `fields` (counted after the command, which may
/// hold spaces, in parentheses: 11 utime, 12 stime, 13 cutime, 14 cstime), summed, in ms.
fn stat_cpu_ms(pid: &str, fields: std::ops::Range<usize>) -> Result<f64> {
    let path = format!("/proc/{pid}/stat");
    let stat = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    let after = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .with_context(|| format!("no command in {path}"))?;
    let all: Vec<&str> = after.split_whitespace().collect();
    let ticks: u64 = all
        .get(fields)
        .with_context(|| format!("short {path}"))?
        .iter()
        .map(|field| field.parse::<u64>().unwrap_or(0))
        .sum();
    // USER_HZ is 100 on Linux.
    Ok(ticks as f64 * 10.0)
}

/// Scenario 2: `samples` jobs submitted one at a time on the idle node, each timed from just
/// before its CLI is spawned to the start time the job writes into `marks`.
fn submit_to_start(
    ctx: &Run,
    cluster: &Cluster,
    marks: &Path,
    samples: usize,
    setup: &Containment,
) -> Result<()> {
    progress(&format!(
        "(2) submit -> first instruction, {samples} samples"
    ));
    let mut latencies = Vec::with_capacity(samples);
    for i in 0..samples {
        latencies.push(one_submit_to_start(cluster, marks, i)?);
        // Let the job end so the next sample finds an idle cluster.
        std::thread::sleep(Duration::from_millis(100));
    }
    let summary = summarize(&latencies)?;
    ctx.report(
        &format!("submit_to_start_latency{}", setup.suffix),
        summary.median,
        "ms",
        Target::AtMost(10.0),
        summary.p99 <= 50.0,
        Some("p50 <= 10 ms and p99 <= 50 ms".to_owned()),
        &summary,
        "ms from CLI spawn to the job's `date +%s%N`",
        json!({ "containment": setup.described }),
    );
    Ok(())
}

/// One sample of scenario 2, in ms: submits a job that writes `date +%s%N` to `marks/<i>`
/// and waits for the file.
fn one_submit_to_start(cluster: &Cluster, marks: &Path, i: usize) -> Result<f64> {
    let file = marks.join(format!("{i}"));
    let command = format!(
        "date +%s%N > {tmp} && mv {tmp} {file}",
        tmp = marks.join(format!("{i}.tmp")).display(),
        file = file.display()
    );
    let t0 = now_ns()?;
    run_mgpu(cluster, &["submit", "-q", "--", &command])?;
    let started: i128 = wait_until(
        "the job to write its start time",
        Duration::from_secs(30),
        Duration::from_millis(1),
        || read_ns(&file),
    )?;
    Ok((started - t0) as f64 / 1e6)
}

/// Scenario 3: `jobs` one-GPU `true` jobs submitted by the CLI loop, from the first submit to
/// the latest `ended_at` once all succeeded.
/// Scenario 3 on `cluster`; its rate in jobs per second.
fn drain(ctx: &Run, cluster: &Cluster, jobs: usize, setup: &Containment) -> Result<f64> {
    progress(&format!(
        "(3) drain: {jobs} x `mgpu submit -- true` to 8 GPUs"
    ));
    let cpu_before = CpuSplit::read(cluster, setup.agent)?;
    let first_submit = chrono::Utc::now();
    let (ids, durations, submit_wall) = submit_loop(cluster, jobs)?;
    // The submitting processes only: waiting below runs `mgpu` to look, which is not theirs.
    let cli_after_submits = reaped_children_cpu_ms()?;
    let ids: HashSet<String> = ids.into_iter().collect();
    let last_end = wait_drained(cluster, &ids)?;
    let span = (last_end - first_submit)
        .to_std()
        .context("the last job ended before the first submit")?;
    let rate = ids.len() as f64 / span.as_secs_f64();
    let mut after = CpuSplit::read(cluster, setup.agent)?;
    after.cli = cli_after_submits;
    let cpu = after.since(&cpu_before, ids.len());
    ctx.report(
        &format!("drain_rate{}", setup.suffix),
        rate,
        "jobs/s",
        Target::AtLeast(250.0),
        true,
        None,
        &summarize(&durations)?,
        "ms per submit process (while jobs run)",
        json!({
            "jobs": ids.len(),
            "gpus": 8,
            "span_s": round3(span.as_secs_f64()),
            "submit_wall_s": round3(submit_wall.as_secs_f64()),
            "containment": setup.described,
            "agent_cpu_ms_per_job": cpu.agent,
            "cpu_ms_per_job": cpu.json(),
        }),
    );
    Ok(rate)
}

/// Waits until every job in `ids` succeeded (an error as soon as one did not); returns the
/// latest `ended_at` among them.
pub(crate) fn wait_drained(
    cluster: &Cluster,
    ids: &HashSet<String>,
) -> Result<chrono::DateTime<chrono::Utc>> {
    wait_until(
        "every drain job to succeed",
        Duration::from_secs(600),
        Duration::from_secs(1),
        || {
            let jobs = all_jobs(cluster)?;
            let mine: Vec<&Value> = jobs
                .iter()
                .filter(|j| j["id"].as_str().is_some_and(|id| ids.contains(id)))
                .collect();
            if let Some(bad) = mine.iter().find(|j| {
                matches!(
                    j["state"].as_str(),
                    Some("failed" | "cancelled" | "timed_out" | "node_failed")
                )
            }) {
                bail!("a drain job did not succeed: {bad}");
            }
            let done: Vec<chrono::DateTime<chrono::Utc>> = mine
                .iter()
                .filter(|j| j["state"] == "succeeded")
                .filter_map(|j| j["ended_at"].as_str()?.parse().ok())
                .collect();
            Ok((done.len() == ids.len())
                .then(|| done.into_iter().max())
                .flatten())
        },
    )
}
