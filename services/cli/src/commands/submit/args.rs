//! `mgpu submit`'s command line: every option, how clap parses the values, and the checks
//! clap cannot make on its own.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Result, bail};
use clap::{Args, ValueEnum};
use mgpu_protocol::duration::parse_duration;
use mgpu_protocol::gpu_amount::GpuAmount;
use mgpu_protocol::job::{NodeGpuIds, OnTimeout};
use mgpu_protocol::notify::{NotifyEvent, parse_events};
use mgpu_protocol::stop::StopSignal;

use crate::parse::{self, ArraySpec, GpuIds};

#[derive(Debug, Args)]
pub struct SubmitArgs {
    /// GPUs to use: a whole number (2), a share of one GPU (0.5), or 0 for a CPU-only job;
    /// `TYPE:N` (h100:2) also asks for that GPU type (as --gpu-type TYPE). Defaults to the
    /// --profile's requirement, the number of ids in --gpu-ids, the profile of `--llm NAME`
    /// in the command (when a profiles file exists), or 1.
    #[arg(long, value_name = "[TYPE:]N", allow_negative_numbers = true, value_parser = parse_gpus)]
    pub gpus: Option<GpuRequest>,

    /// GPU types the job takes, preferred first: `h100,a100-80gb` takes an H100 when one is
    /// free, else an A100 80GB. All of a job's GPUs are of one type. `mgpu nodes` lists the
    /// types the cluster has.
    #[arg(long, value_name = "TYPE[,TYPE…]", value_parser = parse_gpu_types)]
    pub gpu_type: Option<GpuTypes>,

    /// Run only on nodes with these features: `ib&nvlink` (all), `ib|roce` (any), with
    /// parentheses to group. `mgpu nodes` lists each node's features.
    #[arg(long, value_name = "EXPR", value_parser = parse_constraint)]
    pub constraint: Option<String>,

    /// Run on exactly these GPUs of a node: `0,2` or `0-3`.
    #[arg(long, value_name = "LIST", value_parser = parse::gpu_ids)]
    pub gpu_ids: Option<GpuIds>,

    /// Nodes the job spans (gang-scheduled: all start together or none does). --gpus then
    /// counts GPUs per node. Without --distributed the command runs once, on the first node,
    /// with MGPU_HOSTFILE listing every node (for mpirun or ssh).
    #[arg(long, value_name = "N")]
    pub nodes: Option<u32>,

    /// GPUs on each node of a multi-node job (the same as --gpus, said explicitly).
    #[arg(long, value_name = "G", conflicts_with = "gpus")]
    pub gpus_per_node: Option<u32>,

    /// Run on these nodes (all of them, in this order: the first is rank 0); --nodes
    /// defaults to their count and may ask for more, chosen by the scheduler.
    #[arg(long, value_name = "NODE[,NODE…]", value_delimiter = ',')]
    pub nodelist: Vec<String>,

    /// Never run on these nodes.
    #[arg(long, value_name = "NODE[,NODE…]", value_delimiter = ',')]
    pub exclude: Vec<String>,

