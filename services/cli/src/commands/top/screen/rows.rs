//! The lines the two panes list, worked out from [`Data`] after each change: one line per GPU
//! (with the job holding it), the queue in the order the scheduler considers it (with each
//! waiting job's effective priority), and the summary counts.
//!
//! Built for 1 000 nodes of 8 GPUs and 10 000 jobs well inside a frame's budget: lines name
//! nodes and jobs by index into [`Data`], the queue is sorted on keys computed once per job,
//! and the holders of GPUs are found from the running jobs, never by searching all jobs per GPU.

use std::cmp::Reverse;
use std::collections::{BTreeMap, HashMap};

use mgpu_protocol::Timestamp;
use mgpu_protocol::job::{JobRecord, JobState};
use mgpu_protocol::node::NodeLiveness;
use mgpu_protocol::priority::{base_priority, effective_priority};

use super::data::Data;
use super::filter::{Filter, GpuFacts};
use super::format;
use super::me::Me;

/// One line of the nodes pane: a GPU, or a node without any.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuLine {
    /// Index into [`Data::nodes`].
    pub node: usize,
    /// Index into that node's `gpus`; None for a node without GPUs.
    pub gpu: Option<usize>,
    /// The node's first line shown: it carries the node's name and state.
    pub first: bool,
    /// The first job holding a share of this GPU (index into [`Data::jobs`]).
    pub job: Option<usize>,
    /// How many other jobs share it.
    pub sharers: usize,
    pub paused: bool,
}

/// One line of the queue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobLine {
    /// Index into [`Data::jobs`].
    pub job: usize,
    /// Queued jobs only.
    pub effective: Option<i64>,
    pub mine: bool,
}

/// What a node is doing, as `mgpu top`, `mgpu queue` and `mgpu nodes` say it: liveness first
/// (an offline node runs nothing that can be seen), then the admins' drain.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeState {
    /// Heartbeats arrive and new jobs may start there.
    Online,
    /// Drained by an admin, but jobs still run there.
    Draining,
    /// Drained by an admin and idle.
    Drained,
    /// More heartbeats missed than the scheduler's policy allows (`missed_heartbeats`).
    Offline,
}

impl NodeState {
    pub fn of(liveness: NodeLiveness, drained: bool, jobs_running: usize) -> NodeState {
        match (liveness, drained) {
            (NodeLiveness::Offline, _) => NodeState::Offline,
            (NodeLiveness::Online, true) if jobs_running > 0 => NodeState::Draining,
            (NodeLiveness::Online, true) => NodeState::Drained,
            (NodeLiveness::Online, false) => NodeState::Online,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            NodeState::Online => "online",
            NodeState::Draining => "draining",
            NodeState::Drained => "drained",
            NodeState::Offline => "offline",
        }
    }
}

/// GPUs counted by what they are doing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GpuCounts {
    pub free: usize,
    /// A job holds some of it.
    pub used: usize,
    /// Paused, or on a drained node: nothing new starts there.
    pub paused: usize,
    /// On a node that stopped heartbeating.
    pub offline: usize,
}

/// The header's counts, over the whole cluster whatever the filter shows.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    pub nodes: usize,
    pub nodes_online: usize,
    pub gpus: GpuCounts,
    /// By GPU type (the model name for a GPU whose agent reports no type).
    pub models: Vec<(String, GpuCounts)>,
    pub running: usize,
    pub queued: usize,
    pub held: usize,
    pub mine_running: usize,
    pub mine_queued: usize,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Rows {
    pub gpus: Vec<GpuLine>,
    pub jobs: Vec<JobLine>,
    /// Each node's state, by index into [`Data::nodes`].
    pub node_states: Vec<NodeState>,
    pub summary: Summary,
    /// Some GPU, shown or not, reports its temperature or power (NVML reads them; declared
    /// GPUs have neither): the nodes pane makes room for them.
    pub sensors: bool,
}

/// Whose a job is: signed with the user's key, or (records from before requests were signed)
/// under the user's name.
pub fn is_mine(me: &Me, job: &JobRecord) -> bool {
    match &job.user_key {
        Some(key) => *key == me.key,
        None => job.user == me.user,
    }
}

/// When a queued job (re-)entered the queue: a requeued job waits from its requeue.
pub fn queued_at(job: &JobRecord) -> Timestamp {
    match &job.state {
        JobState::Queued(waiting) => waiting.enqueued_at.unwrap_or(job.submitted_at),
        _ => job.submitted_at,
    }
}

