//! What people ask of a job: a submission makes its record; a cancel ends a queued job or
//! stops a running one; a hold keeps a queued job from starting and a release lets it go.
//! Only the job's owner or an admin may cancel, hold or release it.

use mgpu_protocol::Timestamp;
use mgpu_protocol::event::JobEventKind;
use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::{JobRecord, JobState, WaitReason, Waiting};
use mgpu_protocol::request::Action;
use mgpu_protocol::submit::SubmitRequest;

use super::{
    Effect, Level, Requester, StreamOrder, Transition, ended_unstarted, finish, kill_everywhere,
    log,
};

/// Who signed a submission.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Signer {
    pub name: String,
    pub key: String,
}

/// Why a valid submission is not added to the queue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NotAdded<'a> {
    /// `--dedup` found its twin, queued or running.
    Duplicate(&'a JobId),
    /// It is over one of its owner's limits (the reason names it).
    OverLimit(String),
    /// It asks for a GPU type or node feature no node has (the reason names those there are).
    Unselectable(String),
    /// No node known could ever run it, even idle (as the pass would find: the reason says
    /// what it asks for against the largest node).
    Impossible(String),
}

/// The record a submission makes, signed by `signer` at `now`: queued, or failed when its
/// spec is invalid or it is `not_added` (a `--dedup` twin, over a limit). A submission whose
/// sender field is not a user name makes no record; its submitter hears why from the event.
/// The effects are for a record just created: a redelivered submission's are dropped.
pub fn submit(
    request: SubmitRequest,
    signer: &Signer,
    not_added: Option<NotAdded<'_>>,
    now: Timestamp,
) -> Transition {
    if let Err(invalid) = request.validate_sender() {
        return Transition {
            record: None,
            effects: vec![
                log(Level::Warn, format!("refusing a submission: {invalid}")),
                Effect::Publish(JobEventKind::Rejected {
                    reason: format!("invalid submission: {invalid}"),
                }),
            ],
        };
    }
    let state = match (request.spec.validate(), not_added) {
        (Err(invalid), _) => JobState::Failed(ended_unstarted(
            now,
            format!("invalid submission: {invalid}"),
        )),
        (Ok(()), Some(NotAdded::Duplicate(original))) => JobState::Failed(ended_unstarted(
            now,
            format!("not added: identical to job {} (--dedup)", original.short()),
        )),
        (Ok(()), Some(NotAdded::OverLimit(why) | NotAdded::Unselectable(why))) => {
            JobState::Failed(ended_unstarted(now, format!("not added: {why}")))
        }
        (Ok(()), Some(NotAdded::Impossible(why))) => {
            JobState::Failed(ended_unstarted(now, format!("cannot run: {why}")))
        }
        (Ok(()), None) => JobState::Queued(Waiting::new(WaitReason::Submitted)),
    };
    let mut effects = Vec::with_capacity(4);
    if request.user != signer.name {
        // The payload's name is only what the CLI believed; the signature decides.
        effects.push(log(
            Level::Debug,
            format!(
                "submission claims user {}, recorded under its signer {}",
                request.user, signer.name
            ),
        ));
    }
    let rejection = state.ending().and_then(|e| e.reason.clone());
    effects.push(log(
        Level::Info,
        format!("job submitted by {}", signer.name),
    ));
    effects.push(Effect::Audit {
        action: Action::Submit,
        accepted: rejection.is_none(),
        detail: if rejection.is_some() {
            "rejected"
        } else {
            "queued"
        }
        .into(),
    });
    effects.push(Effect::Publish(match rejection {
        Some(reason) => JobEventKind::Rejected { reason },
        None => JobEventKind::Queued {
            reason: WaitReason::Submitted,
        },
    }));
    let record = JobRecord {
        id: request.id,
        user: signer.name.clone(),
        user_key: Some(signer.key.clone()),
        spec: request.spec,
        submitted_at: now,
        attempt: 1,
        state,
        last_request: None,
        preemptions: Vec::new(),
    };
    Transition {
        record: Some(record),
        effects,
    }
}

