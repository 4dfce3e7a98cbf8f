//! Jobs: what a user asks for ([`JobSpec`], sent in a [`SubmitRequest`]) and what the scheduler
//! records about it ([`JobRecord`], one KV entry per job).
//!
//! Lifecycle data lives inside [`JobState`]'s variants, so a queued job cannot carry a
//! placement and a running one cannot lack one.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::Timestamp;
use crate::duration::MAX_TIME_LIMIT;
use crate::error::InvalidInput;
use crate::gpu_amount::GpuAmount;
use crate::ids::JobId;

mod listing;
mod placement;
mod script;
mod state;
mod validate;

use validate::check_gpu_index;

pub use placement::{GpuShare, Launch, NodeShare, Placement};
pub use script::{BatchScript, MAX_SCRIPT_BYTES};
pub use state::{Ending, JobState, Run, WaitReason, Waiting};

/// Everything a user asks for when submitting. Fields not given take their defaults.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobSpec {
    /// The command. One element is a shell command line (`"python a.py | tee log"`);
    /// several are a program and its arguments, passed on exactly as given.
    pub command: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// GPUs wanted: whole GPUs, or a share (below 1) of one GPU.
    #[serde(default = "one_gpu")]
    pub gpus: GpuAmount,
    /// Exact physical GPU indices on the node, when the user pins them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_ids: Option<Vec<u32>>,
    /// GPUs the job may be placed on (the CSV job format's `allowed_gpus`): any of these,
    /// chosen by the scheduler, unlike `gpu_ids`, which pins exactly those.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_gpus: Option<Vec<u32>>,
    /// GPU memory needed on each GPU, in MiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_mib: Option<u64>,
    /// CPU cores the job needs on each of its nodes (`--cpus`), counted like GPUs and pinned
    /// with a cpuset where the node can; None: the cluster's `cpus_per_gpu`, else not counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<u32>,
    /// Host memory (RAM) the job may use on each of its nodes, in MiB (`--mem-host`), its
    /// cgroup's limit; None: the cluster's `mem_per_gpu`, else no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_host_mib: Option<u64>,
    /// Higher runs first.
    #[serde(default)]
    pub priority: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_limit_secs: Option<u64>,
    /// Shell code run before the command in the same shell (`source venv/bin/activate`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env_setup_cmd: Option<String>,
    /// Absolute directory the job runs in.
    pub workdir: String,
    /// The submitter's environment, captured at submit. Empty in the records users read
    /// when [`JobSpec::private_env`] is set; filled in the job's assignments.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// The environment is kept apart, in the `mgpu-job-env` bucket under the owner's key,
    /// readable by the owner, admins and the scheduler only.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub private_env: bool,
    /// Its output goes to `users.<owner key>.jobs.<id>.output`, which only its owner and
    /// admins may read (`mgpu submit --private`, or the scheduler's `private_output`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub private_output: bool,
    /// The submitter is attached and may send standard input.
    #[serde(default)]
    pub interactive: bool,
    /// Conda environment activated before the command (after `env_setup_cmd`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conda_env: Option<String>,
    /// What happens at the time limit: back to the end of the queue, or end as `timed_out`.
    #[serde(default)]
    pub on_timeout: OnTimeout,
    /// Start only after these jobs succeeded (`--after`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub after: Vec<JobId>,
    /// Start only after these jobs ended, however they ended (`--after-any`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub after_any: Vec<JobId>,
    /// Membership in a job array (`--array 0-9%2`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub array: Option<ArrayMember>,
    /// Refuse this job when an identical one is queued or running (`--dedup`, job files).
    #[serde(default)]
    pub dedup: bool,
    /// The profile the GPU requirement came from (`--profile`, or `--llm NAME` in the command).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    /// When its node is lost, end as `node_failed` instead of going back to the queue.
    #[serde(default)]
    pub no_requeue: bool,
    /// Nodes the job spans (`--nodes`); `gpus` is then the count on each node.
    #[serde(default = "one_node", skip_serializing_if = "is_one_node")]
    pub nodes: u32,
    /// Nodes the job must run on, in rank order (`--nodelist a,b`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodelist: Vec<String>,
    /// Nodes the job must not run on (`--exclude c`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exclude: Vec<String>,
    /// Exact GPUs on exact nodes, in rank order (`--node-gpu-ids "node001:0,1;node002:0,1"`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub node_gpu_ids: Vec<NodeGpuIds>,
    /// Run the command once per node, with the torchrun/MPI rendezvous variables set
    /// (`--distributed`); otherwise a multi-node job's command runs once, on its first node.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub distributed: bool,
    /// Run under a pseudo-terminal of this size (`--pty`), which `mgpu attach` joins; None:
    /// plain pipes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pty: Option<crate::terminal::TermSize>,
    /// A batch script captured at submit (`mgpu submit train.sh`): its node runs this
    /// content, written to a private file, in place of the command's first word.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub script: Option<BatchScript>,
    /// GPU types it takes, preferred first (`--gpu-type h100,a100-80gb`); empty: any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpu_types: Vec<String>,
    /// The node features it needs (`--constraint 'ib&nvlink'`), as typed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub constraint: Option<String>,
    /// Its quality-of-service class (`--qos`); None: `normal`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qos: Option<String>,
    /// The warning it asks for before it is stopped (`--signal USR1@300`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<crate::stop::StopSignal>,
    /// Its owner knows its GPUs may sit idle (`--idle-ok`): the `[idle]` policy leaves it
    /// alone, where its class allows that.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub idle_ok: bool,
    /// The moments its owner is told about through their destinations (`--notify end,fail`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notify: Vec<crate::notify::NotifyEvent>,
    /// The reservation it runs in (`--reservation NAME`): only on its GPUs, inside its window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reservation: Option<String>,
}

