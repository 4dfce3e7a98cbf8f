//! `mgpu submit`: send a job (or a job array, or a job file's jobs) to the scheduler through
//! JetStream, then (with `-i`) follow it.

mod array;
mod attach;
mod dedup;
mod file;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, Result, anyhow, bail};
use clap::{Args, ValueEnum};
use mgpu_nats::records;
use mgpu_protocol::duration::parse_duration;
use mgpu_protocol::gpu_amount::GpuAmount;
use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::{JobSpec, NodeGpuIds, OnTimeout, SubmitRequest};
use serde_json::json;

use crate::session::ConnectionArgs;

use crate::console::{self, print_json, println};
use crate::errors::plain;
use crate::parse::{self, ArraySpec, GpuIds};
use crate::profiles::{self, LazyProfiles};
use crate::publish;
use crate::session::Session;

#[derive(Debug, Args)]
pub struct SubmitArgs {
    /// GPUs to use: a whole number (2), a share of one GPU (0.5), or 0 for a CPU-only job.
    /// Defaults to the --profile's requirement, the number of ids in --gpu-ids, the profile of
    /// `--llm NAME` in the command (when a profiles file exists), or 1.
    #[arg(long, value_name = "N", allow_negative_numbers = true, value_parser = parse_gpus)]
    pub gpus: Option<GpuAmount>,

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

    /// When the job's node is lost (stops heartbeating, or its agent restarts) while the job
    /// runs, end it as `node_failed` instead of putting it back in the queue: for jobs that
    /// must not run twice (they send mail, they append to a shared file).
    #[arg(long)]
    pub no_requeue: bool,

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

    /// Profiles file (seed 004's llm_config.json); default ./llm_config.json, then
    /// ~/.config/mgpu/llm_config.json, when they exist.
    #[arg(long, env = "MGPU_PROFILES", value_name = "FILE")]
    pub profiles: Option<PathBuf>,

    /// Submit every job of a job file: seed 004's lines
    /// (`priority,script_path,conda_env,arguments,allowed_gpus`), or `[[job]]` tables in a
    /// `.toml` file. Jobs identical to a queued or running one are skipped.
    #[arg(long, value_name = "FILE", conflicts_with_all = [
        "gpus", "gpu_ids", "mem", "name", "priority", "conda", "array", "profile",
        "interactive", "json", "command", "nodes", "gpus_per_node", "nodelist", "exclude",
        "node_gpu_ids", "distributed",
    ])]
    pub file: Option<PathBuf>,

    /// With --file: keep watching the file and submit jobs appended to it, until Ctrl+C.
    #[arg(long, requires = "file")]
    pub watch: bool,

    /// Stay attached: show the job's output here, send it this terminal's input, and exit with
    /// its exit status. Ctrl+C detaches and leaves the job running.
    #[arg(short, long, conflicts_with = "json")]
    pub interactive: bool,

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

fn parse_gpus(text: &str) -> Result<GpuAmount, String> {
    text.parse::<GpuAmount>().map_err(|e| e.to_string())
}

fn parse_time_limit(text: &str) -> Result<Duration, String> {
    parse_duration(text).map_err(|e| e.to_string())
}

