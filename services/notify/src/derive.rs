//! What a job's events and its clock tell its owner, decided without I/O: the notice (with
//! its id, the same however often the event is read) for a start, a preemption or an end, the
//! one summary of an array whose last task ended, and 80 % of a time limit. The loops in
//! `events.rs` and `time80.rs` read the records and publish what these return.

use mgpu_protocol::Timestamp;
use mgpu_protocol::event::{EventSource, JobEvent, JobEventKind};
use mgpu_protocol::idle::{Notice, NoticeKind};
use mgpu_protocol::job::{JobRecord, JobState};
use mgpu_protocol::notify::{NotifyEvent, wanted_by};

/// A notice to publish on `users.<owner>.notices`, under message id `id`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Derived {
    pub id: String,
    pub owner: String,
    pub notice: Notice,
}

/// What `event` about `record`'s job tells its owner, if they asked for it (`--notify`). An
/// array task's start, end and failure are not told one by one: see [`array_ended`].
///
/// A node's report counts only for the attempt the record has and a node it placed the job
/// on: any node may publish on any job's events subject, and a notice must not be forged so.
pub fn from_event(event: &JobEvent, record: &JobRecord) -> Option<Derived> {
    let owner = record.user_key.clone()?;
    let job = &record.id;
    let array = record.spec.array.as_ref();
    let (id, kind, message) = match (&event.kind, &event.source) {
        (JobEventKind::Started { .. }, EventSource::Node(node)) => {
            let placed = record
                .state
                .placement()
                .is_some_and(|p| p.node_names().contains(&node.as_str()));
            if !placed || event.attempt != record.attempt {
                return None;
            }
            let kind = NoticeKind::Started {
                attempt: event.attempt,
                node: node.clone(),
            };
            match array {
                // One notice for the whole array: its first task to start.
                Some(member) => (
                    format!("{}-array-start", member.array_id),
                    kind,
                    format!(
                        "array {}: its first task started on {node}",
                        member.array_id.short()
                    ),
                ),
                None => (
                    format!("{job}-{}-start", event.attempt),
                    kind,
                    format!("started on {node} (attempt {})", event.attempt),
                ),
            }
        }
        (
            JobEventKind::Exited {
                preempted: true, ..
            },
            EventSource::Node(_),
        ) => {
            if event.attempt > record.attempt {
                return None;
            }
            (
                format!("{job}-{}-preempt", event.attempt),
                NoticeKind::Preempted {
                    attempt: event.attempt,
                },
                format!(
                    "stopped to make room (attempt {}) and queued again",
                    event.attempt
                ),
            )
        }
        (
            JobEventKind::Finished {
                state,
                exit_code,
                reason,
            },
            EventSource::Scheduler,
        ) if array.is_none() => {
            let kind = NoticeKind::Ended {
                state: state.clone(),
                exit_code: *exit_code,
                reason: reason.clone(),
            };
            (
                format!("{job}-end"),
                kind,
                ended_text(state, *exit_code, reason.as_deref()),
            )
        }
        (JobEventKind::Rejected { reason }, EventSource::Scheduler) if array.is_none() => (
            format!("{job}-end"),
            NoticeKind::Ended {
                state: "failed".to_owned(),
                exit_code: None,
                reason: Some(reason.clone()),
            },
            format!("refused at submit: {reason}"),
        ),
        _ => return None,
    };
    wanted_by(&kind, &record.spec.notify).then(|| Derived {
        id,
        owner,
        notice: Notice {
            job: Some(job.clone()),
            at: event.at,
            message: format!("{}{message}", name_prefix(record)),
            kind,
        },
    })
}

/// `name: ` when the job has a name, so a person sees which job without looking it up.
fn name_prefix(record: &JobRecord) -> String {
    record
        .spec
        .name
        .as_deref()
        .map(|name| format!("{name}: "))
        .unwrap_or_default()
}