    /// Exact GPUs on exact nodes, rank order: `node001:0,1;node002:0,1`. Sets --nodes and
    /// --gpus from what it names.
    #[arg(long, value_name = "NODE:IDS;…", value_parser = parse_node_gpu_ids,
          conflicts_with_all = ["gpu_ids", "nodelist"])]
    pub node_gpu_ids: Option<NodeGpuIdList>,

    /// Run the command once per node, with MASTER_ADDR, MASTER_PORT, NNODES, NODE_RANK,
    /// GPUS_PER_NODE and WORLD_SIZE set for torchrun (and MGPU_HOSTFILE for MPI). Every
    /// rank's output is tagged with its rank; one rank failing stops the others.
    #[arg(long)]
    pub distributed: bool,

    /// GPU memory the job needs on each of its GPUs: MiB (24576) or with a unit (24GiB).
    #[arg(long, value_name = "MIB", value_parser = parse::mem_mib)]
    pub mem: Option<u64>,

    /// CPU cores the job needs on each node: counted like GPUs (two jobs never get the same
    /// cores) and pinned where the node can. Default: the cluster's `cpus_per_gpu`, if set.
    #[arg(long, value_name = "N")]
    pub cpus: Option<u32>,

    /// Host memory (RAM) the job may use on each node: MiB or with a unit (16GiB). Over it,
    /// the job is killed and ends `failed` with `out of memory (host)`. Default: the
    /// cluster's `mem_per_gpu`, if set.
    #[arg(long, value_name = "SIZE", value_parser = parse::mem_mib)]
    pub mem_host: Option<u64>,

    /// Name shown in listings (default: the program's name).
    #[arg(long)]
    pub name: Option<String>,

    /// Higher runs first; may be negative.
    #[arg(
        long,
        default_value_t = 0,
        allow_negative_numbers = true,
        value_name = "P"
    )]
    pub priority: i32,

    /// Time limit: 90 (seconds), 10m, 2h, 1h30m, 2d or [D-]HH:MM:SS. What happens then is
    /// --on-timeout's choice.
    #[arg(long, value_name = "DUR", value_parser = parse_time_limit)]
    pub time_limit: Option<Duration>,

    /// At the time limit: `requeue` (default) stops the job and puts it back at the end of the
    /// queue when others wait (a time slice; it keeps running while nobody waits); `fail` stops
    /// it for good, as `timed_out`.
    #[arg(long, value_enum, value_name = "WHAT")]
    pub on_timeout: Option<TimeoutAction>,

    /// The quality-of-service class the job runs in (default `normal`). The cluster's classes
    /// decide which jobs may preempt which, and how long a preempted job has to save its
    /// work; a class may be open to some users only.
    #[arg(long, value_name = "NAME")]
    pub qos: Option<String>,

    /// Run in reservation NAME (`mgpu reserve`, `mgpu reservations`): on its GPUs, inside its
    /// window. Its owner and the users it names may; the job needs a --time-limit that ends
    /// before the window closes, else it is refused.
    #[arg(long, value_name = "NAME")]
    pub reservation: Option<String>,

    /// Warn the job before it is stopped: SIG (USR1, USR2, HUP, INT, QUIT, ALRM, TERM, URG or
    /// its number) goes to all its processes SECONDS before SIGTERM, and the file named by
    /// $MGPU_STOP_FILE says why (`preempted`, `time_limit`, …). Default: USR1, at the class's
    /// grace, when it is preempted. With a hard time limit (--on-timeout fail) it also comes
    /// SECONDS before the limit.
    #[arg(long, value_name = "SIG[@SECONDS]", value_parser = parse_signal)]
    pub signal: Option<StopSignal>,

    /// When the job's node is lost (stops heartbeating, or its agent restarts) while the job
    /// runs, end it as `node_failed` instead of putting it back in the queue: for jobs that
    /// must not run twice (they send mail, they append to a shared file).
    #[arg(long)]
    pub no_requeue: bool,

    /// This job's GPUs may sit idle (a notebook, a debugger): the scheduler's idle policy
    /// leaves it alone, where its QoS class allows that.
    #[arg(long)]
    pub idle_ok: bool,

    /// Tell you when the job reaches these moments, through the destinations you set once with
    /// `mgpu notify add`: end, fail, start, preempt, time80 (80 % of its time limit), idle, or
    /// all; Slurm's --mail-type names BEGIN and TIME_LIMIT_80 work too. An array sends one
    /// summary when its last task ends.
    #[arg(long, value_name = "EVENT[,EVENT…]", value_parser = parse_notify)]
    pub notify: Option<NotifyEvents>,

    /// Send the job's output to a subject only you and admins may read
    /// (`users.<your key>.jobs.<id>.output`) instead of `jobs.<id>.output`, which every user
    /// may read. `mgpu logs`, `-i` and `mgpu attach` follow either.
    #[arg(long)]
    pub private: bool,

    /// Shell code run before the command, in the same shell (`source venv/bin/activate`).
    #[arg(long, value_name = "CMD")]
    pub env_setup_cmd: Option<String>,

    /// Conda environment the node agent activates before the command (after --env-setup-cmd).
    #[arg(long, value_name = "ENV")]
    pub conda: Option<String>,

    /// Directory the job runs in (default: the current one). It must exist on the nodes too.
    #[arg(long, value_name = "DIR")]
    pub workdir: Option<PathBuf>,

    /// Start only after these jobs succeeded (ids or unique prefixes; comma-separated or
    /// repeated). If one of them fails, this job never runs.
    #[arg(long, value_name = "ID[,ID…]", value_delimiter = ',')]
    pub after: Vec<String>,

    /// Start only after these jobs ended, however they ended.
    #[arg(long, value_name = "ID[,ID…]", value_delimiter = ',')]
    pub after_any: Vec<String>,

    /// Submit a job array: one task per index, `0-9`, `1,3,5-7`; `%N` runs at most N at once
    /// (`0-99%4`). Each task gets MGPU_ARRAY_INDEX. At most 10000 tasks.
    #[arg(long, value_name = "SPEC", value_parser = parse::array_spec, conflicts_with = "interactive")]
    pub array: Option<ArraySpec>,

    /// Do not submit when one of your queued or running jobs is identical (same command,
    /// directory, environment setup and resources); the scheduler also refuses such races.
    #[arg(long)]
    pub dedup: bool,

    /// Ask for the GPUs the profiles file gives this model (an explicit --gpus still wins).
    #[arg(long, value_name = "NAME")]
    pub profile: Option<String>,

    /// Profiles file (JSON: each model's GPU requirement); default ./llm_config.json, then
    /// ~/.config/mgpu/llm_config.json, when they exist.
    #[arg(long, env = "MGPU_PROFILES", value_name = "FILE")]
    pub profiles: Option<PathBuf>,

    /// Submit every job of a job file: CSV lines
    /// (`priority,script_path,conda_env,arguments,allowed_gpus`), or `[[job]]` tables in a
    /// `.toml` file. Jobs identical to a queued or running one are skipped.
    #[arg(long, value_name = "FILE", conflicts_with_all = [
        "gpus", "gpu_ids", "mem", "name", "priority", "conda", "array", "profile",
        "interactive", "json", "command", "nodes", "gpus_per_node", "nodelist", "exclude",
        "node_gpu_ids", "distributed", "cpus", "mem_host", "pty", "gpu_type", "constraint",
        "qos", "signal", "reservation",
    ])]
    pub file: Option<PathBuf>,

    /// With --file: keep watching the file and submit jobs appended to it, until Ctrl+C.
    #[arg(long, requires = "file")]
    pub watch: bool,

    /// Stay attached: show the job's output here, send it this terminal's input, and exit with
    /// its exit status. Ctrl+C detaches and leaves the job running.
    #[arg(short, long, conflicts_with = "json")]
    pub interactive: bool,

    /// Run the job under a pseudo-terminal on its node, sized like this terminal (80x24 when
    /// there is none): colours, progress bars, debuggers and full-screen programs work, and
    /// `mgpu attach ID` joins it from any machine. With -i, attach at once.
    #[arg(long, conflicts_with = "distributed")]
    pub pty: bool,

    /// Print `{"id": …}` (arrays: `{"array_id": …, "ids": […]}`) instead of a sentence.
    #[arg(long, conflicts_with = "quiet")]
    pub json: bool,

    /// Print only the job id, one per line for arrays and files (with -i: print nothing but
    /// the job's own output).
    #[arg(short, long)]
    pub quiet: bool,

    /// The command: one argument is a shell command line ("python a.py | tee log"); several are
    /// a program and its arguments, passed as given. Put `--` before it when it has options.
    /// `{gpus}` in it is replaced by the job's GPU ids on the node (`--cuda {gpus}`).
    /// A batch script as the first word (`train.sh ARG…`, a file here or a path, starting
    /// with `#!` or comments) is captured now, as sbatch does, and its leading `#MGPU` lines
    /// are read as options (`#MGPU --gpus 2`); options given here win.
    #[arg(
        required_unless_present = "file",
        trailing_var_arg = true,
        value_name = "COMMAND"
    )]
    pub command: Vec<String>,
}

