//! `mgpu nodes`: every node that ever reported, from its last heartbeat, with its GPUs.
//!
//! A node's state (`online`, `draining`, `drained`, `offline`) is the read model's
//! ([`crate::model::nodes`]), worked out as the scheduler does with the policy read from the
//! cluster bucket, so the listing agrees with the scheduler about which nodes it has given up
//! on. This module prints it: a block of text per node (with its GPU types and features), or
//! the heartbeats as JSON.

use std::process::ExitCode;

use anyhow::Result;
use clap::Args;
use mgpu_protocol::Timestamp;
use mgpu_protocol::host::format_mib;
use mgpu_protocol::job::JobRecord;
use mgpu_protocol::node::{
    AdminMark, ForeignProcess, GpuSource, GpuStatus, NodeAdmin, NodeHeartbeat,
};

use crate::client::session::{ConnectionArgs, Session};
use crate::console::{print, print_json, println};
use crate::human;
use crate::model::nodes::{NodeRow, NodeState};
use crate::model::snapshot::Snapshot;
use crate::tables::Table;

#[derive(Debug, Args)]
pub struct NodesArgs {
    /// Print an array of heartbeats (plus `state`, `last_heartbeat_age_ms` and `admin`, the
    /// drained mark and paused GPUs) for scripts.
    #[arg(long)]
    pub json: bool,
}

pub async fn run(connection: &ConnectionArgs, args: &NodesArgs) -> Result<ExitCode> {
    let session = Session::connect(connection).await?;
    // The records say which jobs run where (a job assigned but not started yet is not in the
    // heartbeat): a drained node is `draining` until they are done.
    let Snapshot {
        jobs,
        nodes,
        cluster,
    } = Snapshot::read(&session.js).await?;
    let now = mgpu_protocol::now();
    let view = |node: &NodeHeartbeat| View {
        now,
        jobs: &jobs,
        admin: cluster.admin.get(&node.node).cloned().unwrap_or_default(),
        missed_heartbeats: cluster.policy.missed_heartbeats,
    };
    if args.json {
        let values = nodes
            .iter()
            .map(|node| json_value(node, &view(node)))
            .collect::<Result<Vec<_>>>()?;
        print_json(&values)?;
        return Ok(ExitCode::SUCCESS);
    }
    if nodes.is_empty() {
        println("No nodes have reported yet: start mgpu-node on a GPU host.")?;
        return Ok(ExitCode::SUCCESS);
    }
    let blocks: Vec<String> = nodes.iter().map(|node| render(node, &view(node))).collect();
    print(&blocks.join("\n"))?;
    Ok(ExitCode::SUCCESS)
}

/// What a node's listing is computed from besides its heartbeat.
struct View<'a> {
    now: Timestamp,
    jobs: &'a [JobRecord],
    admin: NodeAdmin,
    /// The scheduler's policy: heartbeats a node may miss before it is offline.
    missed_heartbeats: u32,
}

impl View<'_> {
    fn row(&self, node: &NodeHeartbeat) -> NodeRow {
        NodeRow::new(
            node,
            self.jobs,
            Some(&self.admin),
            self.now,
            self.missed_heartbeats,
        )
    }
}

/// The heartbeat as sent, with what the reader would otherwise compute.
fn json_value(node: &NodeHeartbeat, view: &View<'_>) -> Result<serde_json::Value> {
    let row = view.row(node);
    let mut value = serde_json::to_value(node)?;
    if let Some(object) = value.as_object_mut() {
        object.insert("state".into(), serde_json::to_value(row.state)?);
        let age_ms = (view.now - node.sent_at).num_milliseconds().max(0);
        object.insert("last_heartbeat_age_ms".into(), age_ms.into());
        object.insert("admin".into(), serde_json::to_value(&view.admin)?);
        // Always there for scripts, though the heartbeat leaves out empty ones: `features`
        // as an array, each GPU's `gpu_type` and each foreign process's `user` as a string
        // or null.
        object.insert("features".into(), serde_json::to_value(&node.features)?);
        if let Some(gpus) = object.get_mut("gpus").and_then(|v| v.as_array_mut()) {
            for (value, gpu) in gpus.iter_mut().zip(&node.gpus) {
                if let Some(gpu_object) = value.as_object_mut() {
                    gpu_object.insert("gpu_type".into(), serde_json::to_value(&gpu.gpu_type)?);
                    insert_users(gpu_object, gpu)?;
                }
            }
        }
    }
    Ok(value)
}

