//! Job files for `mgpu submit --file`: many jobs in one file, in one of two formats.
//!
//! - seed 004's lines, `priority,script_path,conda_env,arguments,allowed_gpus` ([`seed`]);
//! - a native TOML file of `[[job]]` tables, chosen by the `.toml` extension ([`native`]).
//!
//! Parsing is pure: each job becomes a [`Draft`] (or the reason it cannot), tagged with its line.
//! [`finalize`] then settles what depends on the submitter (GPU count from profiles, workdir,
//! environment) and checks the result as `mgpu submit` would.

pub mod native;
pub mod seed;

use std::collections::BTreeMap;
use std::path::Path;

use mgpu_protocol::gpu_amount::GpuAmount;
use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::{JobSpec, OnTimeout};

use crate::profiles::{self, LazyProfiles};

pub use mgpu_protocol::job::GPUS_PLACEHOLDER;

/// Which parser a file gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Seed,
    Toml,
}

impl Format {
    /// `.toml` files are native job files; anything else is read as seed 004's lines.
    pub fn of(path: &Path) -> Format {
        match path.extension().and_then(|e| e.to_str()) {
            Some(ext) if ext.eq_ignore_ascii_case("toml") => Format::Toml,
            _ => Format::Seed,
        }
    }
}

/// One job as a file describes it, before the submitter's defaults and profiles apply.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Draft {
    pub command: Vec<String>,
    pub name: Option<String>,
    /// None: decided by the profile rules (`--llm NAME` in the command), else one GPU.
    pub gpus: Option<GpuAmount>,
    pub profile: Option<String>,
    pub gpu_ids: Option<Vec<u32>>,
    pub allowed_gpus: Option<Vec<u32>>,
    pub mem_mib: Option<u64>,
    pub priority: i32,
    pub time_limit_secs: Option<u64>,
    pub on_timeout: Option<OnTimeout>,
    pub conda_env: Option<String>,
    pub env_setup_cmd: Option<String>,
    /// As written; relative paths are taken from the current directory, like `--workdir`.
    pub workdir: Option<String>,
    /// Skip the job when an identical one is queued, running, or earlier in this run.
    pub dedup: bool,
    /// `no_requeue = true|false` in a TOML job; None: the command line's `--no-requeue`.
    pub no_requeue: Option<bool>,
}

/// One job of a file: the line it starts on (1-based) and the job, or why it is unusable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub line: usize,
    pub draft: Result<Draft, String>,
}

/// A file that cannot be read as a whole (a TOML syntax error): nothing in it is usable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileError {
    pub line: usize,
    pub message: String,
}

/// Every job in `text`, in file order.
pub fn parse(format: Format, text: &str) -> Result<Vec<Entry>, FileError> {
    match format {
        Format::Seed => Ok(seed::parse(text)),
        Format::Toml => native::parse(text),
    }
}

/// What applies to every job of the file unless the file says otherwise: set from the command
/// line (`--time-limit`, `--on-timeout`, `--env-setup-cmd`, `--workdir`, `--after`, …).
#[derive(Clone, Debug, Default)]
pub struct Defaults {
    pub workdir: String,
    pub env: BTreeMap<String, String>,
    pub time_limit_secs: Option<u64>,
    pub on_timeout: Option<OnTimeout>,
    pub env_setup_cmd: Option<String>,
    /// `--no-requeue`: every job of the file ends as `node_failed` if its node is lost.
    pub no_requeue: bool,
    pub after: Vec<JobId>,
    pub after_any: Vec<JobId>,
}