/// `--on-timeout`'s values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum TimeoutAction {
    /// Back to the end of the queue when others wait.
    Requeue,
    /// End as `timed_out`.
    Fail,
}

impl From<TimeoutAction> for OnTimeout {
    fn from(action: TimeoutAction) -> OnTimeout {
        match action {
            TimeoutAction::Requeue => OnTimeout::Requeue,
            TimeoutAction::Fail => OnTimeout::Fail,
        }
    }
}

/// `--gpus`: an amount, with a GPU type before it (`h100:2`) or not.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuRequest {
    pub amount: GpuAmount,
    pub gpu_type: Option<String>,
}

impl std::fmt::Display for GpuRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.gpu_type {
            Some(gpu_type) => write!(f, "{gpu_type}:{}", self.amount),
            None => write!(f, "{}", self.amount),
        }
    }
}

fn parse_gpus(text: &str) -> Result<GpuRequest, String> {
    let (gpu_type, amount) = match text.split_once(':') {
        Some((gpu_type, amount)) => {
            let gpu_type = gpu_type.trim().to_ascii_lowercase();
            mgpu_protocol::gpu_type::check_name(&gpu_type, "GPU type")
                .map_err(|e| e.to_string())?;
            (Some(gpu_type), amount)
        }
        None => (None, text),
    };
    let amount = amount.parse::<GpuAmount>().map_err(|e| e.to_string())?;
    Ok(GpuRequest { amount, gpu_type })
}