pub fn derive(data: &Data, filter: &Filter, me: &Me, now: Timestamp) -> Rows {
    let mut summary = Summary {
        nodes: data.nodes.len(),
        ..Summary::default()
    };
    let jobs = job_lines(data, filter, me, now, &mut summary);
    let holders = Holders::of(data);
    let node_states = node_states(data, &holders, now);
    summary.nodes_online = node_states
        .iter()
        .filter(|s| **s != NodeState::Offline)
        .count();
    let gpus = gpu_lines(data, filter, &holders, &node_states, &mut summary);
    let sensors = data
        .nodes
        .iter()
        .flat_map(|beat| &beat.gpus)
        .any(|gpu| gpu.temperature_c.is_some() || gpu.power_w.is_some());
    Rows {
        gpus,
        jobs,
        node_states,
        summary,
        sensors,
    }
}

/// Which running jobs hold which GPUs, and how many run on each node.
struct Holders<'a> {
    /// (node, GPU index) → the jobs holding a share of it, in no particular order.
    gpus: HashMap<(&'a str, u32), Vec<usize>>,
    running_on: HashMap<&'a str, usize>,
}

impl<'a> Holders<'a> {
    fn of(data: &'a Data) -> Holders<'a> {
        let mut gpus: HashMap<(&str, u32), Vec<usize>> = HashMap::new();
        let mut running_on: HashMap<&str, usize> = HashMap::new();
        for (at, job) in data.jobs.iter().enumerate() {
            let JobState::Running(run) = &job.state else {
                continue;
            };
            for (_, node, shares) in run.placement.ranks() {
                *running_on.entry(node).or_default() += 1;
                for share in shares {
                    gpus.entry((node, share.index)).or_default().push(at);
                }
            }
        }
        Holders { gpus, running_on }
    }
}

fn node_states(data: &Data, holders: &Holders<'_>, now: Timestamp) -> Vec<NodeState> {
    data.nodes
        .iter()
        .map(|beat| {
            let drained = data
                .marks
                .get(&beat.node)
                .is_some_and(|m| m.drained.is_some());
            // The records and the node's own report can disagree for a moment; either
            // running anything keeps a drained node draining.
            let running = holders
                .running_on
                .get(beat.node.as_str())
                .copied()
                .unwrap_or(0)
                .max(beat.running.len());
            let liveness = beat.liveness_after(now, data.policy.missed_heartbeats);
            NodeState::of(liveness, drained, running)
        })
        .collect()
}

fn gpu_lines(
    data: &Data,
    filter: &Filter,
    holders: &Holders<'_>,
    states: &[NodeState],
    summary: &mut Summary,
) -> Vec<GpuLine> {
    let mut models: BTreeMap<&str, GpuCounts> = BTreeMap::new();
    let mut lines = Vec::with_capacity(data.nodes.iter().map(|n| n.gpus.len().max(1)).sum());
    for node in 0..data.nodes.len() {
        let state = states.get(node).copied().unwrap_or(NodeState::Offline);
        let mut node_lines = NodeLines {
            data,
            filter,
            node,
            state,
            first: true,
            lines: &mut lines,
        };
        node_lines.add(holders, &mut models);
    }
    for counts in models.values() {
        summary.gpus.free += counts.free;
        summary.gpus.used += counts.used;
        summary.gpus.paused += counts.paused;
        summary.gpus.offline += counts.offline;
    }
    summary.models = models
        .into_iter()
        .map(|(name, counts)| (name.to_owned(), counts))
        .collect();
    lines
}

/// One node's lines on their way into the pane.
struct NodeLines<'a, 'l> {
    data: &'a Data,
    filter: &'a Filter,
    node: usize,
    state: NodeState,
    /// No line of this node kept yet: the next one carries its name.
    first: bool,
    lines: &'l mut Vec<GpuLine>,
}

impl<'a> NodeLines<'a, '_> {
    /// Adds the node's GPU lines the filter keeps (one line if it has no GPU), and counts
    /// every GPU by type.
    fn add(&mut self, holders: &Holders<'_>, models: &mut BTreeMap<&'a str, GpuCounts>) {
        let data = self.data;
        let Some(beat) = data.nodes.get(self.node) else {
            return;
        };
        let line = GpuLine {
            node: self.node,
            gpu: None,
            first: true,
            job: None,
            sharers: 0,
            paused: false,
        };
        if beat.gpus.is_empty() {
            return self.keep(line, &[]);
        }
        let marks = data.marks.get(&beat.node);
        for (at, gpu) in beat.gpus.iter().enumerate() {
            let paused = marks.is_some_and(|m| m.paused_gpus.contains_key(&gpu.index));
            let held = holders
                .gpus
                .get(&(beat.node.as_str(), gpu.index))
                .map_or(&[][..], Vec::as_slice);
            let counts = models.entry(format::gpu_kind(gpu)).or_default();
            *bucket(counts, self.state, !held.is_empty(), paused) += 1;
            let line = GpuLine {
                gpu: Some(at),
                sharers: held.len().saturating_sub(1),
                paused,
                ..line
            };
            self.keep(line, held);
        }
    }

