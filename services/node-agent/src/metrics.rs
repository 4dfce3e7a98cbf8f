//! The agent's Prometheus metrics, served on `--metrics-listen` (`GET /metrics`): per GPU
//! (labels `node`, `gpu` = its index, `uuid`, `model`) its utilisation, memory, temperature,
//! power, the mgpu job and user holding it and the processes mgpu did not start; per job
//! (`node`, `job_id`, `user`) the CPU time and host memory its cgroup counts.
//!
//! Nothing is sampled for a scrape: the GPU readings are the heartbeat's latest sample
//! (`heartbeat.rs`), so scraping adds no NVML call, and a declared GPU, which has no sensors,
//! reports no temperature or power (the families are left out rather than shown as 0). The
//! job's label is `job_id`, not `job`: Prometheus gives every scraped series a `job` label of
//! its own (the scrape job), which would rename ours `exported_job`.
//!
//! [`render`] is pure (readings and holdings in, text out) and tested here; how the names map
//! to the DCGM exporter's is in docs/operations.md ("Metrics").

use std::sync::Arc;

use mgpu_metrics::{Exposition, Kind};
use mgpu_protocol::node::GpuStatus;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tracing::warn;

use crate::cgroup::LiveUsage;
use crate::holdings::Holdings;

const BYTES_PER_MIB: f64 = 1024.0 * 1024.0;

/// One running job as the metrics show it.
#[derive(Clone, Debug, PartialEq)]
pub struct JobUse {
    pub job_id: String,
    pub user: String,
    /// Indices of the GPUs it holds here.
    pub gpus: Vec<u32>,
    pub usage: LiveUsage,
}

/// What the endpoint reads at each scrape.
pub struct Sources {
    pub node: String,
    /// The GPUs as the latest heartbeat sampled them.
    pub readings: watch::Receiver<Vec<GpuStatus>>,
    pub holdings: Holdings,
}

impl Sources {
    /// The exposition as of now; reads the jobs' cgroup files, so call it off the async
    /// threads.
    fn render_now(&self) -> String {
        let gpus = self.readings.borrow().clone();
        let jobs: Vec<JobUse> = self
            .holdings
            .snapshot()
            .into_iter()
            .map(|(key, holding)| JobUse {
                job_id: key.job_id.to_string(),
                user: holding.user,
                gpus: holding.gpus,
                usage: holding
                    .cgroup
                    .as_ref()
                    .map(|cgroup| cgroup.live_usage())
                    .unwrap_or_default(),
            })
            .collect();
        render(&self.node, &gpus, &jobs)
    }
}

/// Serves the metrics on `listener` from a task of its own, for as long as the agent runs.
pub fn spawn(listener: TcpListener, sources: Sources) {
    let sources = Arc::new(sources);
    tokio::spawn(mgpu_metrics::http::serve(listener, move || {
        let sources = Arc::clone(&sources);
        async move {
            tokio::task::spawn_blocking(move || sources.render_now())
                .await
                .unwrap_or_else(|err| {
                    warn!(%err, "rendering the metrics failed");
                    String::new()
                })
        }
    }));
}

/// The agent's exposition for `node`: its GPUs as sampled, and the jobs running on them.
pub fn render(node: &str, gpus: &[GpuStatus], jobs: &[JobUse]) -> String {
    let mut out = Exposition::new();
    render_gpus(&mut out, node, gpus);
    render_holders(&mut out, node, gpus, jobs);
    render_jobs(&mut out, node, jobs);
    out.finish()
}

/// A GPU's labels: node, index, UUID, model.
fn gpu_labels<'a>(node: &'a str, gpu: &'a GpuStatus, index: &'a str) -> [(&'a str, &'a str); 4] {
    [
        ("node", node),
        ("gpu", index),
        ("uuid", &gpu.uuid),
        ("model", &gpu.name),
    ]
}

/// One family with a sample per GPU where `value` knows one.
fn per_gpu(
    out: &mut Exposition,
    (name, kind, help): (&str, Kind, &str),
    node: &str,
    gpus: &[GpuStatus],
    value: impl Fn(&GpuStatus) -> Option<f64>,
) {
    out.family(name, kind, help);
    for gpu in gpus {
        if let Some(value) = value(gpu) {
            let index = gpu.index.to_string();
            out.sample(&gpu_labels(node, gpu, &index), value);
        }
    }
}

/// A per-GPU gauge: its name, its help, and its value for a GPU (None: unknown there).
type GpuFamily = (&'static str, &'static str, fn(&GpuStatus) -> Option<f64>);

