//! Scenario 4 at scale: `mgpu queue` with 100 000 jobs waiting (20 000 with `--quick`).
//!
//! One agent with one GPU runs a `sleep` job. The scheduler is then stopped and the bench writes
//! the waiting jobs' records into the `mgpu-jobs` bucket itself, with the scheduler's
//! credentials, exactly as the scheduler records a submission it has looked at (queued,
//! waiting for GPUs). Submitting them instead would measure the scheduler too (the `scale` group
//! does: it records about 3 000 submissions a second here), and a running scheduler would share
//! the two cores with the CLI being timed; the 1 000-job case of the `cli` group keeps the
//! submitted path. Each command then runs as a
//! separate process with stdout to a pipe read as it comes:
//! - `queue_latency_100k`: `mgpu queue` (the human table), spawn to exit;
//! - `queue_json_latency_100k`: `mgpu queue --json`, spawn to exit.
//!
//! Both also report the time to the first byte and to the first complete job on stdout.
//!
//! The target (≤ 2 s) is the for 100 000 waiting; a quick run names its scenarios with
//! the count it used and cannot pass.

use std::collections::{BTreeMap, VecDeque};
use std::io::Read;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::{JobRecord, JobSpec, JobState, WaitReason, Waiting};
use mgpu_protocol::principals::Role;
use mgpu_protocol::subjects;
use mgpu_tests::Cluster;
use serde_json::{Value, json};

use crate::common::*;

/// The size, and its target in ms.
const FULL_JOBS: usize = 100_000;
const TARGET_MS: f64 = 2000.0;

pub fn run(ctx: &Run) -> Result<()> {
    let (jobs, samples) = if ctx.quick {
        (20_000, 5)
    } else {
        (FULL_JOBS, 10)
    };
    let mut cluster = one_busy_gpu()?;

    // The scheduler is stopped before the records are written: it would otherwise go on
    // rewriting every queued job's wait reason, timed along with the CLI on two cores.
    // `mgpu queue` reads JetStream only and answers the same with the scheduler stopped.
    cluster.kill_scheduler();
    progress(&format!(
        "{jobs} queued one-GPU `true` jobs written to the jobs bucket"
    ));
    let write_wall = record_jobs(&cluster, jobs)?;
    let (records, bytes) = bucket_size(&cluster)?;
    progress(&format!(
        "  written in {:.1} s: {records} records, {:.1} MiB in the bucket",
        write_wall.as_secs_f64(),
        bytes as f64 / (1024.0 * 1024.0)
    ));
    let waiting = check_listing(&cluster, jobs)?;

    let suffix = if waiting >= FULL_JOBS {
        "100k".to_owned()
    } else {
        format!("{}k", waiting / 1000)
    };
    let target_text =
        format!("<= {TARGET_MS} ms with {FULL_JOBS} waiting (median); {waiting} waiting here");
    let common = json!({
        "jobs_waiting": waiting,
        "bucket_records": records,
        "bucket_mib": round3(bytes as f64 / (1024.0 * 1024.0)),
        "write_wall_s": round3(write_wall.as_secs_f64()),
        "scheduler": "stopped; records written by the bench as the scheduler writes them",
    });
    for (name, args) in [
        ("queue_latency", vec!["queue"]),
        ("queue_json_latency", vec!["queue", "--json"]),
    ] {
        progress(&format!(
            "{samples} x `mgpu {}` with {waiting} jobs waiting",
            args.join(" ")
        ));
        let timings = sample(&cluster, &args, samples)?;
        let summary = summarize(&timings.totals)?;
        let first_byte = summarize(&timings.first_bytes)?;
        let first_job = summarize(&timings.first_jobs)?;
        ctx.report(
            &format!("{name}_{suffix}"),
            summary.median,
            "ms",
            Target::AtMost(TARGET_MS),
            waiting >= FULL_JOBS,
            Some(target_text.clone()),
            &summary,
            "ms per queue process (spawn to exit, stdout to a pipe)",
            with_first_output(&common, timings.out_bytes, &first_byte, &first_job),
        );
    }
    Ok(())
}

/// One untimed `mgpu queue --json` checks what the timed runs will list (and warms the
/// server's caches); returns how many jobs it lists as queued, at least the `jobs` written.
fn check_listing(cluster: &Cluster, jobs: usize) -> Result<usize> {
    let listing: Value = serde_json::from_str(&run_mgpu(cluster, &["queue", "--json"])?)
        .context("queue --json is not one JSON document")?;
    let waiting = listing["jobs"]
        .as_array()
        .map(|jobs| jobs.iter().filter(|j| j["state"] == "queued").count())
        .unwrap_or(0);
    if waiting < jobs {
        bail!("queue --json lists {waiting} queued jobs, {jobs} were written");
    }
    Ok(waiting)
}

