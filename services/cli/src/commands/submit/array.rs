//! `mgpu submit --array 0-99%4`: one submission per index, sharing a fresh array id, stored
//! pipelined so a thousand tasks take about as long as a few.

use std::process::ExitCode;

use anyhow::{Result, anyhow};
use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::{ArrayMember, JobSpec, SubmitRequest};
use serde_json::json;

use super::SubmitArgs;
use super::dedup::{Existing, Match};
use crate::console::{self, print_json, println};
use crate::human;
use crate::parse::ArraySpec;
use crate::publish;
use crate::session::Session;

/// One submission per index of `array`, each its own job id.
pub fn expand(
    spec: &JobSpec,
    array: &ArraySpec,
    array_id: &JobId,
    user: &str,
) -> Vec<SubmitRequest> {
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
            SubmitRequest {
                id: JobId::random(),
                user: user.to_owned(),
                spec: task,
            }
        })
        .collect()
}

fn index_of(request: &SubmitRequest) -> u32 {
    request.spec.array.as_ref().map(|a| a.index).unwrap_or(0)
}

pub async fn submit(
    session: &Session,
    args: &SubmitArgs,
    spec: JobSpec,
    array: &ArraySpec,
) -> Result<ExitCode> {
    let array_id = JobId::random();
    let mut requests = expand(&spec, array, &array_id, &session.user);
    // With --dedup a task identical to a waiting or running one (same index of the same
    // command) is left out, so resubmitting an array queues only the missing tasks.
    let mut duplicates: Vec<(u32, Match)> = Vec::new();
    if args.dedup {
        let existing = Existing::load(session).await?;
        requests.retain(|request| match existing.find(&request.spec) {
            Some(found) => {
                duplicates.push((index_of(request), found.clone()));
                false
            }
            None => true,
        });
    }

    let results = publish::submit_all(session, &requests).await;
    let mut submitted: Vec<(u32, JobId)> = Vec::with_capacity(requests.len());
    let mut failures: Vec<anyhow::Error> = Vec::new();
    for (request, result) in requests.iter().zip(results) {
        match result {
            Ok(()) => submitted.push((index_of(request), request.id.clone())),
            Err(err) => failures.push(err),
        }
    }
    if submitted.is_empty() && !failures.is_empty() {
        // Nothing was stored: one error line, like a single submission.
        return Err(failures.swap_remove(0));
    }

    if args.json {
        let mut value = json!({
            "array_id": (!submitted.is_empty()).then_some(&array_id),
            "ids": submitted.iter().map(|(_, id)| id).collect::<Vec<_>>(),
        });
        if args.dedup {
            value["duplicates"] = duplicates
                .iter()
                .map(|(index, found)| json!({ "index": index, "duplicate_of": found.id }))
                .collect();
        }
        print_json(&value)?;
    } else if args.quiet {
        let ids: String = submitted.iter().map(|(_, id)| format!("{id}\n")).collect();
        crate::console::print(&ids)?;
    } else if let Some(text) = summary(&array_id, &submitted, array.max_running) {
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
    if let Some(first) = failures.first() {
        return Err(anyhow!(
            "{} of {} tasks were not submitted: {first:#}",
            failures.len(),
            requests.len()
        ));
    }
    Ok(ExitCode::SUCCESS)
}

/// `Submitted array 1a2b3c4d5e with 10 tasks (at most 4 at once)` and the first and last ids;
/// None when no task was submitted.
fn summary(array_id: &JobId, submitted: &[(u32, JobId)], limit: Option<u32>) -> Option<String> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::array_spec;

    #[test]
    fn every_index_is_its_own_job_in_one_array() {
        let spec = JobSpec::new(vec!["python a.py".into()], "/w");
        let array = array_spec("0-9%4").unwrap_or(ArraySpec {
            indices: vec![],
            max_running: None,
        });
        let array_id = JobId::random();
        let tasks = expand(&spec, &array, &array_id, "alice");
        assert_eq!(tasks.len(), 10);
        let mut ids: Vec<&JobId> = tasks.iter().map(|t| &t.id).collect();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), 10, "each task has its own id");
        assert!(
            !ids.contains(&&array_id),
            "the array id is none of the tasks'"
        );
        for (position, task) in tasks.iter().enumerate() {
            let member = task.spec.array.clone();
            assert_eq!(
                member,
                Some(ArrayMember {
                    array_id: array_id.clone(),
                    index: position as u32,
                    max_running: Some(4)
                })
            );
            assert!(task.spec.validate().is_ok());
        }
        // Same command, different index: not duplicates of each other.
        assert_ne!(tasks[0].spec.dedup_key(), tasks[1].spec.dedup_key());
    }

    #[test]
    fn the_summary_names_the_array_and_its_ends() {
        let array_id = JobId::random();
        let first = JobId::random();
        let last = JobId::random();
        let text = summary(&array_id, &[(0, first.clone()), (9, last.clone())], Some(4));
        assert_eq!(
            text,
            Some(format!(
                "Submitted array {} with 2 tasks (at most 4 at once)\n  first: {first} (index 0)\n  last:  {last} (index 9)",
                array_id.short()
            ))
        );
        let one = summary(&array_id, &[(3, first.clone())], None).unwrap_or_default();
        assert!(one.contains("with 1 task\n"), "{one}");
        assert!(one.ends_with(&format!("first: {first} (index 3)")), "{one}");
        assert_eq!(summary(&array_id, &[], None), None);
    }
}