pub async fn run(connection: &ConnectionArgs, args: &SubmitArgs) -> Result<ExitCode> {
    check_flags(args)?;
    if let Some(path) = &args.file {
        return file::run(connection, args, path).await;
    }
    // Mistakes in the request are reported before (and without) reaching the server.
    let mut profiles = LazyProfiles::new(args.profiles.clone());
    let mut spec = build_spec(args, &mut profiles)?;
    let session = Session::connect(connection).await?;
    spec.after = resolve_ids(&session, &args.after).await?;
    spec.after_any = resolve_ids(&session, &args.after_any).await?;
    spec.validate().map_err(plain)?;

    if let Some(array) = &args.array {
        return array::submit(&session, args, spec, array).await;
    }
    let request = SubmitRequest {
        id: JobId::random(),
        user: session.user.clone(),
        spec,
    };
    if args.dedup
        && let Some(existing) = dedup::Existing::load(&session).await?.find(&request.spec)
    {
        report_duplicate(args, existing)?;
        return Ok(ExitCode::SUCCESS);
    }
    let id = request.id.clone();
    publish::submit_all(&session, std::slice::from_ref(&request))
        .await
        .into_iter()
        .collect::<Result<Vec<()>>>()?;

    if args.interactive {
        if !args.quiet {
            // With -i stdout carries the job's own output, so our message goes to stderr.
            console::stderr_line(&format!("Submitted job {id}"));
        }
        return attach::follow(&session, &id, args.quiet).await;
    }
    if args.json {
        print_json(&json!({ "id": id }))?;
    } else if args.quiet {
        println(id.as_str())?;
    } else {
        println(&format!("Submitted job {id}"))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Combinations clap cannot refuse on its own: `--file` conflicts with the command, and clap
/// drops a requirement (`--watch` requires `--file`) that conflicts with a present argument.
fn check_flags(args: &SubmitArgs) -> Result<()> {
    if args.watch && args.file.is_none() {
        bail!("--watch watches a job file: use it with --file FILE");
    }
    Ok(())
}

/// Says the job was not submitted because an identical one waits or runs. Not an error: the
/// work the user asked for is queued.
fn report_duplicate(args: &SubmitArgs, existing: &dedup::Match) -> Result<()> {
    let sentence = format!(
        "Not submitted: identical to job {} ({})",
        existing.id.short(),
        existing.state
    );
    if args.json {
        print_json(&json!({ "id": null, "duplicate_of": existing.id }))
    } else if args.quiet {
        // Stdout stays empty, so `id=$(mgpu submit -q …)` holds no id that was not submitted.
        console::stderr_line(&sentence);
        Ok(())
    } else {
        Ok(println(&sentence)?)
    }
}

/// GPUs per node for the spec. With `--node-gpu-ids`, `--gpus` may also count them all (as in
/// `--gpus 4 --node-gpu-ids "node001:0,1;node002:0,1"`); each node gets exactly its ids.
fn per_node_gpus(asked: GpuAmount, node_gpu_ids: &[NodeGpuIds]) -> Result<GpuAmount> {
    if node_gpu_ids.is_empty() {
        return Ok(asked);
    }
    let counts: Vec<usize> = node_gpu_ids.iter().map(|n| n.gpu_ids.len()).collect();
    let most = counts.iter().copied().max().unwrap_or(0);
    let total: usize = counts.iter().sum();
    let most_gpus = GpuAmount::whole(u32::try_from(most).unwrap_or(u32::MAX));
    if asked == most_gpus || asked == GpuAmount::whole(u32::try_from(total).unwrap_or(u32::MAX)) {
        return Ok(most_gpus);
    }
    Err(plain(format!(
        "--gpus {asked} matches neither the GPUs per node ({most}) nor the total ({total})          that --node-gpu-ids names"
    )))
}

/// `--node-gpu-ids`, parsed (a newtype: clap reads a bare `Vec` as a repeated option).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeGpuIdList(pub Vec<NodeGpuIds>);

fn parse_node_gpu_ids(text: &str) -> Result<NodeGpuIdList, String> {
    mgpu_protocol::job::parse_node_gpu_ids(text)
        .map(NodeGpuIdList)
        .map_err(|e| e.to_string())
}

/// The job as asked for on the command line, checked as far as it can be without a node.
fn build_spec(args: &SubmitArgs, profiles: &mut LazyProfiles) -> Result<JobSpec> {
    let workdir = resolve_workdir(args.workdir.as_deref())?;
    let gpu_ids = args.gpu_ids.as_ref().map(|ids| ids.0.clone());
    let node_gpu_ids = args
        .node_gpu_ids
        .as_ref()
        .map(|list| list.0.clone())
        .unwrap_or_default();
    let pinned_per_node = gpu_ids
        .as_ref()
        .map(Vec::len)
        .or_else(|| node_gpu_ids.first().map(|n| n.gpu_ids.len()));
    let choice = profiles::choose_gpus(
        args.gpus.or(args.gpus_per_node.map(GpuAmount::whole)),
        args.profile.as_deref(),
        pinned_per_node,
        &args.command,
        profiles,
    )?;
    let mut spec = JobSpec::new(args.command.clone(), workdir);
    spec.name = args.name.clone();
    spec.gpus = per_node_gpus(choice.gpus, &node_gpu_ids)?;
    spec.profile = choice.profile;
    spec.gpu_ids = gpu_ids;
    spec.mem_mib = args.mem;
    spec.priority = args.priority;
    spec.time_limit_secs = args.time_limit.map(|d| d.as_secs());
    spec.on_timeout = args.on_timeout.map(OnTimeout::from).unwrap_or_default();
    spec.env_setup_cmd = args.env_setup_cmd.clone();
    spec.conda_env = args.conda.clone();
    spec.env = capture_environment();
    spec.interactive = args.interactive;
    spec.dedup = args.dedup;
    spec.no_requeue = args.no_requeue;
    spec.nodelist = args.nodelist.clone();
    spec.exclude = args.exclude.clone();
    spec.nodes = args.nodes.unwrap_or(if node_gpu_ids.is_empty() {
        spec.nodelist.len().max(1) as u32
    } else {
        node_gpu_ids.len() as u32
    });
    spec.node_gpu_ids = node_gpu_ids;
    spec.distributed = args.distributed;
    // The spec's own message says what is wrong and which option to change.
    spec.validate().map_err(plain)?;
    Ok(spec)
}

/// Turns `--after` ids and prefixes into job ids; an unknown or ambiguous one is an error,
/// since a job waiting for a job that does not exist would wait forever.
async fn resolve_ids(session: &Session, typed: &[String]) -> Result<Vec<JobId>> {
    let mut ids: Vec<JobId> = Vec::with_capacity(typed.len());
    for text in typed.iter().filter(|t| !t.trim().is_empty()) {
        let id = records::resolve_job(&session.js, text)
            .await
            .map_err(plain)?;
        if !ids.contains(&id) {
            ids.push(id);
        }
    }
    Ok(ids)
}

/// The job runs where the user stands unless told otherwise; the path is made absolute
/// (symlinks resolved) because the agent starts the job from nowhere in particular.
pub(crate) fn resolve_workdir(given: Option<&Path>) -> Result<String> {
    let dir = match given {
        Some(dir) => dir.to_path_buf(),
        None => std::env::current_dir().context("cannot read the current directory")?,
    };
    let absolute = dir.canonicalize().map_err(|err| match err.kind() {
        std::io::ErrorKind::NotFound => anyhow!("workdir {} does not exist", dir.display()),
        _ => anyhow!("cannot use workdir {}: {err}", dir.display()),
    })?;
    if !absolute.is_dir() {
        bail!("workdir {} is not a directory", dir.display());
    }
    absolute
        .to_str()
        .map(str::to_owned)
        .ok_or_else(|| anyhow!("workdir {} is not valid UTF-8", absolute.display()))
}

/// The submitter's environment, which the job gets. Variables that are not UTF-8 cannot travel
/// in JSON; they are left out with a warning rather than silently mangled.
pub(crate) fn capture_environment() -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    for (key, value) in std::env::vars_os() {
        match (key.to_str(), value.to_str()) {
            (Some(k), Some(v)) => {
                env.insert(k.to_owned(), v.to_owned());
            }
            _ => console::stderr_line(&format!(
                "warning: not passing environment variable {} to the job: it is not valid UTF-8",
                key.to_string_lossy()
            )),
        }
    }
    env
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command};
    use clap::Parser;

    fn submit_args(argv: &[&str]) -> Option<SubmitArgs> {
        let mut full = vec!["mgpu", "submit"];
        full.extend_from_slice(argv);
        match Cli::try_parse_from(full) {
            Ok(Cli {
                command: Command::Submit(args),
                ..
            }) => Some(*args),
            _ => None,
        }
    }

    fn parse_error(argv: &[&str]) -> String {
        let mut full = vec!["mgpu", "submit"];
        full.extend_from_slice(argv);
        Cli::try_parse_from(full)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    }

    fn spec_of(argv: &[&str]) -> Option<JobSpec> {
        let args = submit_args(argv)?;
        build_spec(&args, &mut LazyProfiles::preloaded(None)).ok()
    }

    #[test]
    fn pinned_gpus_set_the_count() {
        let spec = spec_of(&["--gpu-ids", "0-2", "--workdir", "/", "--", "true"]);
        assert_eq!(spec.as_ref().map(|s| s.gpus), Some(GpuAmount::whole(3)));
        assert_eq!(spec.and_then(|s| s.gpu_ids), Some(vec![0, 1, 2]));
    }

    #[test]
    fn the_spec_check_runs_before_anything_is_sent() {
        let args = submit_args(&["--gpus", "2", "--gpu-ids", "1", "--workdir", "/", "--", "x"]);
        let err = args.map(|a| {
            build_spec(&a, &mut LazyProfiles::preloaded(None))
                .err()
                .map(|e| e.to_string())
        });
        let err = err.flatten().unwrap_or_default();
        assert!(err.contains("does not match"), "{err}");
    }

    #[test]
    fn new_flags_reach_the_spec() {
        let spec = spec_of(&[
            "--workdir",
            "/",
            "--on-timeout",
            "fail",
            "--time-limit",
            "2h",
            "--conda",
            "pytorch_env",
            "--dedup",
            "--no-requeue",
            "--",
            "python a.py --cuda {gpus}",
        ]);
        assert!(spec.is_some(), "the spec did not build");
        let Some(spec) = spec else { return };
        assert_eq!(spec.on_timeout, OnTimeout::Fail);
        assert_eq!(spec.time_limit_secs, Some(7_200));
        assert_eq!(spec.conda_env.as_deref(), Some("pytorch_env"));
        assert!(spec.dedup);
        assert!(spec.no_requeue);
        assert_eq!(
            spec.command,
            ["python a.py --cuda {gpus}"],
            "left for the agent"
        );
        let default = spec_of(&["--workdir", "/", "true"]);
        assert_eq!(
            default.as_ref().map(|s| s.on_timeout),
            Some(OnTimeout::Requeue)
        );
        assert_eq!(default.map(|s| s.no_requeue), Some(false));
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
    fn conflicting_flags_are_refused_by_the_parser() {
        let err = parse_error(&["--array", "0-3", "-i", "x"]);
        assert!(err.contains("cannot be used with"), "{err}");
        let err = parse_error(&["--file", "jobs.txt", "--gpus", "2"]);
        assert!(err.contains("cannot be used with"), "{err}");
        let err = parse_error(&["--file", "jobs.txt", "python", "x.py"]);
        assert!(err.contains("cannot be used with"), "{err}");
        let err = parse_error(&["--watch"]);
        assert!(err.contains("--file"), "{err}");
        let watch_alone = submit_args(&["--watch", "x"]).map(|a| check_flags(&a).is_err());
        assert_eq!(watch_alone, Some(true));
        let err = parse_error(&["--array", "0-3%0", "x"]);
        assert!(err.contains("at least 1"), "{err}");
        let err = parse_error(&["--on-timeout", "retry", "x"]);
        assert!(err.contains("requeue"), "{err}");
        let err = parse_error(&[]);
        assert!(err.contains("COMMAND"), "{err}");
        let file = submit_args(&["--file", "jobs.txt", "--watch", "--time-limit", "1h"]);
        assert!(file.is_some_and(|a| a.watch && a.command.is_empty()));
    }

    #[test]
    fn a_missing_workdir_is_named() {
        let err = resolve_workdir(Some(Path::new("/no/such/dir/anywhere")))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            err.starts_with("workdir /no/such/dir/anywhere does not exist"),
            "{err}"
        );
    }
}
