//! The invariant of priorities, checked at every start: a job never starts in room that a
//! waiting job of a higher `--priority`, first in line, could have taken. "Could" is read
//! narrowly, so that only a plain inversion counts: the waiting job is the only one of its
//! priority or above that waits (no backfill reservation ahead of it), asks for whole GPUs,
//! no more than the started job took on its one node, of that node's type if it names one,
//! and nothing else that narrows where it may run (pins, features, nodes named or excluded,
//! another class, an array, dependencies, a hold, a reservation, a requeue's wait), within
//! its owner's caps; and no reservation books that node.
//!
//! A pass's writes may land in any order (the driver pipelines them), so a start is only a
//! suspect when stored: it breaks the invariant if, once the commands of that moment are all
//! carried out, the job first in line still waits and no fault happened during the moment (a
//! failed write of its own start is one, whether it came before or after the suspected start
//! was stored: seed 915023).

use std::collections::BTreeMap;

use mgpu_protocol::Timestamp;
use mgpu_protocol::gpu_amount::GpuAmount;
use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::{JobRecord, JobState, Run, WaitReason};
use mgpu_protocol::reservation::Reservation;

use super::agents::SimAgent;
use crate::machine::jobs::Tracked;

/// What the check needs besides the records: the nodes, the reservations booked, and the
/// caps in force (a user's total, a user's on a GPU type), in GPU units.
pub struct Context<'a> {
    pub agents: &'a [SimAgent],
    pub reservations: &'a BTreeMap<String, Reservation>,
    pub cap: &'a dyn Fn(&str) -> Option<u64>,
    pub type_cap: &'a dyn Fn(&str, &str) -> Option<u64>,
    pub now: Timestamp,
}

/// The job first in line that starting `started` passed over, if any, and what that breaks;
/// `records` is the bucket after its write.
pub fn started(
    started: &JobRecord,
    records: &BTreeMap<JobId, Tracked>,
    context: &Context<'_>,
) -> Option<(JobId, String)> {
    let JobState::Running(run) = &started.state else {
        return None;
    };
    let (node, whole) = one_node_whole_gpus(run)?;
    let agent = context.agents.iter().find(|a| a.name == node)?;
    let booked = context
        .reservations
        .values()
        .any(|r| r.holds_at(context.now) && r.gpus.iter().any(|gpu| gpu.node == node));
    if booked || started.spec.reservation.is_some() || !normal_class(started) {
        return None;
    }
    let waiting: Vec<&JobRecord> = records
        .values()
        .map(|tracked| &tracked.record)
        .filter(|record| matches!(&record.state, JobState::Queued(w) if w.held_by.is_none()))
        .collect();
    let top = waiting.iter().map(|r| r.spec.priority).max()?;
    let first: Vec<&&JobRecord> = waiting.iter().filter(|r| r.spec.priority == top).collect();
    let [first] = first.as_slice() else {
        return None;
    };
    let plain = top > started.spec.priority
        && plainly_waiting(first)
        && fits(first, whole, &agent.gpu_type, agent.memory_mib)
        && within_caps(first, &agent.gpu_type, records, context);
    plain.then(|| {
        let broken = format!(
            "job {} (priority {}) started on {node} while job {} (priority {}), first in \
             line, could have taken its {whole} GPU(s)",
            started.id.short(),
            started.spec.priority,
            first.id.short(),
            first.spec.priority
        );
        (first.id.clone(), broken)
    })
}

/// The node and the number of whole GPUs of a run on one node taking only whole GPUs.
fn one_node_whole_gpus(run: &Run) -> Option<(&str, u32)> {
    let mut ranks = run.placement.ranks();
    let (_, node, gpus) = ranks.next()?;
    if ranks.next().is_some() || gpus.is_empty() {
        return None;
    }
    let whole = gpus.iter().all(|g| g.amount == GpuAmount::ONE);
    whole.then_some((node, gpus.len() as u32))
}

fn normal_class(record: &JobRecord) -> bool {
    mgpu_protocol::qos::class_name(record.spec.qos.as_deref()) == "normal"
}

