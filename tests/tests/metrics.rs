//! Monitoring, told as stories: a real Prometheus scrapes the scheduler's and an agent's
//! `--metrics-listen` endpoints while a job runs and another waits, and its query API returns
//! the GPU utilisation series and the queue depth, and answers every query of the Grafana
//! dashboard we ship; `promtool check metrics` lints both expositions clean; the scheduler's
//! micro service counts its requests, refusals and processing time in `$SRV.STATS`.
//!
//! Prometheus is the Debian package `prometheus` (it ships `promtool` too), which
//! scripts/setup.sh installs. The story starts its own server on a free port with its own
//! storage directory, so whatever the package's own service does does not matter.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use mgpu_protocol::subjects;
use mgpu_tests::{Cluster, NodeSpec, free_port, wait_for};
use serde_json::Value;

const T: Duration = Duration::from_secs(30);

/// Where `name` is on PATH, or a failure that says how to get it.
fn installed(name: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
        .unwrap_or_else(|| {
            panic!(
                "{name} is not installed: scripts/setup.sh installs it (Debian package \
                 `prometheus`, which provides both prometheus and promtool)"
            )
        })
}

/// `GET target` over HTTP/1.0 (so the answer is never chunked): status and body.
fn http_get(port: u16, target: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .ok()?;
    write!(stream, "GET {target} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut reply = Vec::new();
    stream.read_to_end(&mut reply).ok()?;
    let reply = String::from_utf8_lossy(&reply).into_owned();
    let (head, body) = reply.split_once("\r\n\r\n")?;
    let status = head.split(' ').nth(1)?.parse().ok()?;
    Some((status, body.to_owned()))
}

/// The exposition an endpoint serves now.
fn scrape(port: u16) -> String {
    match http_get(port, "/metrics") {
        Some((200, body)) => body,
        other => panic!("scraping 127.0.0.1:{port}/metrics: {other:?}"),
    }
}

/// Scrapes until some sample line starts with every one of `parts` (in order), and returns
/// the whole exposition.
fn scrape_until(port: u16, what: &str, sample: impl Fn(&str) -> bool) -> String {
    wait_for(what, T, || {
        let text = scrape(port);
        text.lines().any(&sample).then_some(text)
    })
}

/// Pipes an exposition into `promtool check metrics`: it must pass without a lint problem.
fn promtool_accepts(text: &str, whose: &str) {
    let mut child = Command::new(installed("promtool"))
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("starting promtool: {e}"));
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(text.as_bytes())
            .unwrap_or_else(|e| panic!("feeding promtool: {e}"));
    }
    let out = child
        .wait_with_output()
        .unwrap_or_else(|e| panic!("running promtool: {e}"));
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && said.trim().is_empty(),
        "promtool check metrics rejects the {whose}'s exposition: {said}\n{text}"
    );
}

/// A Prometheus server of the story's own, stopped (by its pid) when dropped.
struct Prometheus {
    child: Child,
    port: u16,
}