fn render_gpus(out: &mut Exposition, node: &str, gpus: &[GpuStatus]) {
    let families: [GpuFamily; 7] = [
        (
            "mgpu_gpu_utilization_ratio",
            "Share of time a kernel ran on the GPU over the last sample period (0 to 1).",
            |g| Some(f64::from(g.utilization_pct) / 100.0),
        ),
        (
            "mgpu_gpu_memory_used_bytes",
            "GPU memory in use, by any process.",
            |g| Some(g.memory_used_mib as f64 * BYTES_PER_MIB),
        ),
        ("mgpu_gpu_memory_total_bytes", "GPU memory in all.", |g| {
            Some(g.memory_total_mib as f64 * BYTES_PER_MIB)
        }),
        (
            "mgpu_gpu_temperature_celsius",
            "GPU core temperature, where the GPU has the sensor.",
            |g| g.temperature_c.map(f64::from),
        ),
        (
            "mgpu_gpu_power_watts",
            "GPU power draw, where the GPU reports it.",
            |g| g.power_w.map(f64::from),
        ),
        (
            "mgpu_gpu_foreign_processes",
            "Processes using the GPU that mgpu did not start.",
            |g| Some(g.foreign_processes.len() as f64),
        ),
        (
            "mgpu_gpu_foreign_memory_used_bytes",
            "GPU memory used by processes mgpu did not start.",
            |g| {
                let processes = g.foreign_processes.iter();
                let mib = processes.fold(0u64, |sum, p| sum.saturating_add(p.used_mib));
                Some(mib as f64 * BYTES_PER_MIB)
            },
        ),
    ];
    for (name, help, value) in families {
        per_gpu(out, (name, Kind::Gauge, help), node, gpus, value);
    }
}

/// Per GPU whether an mgpu job holds it, and which job of which user.
fn render_holders(out: &mut Exposition, node: &str, gpus: &[GpuStatus], jobs: &[JobUse]) {
    per_gpu(
        out,
        (
            "mgpu_gpu_allocated",
            Kind::Gauge,
            "1 while an mgpu job holds the GPU, else 0.",
        ),
        node,
        gpus,
        |gpu| {
            let held = jobs.iter().any(|job| job.gpus.contains(&gpu.index));
            Some(if held { 1.0 } else { 0.0 })
        },
    );
    out.family(
        "mgpu_gpu_job_info",
        Kind::Gauge,
        "1 for each mgpu job holding the GPU, with its id and user.",
    );
    for gpu in gpus {
        let index = gpu.index.to_string();
        for job in jobs.iter().filter(|job| job.gpus.contains(&gpu.index)) {
            let [node, gpu_index, uuid, model] = gpu_labels(node, gpu, &index);
            let labels = [
                node,
                gpu_index,
                uuid,
                model,
                ("job_id", job.job_id.as_str()),
                ("user", job.user.as_str()),
            ];
            out.sample(&labels, 1.0);
        }
    }
}

/// Per job: what its cgroup counts, where it has one.
fn render_jobs(out: &mut Exposition, node: &str, jobs: &[JobUse]) {
    out.family(
        "mgpu_node_running_jobs",
        Kind::Gauge,
        "mgpu jobs this agent runs now.",
    )
    .sample(&[("node", node)], jobs.len() as f64);
    out.family(
        "mgpu_job_cpu_seconds_total",
        Kind::Counter,
        "CPU time a running job used so far, all its processes together (from its cgroup).",
    );
    for job in jobs {
        if let Some(seconds) = job.usage.cpu_seconds {
            out.sample(&job_labels(node, job), seconds);
        }
    }
    out.family(
        "mgpu_job_memory_used_bytes",
        Kind::Gauge,
        "Host memory a running job uses now (from its cgroup).",
    );
    for job in jobs {
        if let Some(bytes) = job.usage.memory_bytes {
            out.sample(&job_labels(node, job), bytes as f64);
        }
    }
}

/// A job's labels: node, job id, user.
fn job_labels<'a>(node: &'a str, job: &'a JobUse) -> [(&'a str, &'a str); 3] {
    [("node", node), ("job_id", &job.job_id), ("user", &job.user)]
}

#[cfg(test)]
mod tests {
    use mgpu_protocol::node::ForeignProcess;

    use super::*;

    fn gpu(index: u32, sensors: bool) -> GpuStatus {
        GpuStatus {
            index,
            uuid: format!("GPU-{index}"),
            name: "NVIDIA A100-SXM4-80GB".into(),
            memory_total_mib: 81_920,
            memory_used_mib: 1024,
            utilization_pct: 50,
            temperature_c: sensors.then_some(61),
            power_w: sensors.then_some(250),
            foreign_processes: Vec::new(),
            gpu_type: None,
        }
    }