/// GPUs pinned on one node (`node001:0,1`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeGpuIds {
    pub node: String,
    pub gpu_ids: Vec<u32>,
}

/// Most nodes one job may span.
pub const MAX_JOB_NODES: u32 = 1024;

/// Largest `--priority` either way: the effective priority multiplies it by a million, and
/// a typo of ten digits must not outrank every job forever.
pub const MAX_PRIORITY: i32 = 1_000_000;
/// Most variables a captured environment may hold (a login shell has a few hundred).
pub const MAX_ENV_VARS: usize = 4096;
/// Longest path (Linux's `PATH_MAX`).
pub const MAX_PATH_BYTES: usize = 4096;

fn one_node() -> u32 {
    1
}

fn is_one_node(nodes: &u32) -> bool {
    *nodes == 1
}

/// Parses `--node-gpu-ids`: `node001:0,1;node002:0,1` (rank order as written).
pub fn parse_node_gpu_ids(text: &str) -> Result<Vec<NodeGpuIds>, InvalidInput> {
    let mut out: Vec<NodeGpuIds> = Vec::new();
    for part in text.split(';').map(str::trim).filter(|p| !p.is_empty()) {
        let (node, ids) = part.split_once(':').ok_or_else(|| {
            InvalidInput::new(format!(
                "`{part}` is not NODE:IDS (e.g. node001:0,1;node002:0,1)"
            ))
        })?;
        let node = node.trim();
        crate::ids::validate_node_name(node)?;
        let gpu_ids = ids
            .split(',')
            .map(|id| {
                id.trim().parse::<u32>().map_err(|_| {
                    InvalidInput::new(format!("`{}` in `{part}` is not a GPU index", id.trim()))
                })
            })
            .collect::<Result<Vec<u32>, _>>()?;
        if out.iter().any(|n| n.node == node) {
            return Err(InvalidInput::new(format!(
                "--node-gpu-ids names node {node} twice"
            )));
        }
        out.push(NodeGpuIds {
            node: node.to_owned(),
            gpu_ids,
        });
    }
    if out.is_empty() {
        return Err(InvalidInput::new("--node-gpu-ids names no node"));
    }
    Ok(out)
}

/// What a job does when its time limit is reached.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnTimeout {
    /// A time slice: when it is over and other jobs wait, the job is stopped and goes back to
    /// the end of the queue; while nobody waits it keeps running.
    #[default]
    Requeue,
    /// A hard limit: the job is stopped and ends as `timed_out`.
    Fail,
}

