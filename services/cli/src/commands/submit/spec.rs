//! The job spec each form of `mgpu submit` asks for: from the command line's options, or from
//! a job file's draft with the command line's defaults; and what every spec takes from the
//! submitter: the working directory made absolute, the environment, dependencies by id.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context as _, Result, anyhow, bail};
use mgpu_protocol::gpu_amount::GpuAmount;
use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::{JobSpec, NodeGpuIds, OnTimeout};

use super::args::SubmitArgs;
use crate::client::session::Session;
use crate::console;
use crate::errors::plain;
use crate::gpu_profiles::{self, LazyProfiles};
use crate::human;
use crate::jobfile::Draft;
use crate::model::jobs;

/// The job as asked for on the command line, checked as far as it can be without a node, so
/// a mistake is reported before (and without) reaching the server.
pub fn from_args(args: &SubmitArgs, profiles: &mut LazyProfiles) -> Result<JobSpec> {
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
    let choice = gpu_profiles::choose_gpus(
        args.gpus
            .as_ref()
            .map(|g| g.amount)
            .or(args.gpus_per_node.map(GpuAmount::whole)),
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
    spec.cpus = args.cpus;
    spec.mem_host_mib = args.mem_host;
    spec.priority = args.priority;
    spec.time_limit_secs = args.time_limit.map(|d| d.as_secs());
    spec.on_timeout = args.on_timeout.map(OnTimeout::from).unwrap_or_default();
    spec.env_setup_cmd = args.env_setup_cmd.clone();
    spec.conda_env = args.conda.clone();
    spec.env = capture_environment();
    spec.interactive = args.interactive;
    spec.pty = args
        .pty
        .then(crate::client::follow::raw_terminal::size_or_default);
    spec.dedup = args.dedup;
    spec.no_requeue = args.no_requeue;
    spec.idle_ok = args.idle_ok;
    spec.notify = args.notify.clone().map(|n| n.0).unwrap_or_default();
    spec.private_output = args.private;
    spec.nodelist = args.nodelist.clone();
    spec.exclude = args.exclude.clone();
    spec.nodes = args.nodes.unwrap_or(if node_gpu_ids.is_empty() {
        spec.nodelist.len().max(1) as u32
    } else {
        node_gpu_ids.len() as u32
    });
    spec.node_gpu_ids = node_gpu_ids;
    spec.distributed = args.distributed;
    spec.gpu_types = gpu_types(args)?;
    spec.constraint = args.constraint.clone();
    spec.qos = args.qos.clone();
    spec.reservation = args.reservation.clone();
    spec.signal = args.signal;
    // The spec's own message says what is wrong and which option to change.
    spec.validate().map_err(plain)?;
    Ok(spec)
}

/// The GPU types asked for, by `--gpu-type` or `--gpus TYPE:N` (which must then agree).
fn gpu_types(args: &SubmitArgs) -> Result<Vec<String>> {
    let listed = args.gpu_type.as_ref().map(|t| t.0.clone());
    let shorthand = args.gpus.as_ref().and_then(|g| g.gpu_type.clone());
    match (listed, shorthand) {
        (Some(listed), Some(one)) if !listed.contains(&one) => anyhow::bail!(
            "--gpus {one}:… asks for {one}, --gpu-type for {}: give the type once",
            listed.join(",")
        ),
        (Some(listed), _) => Ok(listed),
        (None, Some(one)) => Ok(vec![one]),
        (None, None) => Ok(Vec::new()),
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
        "--gpus {asked} matches neither the GPUs per node ({most}) nor the total ({total}) that --node-gpu-ids names"
    )))
}

/// What applies to every job of the file unless the file says otherwise: set from the command
/// line (`--time-limit`, `--on-timeout`, `--env-setup-cmd`, `--workdir`, `--after`, …).
#[derive(Clone, Debug, Default)]
pub struct FileDefaults {
    pub workdir: String,
    pub env: BTreeMap<String, String>,
    pub time_limit_secs: Option<u64>,
    pub on_timeout: Option<OnTimeout>,
    pub env_setup_cmd: Option<String>,
    /// `--no-requeue`: every job of the file ends as `node_failed` if its node is lost.
    pub no_requeue: bool,
    /// `--idle-ok`: every job of the file may sit idle, where its class allows that.
    pub idle_ok: bool,
    /// `--notify`: what every job of the file tells its owner about.
    pub notify: Vec<mgpu_protocol::notify::NotifyEvent>,
    /// `--private`: every job of the file writes its output where only its owner reads it.
    pub private_output: bool,
    pub after: Vec<JobId>,
    pub after_any: Vec<JobId>,
}