fn ended_text(state: &str, exit_code: Option<i32>, reason: Option<&str>) -> String {
    let mut text = format!("ended {state}");
    if let Some(code) = exit_code {
        text.push_str(&format!(" (exit code {code})"));
    }
    if let Some(reason) = reason {
        text.push_str(&format!(": {reason}"));
    }
    text
}

/// Whether `event` is the end of an array task, which [`array_ended`] may answer.
pub fn ends_array_task(event: &JobEvent, record: &JobRecord) -> bool {
    record.spec.array.is_some()
        && matches!(
            (&event.kind, &event.source),
            (JobEventKind::Finished { .. }, EventSource::Scheduler)
                | (JobEventKind::Rejected { .. }, EventSource::Scheduler)
        )
}

/// The one summary of `task`'s array once every task in `tasks` (the array's records) has
/// ended, if its owner asked; None while any still waits or runs.
pub fn array_ended(task: &JobRecord, tasks: &[JobRecord], at: Timestamp) -> Option<Derived> {
    let member = task.spec.array.as_ref()?;
    let owner = task.user_key.clone()?;
    let mine: Vec<&JobRecord> = tasks
        .iter()
        .filter(|r| {
            r.spec
                .array
                .as_ref()
                .is_some_and(|m| m.array_id == member.array_id)
        })
        .collect();
    if mine.is_empty() || mine.iter().any(|r| r.state.ending().is_none()) {
        return None;
    }
    let count = |f: fn(&JobState) -> bool| {
        u32::try_from(mine.iter().filter(|r| f(&r.state)).count()).unwrap_or(u32::MAX)
    };
    let succeeded = count(|s| matches!(s, JobState::Succeeded(_)));
    let failed = count(|s| matches!(s, JobState::Failed(_)));
    let tasks = u32::try_from(mine.len()).unwrap_or(u32::MAX);
    let other = tasks - succeeded - failed;
    let kind = NoticeKind::ArrayEnded {
        array_id: member.array_id.clone(),
        tasks,
        succeeded,
        failed,
        other,
    };
    wanted_by(&kind, &task.spec.notify).then(|| Derived {
        id: format!("{}-array-end", member.array_id),
        owner,
        notice: Notice {
            job: Some(task.id.clone()),
            at,
            message: format!(
                "{}array {}: all {tasks} tasks ended: {succeeded} succeeded, {failed} failed, \
                 {other} cancelled, timed out or lost",
                name_prefix(task),
                member.array_id.short()
            ),
            kind,
        },
    })
}

/// The time-limit notice of `record` at `now`: once its running attempt has used 80 % of its
/// time limit, if its owner asked (`--notify time80`).
pub fn time80(record: &JobRecord, now: Timestamp) -> Option<Derived> {
    let JobState::Running(run) = &record.state else {
        return None;
    };
    if !record.spec.notify.contains(&NotifyEvent::Time80) {
        return None;
    }
    let owner = record.user_key.clone()?;
    let limit = record.spec.time_limit_secs?;
    let started = run.started_at?;
    let elapsed_ms = (now - started).num_milliseconds();
    // 80 %, in milliseconds: exact for any limit a spec may hold (366 days at most).
    let due_ms = i64::try_from(limit).ok()?.checked_mul(800)?;
    if elapsed_ms < due_ms {
        return None;
    }
    Some(Derived {
        id: format!("{}-{}-time80", record.id, record.attempt),
        owner,
        notice: Notice {
            job: Some(record.id.clone()),
            at: now,
            message: format!(
                "{}has run 80 % of its time limit of {}",
                name_prefix(record),
                mgpu_protocol::duration::format_duration(std::time::Duration::from_secs(limit))
            ),
            kind: NoticeKind::TimeLimit80 {
                attempt: record.attempt,
                limit_secs: limit,
            },
        },
    })
}

#[cfg(test)]
#[path = "derive_tests.rs"]
mod tests;