    /// Keeps the line if the filter does, showing the first holder the filter keeps (so
    /// `user:bob` finds bob's share of a GPU shared with alice).
    fn keep(&mut self, line: GpuLine, holders: &[usize]) {
        let Some(beat) = self.data.nodes.get(self.node) else {
            return;
        };
        let keeps = |job: Option<&JobRecord>| {
            self.filter.keeps_gpu(&GpuFacts {
                node: &beat.node,
                node_state: self.state.name(),
                paused: line.paused,
                job,
            })
        };
        let shown = if holders.is_empty() {
            keeps(None).then_some(None)
        } else {
            holders
                .iter()
                .find(|&&at| keeps(self.data.jobs.get(at)))
                .map(|&at| Some(at))
        };
        if let Some(job) = shown {
            self.lines.push(GpuLine {
                first: self.first,
                job,
                ..line
            });
            self.first = false;
        }
    }
}

/// Which count a GPU adds to: a silent node's are offline whatever else; then held by a
/// job, then out of service (paused, or its node drained), else free.
fn bucket(counts: &mut GpuCounts, state: NodeState, held: bool, paused: bool) -> &mut usize {
    match (state, held, paused) {
        (NodeState::Offline, _, _) => &mut counts.offline,
        (_, true, _) => &mut counts.used,
        (NodeState::Drained | NodeState::Draining, false, _) | (_, false, true) => {
            &mut counts.paused
        }
        _ => &mut counts.free,
    }
}

/// Running jobs first (longest running first), then queued ones in the order the scheduler
/// considers them: higher effective priority, then earlier queue time; the id settles ties.
type SortKey = (u8, Reverse<i64>, Timestamp);