/// Each foreign process's `user` in a GPU's JSON, null where the agent named none.
fn insert_users(
    gpu_object: &mut serde_json::Map<String, serde_json::Value>,
    gpu: &GpuStatus,
) -> Result<()> {
    let Some(processes) = gpu_object
        .get_mut("foreign_processes")
        .and_then(|v| v.as_array_mut())
    else {
        return Ok(());
    };
    for (value, process) in processes.iter_mut().zip(&gpu.foreign_processes) {
        if let Some(object) = value.as_object_mut() {
            object.insert("user".into(), serde_json::to_value(&process.user)?);
        }
    }
    Ok(())
}

/// `root: fan noise`, or just `root`.
fn mark_text(mark: &AdminMark) -> String {
    match &mark.reason {
        Some(reason) => format!("{}: {}", mark.by, reason.replace(['\n', '\r'], " ")),
        None => mark.by.clone(),
    }
}

/// One node: a summary line, its details, then a table of its GPUs.
fn render(node: &NodeHeartbeat, view: &View<'_>) -> String {
    let row = view.row(node);
    let mut text = details(node, &row, view);
    if node.gpus.is_empty() {
        text.push_str("  no GPUs\n");
    } else {
        text.push_str(&gpu_table(node, &view.admin));
        for gpu in &node.gpus {
            if let Some(line) = foreign_line(gpu) {
                text.push_str(&line);
            }
        }
    }
    text
}

/// Foreign processes named on a GPU's line at most; the rest are counted.
const FOREIGN_SHOWN: usize = 4;

/// `  foreign on GPU 0: pid 4242 (bob) 2 GiB, pid 77 (?) 512 MiB`: the processes mgpu did not
/// start, largest first, with the account each runs as (`?` where the agent could not see it);
/// None for a GPU without any.
fn foreign_line(gpu: &GpuStatus) -> Option<String> {
    if gpu.foreign_processes.is_empty() {
        return None;
    }
    let mut processes: Vec<&ForeignProcess> = gpu.foreign_processes.iter().collect();
    processes.sort_by(|a, b| b.used_mib.cmp(&a.used_mib).then(a.pid.cmp(&b.pid)));
    let mut parts: Vec<String> = processes
        .iter()
        .take(FOREIGN_SHOWN)
        .map(|p| {
            // The name comes from the agent's heartbeat: one line whatever it holds.
            let owner = p.user.as_deref().map_or_else(
                || "?".to_owned(),
                |user| user.replace(|c: char| c.is_control(), " "),
            );
            format!("pid {} ({owner}) {}", p.pid, format_mib(p.used_mib))
        })
        .collect();
    let rest = &processes[processes.len().min(FOREIGN_SHOWN)..];
    if !rest.is_empty() {
        let mib = rest.iter().map(|p| p.used_mib).sum();
        parts.push(format!("{} more ({})", rest.len(), format_mib(mib)));
    }
    Some(format!(
        "  foreign on GPU {}: {}\n",
        gpu.index,
        parts.join(", ")
    ))
}

