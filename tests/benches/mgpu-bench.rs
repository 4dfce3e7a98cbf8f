//! The benchmark program of issue #6: starts real clusters (nats-server, scheduler, agents, all
//! release binaries, through the test harness) and measures what a user sees, printing one JSON
//! object per scenario on stdout. Progress goes to stderr. Run it with `scripts/bench.sh`
//! (`--quick` for reduced sizes); it is not a test and asserts no timing.
//!
//! Scenarios (numbered as in the issue):
//! 1. `cli_submit_rate`: `mgpu submit -- true` run one after another as separate processes.
//! 4. `queue_latency` / `queue_json_latency`: `mgpu queue` (and `--json`) with the jobs of 1
//!    waiting behind a one-GPU node that a `sleep` job keeps busy (measured on the same cluster).
//! 2. `submit_to_start_latency`: from just before the CLI is spawned to the job's first
//!    instruction (`date +%s%N`, written by the job), on an idle node with 8 GPUs.
//! 3. `drain_rate`: one-GPU `true` jobs submitted by the CLI loop of 1 to one agent with 8
//!    declared GPUs, from the first submit to the latest `ended_at` once all succeeded.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, anyhow, bail};
use mgpu_tests::{Cluster, NodeSpec};
use serde_json::{Value, json};

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

/// The target a figure is judged against.
#[derive(Clone, Copy)]
enum Target {
    AtLeast(f64),
    AtMost(f64),
}

impl Target {
    fn met(self, figure: f64) -> bool {
        match self {
            Target::AtLeast(t) => figure >= t,
            Target::AtMost(t) => figure <= t,
        }
    }

    fn describe(self, unit: &str) -> String {
        match self {
            Target::AtLeast(t) => format!(">= {t} {unit}"),
            Target::AtMost(t) => format!("<= {t} {unit}"),
        }
    }
}

/// Min, median, p99 and max of samples (nearest rank).
struct Summary {
    count: usize,
    min: f64,
    median: f64,
    p99: f64,
    max: f64,
}

fn summarize(samples: &[f64]) -> Result<Summary> {
    if samples.is_empty() {
        bail!("no samples");
    }
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = |q: f64| {
        let index = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1;
        sorted[index]
    };
    Ok(Summary {
        count: sorted.len(),
        min: sorted[0],
        median: rank(0.5),
        p99: rank(0.99),
        max: sorted[sorted.len() - 1],
    })
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// What every result carries about the machine and the run.
struct Run {
    machine: Value,
    quick: bool,
}

impl Run {
    fn new(quick: bool) -> Run {
        let cores = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0);
        let cpu = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|text| {
                text.lines()
                    .find(|l| l.starts_with("model name"))
                    .and_then(|l| l.split_once(':'))
                    .map(|(_, v)| v.trim().to_owned())
            })
            .unwrap_or_default();
        let mem_kib = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|text| {
                text.lines()
                    .find(|l| l.starts_with("MemTotal:"))
                    .and_then(|l| l.split_whitespace().nth(1))
                    .and_then(|v| v.parse::<u64>().ok())
            })
            .unwrap_or(0);
        Run {
            machine: json!({"cores": cores, "cpu": cpu, "mem_mib": mem_kib / 1024}),
            quick,
        }
    }

    /// Prints one scenario's JSON line. `figure` is judged against `target`; `extra` holds
    /// what else the scenario wants to say. Returns the object too.
    #[allow(clippy::too_many_arguments)]
    fn report(
        &self,
        scenario: &str,
        figure: f64,
        unit: &str,
        target: Target,
        extra_pass: bool,
        target_text: Option<String>,
        samples: &Summary,
        sample_unit: &str,
        extra: Value,
    ) {
        let mut object = json!({
            "scenario": scenario,
            "figure": round3(figure),
            "unit": unit,
            "target": target_text.unwrap_or_else(|| target.describe(unit)),
            "pass": target.met(figure) && extra_pass,
            "samples": samples.count,
            "sample_unit": sample_unit,
            "min": round3(samples.min),
            "median": round3(samples.median),
            "p99": round3(samples.p99),
            "max": round3(samples.max),
            "machine": self.machine,
            "quick": self.quick,
            "at": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        });
        if let (Some(object), Value::Object(extra)) = (object.as_object_mut(), extra) {
            object.extend(extra);
        }
        println!("{object}");
    }
}

fn progress(text: &str) {
    eprintln!("[bench] {text}");
}

fn now_ns() -> Result<i128> {
    Ok(SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .context("clock before 1970")?
        .as_nanos() as i128)
}

