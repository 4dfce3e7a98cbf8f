//! What `mgpu submit` prints once the pipeline settled its jobs, one printer per form: the
//! command line's one job, an array, a job file's passes. Stdout carries what scripts read
//! (ids, `--json`); with `-q` it carries ids only and everything else goes to stderr.

use anyhow::{Result, anyhow};
use mgpu_protocol::ids::JobId;
use serde_json::json;

use super::args::SubmitArgs;
use super::pipeline::{Duplicate, Outcome, Settled};
use super::plan::Label;
use crate::console::{self, print, print_json, println};
use crate::human;
use crate::jobfile::FileError;

/// Reports the command line's one job; its id when it was stored. A job not submitted because
/// an identical one waits or runs is not an error: the work asked for is queued.
pub fn single(args: &SubmitArgs, settled: Vec<Settled>) -> Result<Option<JobId>> {
    let Some(Settled {
        outcome, unchecked, ..
    }) = settled.into_iter().next()
    else {
        return Err(anyhow!("the job was not submitted"));
    };
    let id = match outcome {
        Outcome::Submitted(id) => id,
        Outcome::Refused(id, why) => {
            if args.json {
                print_json(&json!({ "id": id, "refused": why }))?;
            }
            return Err(anyhow!("job {} refused: {why}", id.short()));
        }
        Outcome::Bad(message) => return Err(anyhow!(message)),
        Outcome::NotStored(err) => return Err(err),
        Outcome::Duplicate(duplicate) => {
            let sentence = format!("Not submitted: {}", duplicate.reason());
            if args.json {
                print_json(&json!({ "id": null, "duplicate_of": duplicate.existing_id() }))?;
            } else if args.quiet {
                // Stdout stays empty, so `id=$(mgpu submit -q …)` holds no id that was not
                // submitted.
                console::stderr_line(&sentence);
            } else {
                println(&sentence)?;
            }
            return Ok(None);
        }
    };
    if args.interactive {
        if !args.quiet {
            // With -i stdout carries the job's own output, so our message goes to stderr.
            console::stderr_line(&format!("Submitted job {id}"));
        }
    } else if args.json {
        print_json(&json!({ "id": id, "checked": !unchecked }))?;
    } else if args.quiet {
        println(id.as_str())?;
    } else {
        println(&format!("Submitted job {id}"))?;
    }
    if unchecked && !args.json {
        console::stderr_line(&not_checked(1));
    }
    Ok(Some(id))
}

/// The note for jobs stored while no scheduler answered.
fn not_checked(count: usize) -> String {
    let jobs = if count == 1 { "it" } else { "them" };
    format!(
        "Not checked yet: the scheduler did not answer in time (none runs, or it is busy). \
         The job{} will be checked all the same; `mgpu show` says if {jobs} cannot run.",
        if count == 1 { "" } else { "s" }
    )
}

/// An array's tasks, sorted by what became of them.
#[derive(Debug, Default)]
struct ArrayOutcomes {
    submitted: Vec<(u32, JobId)>,
    /// Stored and refused by the scheduler: index, id, why.
    refused: Vec<(u32, JobId, String)>,
    /// Stored while no scheduler answered.
    unchecked: usize,
    duplicates: Vec<(u32, Duplicate)>,
    not_stored: Vec<anyhow::Error>,
}

impl ArrayOutcomes {
    fn sort(settled: Vec<Settled>) -> Result<ArrayOutcomes> {
        let mut sorted = ArrayOutcomes::default();
        for Settled {
            label,
            outcome,
            unchecked,
        } in settled
        {
            let index = match label {
                Label::Task(index) => index,
                _ => 0,
            };
            sorted.unchecked += usize::from(unchecked);
            match outcome {
                Outcome::Submitted(id) => sorted.submitted.push((index, id)),
                Outcome::Refused(id, why) => sorted.refused.push((index, id, why)),
                Outcome::Duplicate(duplicate) => sorted.duplicates.push((index, duplicate)),
                Outcome::NotStored(err) => sorted.not_stored.push(err),
                // Every task has the array's spec, so one failing the checks means all do:
                // one error line, nothing submitted.
                Outcome::Bad(message) => return Err(anyhow!(message)),
            }
        }
        Ok(sorted)
    }
}

