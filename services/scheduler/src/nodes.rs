//! The scheduler's view of the nodes: the last heartbeat of each plus its administrative
//! state (drained, paused GPUs), turned into what the core needs.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use mgpu_protocol::Timestamp;
use mgpu_protocol::node::{NodeAdmin, NodeHeartbeat, NodeLiveness};

use crate::core::{GpuView, NodeView};

pub struct NodeTable {
    nodes: HashMap<String, NodeHeartbeat>,
    pub(crate) admin: BTreeMap<String, NodeAdmin>,
    /// Heartbeats a node may miss before it is offline (the policy's `missed_heartbeats`).
    missed: u32,
    /// Nodes already handled as lost, so their loss is acted on once.
    lost: HashSet<String>,
    /// Since when the scheduler could see heartbeats without a break: silence before then may
    /// be its own (stalled, or the heartbeat stream had no leader), not the nodes'.
    watching_since: Option<Timestamp>,
    /// The policy's `require_gpu_isolation`: a node whose jobs could open others' GPUs takes
    /// no job, as if drained.
    pub(crate) require_gpu_isolation: bool,
    /// Nodes whose agent speaks a protocol this scheduler cannot read, with that protocol:
    /// alive (their heartbeats keep their running jobs from being requeued) but given no job.
    incompatible: HashMap<String, u32>,
}

impl NodeTable {
    /// A table of nodes' last heartbeats (already validated) and their administration.
    pub fn new(beats: Vec<NodeHeartbeat>, admin: BTreeMap<String, NodeAdmin>, missed: u32) -> Self {
        NodeTable {
            nodes: beats.into_iter().map(|b| (b.node.clone(), b)).collect(),
            admin,
            missed,
            lost: HashSet::new(),
            watching_since: None,
            require_gpu_isolation: false,
            incompatible: HashMap::new(),
        }
    }

    /// The scheduler could not see heartbeats (or must not judge silence) until `until`: a
    /// node counts as silent only once it missed its heartbeats after that. A later time
    /// already set stands.
    pub fn blind_until(&mut self, until: Timestamp) {
        self.watching_since = Some(self.watching_since.map_or(until, |since| since.max(until)));
    }

    /// Nodes whose latest heartbeat is already too old at `now` (offline, were the scheduler
    /// watching), in name order.
    pub fn silent_at(&self, now: Timestamp) -> Vec<String> {
        let mut silent: Vec<String> = self
            .nodes
            .values()
            .filter(|beat| beat.liveness_after(now, self.missed) == NodeLiveness::Offline)
            .map(|beat| beat.node.clone())
            .collect();
        silent.sort_unstable();
        silent
    }

    /// Nodes that went offline since the last call (each reported once per outage).
    pub fn newly_lost(&mut self, now: Timestamp) -> Vec<String> {
        let mut lost = Vec::new();
        for beat in self.nodes.values() {
            // Silence counts from the last heartbeat, or from when the scheduler could see
            // heartbeats again if that is later.
            let blind_for = self
                .watching_since
                .map_or(chrono::Duration::zero(), |since| since - beat.sent_at)
                .max(chrono::Duration::zero());
            let offline =
                beat.liveness_after(now - blind_for, self.missed) == NodeLiveness::Offline;
            if offline && !self.lost.contains(&beat.node) {
                lost.push(beat.node.clone());
            } else if !offline {
                self.lost.remove(&beat.node);
            }
        }
        self.lost.extend(lost.iter().cloned());
        // In name order: which node's jobs are requeued first must not depend on hashing
        // (a simulated seed replays exactly only so).
        lost.sort_unstable();
        lost
    }

    /// Attempts that may still run: those the latest heartbeat of each node lists, each with
    /// when it surely stopped: None while its node is online (its next heartbeat tells),
    /// the time its agent fenced itself by when the node is offline. An offline node that
    /// does not fence itself, or whose fence time passed, runs nothing.
    pub fn possibly_running(
        &self,
        now: Timestamp,
    ) -> impl Iterator<Item = (&mgpu_protocol::node::RunningJob, Option<Timestamp>)> {
        self.nodes
            .values()
            .filter_map(move |beat| {
                if beat.liveness_after(now, self.missed) != NodeLiveness::Offline {
                    return Some((beat, None));
                }
                let dead_by = beat.jobs_dead_by()?;
                (dead_by > now).then_some((beat, Some(dead_by)))
            })
            .flat_map(|(beat, until)| beat.running.iter().map(move |r| (r, until)))
    }