/// `--gpu-type`, parsed (a newtype: clap reads a bare `Vec` as a repeated option).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuTypes(pub Vec<String>);

fn parse_gpu_types(text: &str) -> Result<GpuTypes, String> {
    mgpu_protocol::gpu_type::parse_types(text)
        .map(GpuTypes)
        .map_err(|e| e.to_string())
}

/// `--constraint`, checked and in its canonical form (`ib&nvlink`).
fn parse_constraint(text: &str) -> Result<String, String> {
    mgpu_protocol::gpu_type::Constraint::parse(text)
        .map(|c| c.to_string())
        .map_err(|e| e.to_string())
}

/// `--signal SIG@SECONDS`, in Slurm's syntax; the message names the option and the value.
fn parse_signal(text: &str) -> Result<StopSignal, String> {
    StopSignal::parse(text).map_err(|e| e.to_string())
}

/// `--notify end,fail,…`, one value (so a `#MGPU --notify` line is replaced, not added to).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NotifyEvents(pub Vec<NotifyEvent>);

fn parse_notify(text: &str) -> Result<NotifyEvents, String> {
    parse_events(text)
        .map(NotifyEvents)
        .map_err(|e| e.to_string())
}

fn parse_time_limit(text: &str) -> Result<Duration, String> {
    parse_duration(text).map_err(|e| e.to_string())
}

impl SubmitArgs {
    /// Combinations clap cannot refuse on its own: `--file` conflicts with the command, and
    /// clap drops a requirement (`--watch` requires `--file`) that conflicts with a present
    /// argument.
    pub fn check(&self) -> Result<()> {
        if self.watch && self.file.is_none() {
            bail!("--watch watches a job file: use it with --file FILE");
        }
        Ok(())
    }
}

/// `--node-gpu-ids`, parsed (a newtype: clap reads a bare `Vec` as a repeated option).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeGpuIdList(pub Vec<NodeGpuIds>);