/// Runs one `mgpu ARGS` as alice, returning its stdout; an error says what it printed.
fn run_mgpu(cluster: &Cluster, args: &[&str]) -> Result<String> {
    let out = cluster
        .mgpu_command(&cluster.user_creds("alice"), args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .with_context(|| format!("running mgpu {args:?}"))?;
    if !out.status.success() {
        bail!(
            "mgpu {args:?} failed ({:?}): {}{}",
            out.status.code(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
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
fn submit_loop(cluster: &Cluster, count: usize) -> Result<(Vec<String>, Vec<f64>, Duration)> {
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

fn wait_until<T>(
    what: &str,
    timeout: Duration,
    poll: Duration,
    mut check: impl FnMut() -> Result<Option<T>>,
) -> Result<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check()? {
            return Ok(value);
        }
        if Instant::now() > deadline {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        std::thread::sleep(poll);
    }
}

/// Scenarios 1 and 4 on one cluster: a node with one GPU kept busy by a `sleep` job, so every
/// submitted job waits; then `mgpu queue` with all of them waiting.
fn submit_and_queue(ctx: &Run, sizes: &Sizes) -> Result<()> {
    progress("cluster: one agent, 1 GPU, busy with a sleep job");
    let cluster = Cluster::start(&[NodeSpec::new("node001", "1x24GiB")]);
    let busy = run_mgpu(&cluster, &["submit", "-q", "--", "sleep 3600"])?
        .trim()
        .to_owned();
    wait_until(
        "the sleep job to run",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || Ok((cluster.state(&busy) == "running").then_some(())),
    )?;

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

    for (scenario, args) in [
        ("queue_latency", vec!["queue"]),
        ("queue_json_latency", vec!["queue", "--json"]),
    ] {
        progress(&format!(
            "(4) {} x `mgpu {}` with {waiting} jobs waiting",
            sizes.queue_samples,
            args.join(" ")
        ));
        let mut samples = Vec::with_capacity(sizes.queue_samples);
        for _ in 0..sizes.queue_samples {
            let t = Instant::now();
            let out = run_mgpu(&cluster, &args)?;
            samples.push(t.elapsed().as_secs_f64() * 1000.0);
            if out.is_empty() {
                bail!("mgpu {args:?} printed nothing");
            }
        }
        let summary = summarize(&samples)?;
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
            json!({"jobs_waiting": waiting}),
        );
    }
    Ok(())
}

/// Scenarios 2 and 3 on one cluster: one agent with 8 declared GPUs.
fn latency_and_drain(ctx: &Run, sizes: &Sizes) -> Result<()> {
    progress("cluster: one agent, 8 GPUs");
    let cluster = Cluster::start(&[NodeSpec::new("node001", "8x24GiB")]);
    let marks = cluster.dir.path().join("marks");
    std::fs::create_dir_all(&marks).with_context(|| format!("creating {}", marks.display()))?;

    progress(&format!(
        "(2) submit -> first instruction, {} samples",
        sizes.latency_samples
    ));
    let mut samples = Vec::with_capacity(sizes.latency_samples);
    for i in 0..sizes.latency_samples {
        let file = marks.join(format!("{i}"));
        let command = format!(
            "date +%s%N > {tmp} && mv {tmp} {file}",
            tmp = marks.join(format!("{i}.tmp")).display(),
            file = file.display()
        );
        let t0 = now_ns()?;
        run_mgpu(&cluster, &["submit", "-q", "--", &command])?;
        let started: i128 = wait_until(
            "the job to write its start time",
            Duration::from_secs(30),
            Duration::from_millis(1),
            || read_ns(&file),
        )?;
        samples.push((started - t0) as f64 / 1e6);
        // Let the job end so the next sample finds an idle cluster.
        std::thread::sleep(Duration::from_millis(100));
    }
    let summary = summarize(&samples)?;
    ctx.report(
        "submit_to_start_latency",
        summary.median,
        "ms",
        Target::AtMost(15.0),
        summary.p99 <= 50.0,
        Some("p50 <= 15 ms and p99 <= 50 ms".to_owned()),
        &summary,
        "ms from CLI spawn to the job's `date +%s%N`",
        json!({}),
    );

    progress(&format!(
        "(3) drain: {} x `mgpu submit -- true` to 8 GPUs",
        sizes.drain_jobs
    ));
    let first_submit = chrono::Utc::now();
    let (ids, durations, submit_wall) = submit_loop(&cluster, sizes.drain_jobs)?;
    let ids: std::collections::HashSet<String> = ids.into_iter().collect();
    let last_end = wait_until(
        "every drain job to succeed",
        Duration::from_secs(600),
        Duration::from_secs(1),
        || {
            let jobs = all_jobs(&cluster)?;
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
    )?;
    let span = (last_end - first_submit)
        .to_std()
        .context("the last job ended before the first submit")?;
    let rate = ids.len() as f64 / span.as_secs_f64();
    ctx.report(
        "drain_rate",
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
        }),
    );
    Ok(())
}

/// The nanoseconds a job wrote, once the file is there.
fn read_ns(file: &Path) -> Result<Option<i128>> {
    match std::fs::read_to_string(file) {
        Ok(text) => text
            .trim()
            .parse()
            .map(Some)
            .with_context(|| format!("{} holds {text:?}", file.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("reading {}", file.display())),
    }
}

fn main() -> Result<()> {
    let mut quick = false;
    for arg in std::env::args().skip(1) {
        match arg.as_str() {
            "--quick" => quick = true,
            // `cargo bench` passes --bench to every bench target.
            "--bench" => {}
            other => bail!("unknown argument {other:?} (use --quick)"),
        }
    }
    // The harness finds nats-server through this, like scripts/test.sh sets it.
    if std::env::var_os("MGPU_NATS_SERVER").is_none() {
        let local = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.tools/bin/nats-server");
        if !local.exists()
            && Command::new("nats-server")
                .arg("--version")
                .output()
                .is_err()
        {
            bail!("no nats-server: run scripts/setup.sh");
        }
    }
    let sizes = if quick { Sizes::quick() } else { Sizes::full() };
    let ctx = Run::new(quick);
    let started = Instant::now();
    submit_and_queue(&ctx, &sizes)?;
    latency_and_drain(&ctx, &sizes)?;
    progress(&format!("done in {:.0} s", started.elapsed().as_secs_f64()));
    Ok(())
}