    /// Every GPU type and node feature the known nodes report, each once, in order.
    pub fn types_and_features(&self) -> (BTreeSet<&str>, BTreeSet<&str>) {
        let types = self
            .nodes
            .values()
            .flat_map(|beat| beat.gpus.iter().filter_map(|g| g.gpu_type.as_deref()))
            .collect();
        let features = self
            .nodes
            .values()
            .flat_map(|beat| beat.features.iter().map(String::as_str))
            .collect();
        (types, features)
    }

    /// `node` counts as newly lost again at the next [`NodeTable::newly_lost`] if it is still
    /// offline then.
    pub fn forget_lost(&mut self, node: &str) {
        self.lost.remove(node);
    }

    /// Records a heartbeat. Returns true when it may let queued work start: the node is new,
    /// was offline, or what it offers changed (GPUs, foreign use, thresholds).
    pub fn update(&mut self, beat: NodeHeartbeat, now: Timestamp) -> bool {
        let changes_capacity = match self.nodes.get(&beat.node) {
            None => true,
            Some(old) => {
                old.liveness_after(now, self.missed) == NodeLiveness::Offline
                    || old.gpus.len() != beat.gpus.len()
                    || old.mem_threshold != beat.mem_threshold
                    || old.load_threshold != beat.load_threshold
                    || old.gpus.iter().zip(&beat.gpus).any(|(a, b)| {
                        a.index != b.index
                            || a.memory_total_mib != b.memory_total_mib
                            || a.foreign_processes != b.foreign_processes
                            || (a.utilization_pct > 80) != (b.utilization_pct > 80)
                    })
            }
        };
        let was_incompatible = self.incompatible.remove(&beat.node).is_some();
        self.nodes.insert(beat.node.clone(), beat);
        changes_capacity || was_incompatible
    }

    /// A heartbeat of protocol `protocol`, which this scheduler cannot read, came from `node`:
    /// the node is alive (as of `now`; what it last said in a protocol read here stays) and
    /// takes no job. True when this is news (first such heartbeat, or another protocol).
    pub fn mark_incompatible(&mut self, node: &str, protocol: u32, now: Timestamp) -> bool {
        if let Some(beat) = self.nodes.get_mut(node) {
            beat.sent_at = now;
        }
        self.incompatible.insert(node.to_owned(), protocol) != Some(protocol)
    }

    /// The protocol of a node marked incompatible.
    #[cfg(test)]
    pub fn incompatible(&self, node: &str) -> Option<u32> {
        self.incompatible.get(node).copied()
    }

    /// The node's last heartbeat.
    pub fn get(&self, node: &str) -> Option<&NodeHeartbeat> {
        self.nodes.get(node)
    }

    /// The address a node said other nodes can reach it at.
    pub fn address(&self, node: &str) -> Option<&str> {
        self.nodes
            .get(node)
            .map(|beat| beat.address.as_str())
            .filter(|address| !address.is_empty())
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn online(&self, now: Timestamp) -> usize {
        self.nodes
            .values()
            .filter(|n| n.liveness_after(now, self.missed) == NodeLiveness::Online)
            .count()
    }

    /// How many nodes are `online`, `drained` (online, taking no new jobs),
    /// `incompatible` (online, speaking a protocol this scheduler cannot read) and `offline`,
    /// for the metrics.
    pub fn state_counts(&self, now: Timestamp) -> BTreeMap<&'static str, u64> {
        let mut counts = BTreeMap::new();
        for beat in self.nodes.values() {
            let drained = self
                .admin
                .get(&beat.node)
                .is_some_and(|admin| admin.drained.is_some());
            let state = match beat.liveness_after(now, self.missed) {
                NodeLiveness::Offline => "offline",
                NodeLiveness::Online if self.incompatible.contains_key(&beat.node) => {
                    "incompatible"
                }
                NodeLiveness::Online if drained => "drained",
                NodeLiveness::Online => "online",
            };
            *counts.entry(state).or_default() += 1;
        }
        counts
    }

