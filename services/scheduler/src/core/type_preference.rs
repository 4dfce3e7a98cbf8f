//! Waiting for a preferred GPU type: a job that lists types (`--gpu-type h100,a100-80gb`)
//! takes the first that fits now, unless a type earlier in its list is expected free soon,
//! in which case it waits for it rather than settle for the next.
//!
//! "Soon" is [`PREFERRED_TYPE_WAIT`]: a node the job may use has enough GPUs of the
//! preferred type, free now or held by running jobs whose time limit ends within it, and at
//! least one of them held so (free ones alone it did not get, being reserved for a job ahead
//! or not fitting it, are no reason to wait: it would wait for ever). A job whose limit has passed (still running, a slice waiting for someone to yield to)
//! or that has none is not counted: nothing says when it ends. A job waits so for
//! [`PREFERRED_TYPE_WAIT`] after it was queued at most, whatever comes; judged for one-node
//! jobs only (a gang takes what fits).

use std::collections::HashSet;
use std::time::Duration;

use mgpu_protocol::Timestamp;
use mgpu_protocol::gpu_amount::GpuAmount;
use mgpu_protocol::job::Placement;

use super::capacity::Capacity;
use super::{QueuedJob, RunningJob};

/// How long a job waits at most for a GPU type it prefers to the one free now.
pub const PREFERRED_TYPE_WAIT: Duration = Duration::from_secs(10 * 60);

/// Whether `job`, which could start on `placed` now, should rather wait for a type it lists
/// before the one it got.
pub(super) fn worth_waiting(
    capacity: &Capacity,
    running: &[&RunningJob],
    job: &QueuedJob,
    placed: &Placement,
    now: Timestamp,
) -> bool {
    if job.gpu_types.len() < 2 || job.nodes > 1 || job.gpus.is_zero() {
        return false;
    }
    let Some(got) = type_of(capacity, placed) else {
        return false;
    };
    let Some(rank) = job.gpu_types.iter().position(|t| t == got) else {
        return false;
    };
    if rank == 0 {
        return false;
    }
    let wait = chrono::Duration::from_std(PREFERRED_TYPE_WAIT).unwrap_or_default();
    if now - job.queued_at >= wait {
        return false;
    }
    let horizon = now + wait;
    // GPUs (node, index) held by jobs due to end within the horizon.
    let ending_soon: HashSet<(&str, u32)> = running
        .iter()
        .filter(|r| {
            r.expected_end
                .is_some_and(|end| end >= now && end <= horizon)
        })
        .flat_map(|r| {
            r.placement
                .ranks()
                .flat_map(|(_, node, gpus)| gpus.iter().map(move |g| (node, g.index)))
        })
        .collect();
    let needed = job.gpus.gpu_count() as usize;
    job.gpu_types[..rank].iter().any(|preferred| {
        capacity.nodes.iter().any(|node| {
            if !job.may_use_node(&node.name) || !job.selects_node(&node.features) {
                return false;
            }
            let preferred_gpus = node
                .gpus
                .iter()
                .filter(|g| g.gpu_type.as_deref() == Some(preferred.as_str()))
                .filter(|g| g.offered() && job.may_use_gpu(&node.name, g.index));
            let (mut free, mut freeing) = (0, 0);
            for gpu in preferred_gpus {
                if ending_soon.contains(&(node.name.as_str(), gpu.index)) {
                    freeing += 1;
                } else if gpu.units == GpuAmount::UNITS_PER_GPU {
                    free += 1;
                }
            }
            // Only GPUs on their way count as a reason to wait: free ones the job did not
            // get (reserved, or not fitting it) would keep it waiting for ever.
            freeing > 0 && free + freeing >= needed
        })
    })
}

/// The GPU type of the first GPU `placed` takes.
fn type_of<'a>(capacity: &'a Capacity, placed: &Placement) -> Option<&'a str> {
    let (_, node, gpus) = placed.ranks().next()?;
    let index = gpus.first()?.index;
    let position = capacity.position_of(node)?;
    capacity
        .nodes
        .get(position)?
        .gpus
        .iter()
        .find(|g| g.index == index)?
        .gpu_type
        .as_deref()
}