/// The spec a draft becomes, checked as `mgpu submit` checks its own. `resolve_workdir` makes a
/// written workdir absolute (and checks it exists).
pub fn finalize(
    draft: Draft,
    defaults: &Defaults,
    profiles: &mut LazyProfiles,
    resolve_workdir: impl Fn(&Path) -> anyhow::Result<String>,
) -> Result<JobSpec, String> {
    let choice = profiles::choose_gpus(
        draft.gpus,
        draft.profile.as_deref(),
        draft.gpu_ids.as_ref().map(Vec::len),
        &draft.command,
        profiles,
    )
    .map_err(|e| format!("{e:#}"))?;
    let workdir = match &draft.workdir {
        Some(dir) => resolve_workdir(Path::new(dir)).map_err(|e| format!("{e:#}"))?,
        None => defaults.workdir.clone(),
    };
    if let Some(allowed) = &draft.allowed_gpus
        && choice.gpus.gpu_count() as usize > allowed.len()
    {
        return Err(format!(
            "the job needs {} GPU(s) but its allowed GPUs ({}) are only {}",
            choice.gpus,
            crate::human::index_list(allowed),
            allowed.len()
        ));
    }
    let mut spec = JobSpec::new(draft.command, workdir);
    spec.name = draft.name;
    spec.gpus = choice.gpus;
    spec.profile = choice.profile;
    spec.gpu_ids = draft.gpu_ids;
    spec.allowed_gpus = draft.allowed_gpus;
    spec.mem_mib = draft.mem_mib;
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
    spec.validate().map_err(|e| e.to_string())?;
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn defaults() -> Defaults {
        Defaults {
            workdir: "/work".into(),
            time_limit_secs: Some(60),
            ..Defaults::default()
        }
    }

    fn no_profiles() -> LazyProfiles {
        LazyProfiles::preloaded(None)
    }

    fn seed_profiles() -> LazyProfiles {
        let text = r#"{"default_requirement": 1.0,
            "models": {"qwen2.5-3b-inst": 0.5, "qwen2.5-7b-inst": 1.0, "qwen2.5-32b-inst": 4.0}}"#;
        LazyProfiles::preloaded(profiles::Profiles::parse(Path::new("llm_config.json"), text).ok())
    }

    fn absolute(dir: &Path) -> anyhow::Result<String> {
        Ok(Path::new("/base").join(dir).display().to_string())
    }

    #[test]
    fn the_format_follows_the_extension() {
        assert_eq!(Format::of(Path::new("jobs.toml")), Format::Toml);
        assert_eq!(Format::of(Path::new("jobs.TOML")), Format::Toml);
        assert_eq!(Format::of(Path::new("jobs.txt")), Format::Seed);
        assert_eq!(Format::of(Path::new("jobs")), Format::Seed);
    }

    #[test]
    fn seed_lines_take_their_gpus_from_the_profiles() {
        let text = "\
0,/path/to/train.py,pytorch_env,--llm qwen2.5-7b-inst --epochs 100,0-3
1,/path/to/eval.py,pytorch_env,--llm qwen2.5-3b-inst --dataset test,
2,/path/to/inference.py,,--llm qwen2.5-32b-inst --batch_size 1,4,5,6,7
";
        let mut profiles = seed_profiles();
        let specs: Vec<JobSpec> = seed::parse(text)
            .into_iter()
            .filter_map(|e| e.draft.ok())
            .filter_map(|d| finalize(d, &defaults(), &mut profiles, absolute).ok())
            .collect();
        assert_eq!(specs.len(), 3);
        let gpus: Vec<String> = specs.iter().map(|s| s.gpus.to_string()).collect();
        assert_eq!(gpus, ["1", "0.5", "4"]);
        assert_eq!(specs[2].profile.as_deref(), Some("qwen2.5-32b-inst"));
        assert_eq!(specs[0].time_limit_secs, Some(60), "command-line default");
        assert_eq!(specs[0].workdir, "/work");
        // Without a profiles file every line asks for one GPU.
        let mut none = no_profiles();
        let draft = seed::parse(text).remove(2).draft;
        let spec = draft
            .ok()
            .map(|d| finalize(d, &defaults(), &mut none, absolute));
        assert_eq!(
            spec.and_then(Result::ok).map(|s| s.gpus),
            Some(GpuAmount::ONE)
        );
    }

    #[test]
    fn more_gpus_than_allowed_is_refused() {
        let text = "0,run.py,,--llm qwen2.5-32b-inst,0-1\n";
        let draft = seed::parse(text).remove(0).draft;
        let err = draft
            .ok()
            .and_then(|d| finalize(d, &defaults(), &mut seed_profiles(), absolute).err())
            .unwrap_or_default();
        assert!(err.contains("needs 4 GPU(s)"), "{err}");
    }

    #[test]
    fn a_written_workdir_is_resolved_and_checked() {
        let draft = Draft {
            command: vec!["true".into()],
            workdir: Some("sub".into()),
            ..Draft::default()
        };
        let spec = finalize(draft.clone(), &defaults(), &mut no_profiles(), absolute);
        assert_eq!(spec.map(|s| s.workdir).ok(), Some("/base/sub".into()));
        let failing =
            |_: &Path| -> anyhow::Result<String> { anyhow::bail!("workdir sub does not exist") };
        let err = finalize(draft, &defaults(), &mut no_profiles(), failing).err();
        assert_eq!(err.as_deref(), Some("workdir sub does not exist"));
    }

    #[test]
    fn spec_checks_apply_to_file_jobs() {
        let draft = Draft {
            command: vec!["true".into()],
            conda_env: Some("bad env!".into()),
            ..Draft::default()
        };
        let err = finalize(draft, &defaults(), &mut no_profiles(), absolute).err();
        assert!(
            err.unwrap_or_default()
                .contains("not a conda environment name")
        );
    }

    #[test]
    fn no_requeue_comes_from_the_job_else_the_command_line() {
        let draft = |no_requeue| Draft {
            command: vec!["true".into()],
            no_requeue,
            ..Draft::default()
        };
        let with_flag = Defaults {
            no_requeue: true,
            ..defaults()
        };
        let spec_of = |draft: Draft, defaults: &Defaults| {
            finalize(draft, defaults, &mut no_profiles(), absolute)
                .map(|s| s.no_requeue)
                .ok()
        };
        assert_eq!(spec_of(draft(None), &defaults()), Some(false));
        assert_eq!(spec_of(draft(None), &with_flag), Some(true));
        assert_eq!(spec_of(draft(Some(false)), &with_flag), Some(false));
        assert_eq!(spec_of(draft(Some(true)), &defaults()), Some(true));
    }
}