fn parse_node_gpu_ids(text: &str) -> Result<NodeGpuIdList, String> {
    mgpu_protocol::job::parse_node_gpu_ids(text)
        .map(NodeGpuIdList)
        .map_err(|e| e.to_string())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use clap::Parser;

    /// `mgpu submit`'s options alone, as the full command line parses them.
    #[derive(Debug, Parser)]
    struct SubmitLine {
        #[command(flatten)]
        args: SubmitArgs,
    }

    /// The options of `mgpu submit ARGV…`, or None when they do not parse.
    pub(crate) fn submit_args(argv: &[&str]) -> Option<SubmitArgs> {
        let mut full = vec!["mgpu-submit"];
        full.extend_from_slice(argv);
        SubmitLine::try_parse_from(full).ok().map(|line| line.args)
    }

    fn parse_error(argv: &[&str]) -> String {
        let mut full = vec!["mgpu-submit"];
        full.extend_from_slice(argv);
        SubmitLine::try_parse_from(full)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    }

    #[test]
    fn dependencies_split_on_commas_and_repeat() {
        let args = submit_args(&[
            "--after",
            "ab,cd",
            "--after",
            "ef",
            "--after-any",
            "01",
            "x",
        ]);
        assert_eq!(
            args.as_ref().map(|a| a.after.clone()),
            Some(vec!["ab".into(), "cd".into(), "ef".into()])
        );
        assert_eq!(args.map(|a| a.after_any), Some(vec!["01".into()]));
    }

    #[test]
    fn the_stop_signal_parses_in_slurm_s_syntax_and_bad_ones_say_why() {
        let args = submit_args(&["--signal", "USR1@300", "--qos", "scavenger", "x"]);
        assert_eq!(
            args.as_ref().and_then(|a| a.signal),
            Some(StopSignal {
                signal: 10,
                seconds: 300
            })
        );
        assert_eq!(args.and_then(|a| a.qos), Some("scavenger".into()));
        let err = parse_error(&["--signal", "USR3@5", "x"]);
        assert!(
            err.contains("--signal \"USR3@5\": unknown signal \"USR3\""),
            "{err}"
        );
        let err = parse_error(&["--signal", "USR1@soon", "x"]);
        assert!(err.contains("whole seconds"), "{err}");
        let err = parse_error(&["--file", "jobs.toml", "--qos", "scavenger"]);
        assert!(err.contains("cannot be used with"), "{err}");
    }

    #[test]
    fn idle_ok_is_a_flag_and_a_default_for_a_job_file() {
        assert_eq!(
            submit_args(&["--idle-ok", "x"]).map(|a| a.idle_ok),
            Some(true)
        );
        assert_eq!(submit_args(&["x"]).map(|a| a.idle_ok), Some(false));
        // Like --no-requeue, it applies to every job of a file that does not say otherwise.
        let file = submit_args(&["--file", "jobs.toml", "--idle-ok"]);
        assert_eq!(file.map(|a| a.idle_ok), Some(true));
        let err = parse_error(&["--idle-ok=yes", "x"]);
        assert!(err.contains("unexpected value"), "{err}");
    }

    #[test]
    fn conflicting_flags_are_refused_by_the_parser() {
        let err = parse_error(&["--array", "0-3", "-i", "x"]);
        assert!(err.contains("cannot be used with"), "{err}");
        let err = parse_error(&["--file", "jobs.txt", "--gpus", "2"]);
        assert!(err.contains("cannot be used with"), "{err}");
        let err = parse_error(&["--file", "jobs.txt", "python", "x.py"]);
        assert!(err.contains("cannot be used with"), "{err}");
        let err = parse_error(&["--watch"]);
        assert!(err.contains("--file"), "{err}");
        let watch_alone = submit_args(&["--watch", "x"]).map(|a| a.check().is_err());
        assert_eq!(watch_alone, Some(true));
        let err = parse_error(&["--array", "0-3%0", "x"]);
        assert!(err.contains("at least 1"), "{err}");
        let err = parse_error(&["--on-timeout", "retry", "x"]);
        assert!(err.contains("requeue"), "{err}");
        let err = parse_error(&[]);
        assert!(err.contains("COMMAND"), "{err}");
        let file = submit_args(&["--file", "jobs.txt", "--watch", "--time-limit", "1h"]);
        assert!(file.is_some_and(|a| a.watch && a.command.is_empty() && a.check().is_ok()));
    }
}
