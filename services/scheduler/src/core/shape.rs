//! A queued job's shape: what decides whether it fits and where, so that a pass learns once
//! per shape, not once per job, that jobs alike do not fit (what keeps a pass over a long
//! queue of alike jobs linear in the queue).

use std::time::Duration;

use mgpu_protocol::gpu_amount::GpuAmount;
use mgpu_protocol::gpu_type::Constraint;
use mgpu_protocol::job::{NodeGpuIds, WaitReason};

use super::QueuedJob;

/// What decides whether a job fits and where: two queued jobs of the same shape get the same
/// answer from the same free capacity (their ids, owners and priorities play no part).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) struct Shape<'a> {
    gpus: GpuAmount,
    gpu_ids: Option<&'a [u32]>,
    allowed_gpus: Option<&'a [u32]>,
    mem_mib: Option<u64>,
    cpus: u32,
    mem_host_mib: u64,
    time_limit: Option<Duration>,
    nodes: u32,
    required_nodes: &'a [String],
    exclude: &'a [String],
    node_gpu_ids: &'a [NodeGpuIds],
    gpu_types: &'a [String],
    constraint: Option<&'a Constraint>,
    /// The owner, only where they have caps per GPU type: what fits depends on them then.
    type_capped_owner: Option<&'a str>,
    /// Where reservations' windows are to be minded: its reservation and how soon it may be
    /// preempted (they treat members, preemptible jobs and others apart); None otherwise, so
    /// that a cluster without reservations hashes nothing more.
    windows: Option<(Option<&'a str>, Option<Duration>)>,
}

impl<'a> Shape<'a> {
    pub(super) fn of(job: &'a QueuedJob, type_capped: bool, windows: bool) -> Self {
        Shape {
            gpus: job.gpus,
            gpu_ids: job.gpu_ids.as_deref(),
            allowed_gpus: job.allowed_gpus.as_deref(),
            mem_mib: job.mem_mib,
            cpus: job.cpus,
            mem_host_mib: job.mem_host_mib,
            time_limit: job.time_limit,
            nodes: job.nodes,
            required_nodes: &job.required_nodes,
            exclude: &job.exclude,
            node_gpu_ids: &job.node_gpu_ids,
            gpu_types: &job.gpu_types,
            constraint: job.constraint.as_ref(),
            type_capped_owner: type_capped.then_some(job.owner.as_str()),
            windows: windows.then_some((job.reservation.as_deref(), job.stoppable_after)),
        }
    }

    /// The shape without its time limit: what decides where it could go and when that is
    /// free (the time limit only decides until when it holds it), unless reservations'
    /// windows are to be minded (`windows`): whether a job ends before one opens depends on
    /// it then.
    pub(super) fn placement_only(mut self, windows: bool) -> Self {
        if !windows {
            self.time_limit = None;
        }
        self
    }
}

/// What a pass learnt about a shape that did not fit.
pub(super) struct Unplaceable {
    /// `Capacity::bookings` when it was learnt.
    pub bookings: u64,
    pub reason: WaitReason,
    /// How many reservations there were when reserving for it failed (None: it was not
    /// tried, or it succeeded).
    pub reserve_failed_at: Option<usize>,
}