impl Prometheus {
    /// Starts one scraping `targets` (job name, port) every second, and waits until ready.
    fn start(dir: &Path, targets: &[(&str, u16)]) -> Prometheus {
        let mut config = String::from("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n");
        config.push_str("scrape_configs:\n");
        for (job, port) in targets {
            config.push_str(&format!(
                "  - job_name: {job}\n    static_configs:\n      - targets: ['127.0.0.1:{port}']\n"
            ));
        }
        let config_file = dir.join("prometheus.yml");
        std::fs::write(&config_file, config).unwrap_or_else(|e| panic!("{e}"));
        let port = free_port();
        let log = std::fs::File::create(dir.join("prometheus.log"))
            .unwrap_or_else(|e| panic!("prometheus log: {e}"));
        let child = Command::new(installed("prometheus"))
            .arg(format!("--config.file={}", config_file.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(log.try_clone().unwrap_or_else(|e| panic!("{e}")))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("starting prometheus: {e}"));
        let server = Prometheus { child, port };
        wait_for("prometheus to be ready", T, || {
            http_get(port, "/-/ready").filter(|(status, _)| *status == 200)
        });
        server
    }

    /// The answer to an instant query (Null when there was none).
    fn answer(&self, promql: &str) -> Value {
        let target = format!("/api/v1/query?query={}", percent_encoded(promql));
        http_get(self.port, &target)
            .and_then(|(_, body)| serde_json::from_str(&body).ok())
            .unwrap_or_default()
    }

    /// The result vector of an instant query (`data.result`).
    fn query(&self, promql: &str) -> Vec<Value> {
        self.answer(promql)["data"]["result"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A query string value with everything but unreserved characters percent-encoded.
fn percent_encoded(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The number an instant query's single sample holds.
fn sample_value(result: &[Value]) -> Option<f64> {
    result.first()?["value"][1].as_str()?.parse().ok()
}

#[test]
fn prometheus_scrapes_gpu_and_queue_metrics_from_the_scheduler_and_an_agent() {
    // Before anything starts: a machine without Prometheus fails here, saying what to run.
    installed("prometheus");
    installed("promtool");
    let (scheduler_port, agent_port) = (free_port(), free_port());
    let scheduler_listen = format!("127.0.0.1:{scheduler_port}");
    let agent_listen = format!("127.0.0.1:{agent_port}");
    let node = NodeSpec::new("node001", "2x24GiB").agent_args(&["--metrics-listen", &agent_listen]);
    let cluster = Cluster::start_with(&[node], &["--metrics-listen", &scheduler_listen]);

    // One job holds a GPU; one asking for both waits.
    let running = cluster.submit(&["--gpus", "1"], "sleep 120");
    let job = cluster.wait_state(&running, "running", T);
    let gpu = mgpu_tests::gpus_of(&job)
        .first()
        .copied()
        .unwrap_or_else(|| panic!("no GPU in {job}"));
    let waiting = cluster.submit(&["--gpus", "2"], "true");
    wait_for("the 2-GPU job to wait for GPUs", T, || {
        let job = cluster.show(&waiting);
        let reason = job["reason"].as_str().unwrap_or("");
        (job["state"] == "queued" && reason.contains("GPUs")).then_some(())
    });
    // Bob may not cancel Alice's job: a refusal to count.
    let cancel = cluster.mgpu_with(&cluster.user_creds("bob"), &["cancel", &running], None);
    assert!(!cancel.status.success(), "{cancel:?}");

    let scheduler = scrape_until(scheduler_port, "the refusal to be counted", |line| {
        line == "mgpu_scheduler_refusals_total{action=\"cancel\",reason=\"not_permitted\"} 1"
    });
    for expected in [
        "mgpu_scheduler_leader 1",
        "mgpu_jobs{state=\"queued\",user=\"alice\"} 1",
        "mgpu_jobs{state=\"running\",user=\"alice\"} 1",
        "mgpu_jobs{state=\"held\",user=\"alice\"} 0",
        "mgpu_user_gpus{user=\"alice\"} 1",
        "mgpu_nodes{state=\"online\"} 1",
        "mgpu_scheduler_submissions_total{outcome=\"queued\",user=\"alice\"} 2",
        "mgpu_queue_wait_seconds_count 1",
    ] {
        assert!(
            scheduler.lines().any(|l| l == expected),
            "{expected} missing in\n{scheduler}"
        );
    }
    assert!(
        scheduler.contains("mgpu_scheduler_pass_duration_seconds_bucket{le=\"+Inf\"} "),
        "{scheduler}"
    );

    let agent = scrape_until(agent_port, "the agent to report the job", |line| {
        line.starts_with("mgpu_gpu_job_info{") && line.contains(&running)
    });
    // Where jobs get a cgroup with a memory controller, the job's memory must be reported.
    let nodes = cluster.mgpu_ok(&["nodes"]);
    let containment = nodes
        .lines()
        .find_map(|line| line.trim().strip_prefix("containment: "))
        .unwrap_or_default();
    let counts_memory =
        containment.starts_with("cgroup") && !containment.contains("no memory controller");
    check_agent_exposition(&agent, &running, gpu, counts_memory);
    promtool_accepts(&scheduler, "scheduler");
    promtool_accepts(&agent, "agent");

    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let prometheus = Prometheus::start(
        dir.path(),
        &[
            ("mgpu-scheduler", scheduler_port),
            ("mgpu-node", agent_port),
        ],
    );
    let utilisation = wait_for("prometheus to have the GPU utilisation", T, || {
        let result = prometheus.query("mgpu_gpu_utilization_ratio{node=\"node001\"}");
        (result.len() == 2).then_some(result)
    });
    for series in &utilisation {
        let labels = &series["metric"];
        assert_eq!(labels["job"], "mgpu-node", "{series}");
        assert_eq!(labels["model"], "Declared GPU", "{series}");
        assert!(
            labels["uuid"]
                .as_str()
                .is_some_and(|u| u.starts_with("declared-node001-"))
        );
        assert_eq!(series["value"][1], "0", "declared GPUs are idle: {series}");
    }
    let depth = wait_for("prometheus to have the queue depth", T, || {
        sample_value(&prometheus.query("sum(mgpu_jobs{state=\"queued\"})"))
    });
    assert_eq!(depth, 1.0);
    let holder = prometheus.query(&format!("mgpu_gpu_job_info{{job_id=\"{running}\"}}"));
    assert_eq!(holder.len(), 1, "{holder:?}");
    assert_eq!(holder[0]["metric"]["user"], "alice");
    assert_eq!(holder[0]["metric"]["gpu"], gpu.to_string());
    let leader = sample_value(&prometheus.query("max(mgpu_scheduler_leader)"));
    assert_eq!(leader, Some(1.0));
    dashboard_queries_work(&prometheus);
}

/// Every query of the shipped Grafana dashboard is valid PromQL over metrics that exist:
/// those that need no rate over time return data already (but for the jobs' cgroup usage,
/// which a host without cgroups does not have).
fn dashboard_queries_work(prometheus: &Prometheus) {
    let file =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/grafana/mgpu-overview.json");
    let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let dashboard: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("dashboard: {e}"));
    let panels = dashboard["panels"].as_array().cloned().unwrap_or_default();
    let exprs: Vec<String> = panels
        .iter()
        .flat_map(|panel| panel["targets"].as_array().cloned().unwrap_or_default())
        .filter_map(|target| target["expr"].as_str().map(str::to_owned))
        .collect();
    assert!(exprs.len() > 10, "{exprs:?}");
    for expr in exprs {
        let promql = expr
            .replace("$node", ".*")
            .replace("$__rate_interval", "1m");
        let answer = prometheus.answer(&promql);
        assert_eq!(answer["status"], "success", "{promql}: {answer}");
        let may_be_empty = promql.contains("rate(") || promql.contains("mgpu_job_");
        let result = answer["data"]["result"].as_array().map_or(0, Vec::len);
        assert!(may_be_empty || result > 0, "{promql} has no data: {answer}");
    }
}

/// What the agent says while `job` holds GPU `gpu` of its two declared 24 GiB GPUs (and its
/// memory use, where the job's cgroup `counts_memory`).
fn check_agent_exposition(text: &str, job: &str, gpu: u64, counts_memory: bool) {
    let labels = |index: u64| {
        format!(
            "node=\"node001\",gpu=\"{index}\",uuid=\"declared-node001-{index}\",model=\"Declared GPU\""
        )
    };
    let other = 1 - gpu;
    for expected in [
        format!("mgpu_gpu_utilization_ratio{{{}}} 0", labels(gpu)),
        format!("mgpu_gpu_memory_total_bytes{{{}}} 25769803776", labels(gpu)),
        format!("mgpu_gpu_memory_used_bytes{{{}}} 0", labels(gpu)),
        format!("mgpu_gpu_allocated{{{}}} 1", labels(gpu)),
        format!("mgpu_gpu_allocated{{{}}} 0", labels(other)),
        format!("mgpu_gpu_foreign_processes{{{}}} 0", labels(other)),
        format!(
            "mgpu_gpu_job_info{{{},job_id=\"{job}\",user=\"alice\"}} 1",
            labels(gpu)
        ),
        "mgpu_node_running_jobs{node=\"node001\"} 1".to_owned(),
    ] {
        assert!(
            text.lines().any(|l| l == expected),
            "{expected} missing in\n{text}"
        );
    }
    // Declared GPUs have no sensors: no made-up zeros.
    assert!(!text.contains("mgpu_gpu_temperature_celsius"), "{text}");
    assert!(!text.contains("mgpu_gpu_power_watts"), "{text}");
    // Where the job has a cgroup with the controllers, its usage is reported under its id.
    let job_labels = format!("{{node=\"node001\",job_id=\"{job}\",user=\"alice\"}} ");
    for line in text.lines().filter(|l| l.starts_with("mgpu_job_")) {
        assert!(line.contains(&job_labels), "{line}");
    }
    if counts_memory {
        let memory = format!("mgpu_job_memory_used_bytes{job_labels}");
        assert!(
            text.lines().any(|l| l.starts_with(&memory)),
            "{memory} missing in\n{text}"
        );
    }
}

#[test]
fn the_status_service_counts_requests_refusals_and_processing_time() {
    let cluster = Cluster::start(&[NodeSpec::new("node001", "1x24GiB")]);
    let stats: Value = cluster.with_nats(&cluster.admin_creds(), |client| async move {
        let ask = |body: &'static str| {
            let client = client.clone();
            async move {
                tokio::time::timeout(
                    Duration::from_secs(10),
                    client.request(subjects::SCHEDULER_STATUS, body.into()),
                )
                .await
                .unwrap_or_else(|_| panic!("status request timed out"))
                .unwrap_or_else(|e| panic!("status request: {e}"))
            }
        };
        // The scheduler registers its service once it has loaded its state: wait for that.
        for _ in 0..100 {
            let asked = client.request(subjects::SCHEDULER_STATUS, "".into()).await;
            if asked.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        for _ in 0..2 {
            let answer = ask("").await;
            let status: Value = serde_json::from_slice(&answer.payload)
                .unwrap_or_else(|e| panic!("status is not JSON: {e}"));
            assert!(status["passes"].as_u64().is_some(), "{status}");
        }
        let limited = ask(r#"{"recent_passes": 1}"#).await;
        let status: Value = serde_json::from_slice(&limited.payload).unwrap_or_default();
        assert!(
            status["recent_passes"]
                .as_array()
                .is_some_and(|p| p.len() <= 1)
        );
        // Not a status query: refused, and said so in the micro service's error headers.
        let refused = ask("status please").await;
        let code = refused
            .headers
            .as_ref()
            .and_then(|h| h.get("Nats-Service-Error-Code"))
            .map(|v| v.as_str().to_owned());
        assert_eq!(code.as_deref(), Some("400"), "{refused:?}");
        let stats = client
            .request(
                format!("$SRV.STATS.{}", subjects::SCHEDULER_SERVICE),
                "".into(),
            )
            .await
            .unwrap_or_else(|e| panic!("$SRV.STATS: {e}"));
        serde_json::from_slice(&stats.payload).unwrap_or_else(|e| panic!("stats: {e}"))
    });
    assert_eq!(stats["name"], subjects::SCHEDULER_SERVICE, "{stats}");
    let endpoints = stats["endpoints"].as_array().cloned().unwrap_or_default();
    let status = endpoints
        .iter()
        .find(|e| e["subject"] == subjects::SCHEDULER_STATUS)
        .unwrap_or_else(|| panic!("no status endpoint in {stats}"));
    // The first request that found the service, two more, a limited one and the refused one.
    assert_eq!(status["num_requests"], 5, "{stats}");
    assert_eq!(status["num_errors"], 1, "{stats}");
    assert!(
        status["processing_time"].as_u64().is_some_and(|ns| ns > 0),
        "{stats}"
    );
    assert!(
        status["last_error"]
            .as_str()
            .is_some_and(|e| e.starts_with("400")),
        "{stats}"
    );
}