/// The spec a job file's draft becomes: the GPU count from the profile rules, a written
/// workdir made absolute (and checked), the command line's defaults where the file is silent.
/// The pipeline checks the spec as it checks every other.
pub fn from_draft(
    draft: Draft,
    defaults: &FileDefaults,
    profiles: &mut LazyProfiles,
) -> Result<JobSpec, String> {
    let choice = gpu_profiles::choose_gpus(
        draft.gpus,
        draft.profile.as_deref(),
        draft.gpu_ids.as_ref().map(Vec::len),
        &draft.command,
        profiles,
    )
    .map_err(|e| format!("{e:#}"))?;
    let workdir = match &draft.workdir {
        Some(dir) => resolve_workdir(Some(Path::new(dir))).map_err(|e| format!("{e:#}"))?,
        None => defaults.workdir.clone(),
    };
    if let Some(allowed) = &draft.allowed_gpus
        && choice.gpus.gpu_count() as usize > allowed.len()
    {
        return Err(format!(
            "the job needs {} GPU(s) but its allowed GPUs ({}) are only {}",
            choice.gpus,
            human::index_list(allowed),
            allowed.len()
        ));
    }
    let mut spec = JobSpec::new(draft.command, workdir);
    spec.name = draft.name;
    spec.gpus = choice.gpus;
    spec.profile = choice.profile;
    spec.gpu_ids = draft.gpu_ids;
    spec.allowed_gpus = draft.allowed_gpus;
    spec.gpu_types = draft.gpu_types;
    spec.constraint = draft.constraint;
    spec.qos = draft.qos;
    spec.reservation = draft.reservation;
    spec.signal = draft.signal;
    spec.mem_mib = draft.mem_mib;
    spec.cpus = draft.cpus;
    spec.mem_host_mib = draft.mem_host_mib;
    spec.priority = draft.priority;
    spec.time_limit_secs = draft.time_limit_secs.or(defaults.time_limit_secs);
    spec.on_timeout = draft.on_timeout.or(defaults.on_timeout).unwrap_or_default();
    spec.conda_env = draft.conda_env;
    spec.env_setup_cmd = draft.env_setup_cmd.or(defaults.env_setup_cmd.clone());
    spec.env = defaults.env.clone();
    spec.after = defaults.after.clone();
    spec.after_any = defaults.after_any.clone();
    spec.dedup = draft.dedup;
    spec.no_requeue = draft.no_requeue.unwrap_or(defaults.no_requeue);
    spec.idle_ok = draft.idle_ok.unwrap_or(defaults.idle_ok);
    spec.notify = defaults.notify.clone();
    spec.private_output = defaults.private_output;
    Ok(spec)
}

impl FileDefaults {
    /// The defaults the command line sets; dependencies are resolved to job ids, so this
    /// needs the session.
    pub async fn from_args(args: &SubmitArgs, session: &Session) -> Result<FileDefaults> {
        Ok(FileDefaults {
            workdir: resolve_workdir(args.workdir.as_deref())?,
            env: capture_environment(),
            time_limit_secs: args.time_limit.map(|d| d.as_secs()),
            on_timeout: args.on_timeout.map(Into::into),
            env_setup_cmd: args.env_setup_cmd.clone(),
            no_requeue: args.no_requeue,
            idle_ok: args.idle_ok,
            notify: args.notify.clone().map(|n| n.0).unwrap_or_default(),
            private_output: args.private,
            after: resolve_ids(session, &args.after).await?,
            after_any: resolve_ids(session, &args.after_any).await?,
        })
    }
}

/// Turns `--after` ids and prefixes into job ids; an unknown or ambiguous one is an error,
/// since a job waiting for a job that does not exist would wait forever.
pub async fn resolve_ids(session: &Session, typed: &[String]) -> Result<Vec<JobId>> {
    let mut ids: Vec<JobId> = Vec::with_capacity(typed.len());
    for text in typed.iter().filter(|t| !t.trim().is_empty()) {
        let id = jobs::resolve_anywhere(session, text).await?;
        if !ids.contains(&id) {
            ids.push(id);
        }
    }
    Ok(ids)
}