/// Reports an array: its id and ends (or the ids, or JSON), the tasks left out as
/// duplicates, and an error when some tasks were not stored.
pub fn array(
    args: &SubmitArgs,
    array_id: &JobId,
    max_running: Option<u32>,
    settled: Vec<Settled>,
) -> Result<()> {
    let ArrayOutcomes {
        submitted,
        refused,
        unchecked,
        duplicates,
        mut not_stored,
    } = ArrayOutcomes::sort(settled)?;
    if submitted.is_empty() && !not_stored.is_empty() {
        // Nothing was stored: one error line, like a single submission.
        return Err(not_stored.swap_remove(0));
    }
    if args.json {
        let mut value = json!({
            "array_id": (!submitted.is_empty()).then_some(array_id),
            "ids": submitted.iter().map(|(_, id)| id).collect::<Vec<_>>(),
            "checked": unchecked == 0,
        });
        if !refused.is_empty() {
            value["refused"] = refused
                .iter()
                .map(|(index, id, why)| json!({ "index": index, "id": id, "reason": why }))
                .collect();
        }
        if args.dedup {
            value["duplicates"] = duplicates
                .iter()
                .map(
                    |(index, found)| json!({ "index": index, "duplicate_of": found.existing_id() }),
                )
                .collect();
        }
        print_json(&value)?;
    } else if args.quiet {
        let ids: String = submitted.iter().map(|(_, id)| format!("{id}\n")).collect();
        print(&ids)?;
    } else if let Some(text) = array_summary(array_id, &submitted, max_running) {
        println(&text)?;
    }
    if !duplicates.is_empty() && !args.json {
        let indices: Vec<u32> = duplicates.iter().map(|(index, _)| *index).collect();
        let sentence = format!(
            "Not submitted: {} of the tasks are identical to queued or running jobs (indices {})",
            duplicates.len(),
            human::index_list(&indices)
        );
        // Like a single duplicate: with -q, stdout keeps only ids.
        if args.quiet {
            console::stderr_line(&sentence);
        } else {
            println(&sentence)?;
        }
    }
    if unchecked > 0 && !args.json {
        console::stderr_line(&not_checked(unchecked));
    }
    let total = submitted.len() + refused.len() + not_stored.len();
    if let Some(first) = not_stored.first() {
        return Err(anyhow!(
            "{} of {total} tasks were not submitted: {first:#}",
            not_stored.len(),
        ));
    }
    if !refused.is_empty() {
        return Err(anyhow!("{}", refusals(&refused, total)));
    }
    Ok(())
}

/// `3 of 10 tasks refused: index 0-2: why`, one line per reason.
fn refusals(refused: &[(u32, JobId, String)], total: usize) -> String {
    let mut by_reason: std::collections::BTreeMap<&str, Vec<u32>> = Default::default();
    for (index, _, why) in refused {
        by_reason.entry(why.as_str()).or_default().push(*index);
    }
    let lines: Vec<String> = by_reason
        .iter()
        .map(|(why, indices)| format!("  index {}: {why}", human::index_ranges(indices)))
        .collect();
    format!(
        "{} of {total} tasks refused by the scheduler:\n{}",
        refused.len(),
        lines.join("\n")
    )
}

/// `Submitted array 1a2b3c4d5e with 10 tasks (at most 4 at once)` and the first and last ids;
/// None when no task was submitted.
fn array_summary(
    array_id: &JobId,
    submitted: &[(u32, JobId)],
    limit: Option<u32>,
) -> Option<String> {
    let ((first_index, first), (last_index, last)) = (submitted.first()?, submitted.last()?);
    let limit = limit
        .map(|n| format!(" (at most {n} at once)"))
        .unwrap_or_default();
    let count = submitted.len();
    let tasks = if count == 1 { "task" } else { "tasks" };
    let mut text = format!(
        "Submitted array {} with {count} {tasks}{limit}\n  first: {first} (index {first_index})",
        array_id.short(),
    );
    if count > 1 {
        text.push_str(&format!("\n  last:  {last} (index {last_index})"));
    }
    Some(text)
}

/// A job file's printer: a line per job as each pass settles (`FILE:LINE: submitted …`, or
/// on stderr what is wrong with it), and the tally at the end.
pub struct FilePrinter {
    /// The path as the user gave it, starting every line.
    name: String,
    quiet: bool,
    tally: Tally,
}

