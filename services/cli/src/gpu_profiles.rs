//! GPU profiles: how many GPUs each model needs, read from a JSON profiles file mapping model
//! names to GPU requirements (whole GPUs or shares of one), with a default for the others:
//!
//! ```json
//! {"default_requirement": 1.0, "models": {"qwen2.5-3b-inst": 0.5, "qwen2.5-7b-inst": 1.0}}
//! ```
//!
//! `mgpu submit --profile NAME` asks for that model's GPUs; without `--profile` or `--gpus`, a
//! command carrying `--llm NAME` gets NAME's requirement (or the default one) when a profiles
//! file exists. The file is found at `--profiles FILE`, `$MGPU_PROFILES`, `./llm_config.json`
//! or `~/.config/mgpu/llm_config.json`, in that order.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, anyhow, bail};
use mgpu_protocol::gpu_amount::GpuAmount;
use serde::Deserialize;

/// The profiles file's usual name, looked for in the current directory and `~/.config/mgpu/`.
pub const FILE_NAME: &str = "llm_config.json";

/// The file as written; other keys it may hold (settings of other tools) are ignored.
#[derive(Debug, Deserialize)]
struct ProfilesFile {
    #[serde(default = "one")]
    default_requirement: f64,
    #[serde(default)]
    models: BTreeMap<String, f64>,
}

fn one() -> f64 {
    1.0
}

/// Loaded profiles: each model's GPU requirement and the default for unlisted models.
#[derive(Clone, Debug, PartialEq)]
pub struct Profiles {
    pub path: PathBuf,
    pub default: GpuAmount,
    pub models: BTreeMap<String, GpuAmount>,
}

impl Profiles {
    pub fn parse(path: &Path, text: &str) -> Result<Profiles> {
        let file: ProfilesFile = serde_json::from_str(text)
            .with_context(|| format!("{} is not a profiles file", path.display()))?;
        let amount = |what: &str, value: f64| -> Result<GpuAmount> {
            // Through text, so 0.5 and 1.0 read exactly as a person typing them would.
            value
                .to_string()
                .parse::<GpuAmount>()
                .map_err(|err| anyhow!("{}: {what}: {err}", path.display()))
        };
        let default = amount("default_requirement", file.default_requirement)?;
        let models = file
            .models
            .iter()
            .map(|(name, value)| Ok((name.clone(), amount(&format!("model `{name}`"), *value)?)))
            .collect::<Result<_>>()?;
        Ok(Profiles {
            path: path.to_owned(),
            default,
            models,
        })
    }

    pub fn load(path: &Path) -> Result<Profiles> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read profiles file {}", path.display()))?;
        Profiles::parse(path, &text)
    }

    /// The requirement of a model named with `--profile`: an unknown name is an error that
    /// lists the known ones, since a typo would otherwise silently get the default.
    pub fn named(&self, name: &str) -> Result<GpuAmount> {
        self.models.get(name).copied().ok_or_else(|| {
            let known: Vec<&str> = self.models.keys().map(String::as_str).collect();
            anyhow!(
                "no profile `{name}` in {}; known profiles: {}",
                self.path.display(),
                if known.is_empty() {
                    "none".to_owned()
                } else {
                    known.join(", ")
                }
            )
        })
    }

    /// The requirement of a model named with `--llm`: unlisted models get the file's default.
    pub fn for_llm(&self, name: &str) -> GpuAmount {
        self.models.get(name).copied().unwrap_or(self.default)
    }
}

/// Where the profiles file is, if any. An explicit path (`--profiles`, `$MGPU_PROFILES`) must
/// exist; the usual places are used only when they do.
pub fn locate(explicit: Option<&Path>, cwd: &Path, home: Option<&Path>) -> Result<Option<PathBuf>> {
    if let Some(path) = explicit {
        if !path.is_file() {
            bail!("profiles file {} does not exist", path.display());
        }
        return Ok(Some(path.to_owned()));
    }
    let here = cwd.join(FILE_NAME);
    if here.is_file() {
        return Ok(Some(here));
    }
    Ok(home
        .map(|home| home.join(".config/mgpu").join(FILE_NAME))
        .filter(|path| path.is_file()))
}

/// The profiles, read once and only when a submission needs them, so a broken file nobody
/// asked for does not stop a plain `--gpus 2` submission.
pub struct LazyProfiles {
    explicit: Option<PathBuf>,
    loaded: Option<Option<Profiles>>,
}

impl LazyProfiles {
    pub fn new(explicit: Option<PathBuf>) -> LazyProfiles {
        LazyProfiles {
            explicit,
            loaded: None,
        }
    }

    /// Profiles already at hand (tests), so no file is looked for.
    #[cfg(test)]
    pub fn preloaded(profiles: Option<Profiles>) -> LazyProfiles {
        LazyProfiles {
            explicit: None,
            loaded: Some(profiles),
        }
    }