/// The refusal of a request by someone who may not act on `current`.
fn refused(current: &JobRecord, action: Action) -> Transition {
    Transition {
        record: None,
        effects: vec![Effect::Refuse {
            action,
            reason: format!("job {} belongs to {}", current.id.short(), current.user),
        }],
    }
}

/// `by` cancels the job (`why`: the reason they gave): a queued job ends at once; a running
/// one is marked and its processes are killed (it ends when its agent reports so).
pub(super) fn cancel(
    current: &JobRecord,
    by: &Requester,
    why: Option<&str>,
    now: Timestamp,
) -> Transition {
    if !by.may_act_on(&current.user) {
        return refused(current, Action::Cancel);
    }
    let audit = Effect::Audit {
        action: Action::Cancel,
        accepted: true,
        detail: format!("was {}", current.state.name()),
    };
    let reason = match why {
        Some(why) => format!("cancelled by {}: {why}", by.name),
        None => format!("cancelled by {}", by.name),
    };
    let mut transition = match &current.state {
        JobState::Queued(_) => finish(current, JobState::Cancelled(ended_unstarted(now, reason))),
        JobState::Running(run) if run.cancel_requested_by.is_none() => {
            let mut record = current.clone();
            if let JobState::Running(run) = &mut record.state {
                run.cancel_requested_by = Some(by.name.clone());
            }
            let nodes = run.placement.nodes_label();
            Transition {
                record: Some(record),
                effects: vec![
                    kill_everywhere(current, &run.placement, reason, false),
                    log(Level::Info, format!("kill sent to {nodes}")),
                ],
            }
        }
        state => Transition::unchanged(
            Level::Debug,
            format!("cancel of a {} job: nothing to do", state.name()),
        ),
    };
    transition.effects.insert(0, audit);
    transition
}

/// `by` holds (`hold`) or releases the job: only a queued job changes, and not by a request
/// delivered again after a later one was applied (`order`).
pub(super) fn hold(
    current: &JobRecord,
    by: &Requester,
    hold: bool,
    order: Option<StreamOrder>,
) -> Transition {
    let action = if hold { Action::Hold } else { Action::Release };
    if !by.may_act_on(&current.user) {
        return refused(current, action);
    }
    if StreamOrder::is_stale(order, current.last_request) {
        return Transition {
            record: None,
            effects: vec![
                Effect::Audit {
                    action,
                    accepted: true,
                    detail: "delivered again after a later request: not applied".into(),
                },
                log(
                    Level::Info,
                    format!("{action} delivered again after a later request: not applied"),
                ),
            ],
        };
    }
    let JobState::Queued(waiting) = &current.state else {
        // Nothing changes but a running job's sequence: an older hold delivered again once
        // the job is back in the queue must not undo this release (or the reverse).
        let running = matches!(current.state, JobState::Running(_));
        let record = order.filter(|_| running).map(|order| {
            let mut record = current.clone();
            record.last_request = Some(order.sequence);
            record
        });
        return Transition {
            record,
            effects: vec![
                Effect::Audit {
                    action,
                    accepted: true,
                    detail: "not queued: nothing to do".into(),
                },
                log(
                    Level::Info,
                    format!("{action} of a job that is not queued: nothing to do"),
                ),
            ],
        };
    };
    let mut waiting = waiting.clone();
    waiting.held_by = hold.then(|| by.name.clone());
    if hold {
        waiting.reason = WaitReason::Held;
    }
    let mut record = current.clone();
    record.state = JobState::Queued(waiting);
    if let Some(order) = order {
        record.last_request = Some(order.sequence);
    }
    Transition {
        record: Some(record),
        effects: vec![
            Effect::Audit {
                action,
                accepted: true,
                detail: "done".into(),
            },
            log(Level::Info, format!("{action}: hold state changed")),
        ],
    }
}