/// The job runs where the user stands unless told otherwise; the path is made absolute
/// (symlinks resolved) because the agent starts the job from nowhere in particular.
pub fn resolve_workdir(given: Option<&Path>) -> Result<String> {
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
pub fn capture_environment() -> BTreeMap<String, String> {
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
    use crate::commands::submit::args::tests::submit_args;
    use crate::gpu_profiles::Profiles;
    use crate::jobfile::csv;

    fn spec_of(argv: &[&str]) -> Option<JobSpec> {
        let args = submit_args(argv)?;
        from_args(&args, &mut LazyProfiles::preloaded(None)).ok()
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
            from_args(&a, &mut LazyProfiles::preloaded(None))
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
            "--idle-ok",
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
        assert!(spec.idle_ok);
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
        assert_eq!(default.as_ref().map(|s| s.idle_ok), Some(false));
        assert_eq!(default.map(|s| s.no_requeue), Some(false));
    }

    #[test]
    fn qos_and_signal_reach_the_spec_and_the_warning_must_fit_the_limit() {
        let spec = spec_of(&[
            "--workdir",
            "/",
            "--qos",
            "scavenger",
            "--signal",
            "USR1@300",
            "--",
            "true",
        ]);
        assert_eq!(
            spec.as_ref().and_then(|s| s.qos.as_deref()),
            Some("scavenger")
        );
        assert_eq!(
            spec.and_then(|s| s.signal.map(|s| s.to_string())),
            Some("USR1@300".into())
        );
        let err = |argv: &[&str]| {
            submit_args(argv)
                .and_then(|a| from_args(&a, &mut LazyProfiles::preloaded(None)).err())
                .map(|e| e.to_string())
                .unwrap_or_default()
        };
        let late = err(&[
            "--workdir",
            "/",
            "--signal",
            "USR1@60",
            "--time-limit",
            "60",
            "--",
            "x",
        ]);
        assert!(
            late.contains("not less than the job's time limit"),
            "{late}"
        );
        let badly_named = err(&["--workdir", "/", "--qos", "no way", "--", "x"]);
        assert!(badly_named.contains("--qos"), "{badly_named}");
    }

    #[test]
    fn the_reservation_reaches_the_spec_and_a_bad_name_is_refused() {
        let spec = spec_of(&["--workdir", "/", "--reservation", "deadline", "--", "x"]);
        assert_eq!(
            spec.and_then(|s| s.reservation),
            Some("deadline".to_owned())
        );
        let err = submit_args(&["--workdir", "/", "--reservation", "a.b", "--", "x"])
            .and_then(|a| from_args(&a, &mut LazyProfiles::preloaded(None)).err())
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("--reservation"), "{err}");
    }

    #[test]
    fn node_gpu_ids_set_the_nodes_and_the_gpus_per_node() {
        let spec = spec_of(&[
            "--node-gpu-ids",
            "node001:0,1;node002:2,3",
            "--gpus",
            "4",
            "--workdir",
            "/",
            "--",
            "true",
        ]);
        assert_eq!(spec.as_ref().map(|s| s.nodes), Some(2));
        assert_eq!(spec.map(|s| s.gpus), Some(GpuAmount::whole(2)), "4 in all");
        let args = submit_args(&[
            "--node-gpu-ids",
            "node001:0,1;node002:2,3",
            "--gpus",
            "3",
            "--workdir",
            "/",
            "true",
        ]);
        let err = args
            .and_then(|a| from_args(&a, &mut LazyProfiles::preloaded(None)).err())
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            err.contains("matches neither the GPUs per node (2) nor the total (4)"),
            "{err}"
        );
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

    fn defaults() -> FileDefaults {
        FileDefaults {
            workdir: "/work".into(),
            time_limit_secs: Some(60),
            ..FileDefaults::default()
        }
    }

    fn no_profiles() -> LazyProfiles {
        LazyProfiles::preloaded(None)
    }

    fn example_profiles() -> LazyProfiles {
        let text = r#"{"default_requirement": 1.0,
            "models": {"qwen2.5-3b-inst": 0.5, "qwen2.5-7b-inst": 1.0, "qwen2.5-32b-inst": 4.0}}"#;
        LazyProfiles::preloaded(Profiles::parse(Path::new("llm_config.json"), text).ok())
    }

    #[test]
    fn csv_lines_take_their_gpus_from_the_profiles() {
        let text = "\
0,/path/to/train.py,pytorch_env,--llm qwen2.5-7b-inst --epochs 100,0-3
1,/path/to/eval.py,pytorch_env,--llm qwen2.5-3b-inst --dataset test,
2,/path/to/inference.py,,--llm qwen2.5-32b-inst --batch_size 1,4,5,6,7
";
        let mut profiles = example_profiles();
        let specs: Vec<JobSpec> = csv::parse(text)
            .into_iter()
            .filter_map(|e| e.draft.ok())
            .filter_map(|d| from_draft(d, &defaults(), &mut profiles).ok())
            .collect();
        assert_eq!(specs.len(), 3);
        let gpus: Vec<String> = specs.iter().map(|s| s.gpus.to_string()).collect();
        assert_eq!(gpus, ["1", "0.5", "4"]);
        assert_eq!(specs[2].profile.as_deref(), Some("qwen2.5-32b-inst"));
        assert_eq!(specs[0].time_limit_secs, Some(60), "command-line default");
        assert_eq!(specs[0].workdir, "/work");
        // Without a profiles file every line asks for one GPU.
        let mut none = no_profiles();
        let draft = csv::parse(text).remove(2).draft;
        let spec = draft.ok().map(|d| from_draft(d, &defaults(), &mut none));
        assert_eq!(
            spec.and_then(Result::ok).map(|s| s.gpus),
            Some(GpuAmount::ONE)
        );
    }

    #[test]
    fn more_gpus_than_allowed_is_refused() {
        let text = "0,run.py,,--llm qwen2.5-32b-inst,0-1\n";
        let draft = csv::parse(text).remove(0).draft;
        let err = draft
            .ok()
            .and_then(|d| from_draft(d, &defaults(), &mut example_profiles()).err())
            .unwrap_or_default();
        assert!(err.contains("needs 4 GPU(s)"), "{err}");
    }

    #[test]
    fn a_written_workdir_is_resolved_and_checked() {
        let Ok(dir) = tempfile::tempdir() else { return };
        let sub = dir.path().join("sub");
        assert!(std::fs::create_dir(&sub).is_ok());
        let draft = |workdir: &Path| Draft {
            command: vec!["true".into()],
            workdir: Some(workdir.display().to_string()),
            ..Draft::default()
        };
        let spec = from_draft(draft(&sub), &defaults(), &mut no_profiles());
        let canonical = sub.canonicalize().map(|p| p.display().to_string()).ok();
        assert_eq!(spec.map(|s| s.workdir).ok(), canonical);
        let missing = dir.path().join("missing");
        let err = from_draft(draft(&missing), &defaults(), &mut no_profiles()).err();
        assert_eq!(
            err,
            Some(format!("workdir {} does not exist", missing.display()))
        );
    }

    #[test]
    fn no_requeue_comes_from_the_job_else_the_command_line() {
        let draft = |no_requeue| Draft {
            command: vec!["true".into()],
            no_requeue,
            ..Draft::default()
        };
        let with_flag = FileDefaults {
            no_requeue: true,
            ..defaults()
        };
        let spec_of = |draft: Draft, defaults: &FileDefaults| {
            from_draft(draft, defaults, &mut no_profiles())
                .map(|s| s.no_requeue)
                .ok()
        };
        assert_eq!(spec_of(draft(None), &defaults()), Some(false));
        assert_eq!(spec_of(draft(None), &with_flag), Some(true));
        assert_eq!(spec_of(draft(Some(false)), &with_flag), Some(false));
        assert_eq!(spec_of(draft(Some(true)), &defaults()), Some(true));
    }

    #[test]
    fn idle_ok_comes_from_the_job_else_the_command_line() {
        let draft = |idle_ok| Draft {
            command: vec!["true".into()],
            idle_ok,
            ..Draft::default()
        };
        let with_flag = FileDefaults {
            idle_ok: true,
            ..defaults()
        };
        let spec_of = |draft: Draft, defaults: &FileDefaults| {
            from_draft(draft, defaults, &mut no_profiles())
                .map(|s| s.idle_ok)
                .ok()
        };
        assert_eq!(spec_of(draft(None), &defaults()), Some(false));
        assert_eq!(spec_of(draft(None), &with_flag), Some(true));
        assert_eq!(spec_of(draft(Some(false)), &with_flag), Some(false));
        assert_eq!(spec_of(draft(Some(true)), &defaults()), Some(true));
    }
}