    fn samples(text: &str) -> Vec<&str> {
        text.lines().filter(|l| !l.starts_with('#')).collect()
    }

    #[test]
    fn each_gpu_reports_its_readings_under_its_labels() {
        let mut busy = gpu(1, true);
        busy.foreign_processes = vec![ForeignProcess {
            pid: 7,
            used_mib: 512,
            user: None,
        }];
        let text = render("node001", &[gpu(0, true), busy], &[]);
        let lines = samples(&text);
        let labels = "node=\"node001\",gpu=\"1\",uuid=\"GPU-1\",model=\"NVIDIA A100-SXM4-80GB\"";
        for expected in [
            format!("mgpu_gpu_utilization_ratio{{{labels}}} 0.5"),
            format!("mgpu_gpu_memory_used_bytes{{{labels}}} 1073741824"),
            format!("mgpu_gpu_memory_total_bytes{{{labels}}} 85899345920"),
            format!("mgpu_gpu_temperature_celsius{{{labels}}} 61"),
            format!("mgpu_gpu_power_watts{{{labels}}} 250"),
            format!("mgpu_gpu_foreign_processes{{{labels}}} 1"),
            format!("mgpu_gpu_foreign_memory_used_bytes{{{labels}}} 536870912"),
            format!("mgpu_gpu_allocated{{{labels}}} 0"),
            "mgpu_node_running_jobs{node=\"node001\"} 0".to_owned(),
        ] {
            assert!(
                lines.contains(&expected.as_str()),
                "{expected} missing in\n{text}"
            );
        }
        assert!(!text.contains("mgpu_gpu_job_info"), "{text}");
        let idle = "mgpu_gpu_foreign_memory_used_bytes{node=\"node001\",gpu=\"0\",uuid=\"GPU-0\",model=\"NVIDIA A100-SXM4-80GB\"} 0";
        assert!(lines.contains(&idle), "{text}");
    }

    #[test]
    fn gpus_without_sensors_report_no_temperature_or_power() {
        let text = render("n", &[gpu(0, false)], &[]);
        assert!(!text.contains("temperature"), "{text}");
        assert!(!text.contains("power"), "{text}");
        assert!(text.contains("mgpu_gpu_utilization_ratio{"), "{text}");
    }

    #[test]
    fn a_held_gpu_names_its_job_and_user_and_the_job_its_usage() {
        let jobs = [JobUse {
            job_id: "j1".into(),
            user: "alice".into(),
            gpus: vec![1],
            usage: LiveUsage {
                cpu_seconds: Some(2.5),
                memory_bytes: Some(4096),
            },
        }];
        let text = render("node001", &[gpu(0, false), gpu(1, false)], &jobs);
        let lines = samples(&text);
        for expected in [
            "mgpu_gpu_allocated{node=\"node001\",gpu=\"0\",uuid=\"GPU-0\",model=\"NVIDIA A100-SXM4-80GB\"} 0",
            "mgpu_gpu_allocated{node=\"node001\",gpu=\"1\",uuid=\"GPU-1\",model=\"NVIDIA A100-SXM4-80GB\"} 1",
            "mgpu_gpu_job_info{node=\"node001\",gpu=\"1\",uuid=\"GPU-1\",model=\"NVIDIA A100-SXM4-80GB\",job_id=\"j1\",user=\"alice\"} 1",
            "mgpu_node_running_jobs{node=\"node001\"} 1",
            "mgpu_job_cpu_seconds_total{node=\"node001\",job_id=\"j1\",user=\"alice\"} 2.5",
            "mgpu_job_memory_used_bytes{node=\"node001\",job_id=\"j1\",user=\"alice\"} 4096",
        ] {
            assert!(lines.contains(&expected), "{expected} missing in\n{text}");
        }
        assert!(
            text.contains("# TYPE mgpu_job_cpu_seconds_total counter\n"),
            "{text}"
        );
    }

    #[test]
    fn a_job_without_a_cgroup_reports_no_usage() {
        let jobs = [JobUse {
            job_id: "j1".into(),
            user: "alice".into(),
            gpus: vec![0],
            usage: LiveUsage::default(),
        }];
        let text = render("n", &[gpu(0, false)], &jobs);
        assert!(!text.contains("mgpu_job_"), "{text}");
        assert!(text.contains("mgpu_gpu_job_info{"), "{text}");
    }
}
