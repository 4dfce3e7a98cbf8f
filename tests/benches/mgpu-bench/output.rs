//! Scenario 6, a job's output as its user sees it:
//! - `output_throughput`: a job writes 1 GiB of printable text to stdout (`yes LINE | head -c
//!   N`, 256 MiB with `--quick`) and `mgpu logs -f ID` reads it; MB/s (10^6 bytes per second)
//!   from the job's own start (a `date +%s%N` it writes to a file just before `yes`) to the
//!   reader's last byte; the figure is the median of the runs (3, one with `--quick`), the
//!   samples the rate over each 250 ms of reading. The bytes are checked: exactly N, the
//!   repeated line, in order. Beside it: the messages the agent published (`run_chunks`) and
//!   the CPU seconds per GiB of nats-server, the agent and the reader (`cpu_s_per_gib`), which
//!   say where the time goes on a machine shared with other work.
//! - `output_line_latency`: a job writes `date +%s%N` every 50 ms; a raw NATS subscription on
//!   `jobs.<id>.output` (what `nats sub 'jobs.*.output'` does) takes each line's arrival time;
//!   latency = arrival - the time in the line (same machine, same clock). A `mgpu logs -f`
//!   reading the same job at the same time is reported beside it.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use futures::StreamExt;
use mgpu_tests::{Cluster, NodeSpec};
use serde_json::json;

use crate::common::*;

/// The line `yes` repeats: printable, so the bytes are what a real log would be, and of a
/// length that does not divide the chunk size, so a lost or repeated chunk shows.
const LINE: &str = "mgpu output benchmark 0123456789 abcdefghijklmnopqrstuvwxyz";

/// How long the throughput job waits before writing, so the reader is attached and reads the
/// output live rather than replaying it.
const START_DELAY: &str = "1";

/// Throughput samples: the rate over each such slice of the reader's time.
const SLICE: Duration = Duration::from_millis(250);

/// Pause between the lines of the latency job (the live `tail -f` case).
const LINE_PAUSE: &str = "0.05";

/// Sizes of one run.
struct Sizes {
    bytes: u64,
    runs: usize,
    lines: usize,
}

impl Sizes {
    fn full() -> Sizes {
        Sizes {
            bytes: 1 << 30,
            runs: 3,
            lines: 200,
        }
    }

    fn quick() -> Sizes {
        Sizes {
            bytes: 256 << 20,
            runs: 1,
            lines: 50,
        }
    }
}

/// Both scenarios, on one cluster of one agent.
pub fn run(ctx: &Run) -> Result<()> {
    let sizes = if ctx.quick {
        Sizes::quick()
    } else {
        Sizes::full()
    };
    progress("cluster: one agent, 1 GPU");
    // The output stream keeps 4 GiB by default (`--output-max-mib`), oldest first: room for
    // each 1 GiB run while it is read.
    let cluster = Cluster::start(&[NodeSpec::new("node001", "1x24GiB")]);
    let marks = cluster.dir.path().join("marks");
    std::fs::create_dir_all(&marks).with_context(|| format!("creating {}", marks.display()))?;
    throughput(ctx, &cluster, &sizes, &marks)?;
    line_latency(ctx, &cluster, &sizes)
}

/// What one `logs -f` run read.
struct Reading {
    /// Nanoseconds since the epoch of the first and last byte read.
    first_ns: i128,
    last_ns: i128,
    /// MB/s over each [`SLICE`] of reading.
    slice_rates: Vec<f64>,
}

/// The output throughput scenario: `sizes.runs` jobs each writing `sizes.bytes`, each read by
/// a `mgpu logs -f` while it runs.
fn throughput(ctx: &Run, cluster: &Cluster, sizes: &Sizes, marks: &std::path::Path) -> Result<()> {
    progress(&format!(
        "(6) {} x a job writing {} MiB to stdout, read by `mgpu logs -f`",
        sizes.runs,
        sizes.bytes >> 20
    ));
    let mut runs = ThroughputRuns {
        run_rates: Vec::with_capacity(sizes.runs),
        slice_rates: Vec::new(),
        first_byte_ms: Vec::with_capacity(sizes.runs),
        rates_from_first_byte: Vec::with_capacity(sizes.runs),
        chunks: Vec::with_capacity(sizes.runs),
        cpu: BTreeMap::new(),
    };
    for run in 0..sizes.runs {
        throughput_run(cluster, sizes, marks, run, &mut runs)?;
    }
    report_throughput(ctx, sizes, &runs)
}

