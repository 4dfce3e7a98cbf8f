//! What agents report about the processes they run (`started`, `failed_to_start`,
//! `exited`), turned into job state. A report about an attempt that is not the job's current
//! one, or from a node that does not run it, changes nothing.
//!
//! A distributed job has one process per node: it succeeds when every rank exited 0, and
//! the first rank that fails, is cancelled or is lost ends it and stops the others.

use mgpu_protocol::Timestamp;
use mgpu_protocol::event::JobEventKind;
use mgpu_protocol::job::{Ending, JobRecord, JobState, Run, WaitReason, Waiting};
use mgpu_protocol::report::{AgentReport, Exit, ReportKind};

use super::{
    Effect, Level, Limits, Transition, finish, log, scheduling, stop_other_ranks, usage_of,
};

pub(super) fn on_report(current: &JobRecord, report: AgentReport, limits: &Limits) -> Transition {
    let node = report.node.as_str();
    let JobState::Running(run) = &current.state else {
        return Transition::unchanged(
            Level::Debug,
            format!(
                "report from {node} about a job that is {}",
                current.state.name()
            ),
        );
    };
    if !run.placement.launches_on(node) || current.attempt != report.attempt {
        return Transition::unchanged(
            Level::Warn,
            format!(
                "stale report from {node} about attempt {} ignored",
                report.attempt
            ),
        );
    }
    match report.kind {
        ReportKind::Started { pid } => started(current, run, node, pid, report.at),
        ReportKind::FailedToStart { error } => {
            // Where other ranks had started, the job ran (and used its GPUs) until now.
            let usage = usage_of(current, report.at);
            let mut transition = finish(
                current,
                JobState::Failed(Ending {
                    placement: Some(run.placement.clone()),
                    started_at: run.started_at,
                    ended_at: report.at,
                    exit_code: None,
                    signal: None,
                    reason: Some(format!("{}could not start: {error}", which(run, node))),
                    usage: None,
                }),
            );
            transition.effects.extend(stop_other_ranks(
                current,
                &run.placement,
                Some(node),
                "another rank could not start",
            ));
            transition.effects.splice(0..0, usage);
            transition
        }
        ReportKind::Exited(exit) if exit.lost => {
            let why = format!("its agent on {node} restarted and stopped it");
            scheduling::node_lost(current, &why, report.at, None, limits)
        }
        ReportKind::Exited(exit) => exited(current, run, node, exit, report.at),
    }
}

/// "rank 1 (node002): " in reasons, where a job has several ranks.
fn which(run: &Run, node: &str) -> String {
    if run.placement.launched_ranks().len() > 1 {
        let rank = run.placement.rank_of(node).unwrap_or(0);
        format!("rank {rank} ({node}): ")
    } else {
        String::new()
    }
}

fn started(current: &JobRecord, run: &Run, node: &str, pid: u32, at: Timestamp) -> Transition {
    let rank = run.placement.rank_of(node).unwrap_or(0);
    let ranks = run.placement.launched_ranks().len();
    let mut run = run.clone();
    run.started_at.get_or_insert(at);
    if rank == 0 {
        run.pid = Some(pid);
    }
    if ranks > 1 && !run.ranks_started.contains(&rank) {
        run.ranks_started.push(rank);
        run.last_rank_started_at = Some(at);
    }
    let mut record = current.clone();
    record.state = JobState::Running(run);
    Transition {
        record: Some(record),
        effects: vec![log(Level::Debug, format!("started on {node} (pid {pid})"))],
    }
}