/// One task of a job array.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArrayMember {
    /// Shared by every task of the array (a fresh id, not one of the tasks' ids).
    pub array_id: JobId,
    /// This task's index (`MGPU_ARRAY_INDEX`).
    pub index: u32,
    /// At most this many tasks of the array run at once (`%4`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_running: Option<u32>,
}

fn one_gpu() -> GpuAmount {
    GpuAmount::ONE
}

impl JobSpec {
    /// A spec with defaults for everything but the command and directory.
    pub fn new(command: Vec<String>, workdir: impl Into<String>) -> Self {
        JobSpec {
            command,
            name: None,
            gpus: GpuAmount::ONE,
            gpu_ids: None,
            allowed_gpus: None,
            mem_mib: None,
            cpus: None,
            mem_host_mib: None,
            priority: 0,
            time_limit_secs: None,
            env_setup_cmd: None,
            workdir: workdir.into(),
            env: BTreeMap::new(),
            private_env: false,
            private_output: false,
            interactive: false,
            conda_env: None,
            on_timeout: OnTimeout::Requeue,
            after: Vec::new(),
            after_any: Vec::new(),
            array: None,
            dedup: false,
            profile: None,
            no_requeue: false,
            nodes: 1,
            nodelist: Vec::new(),
            exclude: Vec::new(),
            node_gpu_ids: Vec::new(),
            distributed: false,
            pty: None,
            script: None,
            gpu_types: Vec::new(),
            constraint: None,
            qos: None,
            signal: None,
            idle_ok: false,
            notify: Vec::new(),
            reservation: None,
        }
    }

    /// Whether the job spans more than one node.
    pub fn is_multi_node(&self) -> bool {
        self.nodes > 1
    }

    /// What makes two submissions "the same job" for dedup: command, environment setup and
    /// resources (the user is compared separately). The captured environment is left out on
    /// purpose: it differs between two shells of the same person.
    pub fn dedup_key(&self) -> String {
        let mut key = serde_json::json!([
            self.command,
            self.env_setup_cmd,
            self.conda_env,
            self.workdir,
            self.gpus,
            self.gpu_ids,
            self.allowed_gpus,
            self.mem_mib,
            self.array.as_ref().map(|a| a.index),
            self.nodes,
            self.nodelist,
            self.exclude,
            self.node_gpu_ids,
            self.distributed,
            self.cpus,
            self.mem_host_mib,
        ]);
        if let (Some(content), Some(parts)) = (self.script_dedup_part(), key.as_array_mut()) {
            parts.push(content.into());
        }
        // Only when set, so a job without them keys as it did before they existed.
        if (!self.gpu_types.is_empty() || self.constraint.is_some())
            && let Some(parts) = key.as_array_mut()
        {
            parts.push(serde_json::json!([self.gpu_types, self.constraint]));
        }
        key.to_string()
    }

    pub fn time_limit(&self) -> Option<Duration> {
        self.time_limit_secs.map(Duration::from_secs)
    }

    /// The name shown in listings: the given name, or the program's file name.
    pub fn display_name(&self) -> String {
        let base = match &self.name {
            Some(name) => name.clone(),
            None => {
                let first = self.command.first().map(String::as_str).unwrap_or("");
                let program = first.split_whitespace().next().unwrap_or("");
                program.rsplit('/').next().unwrap_or(program).to_owned()
            }
        };
        match &self.array {
            Some(member) => format!("{base}[{}]", member.index),
            None => base,
        }
    }

    /// The command as one line, for listings.
    pub fn command_line(&self) -> String {
        command_line(&self.command)
    }
}

impl JobSpec {
    /// The nodes the job must run on, in rank order: `--node-gpu-ids`'s, else `--nodelist`.
    pub fn required_nodes(&self) -> Vec<String> {
        if self.node_gpu_ids.is_empty() {
            self.nodelist.clone()
        } else {
            self.node_gpu_ids.iter().map(|n| n.node.clone()).collect()
        }
    }
}