/// The timings of `samples` runs of one command, in ms, and the size of its output.
struct Samples {
    totals: Vec<f64>,
    first_bytes: Vec<f64>,
    first_jobs: Vec<f64>,
    /// Bytes on stdout (of the last run).
    out_bytes: usize,
}

/// Runs `mgpu ARGS` `samples` times, one after another.
fn sample(cluster: &Cluster, args: &[&str], samples: usize) -> Result<Samples> {
    let mut timings = Samples {
        totals: Vec::with_capacity(samples),
        first_bytes: Vec::with_capacity(samples),
        first_jobs: Vec::with_capacity(samples),
        out_bytes: 0,
    };
    for _ in 0..samples {
        let timing = timed_run(cluster, args)?;
        timings.totals.push(timing.total_ms);
        timings.first_bytes.push(timing.first_byte_ms);
        timings.first_jobs.push(timing.first_job_ms);
        timings.out_bytes = timing.bytes;
    }
    Ok(timings)
}

/// The fields every queue scenario reports (`common`), with one command's output size and
/// times to its first byte and first job.
fn with_first_output(
    common: &Value,
    out_bytes: usize,
    first_byte: &Summary,
    first_job: &Summary,
) -> Value {
    let mut extra = common.clone();
    if let Some(extra) = extra.as_object_mut() {
        extra.insert("output_bytes".into(), json!(out_bytes));
        extra.insert(
            "first_byte_ms_median".into(),
            json!(round3(first_byte.median)),
        );
        extra.insert("first_byte_ms_max".into(), json!(round3(first_byte.max)));
        // The first job id on stdout: in the table, after the header line.
        extra.insert(
            "first_job_ms_median".into(),
            json!(round3(first_job.median)),
        );
        extra.insert("first_job_ms_max".into(), json!(round3(first_job.max)));
    }
    extra
}