/// What the throughput runs measured, run by run.
struct ThroughputRuns {
    /// MB/s from the job's start to the reader's last byte.
    run_rates: Vec<f64>,
    /// MB/s over each [`SLICE`] of reading, all runs together.
    slice_rates: Vec<f64>,
    first_byte_ms: Vec<f64>,
    /// MB/s from the reader's first byte to its last.
    rates_from_first_byte: Vec<f64>,
    /// Output messages the agent published.
    chunks: Vec<u64>,
    /// CPU seconds of the cluster's processes and the reader over all runs, by program.
    cpu: BTreeMap<String, f64>,
}

/// Run number `run`: submits the job, reads its output with `mgpu logs -f` and adds what was
/// measured to `runs`.
fn throughput_run(
    cluster: &Cluster,
    sizes: &Sizes,
    marks: &std::path::Path,
    run: usize,
    runs: &mut ThroughputRuns,
) -> Result<()> {
    let mb = sizes.bytes as f64 / 1e6;
    let started_file = marks.join(format!("output-{run}"));
    let command = format!(
        "sleep {START_DELAY}; date +%s%N > {tmp} && mv {tmp} {file}; yes '{LINE}' | head -c {bytes}",
        tmp = marks.join(format!("output-{run}.tmp")).display(),
        file = started_file.display(),
        bytes = sizes.bytes,
    );
    let cpu_before = children_cpu()?;
    let id = run_mgpu(cluster, &["submit", "-q", "--", &command])?
        .trim()
        .to_owned();
    let mut reader = cluster
        .mgpu_command(&cluster.user_creds("alice"), &["logs", "-f", &id])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting mgpu logs -f")?;
    let reading = read_all(&mut reader, sizes.bytes)?;
    // Before `wait`, while the exited reader is still our (zombie) child and counted.
    let run_cpu = add_cpu_since(&cpu_before, &mut runs.cpu)?;
    let status = reader.wait().context("waiting for mgpu logs -f")?;
    if !status.success() {
        bail!("mgpu logs -f {id} exited with {status}");
    }
    let job_start = wait_until(
        "the job's start time",
        Duration::from_secs(10),
        Duration::from_millis(10),
        || read_ns(&started_file),
    )?;
    if reading.first_ns < job_start {
        bail!("the reader's first byte came before the job's start");
    }
    runs.chunks.push(output_chunks(cluster, &id)?);
    let seconds = (reading.last_ns - job_start) as f64 / 1e9;
    let rate = mb / seconds;
    progress(&format!(
        "  run {run}: {rate:.1} MB/s over {seconds:.2} s; CPU s: {}",
        run_cpu.join(", ")
    ));
    runs.run_rates.push(rate);
    runs.first_byte_ms
        .push(round3((reading.first_ns - job_start) as f64 / 1e6));
    runs.rates_from_first_byte.push(round3(
        mb / ((reading.last_ns - reading.first_ns) as f64 / 1e9),
    ));
    runs.slice_rates.extend(reading.slice_rates);
    Ok(())
}

/// Adds the CPU seconds each child program spent since `before` to `cpu`; returns the
/// programs that spent more than 0.05 s, for the progress line (`name seconds`).
fn add_cpu_since(
    before: &BTreeMap<String, f64>,
    cpu: &mut BTreeMap<String, f64>,
) -> Result<Vec<String>> {
    let mut run_cpu = Vec::new();
    for (name, after) in children_cpu()? {
        let spent = after - before.get(&name).copied().unwrap_or(0.0);
        *cpu.entry(name.clone()).or_insert(0.0) += spent;
        if spent > 0.05 {
            run_cpu.push(format!("{name} {spent:.2}"));
        }
    }
    Ok(run_cpu)
}

