//! The `--gpu-samples` file: what declared GPUs are doing, for machines without an NVIDIA
//! driver (a laptop, CI, a demonstration). The agent reads it at every sample instead of NVML:
//!
//! ```json
//! {"gpus": [{"index": 0, "utilization_pct": 37, "memory_used_mib": 1200,
//!            "processes": [{"pid": 1234, "used_mib": 1000}]}]}
//! ```
//!
//! Every field but `index` may be left out; a GPU the file does not list keeps the declared
//! defaults (idle, no memory used, no processes). This module owns the format, its checks
//! against the declared GPUs, applying it to them ([`Samples::apply`], pure: the processes are
//! split into the jobs' and foreign ones by a process-group lookup passed in), and reading the
//! file with its warnings ([`SamplesSource`]).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use mgpu_protocol::node::GpuStatus;
use serde::Deserialize;
use tracing::{info, warn};

use crate::gpu_processes::{GpuProcessMemory, ListedProcess, foreign_processes};

/// The file as written. Unknown keys are refused: a misspelt `utilisation_pct` silently
/// meaning "idle" would be a puzzle.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct SamplesFile {
    #[serde(default)]
    gpus: Vec<GpuSample>,
}

#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
struct GpuSample {
    index: u32,
    #[serde(default)]
    utilization_pct: Option<u32>,
    #[serde(default)]
    memory_used_mib: Option<u64>,
    /// None: the GPU's processes cannot be seen (unlike an empty list: none run there).
    #[serde(default)]
    processes: Option<Vec<ProcessSample>>,
}

#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
struct ProcessSample {
    pid: u32,
    used_mib: u64,
}

/// A samples file checked against the declared GPUs; empty (every GPU at its defaults) where
/// there is no usable file.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Samples {
    gpus: Vec<GpuSample>,
}

/// The declared GPUs with one reading of the file applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Applied {
    pub gpus: Vec<GpuStatus>,
    /// Every listed process, as NVML's would be (for jobs' peak GPU memory and idleness).
    pub processes: Vec<GpuProcessMemory>,
    /// The GPUs whose entry lists its processes.
    pub listed_gpus: Vec<u32>,
}

impl Samples {
    /// Reads and checks the file's text: each GPU declared and listed once, utilisation at most
    /// 100 %, memory (the GPU's and each process's) at most the GPU's total.
    pub fn parse(text: &str, declared: &[GpuStatus]) -> Result<Samples, String> {
        let file: SamplesFile = serde_json::from_str(text).map_err(|err| err.to_string())?;
        let mut seen = BTreeSet::new();
        for sample in &file.gpus {
            check(sample, declared)?;
            if !seen.insert(sample.index) {
                return Err(format!("GPU {} is listed twice", sample.index));
            }
        }
        Ok(Samples { gpus: file.gpus })
    }

    /// The declared GPUs as the file describes them. A GPU's used memory, where the file gives
    /// none, is what its processes hold. `process_group` reads a pid's process group: listed
    /// processes outside `job_pgids` are foreign, as NVML's are.
    pub fn apply(
        &self,
        declared: &[GpuStatus],
        job_pgids: &[u32],
        process_group: impl Fn(u32) -> Option<u32>,
    ) -> Applied {
        let mut applied = Applied {
            gpus: declared.to_vec(),
            processes: Vec::new(),
            listed_gpus: Vec::new(),
        };
        for sample in &self.gpus {
            let Some(gpu) = applied.gpus.iter_mut().find(|g| g.index == sample.index) else {
                continue;
            };
            let listed: Vec<ListedProcess> = sample
                .processes
                .iter()
                .flatten()
                .map(|p| ListedProcess {
                    pid: p.pid,
                    used_mib: p.used_mib,
                })
                .collect();
            gpu.utilization_pct = sample.utilization_pct.unwrap_or(0);
            gpu.memory_used_mib = used_memory(sample);
            gpu.foreign_processes = foreign_processes(&listed, job_pgids, &process_group);
            if sample.processes.is_some() {
                applied.listed_gpus.push(sample.index);
            }
            applied
                .processes
                .extend(listed.iter().map(|p| GpuProcessMemory {
                    gpu: sample.index,
                    pid: p.pid,
                    used_mib: p.used_mib,
                }));
        }
        applied
    }
}

