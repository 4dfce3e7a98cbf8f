//! Every form of `mgpu submit` as one list of prepared submissions: the command line's one
//! job, one job per index of an array, one job per entry of a job file. Each carries its
//! [`Label`] (how reports name it) and its request (spec, id, user), or why no spec could be
//! made (a bad entry of a job file). The pipeline ([`super::pipeline`]) takes it from there.

use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::{ArrayMember, JobSpec};
use mgpu_protocol::submit::SubmitRequest;

use super::spec::{self, FileDefaults};
use crate::gpu_profiles::LazyProfiles;
use crate::jobfile::Entry;
use crate::parse::ArraySpec;

/// How the reports name a job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Label {
    /// The one job of the command line.
    Single,
    /// The task of this index of an array.
    Task(u32),
    /// The job starting on this line (1-based) of a job file.
    Line(usize),
}

impl std::fmt::Display for Label {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Label::Single => f.write_str("the job"),
            Label::Task(index) => write!(f, "task {index}"),
            Label::Line(line) => write!(f, "line {line}"),
        }
    }
}

/// One submission, ready for the pipeline.
#[derive(Debug)]
pub struct Prepared {
    pub label: Label,
    /// The request to store (its id is the job's), or why the job cannot be submitted.
    pub request: Result<SubmitRequest, String>,
}

impl Prepared {
    fn new(label: Label, user: &str, spec: Result<JobSpec, String>) -> Prepared {
        Prepared {
            label,
            request: spec.map(|spec| SubmitRequest {
                id: JobId::random(),
                user: user.to_owned(),
                spec,
            }),
        }
    }
}

/// The command line's one job.
pub fn single(spec: JobSpec, user: &str) -> Vec<Prepared> {
    vec![Prepared::new(Label::Single, user, Ok(spec))]
}

/// One job per index of `array`, each its own job id, all members of the array `array_id`.
pub fn array(spec: &JobSpec, array: &ArraySpec, array_id: &JobId, user: &str) -> Vec<Prepared> {
    array
        .indices
        .iter()
        .map(|&index| {
            let mut task = spec.clone();
            task.array = Some(ArrayMember {
                array_id: array_id.clone(),
                index,
                max_running: array.max_running,
            });
            Prepared::new(Label::Task(index), user, Ok(task))
        })
        .collect()
}

/// One job per entry of a job file, in file order; a bad entry keeps its message.
pub fn file_entries(
    entries: Vec<Entry>,
    defaults: &FileDefaults,
    profiles: &mut LazyProfiles,
    user: &str,
) -> Vec<Prepared> {
    entries
        .into_iter()
        .map(|Entry { line, draft }| {
            let spec = draft.and_then(|draft| spec::from_draft(draft, defaults, profiles));
            Prepared::new(Label::Line(line), user, spec)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jobfile::{Format, parse};
    use crate::parse::array_spec;

    #[test]
    fn every_index_is_its_own_job_in_one_array() {
        let spec = JobSpec::new(vec!["python a.py".into()], "/w");
        let array = array_spec("0-9%4").unwrap_or(ArraySpec {
            indices: vec![],
            max_running: None,
        });
        let array_id = JobId::random();
        let tasks = super::array(&spec, &array, &array_id, "alice");
        assert_eq!(tasks.len(), 10);
        let requests: Vec<&SubmitRequest> = tasks
            .iter()
            .filter_map(|t| t.request.as_ref().ok())
            .collect();
        assert_eq!(requests.len(), 10);
        let mut ids: Vec<&JobId> = requests.iter().map(|r| &r.id).collect();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), 10, "each task has its own id");
        assert!(
            !ids.contains(&&array_id),
            "the array id is none of the tasks'"
        );
        for (position, (task, request)) in tasks.iter().zip(&requests).enumerate() {
            let index = position as u32;
            assert_eq!(task.label, Label::Task(index));
            assert_eq!(request.user, "alice");
            assert_eq!(
                request.spec.array,
                Some(ArrayMember {
                    array_id: array_id.clone(),
                    index,
                    max_running: Some(4)
                })
            );
            assert!(request.spec.validate().is_ok());
        }
        // Same command, different index: not duplicates of each other.
        assert_ne!(requests[0].spec.dedup_key(), requests[1].spec.dedup_key());
    }

    #[test]
    fn file_entries_keep_their_lines_and_the_command_lines_defaults() {
        let text = "# header\n0,train.py,,--epochs 3,\nx,bad.py,,,\n\n2,eval.py,env,,0-1\n";
        let entries = parse(Format::Csv, text).unwrap_or_default();
        let defaults = FileDefaults {
            workdir: "/work".into(),
            time_limit_secs: Some(600),
            after: vec![JobId::random()],
            ..FileDefaults::default()
        };
        let prepared = file_entries(
            entries,
            &defaults,
            &mut LazyProfiles::preloaded(None),
            "bob",
        );
        let labels: Vec<Label> = prepared.iter().map(|p| p.label).collect();
        assert_eq!(labels, [Label::Line(2), Label::Line(3), Label::Line(5)]);
        let first = prepared[0].request.as_ref().ok();
        assert_eq!(
            first.map(|r| r.spec.command.clone()),
            Some(vec!["python train.py --epochs 3".to_owned()])
        );
        assert_eq!(first.map(|r| r.spec.workdir.as_str()), Some("/work"));
        assert_eq!(first.and_then(|r| r.spec.time_limit_secs), Some(600));
        assert_eq!(
            first.map(|r| r.spec.after.clone()),
            Some(defaults.after.clone())
        );
        assert_eq!(first.map(|r| r.user.as_str()), Some("bob"));
        assert_eq!(
            first.map(|r| r.spec.dedup),
            Some(true),
            "job files dedup by default"
        );
        let bad = prepared[1]
            .request
            .as_ref()
            .err()
            .cloned()
            .unwrap_or_default();
        assert!(bad.contains("priority `x` is not a whole number"), "{bad}");
        let last = prepared[2].request.as_ref().ok();
        assert_eq!(
            last.and_then(|r| r.spec.allowed_gpus.clone()),
            Some(vec![0, 1])
        );
        assert_eq!(
            last.and_then(|r| r.spec.conda_env.clone()),
            Some("env".into())
        );
    }

    #[test]
    fn labels_read_as_the_reports_name_jobs() {
        assert_eq!(Label::Line(7).to_string(), "line 7");
        assert_eq!(Label::Task(3).to_string(), "task 3");
        assert_eq!(Label::Single.to_string(), "the job");
    }
}