/// Reports `output_throughput`: the median of the runs' rates, the slices as samples.
fn report_throughput(ctx: &Run, sizes: &Sizes, runs: &ThroughputRuns) -> Result<()> {
    let median_run = summarize(&runs.run_rates)?.median;
    ctx.report(
        "output_throughput",
        median_run,
        "MB/s (10^6 bytes/s)",
        Target::AtLeast(100.0),
        true,
        Some(format!(
            ">= 100 MB/s (10^6 bytes/s) for 1 GiB; {} MiB here, median of {} runs",
            sizes.bytes >> 20,
            sizes.runs
        )),
        &summarize(&runs.slice_rates)?,
        "MB/s over each 250 ms of reading (all runs)",
        json!({
            "bytes": sizes.bytes,
            "runs": sizes.runs,
            "run_mb_per_s": runs.run_rates.iter().map(|r| round3(*r)).collect::<Vec<_>>(),
            "first_byte_ms_after_job_start": runs.first_byte_ms,
            "run_mb_per_s_from_first_byte": runs.rates_from_first_byte,
            "run_chunks": runs.chunks,
            // CPU cost per GiB: what the throughput would be on an idle machine is bounded
            // by these, whatever else runs on it.
            "cpu_s_per_gib": runs.cpu
                .iter()
                .filter(|(_, seconds)| **seconds > 0.0)
                .map(|(name, seconds)| {
                    let gib = (sizes.bytes * sizes.runs as u64) as f64 / (1u64 << 30) as f64;
                    (name.clone(), json!(round3(seconds / gib)))
                })
                .collect::<serde_json::Map<_, _>>(),
            "mean_chunk_kib": round3(sizes.bytes as f64 * sizes.runs as f64
                / runs.chunks.iter().sum::<u64>().max(1) as f64 / 1024.0),
        }),
    );
    Ok(())
}

