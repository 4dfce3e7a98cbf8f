//! `mgpu submit`: send a job to the scheduler through JetStream, then (with `-i`) follow it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, Result, anyhow, bail};
use async_nats::jetstream::context::PublishErrorKind;
use async_nats::{HeaderMap, header};
use clap::Args;
use mgpu_shared::duration::parse_duration;
use mgpu_shared::error::StateError;
use mgpu_shared::gpu_amount::GpuAmount;
use mgpu_shared::ids::JobId;
use mgpu_shared::job::{JobSpec, MAX_SUBMIT_BYTES, SubmitRequest};
use mgpu_shared::subjects;
use serde_json::json;

use crate::cli::GlobalArgs;
use crate::commands::{attach, print_json, println};
use crate::errors::plain;
use crate::human;
use crate::parse::{self, GpuIds};
use crate::session::{Session, current_user};

#[derive(Debug, Args)]
pub struct SubmitArgs {
    /// GPUs to use: a whole number (2), a share of one GPU (0.5), or 0 for a CPU-only job.
    /// Defaults to 1, or to the number of ids in --gpu-ids.
    #[arg(long, value_name = "N", allow_negative_numbers = true, value_parser = parse_gpus)]
    pub gpus: Option<GpuAmount>,

    /// Run on exactly these GPUs of a node: `0,2` or `0-3`.
    #[arg(long, value_name = "LIST", value_parser = parse::gpu_ids)]
    pub gpu_ids: Option<GpuIds>,

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

    /// Stop the job after this long: 90 (seconds), 10m, 2h, 1h30m, 2d or [D-]HH:MM:SS.
    #[arg(long, value_name = "DUR", value_parser = parse_time_limit)]
    pub time_limit: Option<Duration>,

    /// Shell code run before the command, in the same shell (`source venv/bin/activate`).
    #[arg(long, value_name = "CMD")]
    pub env_setup_cmd: Option<String>,

    /// Directory the job runs in (default: the current one). It must exist on the nodes too.
    #[arg(long, value_name = "DIR")]
    pub workdir: Option<PathBuf>,

    /// Stay attached: show the job's output here, send it this terminal's input, and exit with
    /// its exit status. Ctrl+C detaches and leaves the job running.
    #[arg(short, long, conflicts_with = "json")]
    pub interactive: bool,

    /// Print `{"id": …}` instead of a sentence.
    #[arg(long, conflicts_with = "quiet")]
    pub json: bool,

    /// Print only the job id (with -i: print nothing but the job's own output).
    #[arg(short, long)]
    pub quiet: bool,