/// The GPU's used memory: as given, else what its processes hold.
fn used_memory(sample: &GpuSample) -> u64 {
    sample.memory_used_mib.unwrap_or_else(|| {
        sample
            .processes
            .iter()
            .flatten()
            .fold(0u64, |sum, p| sum.saturating_add(p.used_mib))
    })
}

fn check(sample: &GpuSample, declared: &[GpuStatus]) -> Result<(), String> {
    let index = sample.index;
    let Some(gpu) = declared.iter().find(|g| g.index == index) else {
        return Err(format!(
            "GPU {index} is not declared (this node has {} GPUs)",
            declared.len()
        ));
    };
    let total = gpu.memory_total_mib;
    if let Some(pct) = sample.utilization_pct.filter(|pct| *pct > 100) {
        return Err(format!("GPU {index}: utilization_pct {pct} is over 100"));
    }
    let used = used_memory(sample);
    if used > total {
        return Err(format!(
            "GPU {index}: {used} MiB used is more than its {total} MiB"
        ));
    }
    if let Some(process) = sample
        .processes
        .iter()
        .flatten()
        .find(|p| p.used_mib > total)
    {
        return Err(format!(
            "GPU {index}: process {} uses {} MiB, more than the GPU's {total} MiB",
            process.pid, process.used_mib
        ));
    }
    Ok(())
}

/// The file, read at every sample. A missing file is the defaults, silently (it may be
/// written later); an unreadable or wrong one is the defaults too, with one warning per
/// distinct problem rather than one per heartbeat.
#[derive(Debug)]
pub struct SamplesSource {
    path: PathBuf,
    /// The problem last warned about, until the file reads well (or is gone) again.
    problem: Option<String>,
}

impl SamplesSource {
    pub fn new(path: &Path) -> Self {
        SamplesSource {
            path: path.to_owned(),
            problem: None,
        }
    }

    /// The file's samples now, checked against `declared`.
    pub fn read(&mut self, declared: &[GpuStatus]) -> Samples {
        let read = match std::fs::read_to_string(&self.path) {
            Ok(text) => Samples::parse(&text, declared).map(Some),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(err) => Err(err.to_string()),
        };
        match read {
            Ok(samples) => {
                if self.problem.take().is_some() && samples.is_some() {
                    info!(file = %self.path.display(), "the GPU samples file reads well again");
                }
                samples.unwrap_or_default()
            }
            Err(problem) => {
                if self.problem.as_ref() != Some(&problem) {
                    warn!(
                        file = %self.path.display(),
                        "cannot use the GPU samples file {} ({problem}); reporting the declared \
                         GPUs idle until it is fixed",
                        self.path.display()
                    );
                    self.problem = Some(problem);
                }
                Samples::default()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mgpu_protocol::node::ForeignProcess;

    fn declared() -> Vec<GpuStatus> {
        (0..2)
            .map(|index| GpuStatus {
                index,
                uuid: format!("declared-n1-{index}"),
                name: "Declared GPU".to_owned(),
                gpu_type: None,
                memory_total_mib: 24 * 1024,
                memory_used_mib: 0,
                utilization_pct: 0,
                temperature_c: None,
                power_w: None,
                foreign_processes: Vec::new(),
            })
            .collect()
    }

    fn parse(text: &str) -> Result<Samples, String> {
        Samples::parse(text, &declared())
    }

    #[test]
    fn the_documented_example_applies_with_job_and_foreign_processes_apart() {
        let text = r#"{"gpus": [{"index": 0, "utilization_pct": 37, "memory_used_mib": 1200,
            "processes": [{"pid": 1234, "used_mib": 1000}, {"pid": 77, "used_mib": 200}]}]}"#;
        let Ok(samples) = parse(text) else {
            panic!("the example did not parse: {:?}", parse(text));
        };
        // 1234 is in job group 1230; 77 is someone else's.
        let group = |pid| (pid == 1234).then_some(1230);
        let applied = samples.apply(&declared(), &[1230], group);
        let gpu = &applied.gpus[0];
        assert_eq!((gpu.utilization_pct, gpu.memory_used_mib), (37, 1200));
        assert_eq!(
            gpu.foreign_processes,
            vec![ForeignProcess {
                pid: 77,
                used_mib: 200,
                user: None
            }]
        );
        assert_eq!(
            applied.gpus[1],
            declared()[1],
            "unlisted GPUs keep the defaults"
        );
        assert_eq!(applied.listed_gpus, vec![0]);
        assert_eq!(
            applied.processes,
            vec![
                GpuProcessMemory {
                    gpu: 0,
                    pid: 1234,
                    used_mib: 1000
                },
                GpuProcessMemory {
                    gpu: 0,
                    pid: 77,
                    used_mib: 200
                },
            ]
        );
    }