/// Waiting for room and nothing else, with nothing narrowing where it may run.
fn plainly_waiting(record: &JobRecord) -> bool {
    let JobState::Queued(waiting) = &record.state else {
        return false;
    };
    let spec = &record.spec;
    let deliberate = matches!(
        waiting.reason,
        WaitReason::PreferredType | WaitReason::Fencing | WaitReason::ReservationWindow
    );
    record.attempt == 1
        && waiting.not_before.is_none()
        && !deliberate
        && normal_class(record)
        && spec.after.is_empty()
        && spec.after_any.is_empty()
        && spec.array.is_none()
        && spec.reservation.is_none()
        && !spec.dedup
        && spec.nodes <= 1
        && spec.gpu_ids.as_ref().is_none_or(Vec::is_empty)
        && spec.node_gpu_ids.is_empty()
        && spec.constraint.is_none()
        && spec.exclude.is_empty()
        && spec.required_nodes().is_empty()
        && spec.gpu_types.len() <= 1
}

/// Whole GPUs, no more than `whole`, of `gpu_type` if it names one, memory within a GPU's.
fn fits(record: &JobRecord, whole: u32, gpu_type: &str, memory_mib: u64) -> bool {
    let spec = &record.spec;
    spec.gpus.is_whole()
        && !spec.gpus.is_zero()
        && spec.gpus.gpu_count() <= whole
        && spec
            .gpu_types
            .iter()
            .all(|t| t.eq_ignore_ascii_case(gpu_type))
        && spec.mem_mib.is_none_or(|mib| mib <= memory_mib)
}

/// Its owner may run it: within their total cap, and their cap on the node's GPU type.
fn within_caps(
    record: &JobRecord,
    gpu_type: &str,
    records: &BTreeMap<JobId, Tracked>,
    context: &Context<'_>,
) -> bool {
    let units = u64::from(record.spec.gpus.units());
    let (mut held, mut held_of_type) = (0u64, 0u64);
    for tracked in records.values().filter(|t| t.record.user == record.user) {
        let JobState::Running(run) = &tracked.record.state else {
            continue;
        };
        for (_, node, gpus) in run.placement.ranks() {
            let taken: u64 = gpus.iter().map(|g| u64::from(g.amount.units())).sum();
            held += taken;
            let of_type = context
                .agents
                .iter()
                .any(|a| a.name == node && a.gpu_type == gpu_type);
            if of_type {
                held_of_type += taken;
            }
        }
    }
    let total = (context.cap)(&record.user).is_none_or(|cap| held + units <= cap);
    let typed =
        (context.type_cap)(&record.user, gpu_type).is_none_or(|cap| held_of_type + units <= cap);
    total && typed
}

/// Starts suspected of passing over the job first in line, until the commands of the moment
/// are carried out.
#[derive(Default)]
pub struct Suspects {
    /// The job passed over, the faults so far when suspected, and what it would break.
    waiting: Vec<(JobId, u64, String)>,
    /// Starts checked, for the run's counts.
    pub checked: u64,
}

impl Suspects {
    /// A start was stored (`faults` as the moment began): suspected when it passed over the
    /// job first in line.
    pub fn start_stored(
        &mut self,
        record: &JobRecord,
        records: &BTreeMap<JobId, Tracked>,
        context: &Context<'_>,
        faults: u64,
    ) {
        self.checked += 1;
        if let Some((first, broken)) = started(record, records, context) {
            self.waiting.push((first, faults, broken));
        }
    }

    /// The commands of the moment are carried out: what the suspects whose job first in line
    /// still waits, with no fault since, break.
    pub fn settle(&mut self, records: &BTreeMap<JobId, Tracked>, faults: u64) -> Vec<String> {
        std::mem::take(&mut self.waiting)
            .into_iter()
            .filter(|(first, suspected_at, _)| {
                let still_waits = records
                    .get(first)
                    .is_some_and(|t| matches!(t.record.state, JobState::Queued(_)));
                still_waits && *suspected_at == faults
            })
            .map(|(_, _, broken)| broken)
            .collect()
    }
}