/// The summary line and the lines under it: note, drain, address, running jobs.
fn details(node: &NodeHeartbeat, row: &NodeRow, view: &View<'_>) -> String {
    let mut text = format!(
        "{}  {}  last heartbeat {}  gpus {}\n",
        node.node,
        human::node_state(row),
        human::age(node.sent_at, view.now),
        human::gpu_source(node.gpu_source)
    );
    if let Some(note) = &node.gpu_note {
        text.push_str(&format!("  note: {}\n", note.replace(['\n', '\r'], " ")));
    }
    if let Some(mark) = &view.admin.drained {
        let running = match row.jobs_running {
            0 => String::new(),
            n => format!("; its {n} running job(s) finish first"),
        };
        text.push_str(&format!("  drained by {}{running}\n", mark_text(mark)));
    }
    text.push_str(&format!(
        "  address {}  runs jobs as {}  agent {} (protocol {})\n",
        node.address,
        if node.runs_jobs_as == mgpu_protocol::node::RUNS_AS_OWNER {
            "each job's owner"
        } else {
            node.runs_jobs_as.as_str()
        },
        node.agent_version,
        node.protocol,
    ));
    text.push_str(&format!(
        "  gpu types: {}  features: {}\n",
        human::gpu_types(&node.gpus),
        human::name_list(&node.features)
    ));
    let sender = format!("its agent {}", node.agent_version);
    if let Some(why) = mgpu_protocol::version::incompatibility(&sender, node.protocol) {
        text.push_str(&format!("  incompatible, gets no jobs: {why}\n"));
    }
    if let Some(containment) = &node.containment {
        text.push_str(&format!("  containment: {containment}\n"));
    }
    if let (Some(cpus), Some(mem)) = (node.cpus, node.mem_host_mib) {
        text.push_str(&format!(
            "  host: {cpus} CPU cores, {} memory  gpu isolation: {}\n",
            mgpu_protocol::host::format_mib(mem),
            if node.gpu_isolation { "yes" } else { "no" }
        ));
    }
    let running: Vec<&str> = node.running.iter().map(|job| job.id.short()).collect();
    // An offline node's list is what it said last, not what runs there now.
    let label = if row.state == NodeState::Offline {
        "running when last heard from"
    } else {
        "running"
    };
    text.push_str(&format!(
        "  {label}: {}\n",
        if running.is_empty() {
            "none".to_owned()
        } else {
            running.join(", ")
        }
    ));
    text
}

/// The node's GPUs, one row each, with the admins' pauses; their temperature and power
/// draw where NVML reads them (a node whose GPUs report neither has no such columns).
fn gpu_table(node: &NodeHeartbeat, admin: &NodeAdmin) -> String {
    // NVML reads the GPUs; otherwise the operator declared them.
    let origin = match node.gpu_source {
        GpuSource::Nvml => "detected",
        GpuSource::Declared => "declared",
    };
    let sensors = node
        .gpus
        .iter()
        .any(|gpu| gpu.temperature_c.is_some() || gpu.power_w.is_some());
    let mut table = if sensors {
        Table::new([
            "GPU",
            "TYPE",
            "NAME",
            "MEM (MiB)",
            "UTIL",
            "TEMP",
            "POWER",
            "FOREIGN",
            "SOURCE",
            "ADMIN",
        ])
    } else {
        Table::new([
            "GPU",
            "TYPE",
            "NAME",
            "MEM (MiB)",
            "UTIL",
            "FOREIGN",
            "SOURCE",
            "ADMIN",
        ])
    }
    .indent(2);
    for gpu in &node.gpus {
        let paused = admin
            .paused_gpus
            .get(&gpu.index)
            .map(|mark| format!("paused by {}", mark_text(mark)))
            .unwrap_or_default();
        let mut cells = vec![
            gpu.index.to_string(),
            human::gpu_type(gpu).to_owned(),
            gpu.name.clone(),
            human::mib_pair(gpu.memory_used_mib, gpu.memory_total_mib),
            format!("{}%", gpu.utilization_pct),
        ];
        if sensors {
            cells.push(reading(gpu.temperature_c, "°C"));
            cells.push(reading(gpu.power_w, "W"));
        }
        cells.extend([
            gpu.foreign_processes.len().to_string(),
            origin.to_owned(),
            paused,
        ]);
        table.row(cells);
    }
    table.render()
}