/// A user environment of typical size: `mgpu submit` records the submitter's environment in
/// every job, so the records the queue reads carry one.
pub fn environment() -> BTreeMap<String, String> {
    let home = "/home/alice";
    [
        ("HOME", home.to_owned()),
        ("USER", "alice".to_owned()),
        ("LOGNAME", "alice".to_owned()),
        ("SHELL", "/bin/bash".to_owned()),
        ("LANG", "en_US.UTF-8".to_owned()),
        ("TERM", "xterm-256color".to_owned()),
        ("PWD", format!("{home}/project")),
        ("PATH", format!("{home}/.local/bin:{home}/.cargo/bin:/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")),
        ("LD_LIBRARY_PATH", "/usr/local/cuda/lib64:/usr/local/nccl/lib".to_owned()),
        ("CUDA_HOME", "/usr/local/cuda".to_owned()),
        ("VIRTUAL_ENV", format!("{home}/project/.venv")),
        ("CONDA_DEFAULT_ENV", "base".to_owned()),
        ("HF_HOME", format!("{home}/.cache/huggingface")),
        ("SSH_CONNECTION", "10.0.0.2 52144 10.0.0.10 22".to_owned()),
        ("XDG_RUNTIME_DIR", "/run/user/1000".to_owned()),
        ("EDITOR", "vim".to_owned()),
        ("MGPU_SERVER", "nats://head:4222".to_owned()),
        ("MGPU_CREDS", format!("{home}/.mgpu/alice.creds")),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

/// Writes `count` queued one-GPU `true` jobs of alice's into the jobs bucket, as the scheduler
/// records a submission once it has looked at it; returns the time the writes took.
fn record_jobs(cluster: &Cluster, count: usize) -> Result<Duration> {
    let alice = user_key(&cluster.user_creds("alice"))?.public_key();
    let workdir = cluster.dir.path().to_string_lossy().into_owned();
    let env = environment();
    let creds = cluster.creds(Role::Scheduler, "scheduler");
    cluster.with_nats(&creds, |client| async move {
        let js = async_nats::jetstream::new(client);
        let started = Instant::now();
        let mut in_flight = VecDeque::with_capacity(WINDOW);
        for index in 0..count {
            if in_flight.len() >= WINDOW
                && let Some(ack) = in_flight.pop_front()
            {
                finish(ack).await?;
            }
            let mut spec = JobSpec::new(vec!["true".to_owned()], workdir.clone());
            spec.env = env.clone();
            let record = JobRecord {
                id: JobId::random(),
                user: "alice".to_owned(),
                user_key: Some(alice.clone()),
                spec,
                submitted_at: mgpu_protocol::now(),
                attempt: 1,
                state: JobState::Queued(Waiting::new(WaitReason::Resources)),
                last_request: None,
                preemptions: Vec::new(),
            };
            let subject = format!("$KV.{}.{}", subjects::JOBS_BUCKET, record.id);
            let ack = js
                .publish(subject, serde_json::to_vec(&record)?.into())
                .await
                .with_context(|| format!("writing record {index}"))?;
            in_flight.push_back(ack);
            if (index + 1) % 20_000 == 0 {
                progress(&format!("  {} written", index + 1));
            }
        }
        while let Some(ack) = in_flight.pop_front() {
            finish(ack).await?;
        }
        Ok(started.elapsed())
    })
}

/// Writes in flight at once.
const WINDOW: usize = 256;

async fn finish(ack: async_nats::jetstream::context::PublishAckFuture) -> Result<()> {
    ack.await.context("a record was not stored")?;
    Ok(())
}

/// How many records the jobs bucket holds, and their bytes.
fn bucket_size(cluster: &Cluster) -> Result<(u64, u64)> {
    cluster.with_nats(&cluster.admin_creds(), |client| async move {
        let js = async_nats::jetstream::new(client);
        let mut jobs = js.get_stream(subjects::JOBS_BUCKET_STREAM).await?;
        let state = jobs.info().await?.state.clone();
        anyhow::Ok((state.messages, state.bytes))
    })
}

/// One timed run of `mgpu ARGS`.
struct Timing {
    total_ms: f64,
    first_byte_ms: f64,
    /// Until the first job's line (table) or object (`--json`) is complete on stdout.
    first_job_ms: f64,
    bytes: usize,
}

/// Runs `mgpu ARGS` as alice with stdout to a pipe read as it comes, timing the first byte,
/// the first job, and the exit.
fn timed_run(cluster: &Cluster, args: &[&str]) -> Result<Timing> {
    let started = Instant::now();
    let mut child = cluster
        .mgpu_command(&cluster.user_creds("alice"), args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("running mgpu {args:?}"))?;
    let mut stdout = child.stdout.take().context("no stdout pipe")?;
    let mut out = Vec::with_capacity(64 << 20);
    let mut chunk = vec![0u8; 1 << 16];
    let mut first_byte = None;
    let mut first_job = None;
    let mut scan = FirstJob::new(args.contains(&"--json"));
    loop {
        let n = stdout.read(&mut chunk).context("reading mgpu's stdout")?;
        if n == 0 {
            break;
        }
        first_byte.get_or_insert_with(|| started.elapsed());
        out.extend_from_slice(&chunk[..n]);
        if first_job.is_none() && scan.feed(&chunk[..n]) {
            first_job = Some(started.elapsed());
        }
    }
    let status = child.wait().context("waiting for mgpu")?;
    let total = started.elapsed();
    if !status.success() {
        bail!("mgpu {args:?} failed ({status})");
    }
    let ms = |d: Option<Duration>| d.unwrap_or(total).as_secs_f64() * 1000.0;
    Ok(Timing {
        total_ms: ms(Some(total)),
        first_byte_ms: ms(first_byte),
        first_job_ms: ms(first_job),
        bytes: out.len(),
    })
}

/// Watches stdout for the end of the first job: the second line of the table, or the close of
/// the first object in the `jobs` array (whatever the JSON's layout).
struct FirstJob {
    json: bool,
    newlines: usize,
    in_array: bool,
    in_string: bool,
    escaped: bool,
    depth: u32,
}

impl FirstJob {
    fn new(json: bool) -> FirstJob {
        FirstJob {
            json,
            newlines: 0,
            in_array: false,
            in_string: false,
            escaped: false,
            depth: 0,
        }
    }

    /// Reads the next bytes; true once the first job is complete.
    fn feed(&mut self, bytes: &[u8]) -> bool {
        for &b in bytes {
            if !self.json {
                if b == b'\n' {
                    self.newlines += 1;
                    if self.newlines == 2 {
                        return true;
                    }
                }
                continue;
            }
            if self.in_string {
                match (self.escaped, b) {
                    (true, _) => self.escaped = false,
                    (false, b'\\') => self.escaped = true,
                    (false, b'"') => self.in_string = false,
                    _ => {}
                }
                continue;
            }
            match b {
                b'"' => self.in_string = true,
                b'[' if self.depth == 1 => self.in_array = true,
                b'{' => self.depth += 1,
                b'}' => {
                    self.depth = self.depth.saturating_sub(1);
                    if self.in_array && self.depth == 1 {
                        return true;
                    }
                }
                _ => {}
            }
        }
        false
    }
}