fn exited(current: &JobRecord, run: &Run, node: &str, exit: Exit, at: Timestamp) -> Transition {
    let rank = run.placement.rank_of(node).unwrap_or(0);
    let ranks = run.placement.launched_ranks().len();
    let cancel_requested_by = run.cancel_requested_by.clone();
    if exit.is_clean() && ranks > 1 && cancel_requested_by.is_none() {
        // One rank of a distributed job is done; the job is done when all are.
        let mut done = run.clone();
        if !done.ranks_done.contains(&rank) {
            done.ranks_done.push(rank);
        }
        if done.ranks_done.len() < ranks {
            let mut record = current.clone();
            record.state = JobState::Running(done);
            return Transition {
                record: Some(record),
                effects: vec![log(
                    Level::Info,
                    format!("rank {rank} finished on {node}; others still run"),
                )],
            };
        }
    }
    if exit.preempted && ranks > 1 && cancel_requested_by.is_none() {
        // A time slice stops every rank; the job goes back to the queue only once all have
        // stopped, or its next attempt could start while a rank still runs (the simulator
        // found that: a rank in its kill grace beside the next attempt).
        let mut stopping = run.clone();
        if !stopping.ranks_done.contains(&rank) {
            stopping.ranks_done.push(rank);
        }
        if stopping.ranks_done.len() < ranks {
            let mut record = current.clone();
            record.state = JobState::Running(stopping);
            return Transition {
                record: Some(record),
                effects: vec![log(
                    Level::Info,
                    format!("rank {rank} stopped on {node}; requeued once every rank stopped"),
                )],
            };
        }
    }
    // The job ends here (or goes back to the queue): its GPU time counts once.
    let mut effects: Vec<Effect> = usage_of(current, at).into_iter().collect();
    if !exit.is_clean() {
        // Whatever ends one rank badly ends the job: stop the others now.
        let why = if exit.preempted {
            "the job is being requeued"
        } else {
            "another rank of the job ended"
        };
        effects.extend(stop_other_ranks(current, &run.placement, Some(node), why));
    }
    let mut transition = if exit.preempted && cancel_requested_by.is_none() {
        // Back to the end of the queue, as the next attempt.
        let idle = run
            .stop_warning
            .is_some_and(|w| w.cause == mgpu_protocol::stop::StopCause::Idle);
        let why = match &run.preempted_for {
            Some(preemptor) => format!("preempted by {preemptor}"),
            None if idle => "its GPUs sat idle while another job waited".to_owned(),
            None => "its time slice ended".to_owned(),
        };
        let mut record = current.clone();
        if let Some(by) = &run.preempted_for {
            record
                .preemptions
                .push(preemption(current, run, by, &exit, at));
        }
        record.attempt = record.attempt.saturating_add(1);
        record.state = JobState::Queued(Waiting {
            reason: WaitReason::Resources,
            held_by: None,
            enqueued_at: Some(at),
            not_before: None,
            previous_stop: Some(why.clone()),
        });
        Transition {
            record: Some(record),
            effects: vec![
                Effect::Publish(JobEventKind::Queued {
                    reason: WaitReason::Resources,
                }),
                log(Level::Info, format!("requeued: {why}")),
            ],
        }
    } else {
        finish(current, ending_state(run, node, exit, at))
    };
    effects.append(&mut transition.effects);
    transition.effects = effects;
    transition
}

/// What accounting keeps of an attempt preempted for `by`: the GPU time it had run, and
/// whether it left by itself within its grace (no signal ended it) or was stopped.
fn preemption(
    current: &JobRecord,
    run: &Run,
    by: &str,
    exit: &Exit,
    at: Timestamp,
) -> mgpu_protocol::stop::Preemption {
    let started = run.started_at.unwrap_or(run.assigned_at);
    let seconds = (at - started).num_milliseconds().max(0) as f64 / 1000.0;
    mgpu_protocol::stop::Preemption {
        attempt: current.attempt,
        by: by.to_owned(),
        gpu_seconds: (run.placement.total_gpus() * seconds).round() as u64,
        within_grace: exit.signal.is_none(),
    }
}

/// The final state an exit makes. A job the kernel killed a process of for going over its
/// `--mem-host` failed with that reason, whatever its exit code said (as Slurm's
/// `OUT_OF_MEMORY`): its result cannot be trusted.
fn ending_state(run: &Run, node: &str, exit: Exit, at: Timestamp) -> JobState {
    let ending = |reason: Option<String>| Ending {
        placement: Some(run.placement.clone()),
        started_at: run.started_at.or(Some(at)),
        ended_at: at,
        exit_code: Some(exit.exit_code),
        signal: exit.signal,
        reason,
        usage: exit.usage.clone(),
    };
    let which = which(run, node);
    if exit.cancelled || run.cancel_requested_by.is_some() {
        let by = run
            .cancel_requested_by
            .as_deref()
            .unwrap_or("an administrator");
        JobState::Cancelled(ending(Some(format!("cancelled by {by}"))))
    } else if exit.timed_out {
        JobState::TimedOut(ending(Some("time limit reached".into())))
    } else if exit.out_of_memory {
        JobState::Failed(ending(Some(format!("{which}out of memory (host)"))))
    } else if exit.exit_code == 0 {
        JobState::Succeeded(ending(None))
    } else if let Some(signal) = exit.signal {
        JobState::Failed(ending(Some(format!("{which}killed by signal {signal}"))))
    } else {
        JobState::Failed(ending(Some(format!("{which}exit code {}", exit.exit_code))))
    }
}