/// `67°C`, `250W`; `-` where the GPU gave no reading.
fn reading(value: Option<u32>, unit: &str) -> String {
    value.map_or_else(|| "-".to_owned(), |v| format!("{v}{unit}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use mgpu_protocol::ids::JobId;
    use mgpu_protocol::node::{DEFAULT_THRESHOLD, RunningJob};

    fn heartbeat(sent_at: Timestamp) -> NodeHeartbeat {
        NodeHeartbeat {
            node: "node001".into(),
            sent_at,
            interval_ms: 2_000,
            gpu_source: GpuSource::Declared,
            gpu_note: Some("NVML unavailable".into()),
            gpus: vec![GpuStatus {
                index: 0,
                uuid: "GPU-0".into(),
                name: "Fake 24GiB".into(),
                memory_total_mib: 24_576,
                memory_used_mib: 100,
                utilization_pct: 7,
                temperature_c: None,
                power_w: None,
                foreign_processes: vec![ForeignProcess {
                    pid: 9,
                    used_mib: 100,
                    user: None,
                }],
                gpu_type: None,
            }],
            running: vec![],
            address: "10.0.0.1".into(),
            runs_jobs_as: "mgpu".into(),
            containment: None,
            agent_version: "0.1.0".into(),
            protocol: mgpu_protocol::version::PROTOCOL,
            mem_threshold: DEFAULT_THRESHOLD,
            load_threshold: DEFAULT_THRESHOLD,
            labels: Default::default(),
            fence_after_ms: None,
            kill_grace_ms: 0,
            gpu_isolation: false,
            cpus: None,
            mem_host_mib: None,
            features: Vec::new(),
        }
    }

    #[test]
    fn a_node_block_lists_its_gpus() {
        let now = mgpu_protocol::now();
        let node = heartbeat(now - chrono::Duration::milliseconds(1_200));
        let view = |admin: NodeAdmin, missed: u32| View {
            now,
            jobs: &[],
            admin,
            missed_heartbeats: missed,
        };
        let text = render(&node, &view(NodeAdmin::default(), 3));
        assert!(
            text.starts_with("node001  online  last heartbeat 1.2s ago  gpus declared\n"),
            "{text}"
        );
        assert!(text.contains("  note: NVML unavailable\n"), "{text}");
        assert!(
            text.contains("  0    -     Fake 24GiB  100/24576  7%    1        declared\n"),
            "{text}"
        );
        // An agent that could not see whose process it is (or one from before owners).
        assert!(
            text.ends_with("\n  foreign on GPU 0: pid 9 (?) 100 MiB\n"),
            "{text}"
        );
        assert!(!text.contains("drained"), "{text}");
        let json = json_value(&node, &view(NodeAdmin::default(), 3)).unwrap_or_default();
        assert_eq!(json["gpus"][0]["foreign_processes"][0]["pid"], 9);
        assert_eq!(
            json["gpus"][0]["foreign_processes"][0]["user"],
            serde_json::Value::Null
        );
        assert_eq!(json["state"], "online");
        assert_eq!(json["last_heartbeat_age_ms"], 1_200);
        assert_eq!(json["admin"]["paused_gpus"], serde_json::json!({}));

        let mark = AdminMark {
            by: "root".into(),
            at: now,
            reason: Some("fan noise".into()),
        };
        let admin = NodeAdmin {
            drained: Some(mark.clone()),
            paused_gpus: [(0, mark)].into(),
            last_request: None,
        };
        let text = render(&node, &view(admin.clone(), 3));
        assert!(text.starts_with("node001  drained  "), "{text}");
        assert!(text.contains("\n  drained by root: fan noise\n"), "{text}");
        assert!(
            text.contains("declared  paused by root: fan noise\n"),
            "{text}"
        );
        let json = json_value(&node, &view(admin, 3)).unwrap_or_default();
        assert_eq!(json["state"], "drained");
        assert_eq!(json["admin"]["drained"]["by"], "root");
        assert_eq!(json["admin"]["paused_gpus"]["0"]["reason"], "fan noise");
    }

    #[test]
    fn gpus_show_their_temperature_and_power_where_nvml_reads_them() {
        let now = mgpu_protocol::now();
        let mut node = heartbeat(now);
        node.gpu_source = GpuSource::Nvml;
        node.gpu_note = None;
        node.gpus[0].temperature_c = Some(67);
        node.gpus[0].power_w = Some(250);
        let mut second = node.gpus[0].clone();
        second.index = 1;
        second.foreign_processes.clear();
        // NVML may read one and not the other.
        (second.temperature_c, second.power_w) = (Some(41), None);
        node.gpus.push(second);
        let view = View {
            now,
            jobs: &[],
            admin: NodeAdmin::default(),
            missed_heartbeats: 3,
        };
        let text = render(&node, &view);
        assert!(
            text.contains(
                "  GPU  TYPE  NAME        MEM (MiB)  UTIL  TEMP  POWER  FOREIGN  SOURCE    ADMIN\n"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "  0    -     Fake 24GiB  100/24576  7%    67°C  250W   1        detected\n"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "  1    -     Fake 24GiB  100/24576  7%    41°C  -      0        detected\n"
            ),
            "{text}"
        );
        // `--json` carries them as read, and leaves out what was not.
        let json = json_value(&node, &view).unwrap_or_default();
        assert_eq!(json["gpus"][0]["temperature_c"], 67);
        assert_eq!(json["gpus"][0]["power_w"], 250);
        assert_eq!(json["gpus"][1]["temperature_c"], 41);
        assert!(json["gpus"][1].get("power_w").is_none(), "{json}");
        // Declared GPUs report neither: no such columns, nothing in the JSON.
        let text = render(&heartbeat(now), &view);
        assert!(!text.contains("TEMP") && !text.contains("POWER"), "{text}");
        let json = json_value(&heartbeat(now), &view).unwrap_or_default();
        assert!(json["gpus"][0].get("temperature_c").is_none(), "{json}");
    }

    #[test]
    fn foreign_processes_name_their_owner_largest_first() {
        let now = mgpu_protocol::now();
        let mut node = heartbeat(now);
        let process = |pid: u32, used_mib: u64, user: Option<&str>| ForeignProcess {
            pid,
            used_mib,
            user: user.map(str::to_owned),
        };
        node.gpus[0].foreign_processes = vec![process(4242, 2_048, Some("bob"))];
        let mut second = node.gpus[0].clone();
        second.index = 1;
        second.foreign_processes = vec![
            process(10, 100, Some("alice")),
            process(11, 1_536, None),
            process(12, 300, Some("carol\nroot")),
            process(13, 4_096, Some("dave")),
            process(14, 50, Some("erin")),
            process(15, 200, Some("frank")),
        ];
        let mut third = node.gpus[0].clone();
        third.index = 2;
        third.foreign_processes.clear();
        node.gpus.extend([second, third]);
        let view = View {
            now,
            jobs: &[],
            admin: NodeAdmin::default(),
            missed_heartbeats: 3,
        };
        let text = render(&node, &view);
        assert!(
            text.contains("\n  foreign on GPU 0: pid 4242 (bob) 2 GiB\n"),
            "{text}"
        );
        // Four named, the smallest counted; a name is kept on its line.
        assert!(
            text.ends_with(
                "\n  foreign on GPU 1: pid 13 (dave) 4 GiB, pid 11 (?) 1.5 GiB, \
                 pid 12 (carol root) 300 MiB, pid 15 (frank) 200 MiB, 2 more (150 MiB)\n"
            ),
            "{text}"
        );
        assert!(!text.contains("GPU 2:"), "{text}");
        let json = json_value(&node, &view).unwrap_or_default();
        assert_eq!(json["gpus"][0]["foreign_processes"][0]["user"], "bob");
        assert_eq!(json["gpus"][0]["foreign_processes"][0]["used_mib"], 2_048);
        assert_eq!(json["gpus"][1]["foreign_processes"][0]["user"], "alice");
        assert_eq!(
            json["gpus"][1]["foreign_processes"][1]["user"],
            serde_json::Value::Null
        );
        assert_eq!(json["gpus"][2]["foreign_processes"], serde_json::json!([]));
    }

    #[test]
    fn states_follow_the_policys_missed_heartbeats_and_the_running_jobs() {
        let now = mgpu_protocol::now();
        let mut node = heartbeat(now - chrono::Duration::milliseconds(5_000));
        node.running = vec![RunningJob {
            id: JobId::random(),
            attempt: 1,
            pid: 7,
            idle: None,
        }];
        let drained = NodeAdmin {
            drained: Some(AdminMark {
                by: "root".into(),
                at: now,
                reason: None,
            }),
            ..NodeAdmin::default()
        };
        let view = |admin: NodeAdmin, missed: u32| View {
            now,
            jobs: &[],
            admin,
            missed_heartbeats: missed,
        };
        // 5 s since the last of 2 s heartbeats: online when 3 may be missed, not when 2 may.
        let text = render(&node, &view(drained.clone(), 3));
        assert!(
            text.starts_with("node001  draining  last heartbeat 5.0s ago"),
            "{text}"
        );
        assert!(text.contains("its 1 running job(s) finish first"), "{text}");
        let text = render(&node, &view(NodeAdmin::default(), 2));
        assert!(
            text.starts_with("node001  offline  last heartbeat 5.0s ago"),
            "{text}"
        );
        assert!(
            text.contains("\n  running when last heard from: "),
            "{text}"
        );
        let json = json_value(&node, &view(NodeAdmin::default(), 2)).unwrap_or_default();
        assert_eq!(json["state"], "offline");
        let json = json_value(&node, &view(drained, 3)).unwrap_or_default();
        assert_eq!(json["state"], "draining");
    }

    #[test]
    fn gpu_types_and_features_show_and_are_always_in_the_json() {
        let now = mgpu_protocol::now();
        let mut node = heartbeat(now);
        let view = View {
            now,
            jobs: &[],
            admin: NodeAdmin::default(),
            missed_heartbeats: 3,
        };
        // An agent that reports neither: dashes, and the JSON still has both fields.
        let text = render(&node, &view);
        assert!(text.contains("\n  gpu types: -  features: -\n"), "{text}");
        let json = json_value(&node, &view).unwrap_or_default();
        assert_eq!(json["features"], serde_json::json!([]));
        assert_eq!(json["gpus"][0]["gpu_type"], serde_json::Value::Null);
        assert!(json["gpus"][0].get("gpu_type").is_some(), "{json}");

        node.features = vec!["ib".into(), "nvlink".into()];
        node.gpus[0].gpu_type = Some("h100".into());
        let mut second = node.gpus[0].clone();
        second.index = 1;
        second.name = "NVIDIA A100-SXM4-80GB".into();
        second.gpu_type = Some("a100-80gb".into());
        node.gpus.push(second);
        let text = render(&node, &view);
        assert!(
            text.contains("\n  gpu types: 1×h100,1×a100-80gb  features: ib,nvlink\n"),
            "{text}"
        );
        assert!(text.contains("  GPU  TYPE       NAME "), "{text}");
        assert!(text.contains("\n  0    h100       Fake 24GiB "), "{text}");
        assert!(
            text.contains("\n  1    a100-80gb  NVIDIA A100-SXM4-80GB "),
            "{text}"
        );
        let json = json_value(&node, &view).unwrap_or_default();
        assert_eq!(json["features"], serde_json::json!(["ib", "nvlink"]));
        assert_eq!(json["gpus"][0]["gpu_type"], "h100");
        assert_eq!(json["gpus"][1]["gpu_type"], "a100-80gb");
        // The fields scripts read already are untouched.
        assert_eq!(json["gpus"][1]["name"], "NVIDIA A100-SXM4-80GB");
        assert_eq!(json["node"], "node001");
        assert_eq!(json["state"], "online");
    }
}