    pub fn get(&mut self) -> Result<Option<&Profiles>> {
        if self.loaded.is_none() {
            let cwd = std::env::current_dir().context("cannot read the current directory")?;
            let home = std::env::var_os("HOME").map(PathBuf::from);
            let found = match locate(self.explicit.as_deref(), &cwd, home.as_deref())? {
                Some(path) => Some(Profiles::load(&path)?),
                None => None,
            };
            self.loaded = Some(found);
        }
        Ok(self.loaded.as_ref().and_then(Option::as_ref))
    }
}

/// The model named by `--llm NAME` or `--llm=NAME` in a command. A one-element command is a
/// shell line and is split into words; quotes around the name are dropped.
pub fn llm_name(command: &[String]) -> Option<String> {
    let words: Vec<&str> = match command {
        [line] => line.split_whitespace().collect(),
        argv => argv.iter().map(String::as_str).collect(),
    };
    let unquote = |word: &str| word.trim_matches(|c| c == '"' || c == '\'').to_owned();
    let mut iter = words.iter();
    while let Some(word) = iter.next() {
        if let Some(name) = word.strip_prefix("--llm=") {
            return Some(unquote(name)).filter(|n| !n.is_empty());
        }
        if *word == "--llm" {
            return iter.next().map(|n| unquote(n)).filter(|n| !n.is_empty());
        }
    }
    None
}

/// What decided a job's GPU count.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuChoice {
    pub gpus: GpuAmount,
    pub profile: Option<String>,
}

