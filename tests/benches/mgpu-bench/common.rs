//! What every scenario shares: targets, summaries, the JSON line a scenario reports, and
//! small helpers for driving a cluster (the CLI as alice, waiting, a job's clock readings).

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use mgpu_tests::Cluster;
use serde_json::{Value, json};

/// The target a figure is judged against.
#[derive(Clone, Copy)]
pub enum Target {
    AtLeast(f64),
    AtMost(f64),
}

impl Target {
    pub fn met(self, figure: f64) -> bool {
        match self {
            Target::AtLeast(t) => figure >= t,
            Target::AtMost(t) => figure <= t,
        }
    }

    pub fn describe(self, unit: &str) -> String {
        match self {
            Target::AtLeast(t) => format!(">= {t} {unit}"),
            Target::AtMost(t) => format!("<= {t} {unit}"),
        }
    }
}

/// Min, median, p99 and max of samples (nearest rank).
pub struct Summary {
    pub count: usize,
    pub min: f64,
    pub median: f64,
    pub p99: f64,
    pub max: f64,
}

pub fn summarize(samples: &[f64]) -> Result<Summary> {
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

pub fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// What every result carries about the machine and the run.
pub struct Run {
    machine: Value,
    pub quick: bool,
}

impl Run {
    pub fn new(quick: bool) -> Run {
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
    pub fn report(
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

pub fn progress(text: &str) {
    eprintln!("[bench] {text}");
}

pub fn now_ns() -> Result<i128> {
    Ok(SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .context("clock before 1970")?
        .as_nanos() as i128)
}

/// Runs one `mgpu ARGS` as alice, returning its stdout; an error says what it printed.
pub fn run_mgpu(cluster: &Cluster, args: &[&str]) -> Result<String> {
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

pub fn wait_until<T>(
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

/// The nanoseconds a job wrote, once the file is there.
pub fn read_ns(file: &Path) -> Result<Option<i128>> {
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

/// Submits `specs` as `user` the way a program linking mgpu-nats would: each request signed
/// with the user's key like the CLI signs it, published to `jobs.submit` with the job id as
/// message id, and a window of acknowledgements in flight. Returns the ids and the wall time
/// from the first publish to the last acknowledgement.
pub async fn submit_pipelined(
    js: &async_nats::jetstream::Context,
    key: &nkeys::KeyPair,
    user: &str,
    specs: Vec<mgpu_protocol::job::JobSpec>,
    window: usize,
) -> Result<(Vec<mgpu_protocol::ids::JobId>, Duration)> {
    use mgpu_protocol::submit::SubmitRequest;
    use std::collections::VecDeque;
    let started = Instant::now();
    let mut ids = Vec::with_capacity(specs.len());
    let mut in_flight = VecDeque::with_capacity(window);
    for (index, spec) in specs.into_iter().enumerate() {
        if in_flight.len() >= window
            && let Some(ack) = in_flight.pop_front()
        {
            finish_ack(ack).await?;
        }
        let request = SubmitRequest {
            id: mgpu_protocol::ids::JobId::random(),
            user: user.to_owned(),
            spec,
        };
        let payload = serde_json::to_vec(&request)?;
        let mut headers = async_nats::HeaderMap::new();
        mgpu_nats::signing::sign(
            key,
            mgpu_protocol::subjects::SUBMIT,
            &payload,
            mgpu_protocol::now(),
            &mut headers,
        )
        .map_err(|e| anyhow::anyhow!("signing: {e}"))?;
        headers.insert(async_nats::header::NATS_MESSAGE_ID, request.id.as_str());
        let ack = js
            .publish_with_headers(mgpu_protocol::subjects::SUBMIT, headers, payload.into())
            .await
            .with_context(|| format!("publishing submission {index}"))?;
        in_flight.push_back(ack);
        ids.push(request.id);
        if (index + 1) % 20_000 == 0 {
            progress(&format!("  {} submitted", index + 1));
        }
    }
    while let Some(ack) = in_flight.pop_front() {
        finish_ack(ack).await?;
    }
    Ok((ids, started.elapsed()))
}

async fn finish_ack(ack: async_nats::jetstream::context::PublishAckFuture) -> Result<()> {
    ack.await.context("a submission was not stored")?;
    Ok(())
}

/// The user key in a credentials file the harness wrote.
pub fn user_key(creds: &Path) -> Result<nkeys::KeyPair> {
    let seed = mgpu_nats::connect::read_seed(creds)?;
    nkeys::KeyPair::from_seed(&seed).context("reading the seed")
}

/// Copies a component's log to `target/bench-logs/<group>-<name>.log`, so what a run logged
/// can be read after its cluster (and temporary directory) is gone.
pub fn keep_log(cluster: &Cluster, name: &str, group: &str) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/bench-logs");
    let kept = dir.join(format!("{group}-{name}.log"));
    let copied =
        std::fs::create_dir_all(&dir).and_then(|()| std::fs::copy(cluster.log_path(name), &kept));
    match copied {
        Ok(_) => progress(&format!("  {name} log kept in {}", kept.display())),
        Err(err) => progress(&format!("  could not keep the {name} log: {err}")),
    }
}

/// A NATS client with `creds`, on the caller's runtime (the harness's `with_nats` runs its own
/// single-threaded one), replying on the inbox mgpu clients use.
pub async fn connect(cluster: &Cluster, creds: &Path) -> Result<async_nats::Client> {
    let seed = mgpu_nats::connect::read_seed(creds)?;
    let public_key = nkeys::KeyPair::from_seed(&seed)
        .context("reading the seed")?
        .public_key();
    async_nats::ConnectOptions::with_nkey(seed)
        .custom_inbox_prefix(mgpu_protocol::principals::inbox_prefix(&public_key))
        .connect(mgpu_nats::connect::server_list(&cluster.server_url()))
        .await
        .with_context(|| format!("connecting with {}", creds.display()))
}

/// A cluster of one agent with one GPU that a `sleep` job keeps busy, so every job submitted
/// afterwards waits.
pub fn one_busy_gpu() -> Result<Cluster> {
    progress("cluster: one agent, 1 GPU, busy with a sleep job");
    let cluster = Cluster::start(&[mgpu_tests::NodeSpec::new("node001", "1x24GiB")]);
    let busy = run_mgpu(&cluster, &["submit", "-q", "--", "sleep 3600"])?
        .trim()
        .to_owned();
    wait_until(
        "the sleep job to run",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || Ok((cluster.state(&busy) == "running").then_some(())),
    )?;
    Ok(cluster)
}

/// Submits `count` one-GPU `true` jobs of alice's (pipelined, as one program would) and waits
/// until the scheduler has recorded them all.
pub fn submit_waiting_jobs(cluster: &Cluster, count: usize) -> Result<()> {
    let key = user_key(&cluster.user_creds("alice"))?;
    cluster.with_nats(&cluster.admin_creds(), |client| async move {
        let js = async_nats::jetstream::new(client.clone());
        let specs = (0..count)
            .map(|_| mgpu_protocol::job::JobSpec::new(vec!["true".into()], "/tmp"))
            .collect();
        submit_pipelined(&js, &key, "alice", specs, 1024).await?;
        wait_for_status(
            "every job recorded",
            Duration::from_secs(600),
            &client,
            |s| s["jobs_total"].as_u64().unwrap_or(0) > count as u64,
        )
        .await
        .map(|_| ())
    })
}

/// Asks `mgpu.scheduler.status` until `ready` holds; returns the status and how long it took.
pub async fn wait_for_status(
    what: &str,
    timeout: Duration,
    client: &async_nats::Client,
    ready: impl Fn(&Value) -> bool,
) -> Result<(Value, Duration)> {
    let started = Instant::now();
    let mut last_report = Instant::now();
    loop {
        let answer = tokio::time::timeout(
            Duration::from_secs(5),
            client.request(mgpu_protocol::subjects::SCHEDULER_STATUS, "".into()),
        )
        .await;
        if let Ok(Ok(message)) = answer {
            let status: Value =
                serde_json::from_slice(&message.payload).context("status is not JSON")?;
            if ready(&status) {
                return Ok((status, started.elapsed()));
            }
            if last_report.elapsed() > Duration::from_secs(10) {
                progress(&format!(
                    "  waiting for {what}: {} jobs recorded, {} queued, {} running, {} nodes online",
                    status["jobs_total"],
                    status["jobs_queued"],
                    status["jobs_running"],
                    status["nodes_online"]
                ));
                last_report = Instant::now();
            }
        }
        if started.elapsed() > timeout {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