    /// Nodes as the scheduling core sees them, sorted by name for deterministic passes.
    pub fn views(&self, now: Timestamp) -> Vec<NodeView> {
        let mut views: Vec<NodeView> = self
            .nodes
            .values()
            .map(|beat| {
                let admin = self.admin.get(&beat.node);
                NodeView {
                    name: beat.node.clone(),
                    online: beat.liveness_after(now, self.missed) == NodeLiveness::Online,
                    drained: admin.is_some_and(|a| a.drained.is_some())
                        || (self.require_gpu_isolation && !beat.gpu_isolation)
                        || self.incompatible.contains_key(&beat.node),
                    cpus: beat.cpus,
                    mem_host_mib: beat.mem_host_mib,
                    mem_threshold: beat.mem_threshold,
                    load_threshold: beat.load_threshold,
                    labels: beat.labels.clone(),
                    features: beat.features.clone(),
                    gpus: beat
                        .gpus
                        .iter()
                        .map(|g| GpuView {
                            index: g.index,
                            memory_total_mib: g.memory_total_mib,
                            // Saturating: a plain sum panics (debug) or wraps (release) on overflow.
                            foreign_mem_mib: g
                                .foreign_processes
                                .iter()
                                .fold(0u64, |sum, p| sum.saturating_add(p.used_mib)),
                            utilization_pct: g.utilization_pct,
                            paused: admin.is_some_and(|a| a.paused_gpus.contains_key(&g.index)),
                            gpu_type: g.gpu_type.clone(),
                        })
                        .collect(),
                }
            })
            .collect();
        views.sort_by(|a, b| a.name.cmp(&b.name));
        views
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mgpu_protocol::node::GpuSource;

    fn beat(node: &str, sent_at: Timestamp) -> NodeHeartbeat {
        NodeHeartbeat {
            node: node.into(),
            sent_at,
            interval_ms: 1000,
            gpu_source: GpuSource::Declared,
            gpu_note: None,
            gpus: Vec::new(),
            running: Vec::new(),
            address: "h".into(),
            runs_jobs_as: "u".into(),
            containment: None,
            agent_version: "0".into(),
            protocol: mgpu_protocol::version::PROTOCOL,
            mem_threshold: 0.8,
            load_threshold: 0.8,
            labels: BTreeMap::new(),
            fence_after_ms: None,
            kill_grace_ms: 0,
            gpu_isolation: false,
            cpus: None,
            mem_host_mib: None,
            features: Vec::new(),
        }
    }

    /// An agent of a protocol the scheduler cannot read keeps its node alive (so its running
    /// jobs stay where they are) but the node takes no job until it speaks one it can.
    #[test]
    fn an_incompatible_node_stays_alive_and_takes_no_job() {
        let start = mgpu_protocol::now();
        let mut table = NodeTable::new(Vec::new(), BTreeMap::new(), 3);
        table.update(beat("n1", start), start);
        assert!(!table.views(start)[0].drained);

        let later = start + chrono::Duration::seconds(60);
        assert!(
            table.mark_incompatible("n1", 9, later),
            "news the first time"
        );
        assert!(!table.mark_incompatible("n1", 9, later), "not news again");
        assert_eq!(table.incompatible("n1"), Some(9));
        let view = &table.views(later)[0];
        assert!(view.online && view.drained, "{view:?}");
        assert!(table.newly_lost(later).is_empty());

        assert!(
            table.update(beat("n1", later), later),
            "readable again: capacity changed"
        );
        assert!(!table.views(later)[0].drained);
        assert_eq!(table.incompatible("n1"), None);
    }

    #[test]
    fn nodes_are_counted_by_state_for_the_metrics() {
        let start = mgpu_protocol::now();
        let beats = ["n1", "n2", "n3", "n4"].map(|n| beat(n, start)).to_vec();
        let mut admin = BTreeMap::new();
        let mark = mgpu_protocol::node::AdminMark {
            by: "admin".into(),
            at: start,
            reason: None,
        };
        admin.insert(
            "n2".to_owned(),
            NodeAdmin {
                drained: Some(mark),
                ..NodeAdmin::default()
            },
        );
        let mut table = NodeTable::new(beats, admin, 3);
        table.mark_incompatible("n3", 9, start);
        table.update(beat("n4", start - chrono::Duration::seconds(60)), start);
        let counts = table.state_counts(start);
        let expected: BTreeMap<&str, u64> = [
            ("online", 1),
            ("drained", 1),
            ("incompatible", 1),
            ("offline", 1),
        ]
        .into();
        assert_eq!(counts, expected);
    }

    #[test]
    fn a_silent_node_is_lost_once_per_outage() {
        let start = mgpu_protocol::now();
        let mut table = NodeTable::new(vec![beat("n1", start)], BTreeMap::new(), 3);
        assert!(
            table
                .newly_lost(start + chrono::Duration::seconds(2))
                .is_empty()
        );
        let later = start + chrono::Duration::seconds(4);
        assert_eq!(table.newly_lost(later), vec!["n1".to_owned()]);
        assert!(table.newly_lost(later).is_empty(), "reported once");
        // It comes back, then goes silent again: a new outage.
        table.update(beat("n1", later), later);
        assert!(table.newly_lost(later).is_empty());
        assert_eq!(
            table.newly_lost(later + chrono::Duration::seconds(5)),
            vec!["n1".to_owned()]
        );
    }

    /// Fuzz target: heartbeats as the scheduler reads them. Whatever decodes (validated or
    /// not: stored heartbeats were once loaded unchecked) must go through the node table,
    /// the core's views and a scheduling pass without a panic; what passes validation must
    /// give the core finite thresholds.
    mod fuzz {
        use super::*;
        use crate::core::{self, CoreSettings, QueuedJob};
        use mgpu_protocol::fuzzing::payloads;
        use mgpu_protocol::gpu_amount::GpuAmount;
        use mgpu_protocol::ids::JobId;
        use mgpu_protocol::node::{ForeignProcess, GpuStatus, RunningJob};
        use mgpu_protocol::priority::PlacementPolicy;
        use mgpu_protocol::wire;
        use proptest::prelude::*;

        fn sample() -> serde_json::Value {
            let mut b = beat("node001", mgpu_protocol::now());
            b.gpus = (0..2)
                .map(|index| GpuStatus {
                    index,
                    uuid: format!("GPU-{index}"),
                    name: "NVIDIA H100".into(),
                    memory_total_mib: 81_559,
                    memory_used_mib: 1203,
                    utilization_pct: 37,
                    temperature_c: None,
                    power_w: None,
                    foreign_processes: vec![ForeignProcess {
                        pid: 4242,
                        used_mib: 1200,
                        user: None,
                    }],
                    gpu_type: None,
                })
                .collect();
            b.running = vec![RunningJob {
                id: JobId::random(),
                attempt: 1,
                pid: 31337,
                idle: None,
            }];
            b.labels = BTreeMap::from([("rack".into(), "r1".into())]);
            b.fence_after_ms = Some(10_000);
            b.kill_grace_ms = 10_000;
            serde_json::to_value(&b).unwrap_or_default()
        }

        /// Found by this target: `Duration * missed`, `sent_at + fence` and the foreign memory
        /// sum panicked on these.
        #[test]
        fn huge_intervals_neither_panic_nor_pass() {
            let now = mgpu_protocol::now();
            let mut b = beat("n1", now);
            b.interval_ms = u64::MAX;
            b.fence_after_ms = Some(u64::MAX);
            b.gpus = vec![overflowing_gpu()];
            assert!(b.validate(now).is_err());
            let _ = (b.jobs_dead_by(), b.liveness(now));
            let mut table = NodeTable::new(Vec::new(), BTreeMap::new(), 3);
            table.update(b, now);
            let _ = (table.views(now), table.newly_lost(now));
        }

        /// A GPU with two processes whose memory sums past `u64::MAX`.
        fn overflowing_gpu() -> GpuStatus {
            let huge = ForeignProcess {
                pid: 1,
                used_mib: u64::MAX,
                user: None,
            };
            GpuStatus {
                index: 0,
                uuid: "GPU-0".into(),
                name: "x".into(),
                memory_total_mib: 1,
                memory_used_mib: 1,
                utilization_pct: 0,
                temperature_c: None,
                power_w: None,
                foreign_processes: vec![huge.clone(), huge],
                gpu_type: None,
            }
        }

        proptest! {
            #[test]
            fn fuzz_heartbeat(payload in payloads(sample())) {
                let now = mgpu_protocol::now();
                let Ok(beat) = wire::decode::<NodeHeartbeat>("heartbeat", &payload, wire::MAX_HEARTBEAT_BYTES) else {
                    return Ok(());
                };
                let valid = beat.validate(now).is_ok();
                let _ = (beat.jobs_dead_by(), beat.liveness(now));
                let mut table = NodeTable::new(Vec::new(), BTreeMap::new(), 3);
                table.blind_until(now - chrono::Duration::seconds(30));
                table.update(beat.clone(), now);
                table.update(beat, now);
                let views = table.views(now);
                let _ = (table.newly_lost(now), table.online(now));
                if valid {
                    for view in &views {
                        prop_assert!(view.mem_threshold.is_finite() && view.load_threshold.is_finite());
                    }
                }
                let settings = CoreSettings {
                    placement: PlacementPolicy::FillFirst,
                    max_reservations: 4,
                    topology_label: Some("rack".into()),
                    gpu_caps: Default::default(),
                    gpu_type_caps: Default::default(),
                    class_caps: Default::default(),
                    max_start_estimates: 4,
                    windows: Default::default(),
                    reservation_horizon: chrono::Duration::hours(24),
                };
                let queue = [
                    QueuedJob::new(JobId::random(), GpuAmount::ONE, now),
                    QueuedJob::new(JobId::random(), GpuAmount::from_units(2_500), now),
                ];
                let _ = core::plan::<_, core::RunningJob>(&views, &[], &queue, &settings, now);
            }
        }
    }
}