fn job_lines(
    data: &Data,
    filter: &Filter,
    me: &Me,
    now: Timestamp,
    summary: &mut Summary,
) -> Vec<JobLine> {
    // A user's usage is the same for each of their jobs: looked up once per user.
    let mut usage: HashMap<&str, f64> = HashMap::new();
    let mut keyed: Vec<(SortKey, JobLine)> = Vec::with_capacity(data.jobs.len());
    for (at, job) in data.jobs.iter().enumerate() {
        let mine = is_mine(me, job);
        let key = match &job.state {
            JobState::Running(run) => {
                summary.running += 1;
                summary.mine_running += usize::from(mine);
                (0, Reverse(0), run.started_at.unwrap_or(run.assigned_at))
            }
            JobState::Queued(waiting) => {
                summary.queued += 1;
                summary.mine_queued += usize::from(mine);
                summary.held += usize::from(waiting.held_by.is_some());
                (1, Reverse(0), queued_at(job))
            }
            _ => continue,
        };
        if !filter.keeps_job(job) {
            continue;
        }
        let effective = (key.0 == 1).then(|| {
            let used = *usage.entry(job.user.as_str()).or_insert_with(|| {
                data.usage
                    .gpu_hours(&job.user, now, data.policy.half_life_secs)
            });
            let base = base_priority(&job.spec, &data.policy);
            effective_priority(base, key.2, used, &data.policy, now)
        });
        let key = (key.0, Reverse(effective.unwrap_or(0)), key.2);
        keyed.push((
            key,
            JobLine {
                job: at,
                effective,
                mine,
            },
        ));
    }
    let id = |line: &JobLine| data.jobs.get(line.job).map(|j| j.id.as_str());
    keyed.sort_unstable_by(|a, b| a.0.cmp(&b.0).then_with(|| id(&a.1).cmp(&id(&b.1))));
    keyed.into_iter().map(|(_, line)| line).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::top::screen::test_data::{
        alice, heartbeat, held, job, nvml_heartbeat, queued, running,
    };
    use mgpu_protocol::node::{AdminMark, NodeAdmin};

    fn names(data: &Data, rows: &Rows) -> Vec<String> {
        rows.jobs
            .iter()
            .filter_map(|line| data.jobs.get(line.job))
            .map(|job| job.spec.display_name())
            .collect()
    }

    #[test]
    fn the_queue_lists_running_jobs_then_waiting_ones_by_effective_priority() {
        let mut data = Data::default();
        let mut urgent = job("bob", "urgent", queued());
        urgent.spec.priority = 5;
        data.put_job(job("alice", "waiting", queued()));
        data.put_job(urgent);
        data.put_job(job("alice", "train", running("n1", &[0])));
        data.put_job(job("carol", "held", held("carol")));
        let rows = derive(&data, &Filter::default(), &alice(), mgpu_protocol::now());
        let order = names(&data, &rows);
        assert_eq!(order[0], "train");
        assert_eq!(order[1], "urgent");
        assert_eq!(rows.jobs[0].effective, None);
        assert!(rows.jobs[1].effective > rows.jobs[2].effective);
        let summary = &rows.summary;
        assert_eq!((summary.running, summary.queued, summary.held), (1, 3, 1));
        assert_eq!((summary.mine_running, summary.mine_queued), (1, 1));
        let mine: Vec<bool> = rows.jobs.iter().map(|line| line.mine).collect();
        assert_eq!(mine, [true, false, true, false]);
        // The filter narrows the lines, not the counts.
        let bob = derive(
            &data,
            &Filter::parse("user:bob"),
            &alice(),
            mgpu_protocol::now(),
        );
        assert_eq!(names(&data, &bob), ["urgent"]);
        assert_eq!(bob.summary.queued, 3);
    }

    #[test]
    fn gpus_show_their_jobs_and_are_counted_by_model() {
        let mut data = Data::default();
        data.put_heartbeat(heartbeat("n1", 4));
        let mut other = heartbeat("n2", 2);
        for gpu in &mut other.gpus {
            gpu.name = "H100".into();
        }
        data.put_heartbeat(other);
        data.put_job(job("alice", "train", running("n1", &[0, 1])));
        data.put_job(job("bob", "shared", running("n1", &[1])));
        let mark = AdminMark {
            by: "root".into(),
            at: mgpu_protocol::now(),
            reason: None,
        };
        let mut marks = NodeAdmin::default();
        marks.paused_gpus.insert(3, mark.clone());
        data.put_marks("n1".into(), Some(marks));
        data.put_marks(
            "n2".into(),
            Some(NodeAdmin {
                drained: Some(mark),
                ..NodeAdmin::default()
            }),
        );
        let rows = derive(&data, &Filter::default(), &alice(), mgpu_protocol::now());
        assert_eq!(rows.gpus.len(), 6);
        assert!(rows.gpus[0].first && !rows.gpus[1].first && rows.gpus[4].first);
        assert_eq!(rows.gpus[1].sharers, 1);
        assert!(rows.gpus[3].paused);
        assert_eq!(rows.node_states, [NodeState::Online, NodeState::Drained]);
        let models = &rows.summary.models;
        assert_eq!(models[0].0, "A100");
        assert_eq!(
            models[0].1,
            GpuCounts {
                free: 1,
                used: 2,
                paused: 1,
                offline: 0
            }
        );
        assert_eq!(
            models[1].1.paused, 2,
            "a drained node's GPUs take nothing new"
        );
        // Filtering by user keeps the GPUs their jobs hold; the node's name moves to the
        // first line kept.
        let bob = derive(
            &data,
            &Filter::parse("user:bob"),
            &alice(),
            mgpu_protocol::now(),
        );
        assert_eq!(bob.gpus.len(), 1, "bob's share of GPU 1");
        assert_eq!(
            bob.gpus[0]
                .job
                .and_then(|at| data.jobs.get(at))
                .map(|j| j.user.as_str()),
            Some("bob")
        );
        let train = derive(
            &data,
            &Filter::parse("train"),
            &alice(),
            mgpu_protocol::now(),
        );
        assert_eq!(train.gpus.len(), 2);
        assert!(train.gpus[0].first);
    }

    #[test]
    fn silent_nodes_are_offline() {
        let mut data = Data::default();
        let mut beat = heartbeat("n1", 1);
        beat.sent_at = mgpu_protocol::now() - chrono::Duration::seconds(60);
        data.put_heartbeat(beat);
        let rows = derive(&data, &Filter::default(), &alice(), mgpu_protocol::now());
        assert_eq!(rows.node_states, [NodeState::Offline]);
        assert_eq!(rows.summary.gpus.offline, 1);
        assert_eq!(rows.summary.nodes_online, 0);
    }

    #[test]
    fn temperature_and_power_get_room_once_any_gpu_reports_them() {
        let mut data = Data::default();
        data.put_heartbeat(heartbeat("n1", 2));
        let rows = derive(&data, &Filter::default(), &alice(), mgpu_protocol::now());
        assert!(!rows.sensors, "declared GPUs report neither");
        data.put_heartbeat(nvml_heartbeat("n2", 1));
        // Even while the filter hides the GPU that reports them: the columns stay put.
        let rows = derive(
            &data,
            &Filter::parse("node:n1"),
            &alice(),
            mgpu_protocol::now(),
        );
        assert!(rows.sensors);
        assert_eq!(rows.gpus.len(), 2);
    }
}