/// The GPU count, from (first that applies): `--profile` (an explicit `--gpus` still wins on
/// the count), `--gpus`, the number of pinned GPU ids, `--llm NAME` in the command when a
/// profiles file exists, else one GPU.
pub fn choose_gpus(
    explicit: Option<GpuAmount>,
    profile: Option<&str>,
    pinned: Option<usize>,
    command: &[String],
    profiles: &mut LazyProfiles,
) -> Result<GpuChoice> {
    if let Some(name) = profile {
        let Some(loaded) = profiles.get()? else {
            bail!(
                "--profile needs a profiles file: pass --profiles FILE, set MGPU_PROFILES, or \
                 create ./{FILE_NAME} or ~/.config/mgpu/{FILE_NAME}"
            );
        };
        let required = loaded.named(name)?;
        return Ok(GpuChoice {
            gpus: explicit.unwrap_or(required),
            profile: Some(name.to_owned()),
        });
    }
    if let Some(gpus) = explicit {
        return Ok(GpuChoice {
            gpus,
            profile: None,
        });
    }
    if let Some(count) = pinned {
        return Ok(GpuChoice {
            gpus: GpuAmount::whole(u32::try_from(count).unwrap_or(u32::MAX)),
            profile: None,
        });
    }
    if let Some(name) = llm_name(command)
        && let Some(loaded) = profiles.get()?
    {
        return Ok(GpuChoice {
            gpus: loaded.for_llm(&name),
            profile: Some(name),
        });
    }
    Ok(GpuChoice {
        gpus: GpuAmount::ONE,
        profile: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = r#"{
        "default_requirement": 1.0,
        "models": {"qwen2.5-3b-inst": 0.5, "qwen2.5-7b-inst": 1.0, "qwen2.5-32b-inst": 4.0}
    }"#;

    fn example() -> Option<Profiles> {
        Profiles::parse(Path::new("llm_config.json"), EXAMPLE).ok()
    }

    fn loaded(profiles: Option<Profiles>) -> LazyProfiles {
        LazyProfiles::preloaded(profiles)
    }

    fn words(line: &str) -> Vec<String> {
        vec![line.to_owned()]
    }

    #[test]
    fn the_example_file_reads_as_is() {
        let profiles = example();
        assert!(profiles.is_some());
        let Some(profiles) = profiles else { return };
        assert_eq!(profiles.default, GpuAmount::ONE);
        assert_eq!(
            profiles.named("qwen2.5-3b-inst").ok(),
            Some(GpuAmount::from_units(5_000))
        );
        assert_eq!(profiles.for_llm("qwen2.5-32b-inst"), GpuAmount::whole(4));
        assert_eq!(profiles.for_llm("llama-unknown"), GpuAmount::ONE);
        let err = profiles.named("qwen").err().map(|e| e.to_string());
        let err = err.unwrap_or_default();
        assert!(err.contains("no profile `qwen`"), "{err}");
        assert!(
            err.contains("qwen2.5-32b-inst, qwen2.5-3b-inst, qwen2.5-7b-inst"),
            "{err}"
        );
    }

    #[test]
    fn bad_profile_files_name_the_problem() {
        let path = Path::new("p.json");
        let err = |text: &str| {
            Profiles::parse(path, text)
                .err()
                .map(|e| format!("{e:#}"))
                .unwrap_or_default()
        };
        assert!(err("{").contains("not a profiles file"));
        assert!(err(r#"{"models": {"m": 1.5}}"#).contains("model `m`"));
        assert!(err(r#"{"models": {"m": -1}}"#).contains("model `m`"));
        assert!(err(r#"{"default_requirement": "x"}"#).contains("not a profiles file"));
        // Missing keys take defaults; extra keys belong to other tools.
        let minimal = Profiles::parse(path, r#"{"other": 1}"#).ok();
        assert_eq!(minimal.map(|p| p.default), Some(GpuAmount::ONE));
    }

    #[test]
    fn llm_names_are_found_in_shell_lines_and_argv() {
        assert_eq!(
            llm_name(&words("python a.py --llm qwen2.5-7b-inst --epochs 3")),
            Some("qwen2.5-7b-inst".into())
        );
        assert_eq!(
            llm_name(&words("python a.py --llm=qwen2.5-3b-inst")),
            Some("qwen2.5-3b-inst".into())
        );
        assert_eq!(
            llm_name(&words("python a.py --llm 'm-1'")),
            Some("m-1".into())
        );
        let argv: Vec<String> = ["python", "a.py", "--llm", "m2"]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        assert_eq!(llm_name(&argv), Some("m2".into()));
        assert_eq!(llm_name(&words("python a.py --llm")), None);
        assert_eq!(llm_name(&words("python a.py --llmx m")), None);
        assert_eq!(llm_name(&words("python a.py")), None);
    }

    #[test]
    fn the_gpu_count_comes_from_the_first_rule_that_applies() {
        let cmd = words("python a.py --llm qwen2.5-3b-inst");
        let half = GpuAmount::from_units(5_000);
        let choose = |explicit, profile, pinned, profiles: Option<Profiles>| {
            choose_gpus(explicit, profile, pinned, &cmd, &mut loaded(profiles)).ok()
        };
        let choice = |gpus, profile: Option<&str>| {
            Some(GpuChoice {
                gpus,
                profile: profile.map(str::to_owned),
            })
        };
        // --llm in the command, with a profiles file.
        assert_eq!(
            choose(None, None, None, example()),
            choice(half, Some("qwen2.5-3b-inst"))
        );
        // No profiles file: the default single GPU, no profile recorded.
        assert_eq!(choose(None, None, None, None), choice(GpuAmount::ONE, None));
        // Explicit --gpus wins over --llm.
        let two = GpuAmount::whole(2);
        assert_eq!(choose(Some(two), None, None, example()), choice(two, None));
        // Pinned ids say how many.
        assert_eq!(
            choose(None, None, Some(3), example()),
            choice(GpuAmount::whole(3), None)
        );
        // --profile sets the count; --gpus still wins on the count.
        let four = GpuAmount::whole(4);
        assert_eq!(
            choose(None, Some("qwen2.5-32b-inst"), None, example()),
            choice(four, Some("qwen2.5-32b-inst"))
        );
        assert_eq!(
            choose(Some(two), Some("qwen2.5-32b-inst"), None, example()),
            choice(two, Some("qwen2.5-32b-inst"))
        );
        // Unknown --profile, or none without a file, are errors.
        assert_eq!(choose(None, Some("nope"), None, example()), None);
        let err = choose_gpus(None, Some("x"), None, &cmd, &mut loaded(None))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("--profile needs a profiles file"), "{err}");
    }

    #[test]
    fn the_file_is_looked_for_in_order() {
        let Ok(dir) = tempfile::tempdir() else { return };
        let cwd = dir.path().join("work");
        let home = dir.path().join("home");
        let config = home.join(".config/mgpu");
        assert!(std::fs::create_dir_all(&cwd).is_ok());
        assert!(std::fs::create_dir_all(&config).is_ok());
        assert_eq!(locate(None, &cwd, Some(&home)).ok(), Some(None));
        assert!(std::fs::write(config.join(FILE_NAME), EXAMPLE).is_ok());
        assert_eq!(
            locate(None, &cwd, Some(&home)).ok(),
            Some(Some(config.join(FILE_NAME)))
        );
        assert!(std::fs::write(cwd.join(FILE_NAME), EXAMPLE).is_ok());
        assert_eq!(
            locate(None, &cwd, Some(&home)).ok(),
            Some(Some(cwd.join(FILE_NAME)))
        );
        let explicit = dir.path().join("mine.json");
        assert!(locate(Some(&explicit), &cwd, Some(&home)).is_err());
        assert!(std::fs::write(&explicit, EXAMPLE).is_ok());
        assert_eq!(
            locate(Some(&explicit), &cwd, Some(&home)).ok(),
            Some(Some(explicit))
        );
    }
}