/// CPU seconds (user + system) of each direct child of this process, summed by program name:
/// the harness starts nats-server, the scheduler and the agent as our children, and the
/// `logs -f` reader is one too. The job's processes are the agent's, not counted here.
fn children_cpu() -> Result<BTreeMap<String, f64>> {
    // USER_HZ, the unit of /proc's times: 100 on every Linux architecture mgpu runs on.
    const TICKS_PER_SECOND: f64 = 100.0;
    let me = std::process::id().to_string();
    let mut cpu = BTreeMap::new();
    for entry in std::fs::read_dir("/proc").context("reading /proc")? {
        let Ok(stat) = std::fs::read_to_string(entry?.path().join("stat")) else {
            continue;
        };
        // `pid (comm) state ppid ... utime stime`: the name may hold spaces, so fields are
        // counted after its closing parenthesis.
        let Some((head, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let name = head.split_once('(').map_or("", |(_, name)| name).to_owned();
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.get(1) != Some(&me.as_str()) {
            continue;
        }
        let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok());
        if let (Some(user), Some(system)) = (ticks(11), ticks(12)) {
            *cpu.entry(name).or_insert(0.0) += (user + system) / TICKS_PER_SECOND;
        }
    }
    Ok(cpu)
}

/// How many output messages the agent published for job `id`: the end-of-output marker, the
/// last message on the job's subject, carries the next sequence number.
fn output_chunks(cluster: &Cluster, id: &str) -> Result<u64> {
    let subject = format!("jobs.{id}.output");
    // As an admin: a user may read output through consumers that name their filter only, and
    // this reads one message by subject.
    cluster.with_nats(&cluster.admin_creds(), |client| async move {
        let js = async_nats::jetstream::new(client);
        let stream = js
            .get_stream(mgpu_protocol::subjects::OUTPUT_STREAM)
            .await
            .context("looking up the output stream")?;
        let eof = stream
            .get_last_raw_message_by_subject(&subject)
            .await
            .context("reading the end-of-output marker")?;
        let next: u64 = eof
            .headers
            .get(mgpu_protocol::output::SEQ)
            .and_then(|seq| seq.as_str().parse().ok())
            .ok_or_else(|| anyhow!("the last output message has no sequence number"))?;
        Ok(next.saturating_sub(1))
    })
}

/// Reads `logs -f`'s stdout to its end, checking that it is exactly `expected` bytes of
/// [`LINE`] repeated.
fn read_all(reader: &mut Child, expected: u64) -> Result<Reading> {
    let mut stdout = reader.stdout.take().context("no stdout")?;
    let mut stderr = reader.stderr.take().context("no stderr")?;
    // stderr drained aside, so a chatty reader cannot block on it.
    let errors = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let pattern: Vec<u8> = format!("{LINE}\n").into_bytes();
    let mut buffer = vec![0u8; 1 << 20];
    let mut bytes: u64 = 0;
    let mut first_ns = None;
    let mut last_ns = 0;
    let mut slice_rates = Vec::new();
    let mut slice_start = Instant::now();
    let mut slice_bytes: u64 = 0;
    loop {
        let n = stdout.read(&mut buffer).context("reading mgpu logs -f")?;
        if n == 0 {
            break;
        }
        let now = now_ns()?;
        first_ns.get_or_insert(now);
        last_ns = now;
        // Every byte against the line at its offset: a lost, repeated or reordered chunk
        // breaks the pattern.
        // Compared a line's worth at a time (memcmp), not byte by byte: the check must cost
        // the 2-core machine far less than the pipeline it measures.
        let mut rest = &buffer[..n];
        let mut at = bytes;
        while !rest.is_empty() {
            let offset = (at % pattern.len() as u64) as usize;
            let take = rest.len().min(pattern.len() - offset);
            if rest[..take] != pattern[offset..offset + take] {
                bail!("the output at byte {at} is not what the job wrote");
            }
            rest = &rest[take..];
            at += take as u64;
        }
        bytes += n as u64;
        if first_ns == Some(now) {
            // Slices start at the first byte, not while the job sleeps.
            slice_start = Instant::now();
        } else {
            slice_bytes += n as u64;
        }
        let elapsed = slice_start.elapsed();
        if elapsed >= SLICE {
            slice_rates.push(slice_bytes as f64 / 1e6 / elapsed.as_secs_f64());
            slice_start = Instant::now();
            slice_bytes = 0;
        }
    }
    let errors = errors.join().unwrap_or_default();
    if bytes != expected {
        bail!("mgpu logs -f printed {bytes} bytes, the job wrote {expected}: {errors}");
    }
    let first_ns = first_ns.ok_or_else(|| anyhow!("mgpu logs -f printed nothing: {errors}"))?;
    if slice_rates.is_empty() {
        // Faster than one slice: the whole read is the one sample.
        slice_rates.push(bytes as f64 / 1e6 / ((last_ns - first_ns).max(1) as f64 / 1e9));
    }
    Ok(Reading {
        first_ns,
        last_ns,
        slice_rates,
    })
}

/// The line latency scenario: a job writing its clock every [`LINE_PAUSE`], timed by a raw
/// NATS subscriber and by a `mgpu logs -f` at the same time.
fn line_latency(ctx: &Run, cluster: &Cluster, sizes: &Sizes) -> Result<()> {
    progress(&format!(
        "(6) {} lines written {LINE_PAUSE} s apart, timed by a NATS subscriber and `mgpu logs -f`",
        sizes.lines
    ));
    let lines = sizes.lines;
    // The job waits a moment so both readers are attached before its first line.
    let command =
        format!("sleep 1; for i in $(seq {lines}); do date +%s%N; sleep {LINE_PAUSE}; done");
    let creds = cluster.user_creds("alice");
    let (nats_ms, logs_ms) = cluster.with_nats(&creds, |client| async move {
        // Subscribed before the job exists, so its first line cannot be missed; the id is
        // known only after the submit, so every job's output comes and others' is skipped.
        let subscription = client
            .subscribe(mgpu_protocol::subjects::ALL_OUTPUT)
            .await
            .context("subscribing to job output")?;
        client.flush().await.context("flushing the subscription")?;
        let id = run_mgpu(cluster, &["submit", "-q", "--", &command])?
            .trim()
            .to_owned();
        let subject = format!("jobs.{id}.output");
        let (mut follower, timing) = follow_timed(cluster, &id)?;
        let samples = subscriber_latencies(subscription, &subject, lines).await?;
        let status = tokio::task::spawn_blocking(move || follower.wait())
            .await
            .context("waiting for mgpu logs -f")??;
        let logs = timing
            .join()
            .map_err(|_| anyhow!("the logs -f reader panicked"))??;
        if !status.success() || logs.len() != lines {
            bail!(
                "mgpu logs -f exited with {status} after {} of {lines} lines",
                logs.len()
            );
        }
        Ok::<_, anyhow::Error>((samples, logs))
    })?;
    report_line_latency(ctx, lines, &nats_ms, &logs_ms)
}

/// Starts `mgpu logs -f ID` and, on a thread of its own, times each line as it reads it: the
/// latencies in ms, once the reader's output ends.
fn follow_timed(
    cluster: &Cluster,
    id: &str,
) -> Result<(Child, std::thread::JoinHandle<Result<Vec<f64>>>)> {
    let mut follower = cluster
        .mgpu_command(&cluster.user_creds("alice"), &["logs", "-f", id])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("starting mgpu logs -f")?;
    let follower_out = follower.stdout.take().context("no stdout")?;
    let timing = std::thread::spawn(move || -> Result<Vec<f64>> {
        let mut samples = Vec::new();
        for line in BufReader::new(follower_out).lines() {
            let arrived = now_ns()?;
            let written: i128 = line?.trim().parse().context("a line that is no time")?;
            samples.push((arrived - written) as f64 / 1e6);
        }
        Ok(samples)
    });
    Ok((follower, timing))
}

/// The latency in ms of each of the first `lines` lines arriving on `subject` (others'
/// output is skipped), from the time written in the line to its arrival.
async fn subscriber_latencies(
    mut subscription: async_nats::Subscriber,
    subject: &str,
    lines: usize,
) -> Result<Vec<f64>> {
    let mut samples = Vec::with_capacity(lines);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30 + lines as u64);
    while samples.len() < lines {
        let message = tokio::time::timeout_at(deadline, subscription.next())
            .await
            .map_err(|_| anyhow!("{} of {lines} lines came", samples.len()))?
            .ok_or_else(|| anyhow!("the subscription ended"))?;
        let arrived = now_ns()?;
        if message.subject.as_str() != subject || message.payload.is_empty() {
            continue;
        }
        // One read of the agent may hold several lines when the machine is busy; each
        // counts from its own time.
        let text = std::str::from_utf8(&message.payload).context("output not UTF-8")?;
        for line in text.lines() {
            let written: i128 = line.trim().parse().context("a line that is no time")?;
            samples.push((arrived - written) as f64 / 1e6);
        }
    }
    Ok(samples)
}

/// Reports `output_line_latency`: the subscriber's latencies, `logs -f`'s beside them.
fn report_line_latency(ctx: &Run, lines: usize, nats_ms: &[f64], logs_ms: &[f64]) -> Result<()> {
    let summary = summarize(nats_ms)?;
    let logs = summarize(logs_ms)?;
    ctx.report(
        "output_line_latency",
        summary.median,
        "ms",
        Target::AtMost(20.0),
        true,
        Some("<= 20 ms (median) from the job's write to a live subscriber".to_owned()),
        &summary,
        "ms from the job's `date +%s%N` to its arrival on a NATS subscription of jobs.<id>.output",
        json!({
            "lines": lines,
            "line_pause_s": LINE_PAUSE,
            "logs_f_median_ms": round3(logs.median),
            "logs_f_p99_ms": round3(logs.p99),
            "logs_f_max_ms": round3(logs.max),
        }),
    );
    Ok(())
}