impl FilePrinter {
    pub fn new(name: String, quiet: bool) -> FilePrinter {
        FilePrinter {
            name,
            quiet,
            tally: Tally::default(),
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// One pass's jobs, in file order.
    pub fn pass(&mut self, settled: Vec<Settled>) -> Result<()> {
        for Settled {
            label,
            outcome,
            unchecked,
        } in settled
        {
            let line = match label {
                Label::Line(line) => line,
                _ => 0,
            };
            self.tally.unchecked += usize::from(unchecked);
            self.job(line, outcome)?;
        }
        Ok(())
    }

    fn job(&mut self, line: usize, outcome: Outcome) -> Result<()> {
        let name = &self.name;
        match outcome {
            Outcome::Submitted(id) => {
                self.tally.submitted += 1;
                if self.quiet {
                    println(id.as_str())?;
                } else {
                    println(&format!("{name}:{line}: submitted {}", id.short()))?;
                }
            }
            Outcome::Duplicate(duplicate) => {
                self.tally.skipped += 1;
                let text = format!("{name}:{line}: skipped: {}", duplicate.reason());
                // With -q stdout carries only the ids of submitted jobs.
                if self.quiet {
                    console::stderr_line(&text);
                } else {
                    println(&text)?;
                }
            }
            Outcome::Refused(id, why) => {
                self.tally.refused += 1;
                console::stderr_line(&format!("{name}:{line}: refused ({}): {why}", id.short()));
            }
            Outcome::Bad(message) => {
                self.tally.bad += 1;
                console::stderr_line(&format!("{name}:{line}: {message}"));
            }
            Outcome::NotStored(err) => {
                self.tally.failed += 1;
                console::stderr_line(&format!("{name}:{line}: not submitted: {err:#}"));
            }
        }
        Ok(())
    }

    /// A file that cannot be read as a whole (a TOML syntax error) counts as one bad job.
    pub fn file_error(&mut self, err: &FileError) {
        console::stderr_line(&format!("{}:{}: {}", self.name, err.line, err.message));
        self.tally.bad += 1;
    }

    /// The tally (unless quiet); whether every job went well.
    pub fn finish(&self) -> Result<bool> {
        if !self.quiet {
            println(&self.tally.summary(&self.name))?;
        }
        if self.tally.unchecked > 0 {
            console::stderr_line(&not_checked(self.tally.unchecked));
        }
        Ok(self.tally.bad + self.tally.failed + self.tally.refused == 0)
    }
}

/// What happened to the jobs of a job file's run.
#[derive(Debug, Default)]
struct Tally {
    submitted: usize,
    skipped: usize,
    bad: usize,
    failed: usize,
    /// Stored and refused by the scheduler.
    refused: usize,
    /// Stored while no scheduler answered.
    unchecked: usize,
}

impl Tally {
    fn summary(&self, name: &str) -> String {
        let mut parts = vec![format!("{} submitted", self.submitted)];
        if self.skipped > 0 {
            parts.push(format!("{} skipped as duplicates", self.skipped));
        }
        if self.bad > 0 {
            parts.push(format!("{} bad", self.bad));
        }
        if self.refused > 0 {
            parts.push(format!(
                "{} refused by the scheduler (see above)",
                self.refused
            ));
        }
        if self.failed > 0 {
            parts.push(format!("{} not stored (see above)", self.failed));
        }
        format!("{name}: {}", parts.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_names_the_array_and_its_ends() {
        let array_id = JobId::random();
        let first = JobId::random();
        let last = JobId::random();
        let text = array_summary(&array_id, &[(0, first.clone()), (9, last.clone())], Some(4));
        assert_eq!(
            text,
            Some(format!(
                "Submitted array {} with 2 tasks (at most 4 at once)\n  first: {first} (index 0)\n  last:  {last} (index 9)",
                array_id.short()
            ))
        );
        let one = array_summary(&array_id, &[(3, first.clone())], None).unwrap_or_default();
        assert!(one.contains("with 1 task\n"), "{one}");
        assert!(one.ends_with(&format!("first: {first} (index 3)")), "{one}");
        assert_eq!(array_summary(&array_id, &[], None), None);
    }

    #[test]
    fn array_tasks_are_sorted_by_outcome_and_a_bad_spec_fails_them_all() {
        let id = JobId::random();
        let settled = vec![
            Settled {
                label: Label::Task(4),
                outcome: Outcome::Submitted(id.clone()),
                unchecked: false,
            },
            Settled {
                label: Label::Task(5),
                outcome: Outcome::NotStored(anyhow!("timed out")),
                unchecked: false,
            },
        ];
        let sorted = ArrayOutcomes::sort(settled).ok();
        assert_eq!(
            sorted.as_ref().map(|s| s.submitted.clone()),
            Some(vec![(4, id)])
        );
        assert_eq!(sorted.map(|s| s.not_stored.len()), Some(1));
        let bad = vec![Settled {
            label: Label::Task(0),
            outcome: Outcome::Bad("the job has no command".into()),
            unchecked: false,
        }];
        let err = ArrayOutcomes::sort(bad).err().map(|e| e.to_string());
        assert_eq!(err.as_deref(), Some("the job has no command"));
    }

    #[test]
    fn refused_tasks_are_listed_by_reason() {
        let id = JobId::random();
        let refused = vec![
            (0, id.clone(), "over the limit".to_owned()),
            (1, id.clone(), "over the limit".to_owned()),
            (7, id, "no node has GPU type h200".to_owned()),
        ];
        assert_eq!(
            refusals(&refused, 10),
            "3 of 10 tasks refused by the scheduler:\n  index 7: no node has GPU type h200\n  \
             index 0-1: over the limit"
        );
    }

    #[test]
    fn the_file_summary_mentions_only_what_happened() {
        let mut tally = Tally {
            submitted: 3,
            ..Tally::default()
        };
        assert_eq!(tally.summary("jobs.txt"), "jobs.txt: 3 submitted");
        tally.skipped = 1;
        tally.bad = 2;
        assert_eq!(
            tally.summary("jobs.txt"),
            "jobs.txt: 3 submitted, 1 skipped as duplicates, 2 bad"
        );
    }
}