    /// The command: one argument is a shell command line ("python a.py | tee log"); several are
    /// a program and its arguments, passed as given. Put `--` before it when it has options.
    #[arg(required = true, trailing_var_arg = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

fn parse_gpus(text: &str) -> Result<GpuAmount, String> {
    text.parse::<GpuAmount>().map_err(|e| e.to_string())
}

fn parse_time_limit(text: &str) -> Result<Duration, String> {
    parse_duration(text).map_err(|e| e.to_string())
}

pub async fn run(global: &GlobalArgs, args: &SubmitArgs) -> Result<ExitCode> {
    // Mistakes in the request are reported before (and without) reaching the server.
    let request = build_request(args, &current_user())?;
    let session = Session::connect(global).await?;
    let id = request.id.clone();
    publish(&session, &request).await?;

    if args.interactive {
        if !args.quiet {
            // With -i stdout carries the job's own output, so our message goes to stderr.
            human::stderr_line(&format!("Submitted job {id}"));
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

/// Everything the scheduler needs, checked as far as it can be without a node.
fn build_request(args: &SubmitArgs, user: &str) -> Result<SubmitRequest> {
    let workdir = resolve_workdir(args.workdir.as_deref())?;
    let gpu_ids = args.gpu_ids.as_ref().map(|ids| ids.0.clone());
    let gpus = match (args.gpus, &gpu_ids) {
        (Some(gpus), _) => gpus,
        // Pinning GPUs says how many are wanted.
        (None, Some(ids)) => GpuAmount::whole(u32::try_from(ids.len()).unwrap_or(u32::MAX)),
        (None, None) => GpuAmount::ONE,
    };
    let mut spec = JobSpec::new(args.command.clone(), workdir);
    spec.name = args.name.clone();
    spec.gpus = gpus;
    spec.gpu_ids = gpu_ids;
    spec.mem_mib = args.mem;
    spec.priority = args.priority;
    spec.time_limit_secs = args.time_limit.map(|d| d.as_secs());
    spec.env_setup_cmd = args.env_setup_cmd.clone();
    spec.env = capture_environment();
    spec.interactive = args.interactive;
    // The spec's own message says what is wrong and which option to change.
    spec.validate().map_err(plain)?;
    Ok(SubmitRequest {
        id: JobId::random(),
        user: user.to_owned(),
        spec,
    })
}

/// The job runs where the user stands unless told otherwise; the path is made absolute
/// (symlinks resolved) because the agent starts the job from nowhere in particular.
fn resolve_workdir(given: Option<&Path>) -> Result<String> {
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
fn capture_environment() -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    for (key, value) in std::env::vars_os() {
        match (key.to_str(), value.to_str()) {
            (Some(k), Some(v)) => {
                env.insert(k.to_owned(), v.to_owned());
            }
            _ => human::stderr_line(&format!(
                "warning: not passing environment variable {} to the job: it is not valid UTF-8",
                key.to_string_lossy()
            )),
        }
    }
    env
}

/// Stores the submission in JetStream and waits for the acknowledgement, so the printed id
/// belongs to a job that exists. The job id is the dedup id: a retry cannot submit twice.
async fn publish(session: &Session, request: &SubmitRequest) -> Result<()> {
    let payload = serde_json::to_vec(request).context("encoding the submission")?;
    check_size(payload.len(), &request.spec.env)?;
    let mut headers = HeaderMap::new();
    headers.insert(header::NATS_MESSAGE_ID, request.id.as_str());
    let ack = session
        .js
        .publish_with_headers(subjects::SUBMIT, headers, payload.into())
        .await
        .map_err(|err| publish_error(err.kind(), &err))?;
    ack.await.map_err(|err| publish_error(err.kind(), &err))?;
    Ok(())
}

fn check_size(bytes: usize, env: &BTreeMap<String, String>) -> Result<()> {
    if bytes <= MAX_SUBMIT_BYTES {
        return Ok(());
    }
    let env_bytes: usize = env.iter().map(|(k, v)| k.len() + v.len()).sum();
    bail!(
        "the submission is {} KiB, over the {} KiB limit; {} KiB of it is your environment, \
         which the job inherits: unset large environment variables and submit again",
        bytes.div_ceil(1024),
        MAX_SUBMIT_BYTES / 1024,
        env_bytes.div_ceil(1024)
    )
}

/// Turns a JetStream publish failure into advice. "No responders" means no stream listens on
/// `jobs.submit`: mgpu's streams were never created on this server.
pub fn publish_error(kind: PublishErrorKind, err: &dyn std::fmt::Display) -> anyhow::Error {
    match kind {
        PublishErrorKind::StreamNotFound => plain(StateError::NotSetUp),
        PublishErrorKind::TimedOut => anyhow!(
            "JetStream did not acknowledge the request in time: the server may be overloaded, \
             or your credentials may not allow this request"
        ),
        _ => anyhow!("JetStream refused the request: {err}"),
    }
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
            }) => Some(args),
            _ => None,
        }
    }

    #[test]
    fn pinned_gpus_set_the_count() {
        let args = submit_args(&["--gpu-ids", "0-2", "--workdir", "/", "--", "true"]);
        let request = args.and_then(|a| build_request(&a, "alice").ok());
        let spec = request.map(|r| r.spec);
        assert_eq!(spec.as_ref().map(|s| s.gpus), Some(GpuAmount::whole(3)));
        assert_eq!(spec.and_then(|s| s.gpu_ids), Some(vec![0, 1, 2]));
    }

    #[test]
    fn the_spec_check_runs_before_anything_is_sent() {
        let args = submit_args(&["--gpus", "2", "--gpu-ids", "1", "--workdir", "/", "--", "x"]);
        let err = args.map(|a| build_request(&a, "alice").err().map(|e| e.to_string()));
        let err = err.flatten().unwrap_or_default();
        assert!(err.contains("does not match"), "{err}");
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

    #[test]
    fn oversized_submissions_blame_the_environment() {
        let mut env = BTreeMap::new();
        env.insert("BIG".to_owned(), "x".repeat(300 * 1024));
        let err = check_size(301 * 1024, &env)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("301 KiB of it is your environment"), "{err}");
        assert!(check_size(1024, &env).is_ok());
    }
}