    #[test]
    fn left_out_fields_take_defaults_and_used_memory_follows_the_processes() {
        let Ok(samples) = parse(r#"{"gpus": [{"index": 1}]}"#) else {
            panic!("a bare index did not parse");
        };
        let applied = samples.apply(&declared(), &[], |_| None);
        assert_eq!(applied.gpus, declared());
        assert!(applied.listed_gpus.is_empty(), "no process list given");
        let text = r#"{"gpus": [{"index": 1, "processes": [{"pid": 5, "used_mib": 300},
            {"pid": 6, "used_mib": 200}]}]}"#;
        let applied = parse(text)
            .unwrap_or_default()
            .apply(&declared(), &[], |_| None);
        assert_eq!(applied.gpus[1].memory_used_mib, 500);
        assert_eq!(applied.gpus[1].foreign_processes.len(), 2);
        assert_eq!(parse("{}"), Ok(Samples::default()));
    }

    #[test]
    fn what_no_gpu_could_report_is_refused_naming_the_gpu() {
        let refused = |text: &str, needle: &str| {
            let err = parse(text).err().unwrap_or_default();
            assert!(err.contains(needle), "{text}: {err}");
        };
        refused(
            r#"{"gpus": [{"index": 0, "utilization_pct": 101}]}"#,
            "GPU 0",
        );
        refused(
            r#"{"gpus": [{"index": 1, "memory_used_mib": 24577}]}"#,
            "more than its 24576 MiB",
        );
        refused(
            r#"{"gpus": [{"index": 0, "memory_used_mib": 10,
                "processes": [{"pid": 1, "used_mib": 30000}]}]}"#,
            "process 1",
        );
        refused(r#"{"gpus": [{"index": 2}]}"#, "GPU 2 is not declared");
        refused(r#"{"gpus": [{"index": 0}, {"index": 0}]}"#, "twice");
        refused(
            r#"{"gpus": [{"index": 0, "utilisation_pct": 5}]}"#,
            "unknown field",
        );
        refused(r#"{"gpus": [{"utilization_pct": 5}]}"#, "index");
        refused("not json", "expected");
        assert!(parse(r#"{"gpus": [{"index": 0, "utilization_pct": 100}]}"#).is_ok());
    }

    #[test]
    fn a_missing_or_broken_file_is_the_defaults() {
        let Ok(dir) = tempfile::tempdir() else {
            panic!("no temporary directory");
        };
        let path = dir.path().join("samples.json");
        let mut source = SamplesSource::new(&path);
        assert_eq!(source.read(&declared()), Samples::default());
        assert_eq!(source.problem, None, "a missing file is no problem");
        let write = |text: &str| {
            if let Err(err) = std::fs::write(&path, text) {
                panic!("writing {}: {err}", path.display());
            }
        };
        write("{");
        assert_eq!(source.read(&declared()), Samples::default());
        assert!(source.problem.is_some());
        write(r#"{"gpus": [{"index": 0, "utilization_pct": 90}]}"#);
        let samples = source.read(&declared());
        let applied = samples.apply(&declared(), &[], |_| None);
        assert_eq!(applied.gpus[0].utilization_pct, 90);
        assert_eq!(
            source.problem, None,
            "reading well again clears the problem"
        );
    }
}