/// Text in a command that the agent replaces with the job's GPU indices (`--cuda {gpus}` →
/// `--cuda 0,2`), for programs that take devices as an argument (a `--cuda` flag, say).
pub const GPUS_PLACEHOLDER: &str = "{gpus}";

/// A command as one shell line: a single word is already a shell command line (`"a | tee
/// log"`); several words are a program and its arguments, each quoted as needed.
pub fn command_line(words: &[String]) -> String {
    match words {
        [one] => one.clone(),
        many => many
            .iter()
            .map(|arg| shell_quote(arg))
            .collect::<Vec<_>>()
            .join(" "),
    }
}

/// Whether a POSIX shell reads `word` as itself: letters, digits and `-_./=:,+@%` only
/// (nothing it would expand, split or treat as syntax).
pub fn is_plain_word(word: &str) -> bool {
    !word.is_empty()
        && word
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./=:,+@%".contains(&b))
}

/// Quotes a word for a POSIX shell, leaving plain words as they are.
pub fn shell_quote(word: &str) -> String {
    if is_plain_word(word) {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// The scheduler's record of one job: the value under the job id in the `mgpu-jobs` bucket.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobRecord {
    pub id: JobId,
    /// The principal that signed the submission.
    pub user: String,
    /// That principal's public nkey: only it (or an admin) may cancel, hold or attach.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_key: Option<String>,
    pub spec: JobSpec,
    pub submitted_at: Timestamp,
    /// 1 for the first run; grows each time the job is started again.
    pub attempt: u32,
    #[serde(flatten)]
    pub state: JobState,
    /// The requests stream's sequence of the last hold or release applied: one of them
    /// delivered again after a later one was applied is not applied again (it would undo it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_request: Option<u64>,
    /// Its attempts stopped for jobs of a class that may preempt, for accounting.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub preemptions: Vec<crate::stop::Preemption>,
}

impl JobRecord {
    pub fn exit_code(&self) -> Option<i32> {
        self.state.ending().and_then(|e| e.exit_code)
    }

    /// The flat view that `--json` listings print (a stable contract for scripts).
    pub fn summary(&self) -> JobSummary {
        let placement = self.state.placement();
        let (started_at, ended_at, reason) = match &self.state {
            JobState::Queued(w) => (None, None, Some(w.reason.describe().to_owned())),
            JobState::Running(r) => (r.started_at, None, None),
            JobState::Succeeded(e)
            | JobState::Failed(e)
            | JobState::Cancelled(e)
            | JobState::TimedOut(e)
            | JobState::NodeFailed(e) => (e.started_at, Some(e.ended_at), e.reason.clone()),
        };
        JobSummary {
            id: self.id.clone(),
            name: self.spec.display_name(),
            user: self.user.clone(),
            state: self.state.name(),
            priority: self.spec.priority,
            gpus_requested: self.spec.gpus,
            node: placement.map(|p| p.node.clone()),
            nodes: placement
                .map(|p| p.node_names().into_iter().map(str::to_owned).collect())
                .unwrap_or_default(),
            gpus: placement.map(Placement::gpu_indices).unwrap_or_default(),
            exit_code: self.exit_code(),
            attempt: self.attempt,
            submitted_at: self.submitted_at,
            started_at,
            ended_at,
            reason,
            command: self.spec.command_line(),
            usage: self.state.ending().and_then(|end| end.usage.clone()),
        }
    }
}

/// One job as `mgpu queue --json` and `mgpu show --json` print it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobSummary {
    pub id: JobId,
    pub name: String,
    pub user: String,
    pub state: &'static str,
    pub priority: i32,
    pub gpus_requested: GpuAmount,
    pub node: Option<String>,
    /// Every node of the job, rank 0 first (one entry for a one-node job).
    pub nodes: Vec<String>,
    pub gpus: Vec<u32>,
    pub exit_code: Option<i32>,
    pub attempt: u32,
    pub submitted_at: Timestamp,
    pub started_at: Option<Timestamp>,
    pub ended_at: Option<Timestamp>,
    pub reason: Option<String>,
    pub command: String,
    /// What its last attempt used, once it ended (peak host memory, CPU time, GPU memory).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<crate::host::JobUsage>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> JobSpec {
        JobSpec::new(vec!["python".into(), "train.py".into()], "/tmp")
    }

    #[test]
    fn gpu_types_and_constraints_tell_twins_apart_and_leave_other_keys_as_they_were() {
        let plain = spec().dedup_key();
        let mut typed = spec();
        typed.gpu_types = vec!["h100".into()];
        let mut constrained = spec();
        constrained.constraint = Some("ib".into());
        assert!(plain.ends_with("null]"), "{plain}");
        assert_ne!(typed.dedup_key(), plain);
        assert_ne!(constrained.dedup_key(), plain);
        assert_ne!(typed.dedup_key(), constrained.dedup_key());
    }

    #[test]
    fn a_record_serialises_with_its_state_name_on_top() {
        let record = JobRecord {
            id: JobId::random(),
            user: "alice".into(),
            user_key: None,
            spec: spec(),
            submitted_at: crate::now(),
            attempt: 1,
            state: JobState::Queued(Waiting::new(WaitReason::Resources)),
            last_request: None,
            preemptions: Vec::new(),
        };
        let json = serde_json::to_value(&record).unwrap_or_default();
        assert_eq!(json["state"], "queued");
        assert_eq!(json["reason"], "Resources");
        let back: Option<JobRecord> = serde_json::from_value(json).ok();
        assert_eq!(back, Some(record));
    }

    #[test]
    fn specs_that_cannot_run_are_refused() {
        let mut s = spec();
        s.workdir = "relative".into();
        assert!(s.validate().is_err());
        let mut s = spec();
        s.gpu_ids = Some(vec![0, 0]);
        assert!(s.validate().is_err());
        let mut s = spec();
        s.gpus = GpuAmount::whole(2);
        s.gpu_ids = Some(vec![1]);
        assert!(s.validate().is_err());
        let mut s = spec();
        s.command = vec![];
        assert!(s.validate().is_err());
        assert!(spec().validate().is_ok());
    }

    #[test]
    fn node_gpu_ids_parse_in_rank_order_and_bad_ones_are_refused() {
        let parsed = parse_node_gpu_ids("node002:0,1; node001:3").unwrap_or_default();
        assert_eq!(parsed.len(), 2);
        assert_eq!(parsed[0].node, "node002");
        assert_eq!(parsed[0].gpu_ids, vec![0, 1]);
        assert_eq!(parsed[1].gpu_ids, vec![3]);
        for bad in ["", "node001", "node001:x", "a:0;a:1", "bad.name:0"] {
            assert!(parse_node_gpu_ids(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn multi_node_specs_that_cannot_run_are_refused() {
        let mut s = spec();
        s.nodes = 0;
        assert!(s.validate().is_err());
        let mut s = spec();
        s.nodes = 2;
        s.gpus = GpuAmount::from_units(GpuAmount::UNITS_PER_GPU / 2);
        assert!(s.validate().is_err(), "a share of a GPU across nodes");
        let mut s = spec();
        s.nodelist = vec!["a".into(), "b".into()];
        assert!(s.validate().is_err(), "more listed nodes than --nodes");
        s.nodes = 2;
        assert!(s.validate().is_ok());
        s.exclude = vec!["b".into()];
        assert!(s.validate().is_err(), "listed and excluded");
        let mut s = spec();
        s.node_gpu_ids = parse_node_gpu_ids("a:0,1;b:0").unwrap_or_default();
        s.nodes = 2;
        s.gpus = GpuAmount::whole(2);
        assert!(s.validate().is_ok());
        s.gpus = GpuAmount::whole(3);
        assert!(s.validate().is_err());
    }

    #[test]
    fn unknown_fields_in_a_spec_are_an_error() {
        let text = r#"{"command":["true"],"workdir":"/","gpus":1,"bogus":1}"#;
        assert!(serde_json::from_str::<JobSpec>(text).is_err());
    }

    #[test]
    fn command_lines_quote_what_needs_quoting() {
        let mut s = spec();
        s.command = vec!["python".into(), "-c".into(), "print('hi')".into()];
        assert_eq!(s.command_line(), r#"python -c 'print('\''hi'\'')'"#);
        assert_eq!(s.display_name(), "python");
    }
}
