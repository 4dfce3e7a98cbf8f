//! The invariants of preemption by class, checked as records are stored and kills sent:
//! - a job of a class that is not preemptible is never stopped for another job;
//! - every kill of a job being preempted carries its warning, with the grace its class (or
//!   its shorter `--signal`) gives, so no resend cuts its grace short (the simulated agent
//!   reports a requeue without a warning during a grace);
//! - a job is preempted only once it started and ran its class's `min_runtime`, and never a
//!   `--no-requeue` one (it could not come back).

use mgpu_protocol::Timestamp;
use mgpu_protocol::assign::NodeControl;
use mgpu_protocol::job::{JobRecord, JobState};
use mgpu_protocol::qos::QosClasses;

/// What storing `record` breaks, if anything: a preemption of a job that may not be
/// preempted, or not yet.
pub fn stored(record: &JobRecord, classes: &QosClasses, now: Timestamp) -> Option<String> {
    let JobState::Running(run) = &record.state else {
        return None;
    };
    let preemptor = run.preempted_for.as_ref()?;
    let class = classes.of_job(record.spec.qos.as_deref());
    if !class.preemptible {
        return Some(format!(
            "a job not preemptible preempted: {} ({:?}) for {preemptor}",
            record.id.short(),
            record.spec.qos
        ));
    }
    if record.spec.no_requeue {
        return Some(format!(
            "a --no-requeue job preempted: {} for {preemptor}",
            record.id.short()
        ));
    }
    let Some(started) = run.started_at else {
        return Some(format!(
            "a job preempted before it started: {} for {preemptor}",
            record.id.short()
        ));
    };
    let ran = (now - started).num_seconds();
    let min = i64::try_from(class.min_runtime_secs).unwrap_or(i64::MAX);
    (ran < min).then(|| {
        format!(
            "a job preempted before its minimum run time: {} ran {ran} s of {min} s",
            record.id.short()
        )
    })
}

/// What sending `control` about `record` breaks: a kill of a job being preempted without
/// the warning its class gives.
pub fn kill_sent(
    record: &JobRecord,
    control: &NodeControl,
    classes: &QosClasses,
) -> Option<String> {
    let NodeControl::Kill {
        attempt,
        requeue,
        warning,
        ..
    } = control;
    let JobState::Running(run) = &record.state else {
        return None;
    };
    if !*requeue || *attempt != record.attempt || run.preempted_for.is_none() {
        return None;
    }
    let class = classes.of_job(record.spec.qos.as_deref());
    let grace = match record.spec.signal.map(|s| s.seconds) {
        Some(seconds) if seconds > 0 => seconds.min(class.grace_secs),
        _ => class.grace_secs,
    };
    match warning {
        Some(warning) if warning.grace_secs == grace => None,
        other => Some(format!(
            "a preempted job's kill without its grace: {} got {other:?}, its grace is {grace} s",
            record.id.short()
        )),
    }
}
