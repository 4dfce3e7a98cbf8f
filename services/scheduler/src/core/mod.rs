//! The scheduling core: a pure function from (nodes, running jobs, queue, policy, clock) to
//! decisions. No NATS, no clock reads, no I/O: unit and property tests drive it directly and
//! the service around it stays a thin adapter.
//!
//! # One pass
//! Queued jobs are taken in order of effective priority (see `mgpu_protocol::priority`), then
//! queue time, then id. For each job:
//! 1. held → waits (`Held`); dependencies not met → waits (`Dependency`), or is rejected when
//!    a dependency can no longer succeed; its array already runs `%N` tasks → `ArrayLimit`;
//! 2. a request no known node could ever satisfy, even idle, is rejected with the reason; one
//!    that would take its owner past their `max_gpus_running` waits (`UserLimit`), booking and
//!    reserving nothing, so other users' jobs behind it go on as if it were not there;
//! 3. it starts if it fits now on GPUs that are offered (node online and not drained, GPU not
//!    paused, not busy with processes mgpu did not start) and not reserved for a job ahead of
//!    it — unless it will end before that reservation begins (backfill);
//! 4. otherwise it waits, and the first `max_reservations` such jobs get a reservation: the
//!    GPUs that free up first according to running jobs' time limits, and when.
//!
//! Running jobs whose time slice (`--on-timeout requeue`) is over are preempted when some
//! other job waits for GPUs: they go back to the end of the queue. A waiting job of a class
//! that may preempt (`[qos.*]`) that cannot start, even by backfill, has the fewest jobs of
//! preemptible classes stopped that let it start (`preemption.rs`).
//!
//! # Placement
//! Whole-GPU jobs take GPUs nobody holds; a share (0.5) takes units of one GPU, preferring the
//! fullest GPU that still fits. Among nodes, `fill_first` packs (fewest free GPUs first) and
//! `spread` spreads (most free first). `--mem` is booked per GPU until the job ends.
//!
//! A job that names GPU types (`--gpu-type h100,a100-80gb`) gets GPUs of one type: the first
//! of its list that fits now, on nodes whose features satisfy its `--constraint`
//! (`queued.rs`). It waits a while for a preferred type only when one is expected free soon
//! (`type_preference.rs`).
//!
//! A multi-node job (`--nodes N`) is placed whole or not at all (gang allocation): N distinct
//! nodes that each fit its per-node request, its `--nodelist` nodes first, preferring nodes
//! that share the value of the topology label (`rack`). It is reserved for like any other job.

mod capacity;
mod estimate;
#[cfg(test)]
mod estimate_tests;
mod fast_hash;
mod idle_reclaim;
#[cfg(test)]
mod idle_reclaim_tests;
mod owner_gpus;
#[cfg(test)]
mod owner_gpus_tests;
mod preemption;
#[cfg(test)]
mod preemption_tests;
mod queued;
mod reservation;
#[cfg(test)]
mod selection_tests;
mod shape;
#[cfg(test)]
mod tests;
pub mod type_preference;
mod victims;
mod waiters;
mod windows;
#[cfg(test)]
mod windows_tests;

use std::borrow::Borrow;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use mgpu_protocol::Timestamp;
use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::{Placement, WaitReason};
use mgpu_protocol::priority::PlacementPolicy;

pub use capacity::impossible_reason;
use capacity::{Capacity, Constraints};
pub use estimate::{Plan, StartEstimate, overlapping};
use fast_hash::FastHash;
use owner_gpus::OwnerGpus;
pub use owner_gpus::{TypeCaps, type_caps_impossible_reason};
pub use queued::{Dependencies, QueuedJob};
use queued::{QueueKey, before_room};
use reservation::{ReleaseTimes, Reservation, ReservedGpus};
use shape::{Shape, Unplaceable};
use waiters::Waiters;
pub use windows::Window;
use windows::{Membership, WindowIndex};

/// One GPU of a node as the core sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuView {
    pub index: u32,
    pub memory_total_mib: u64,
    /// Memory used by processes mgpu did not start.
    pub foreign_mem_mib: u64,
    pub utilization_pct: u32,
    pub paused: bool,
    /// Its type (`h100`), where its agent says.
    pub gpu_type: Option<String>,
}

/// A node that may receive work.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeView {
    pub name: String,
    /// Online nodes get new work; offline ones only count when judging what is possible.
    pub online: bool,
    /// Drained: running jobs finish, nothing new lands here.
    pub drained: bool,
    pub mem_threshold: f64,
    pub load_threshold: f64,
    pub gpus: Vec<GpuView>,
    /// CPU cores jobs may be given here; None: not counted (an agent that does not say).
    pub cpus: Option<u32>,
    /// Host memory in MiB jobs may be given here; None: not counted.
    pub mem_host_mib: Option<u64>,
    /// Operator-given labels (`rack=r1`), for topology preference.
    pub labels: BTreeMap<String, String>,
    /// Operator-given features (`ib`), which jobs' constraints select by.
    pub features: Vec<String>,
}

/// A job holding GPUs now.
#[derive(Clone, Debug, PartialEq)]
pub struct RunningJob {
    pub id: JobId,
    /// The user it runs for.
    pub owner: String,
    pub placement: Placement,
    /// When it will be gone at the latest (start + time limit); None when it has no limit.
    pub expected_end: Option<Timestamp>,
    /// End of its time slice when it runs with `--on-timeout requeue`.
    pub slice_end: Option<Timestamp>,
    pub array_id: Option<JobId>,
    /// When it started (was assigned).
    pub started_at: Timestamp,
    /// Its quality-of-service class (None: `normal`).
    pub qos: Option<String>,
    /// From when it may be stopped for a job of a class that may preempt (its class is
    /// preemptible, and it ran the class's `min_runtime`); None: never.
    pub preemptible_from: Option<Timestamp>,
    /// A stop was asked for already (a preemption, a cancel): its room frees up soon.
    pub stopping: bool,
    /// Its class may preempt: at its slice's end it yields to no job it could preempt back.
    pub may_preempt: bool,
    /// From when the `[idle]` policy may take its action on it (warned, past the grace, and
    /// an action other than only warning); None: never.
    pub reclaimable_from: Option<Timestamp>,
    /// The reservation it runs in; None: none.
    pub reservation: Option<String>,
    /// Its effective priority were it put back in the queue now (its own and its class's
    /// priority, no age, its owner's usage): at its slice's end it yields only to a waiter
    /// ranked at least as high, since one ranked lower would see it start again at once in
    /// the room it just left.
    pub priority_if_requeued: i64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    Start {
        job: JobId,
        placement: Placement,
    },
    Wait {
        job: JobId,
        reason: WaitReason,
    },
    Reject {
        job: JobId,
        reason: String,
    },
    /// Stop a running job and put it back in the queue: its time slice is over (`for_job`
    /// None), or a job of a class that may preempt starts in its room.
    Preempt {
        job: JobId,
        for_job: Option<JobId>,
    },
    /// Take the `[idle]` policy's action on a running job idle past its warning's grace:
    /// `for_job` waits for its GPUs.
    Reclaim {
        job: JobId,
        for_job: JobId,
    },
    /// Stop a preemptible running job and put it back in the queue: reservation `window`
    /// opened on its GPUs.
    Vacate {
        job: JobId,
        window: String,
    },
}

/// Scheduling settings the core needs.
#[derive(Clone, Debug, PartialEq)]
pub struct CoreSettings {
    pub placement: PlacementPolicy,
    pub max_reservations: usize,
    /// Multi-node jobs prefer nodes sharing this label's value (`rack`); None: no preference.
    pub topology_label: Option<String>,
    /// Each capped user's most GPUs running at once, in `GpuAmount` units.
    pub gpu_caps: Arc<HashMap<String, u64>>,
    /// Each capped user's caps on running GPUs per type, in units.
    pub gpu_type_caps: Arc<TypeCaps>,
    /// Each class's cap on the GPUs one user's running jobs of it hold, in units.
    pub class_caps: Arc<HashMap<String, u64>>,
    /// Waiting jobs past the first `max_reservations` that still get an expected start: a
    /// reservation that only later estimates respect, never placement (`estimate.rs`).
    pub max_start_estimates: usize,
    /// Reservations' windows not over yet (`windows.rs`).
    pub windows: Arc<Vec<Window>>,
    /// Within this long before a window, jobs without a time limit keep off its GPUs.
    pub reservation_horizon: chrono::Duration,
}

/// The order jobs are considered in: effective priority, then queue time, then id (what
/// [`plan`] sorts by, with the keys copied out).
pub fn queue_order(a: &QueuedJob, b: &QueuedJob) -> std::cmp::Ordering {
    b.effective_priority
        .cmp(&a.effective_priority)
        .then(a.queued_at.cmp(&b.queued_at))
        .then(a.id.cmp(&b.id))
}

/// One scheduling pass: one decision per queued job (in queue order), plus preemptions.
pub fn plan<Q: Borrow<QueuedJob>, R: Borrow<RunningJob>>(
    nodes: &[NodeView],
    running: &[R],
    queue: &[Q],
    settings: &CoreSettings,
    now: Timestamp,
) -> Vec<Decision> {
    planned(nodes, running, queue, settings, now).decisions
}

/// [`plan`], also returning when the waiting jobs it could reserve or estimate for are
/// expected to start, and on which GPUs.
pub fn plan_with_estimates<Q: Borrow<QueuedJob>, R: Borrow<RunningJob>>(
    nodes: &[NodeView],
    running: &[R],
    queue: &[Q],
    settings: &CoreSettings,
    now: Timestamp,
) -> Plan {
    let planned = planned(nodes, running, queue, settings, now);
    let estimates = (planned.reservations.into_iter().map(|r| (r, true)))
        .chain(planned.estimates.into_iter().map(|r| (r, false)))
        .map(|(reservation, reserved)| StartEstimate::of(reservation, reserved))
        .collect();
    Plan {
        decisions: planned.decisions,
        estimates,
    }
}

/// [`plan`], also returning the backfill reservations it made (for tests and diagnostics).
#[cfg(test)]
fn plan_with_reservations<Q: Borrow<QueuedJob>, R: Borrow<RunningJob>>(
    nodes: &[NodeView],
    running: &[R],
    queue: &[Q],
    settings: &CoreSettings,
    now: Timestamp,
) -> (Vec<Decision>, Vec<Reservation>) {
    let planned = planned(nodes, running, queue, settings, now);
    (planned.decisions, planned.reservations)
}

/// What one pass produced: its decisions, the backfill reservations it made, and the
/// reservations made only to estimate later jobs' starts.
struct Planned {
    decisions: Vec<Decision>,
    reservations: Vec<Reservation>,
    estimates: Vec<Reservation>,
}

fn planned<Q: Borrow<QueuedJob>, R: Borrow<RunningJob>>(
    nodes: &[NodeView],
    running: &[R],
    queue: &[Q],
    settings: &CoreSettings,
    now: Timestamp,
) -> Planned {
    // Sorted by keys copied next to each other, as plain integers: comparing through 100 000
    // pointers to jobs scattered in memory costs a cache miss per comparison.
    let mut keyed: Vec<(QueueKey, &QueuedJob)> = queue
        .iter()
        .map(|q| {
            let q: &QueuedJob = q.borrow();
            (QueueKey::of(q), q)
        })
        .collect();
    keyed.sort_unstable_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.id.cmp(&b.1.id)));
    let ordered: Vec<&QueuedJob> = keyed.into_iter().map(|(_, q)| q).collect();
    let running: Vec<&RunningJob> = running.iter().map(Borrow::borrow).collect();
    let mut capacity = Capacity::new(nodes, &running);
    let windows = WindowIndex::new(
        &settings.windows,
        &capacity,
        settings.reservation_horizon,
        now,
    );
    // Jobs started in this pass: with the running ones, what holds GPUs, and until when.
    let mut started: Vec<RunningJob> = Vec::new();
    let mut reservations: Vec<Reservation> = Vec::new();
    let mut reserved = ReservedGpus::default();
    // Waiting jobs without a reservation, in queue order, to be dated once the pass is over
    // (at most `max_start_estimates`).
    let mut to_date: Vec<&QueuedJob> = Vec::new();
    // Built when the first reservation is sought (most passes seek none).
    let mut releases: Option<ReleaseTimes> = None;
    let mut array_running: HashMap<JobId, u32> = HashMap::new();
    for job in &running {
        if let Some(array) = &job.array_id {
            *array_running.entry(array.clone()).or_default() += 1;
        }
    }
    // A task requeued from a silent node may still run there until the node's fence: it
    // counts against its array's `%N` until then, as if it ran.
    for job in &ordered {
        if let Some((array, Some(_))) = &job.array
            && job.not_before.is_some_and(|t| t > now)
        {
            *array_running.entry(array.clone()).or_default() += 1;
        }
    }
    let any_online = nodes.iter().any(|n| n.online);
    let mut owner_gpus = OwnerGpus::new(
        &settings.gpu_caps,
        &settings.gpu_type_caps,
        &settings.class_caps,
        &running,
        nodes,
    );
    // One waiting job of each shape that found no room, with how many reservations jobs ahead
    // of it held then: what a job past its time slice would have to make room for.
    let mut waiting_for_room: Vec<(&QueuedJob, usize)> = Vec::new();
    // Not sized for the queue: most jobs wait for the reason already recorded and yield no
    // decision, and 100 000 empty slots are 15 MB of fresh pages to fault in every pass.
    let mut decisions = Vec::new();
    // What is already known about jobs of the same shape in this pass (see [`Shape`]).
    let mut impossible: HashMap<Shape<'_>, Option<String>, FastHash> = HashMap::default();
    let mut unplaceable: HashMap<Shape<'_>, Unplaceable, FastHash> = HashMap::default();

    for job in ordered {
        let typed = owner_gpus.has_type_caps(&job.owner);
        let shape = Shape::of(job, typed, !windows.is_empty());
        // Waiting for the reason already recorded is no news: no decision, so a pass over a
        // long queue that changes nothing hands back almost nothing.
        let wait = |reason| {
            (job.recorded_reason != Some(reason)).then(|| Decision::Wait {
                job: job.id.clone(),
                reason,
            })
        };
        match before_room(job, &array_running, now) {
            Some(Err(reason)) => {
                decisions.push(Decision::Reject {
                    job: job.id.clone(),
                    reason,
                });
                continue;
            }
            Some(Ok(reason)) => {
                decisions.extend(wait(reason));
                continue;
            }
            None => {}
        }
        let never = impossible.entry(shape.clone()).or_insert_with(|| {
            impossible_reason(nodes, job).or_else(|| {
                owner_gpus::type_caps_impossible_reason(nodes, job, &settings.gpu_type_caps)
            })
        });
        if let Some(reason) = never {
            decisions.push(Decision::Reject {
                job: job.id.clone(),
                reason: reason.clone(),
            });
            continue;
        }
        match windows.membership(job) {
            Membership::Refused(reason) => {
                decisions.push(Decision::Reject {
                    job: job.id.clone(),
                    reason,
                });
                continue;
            }
            Membership::NotYet(_) => {
                // Dated with the others once the pass decided: from the window's start.
                if to_date.len() < settings.max_start_estimates {
                    to_date.push(job);
                }
                decisions.extend(wait(WaitReason::ReservationWindow));
                continue;
            }
            Membership::None | Membership::Member(_) => {}
        }
        if !any_online {
            decisions.extend(wait(WaitReason::NoNodes));
            continue;
        }
        // Past the total cap, or past the cap of every type it takes: it waits, booking and
        // reserving nothing.
        let types_capped = !job.gpu_types.is_empty()
            && !job.gpus.is_zero()
            && job
                .gpu_types
                .iter()
                .all(|t| !owner_gpus.allows_type(job, Some(t)));
        if !owner_gpus.allows(job) || types_capped {
            decisions.extend(wait(WaitReason::UserLimit));
            continue;
        }
        let ends_at = job
            .time_limit
            .and_then(|limit| chrono::Duration::from_std(limit).ok())
            .map(|limit| now + limit);
        let guest = windows.guest(job);
        let avoid_reserved = |position: usize, index: u32| {
            reserved.blocks(position, index, ends_at) || windows.blocks_now(&guest, position, index)
        };
        let nothing_reserved =
            |position: usize, index: u32| windows.blocks_now(&guest, position, index);
        let nothing_at_all = |_: usize, _: u32| false;
        let type_allowed = |gpu_type: Option<&str>| owner_gpus.allows_type(job, gpu_type);
        let any_type = |_: Option<&str>| true;
        let fits_within = |in_service_only,
                           unbusy_only,
                           avoid: &dyn Fn(usize, u32) -> bool,
                           type_allowed: &dyn Fn(Option<&str>) -> bool| {
            let constraints = Constraints {
                in_service_only,
                unbusy_only,
                avoid,
                type_allowed,
            };
            capacity.place(job, &constraints, settings)
        };
        let fits = |in_service_only, unbusy_only, avoid: &dyn Fn(usize, u32) -> bool| {
            fits_within(in_service_only, unbusy_only, avoid, &type_allowed)
        };
        // Free capacity only shrinks during a pass and reservations only accumulate, so a
        // shape that did not fit still does not: jobs of it wait without another search,
        // for the reason found then unless something was booked since. This keeps a pass
        // over a long queue of alike jobs linear in the queue, not queue x GPUs.
        let known = unplaceable.get(&shape).map(|seen| {
            let nothing_booked_since = seen.bookings == capacity.bookings;
            // A reservation that could not be made cannot be made now either, unless a
            // booking or another reservation changed what is free when.
            let reserving_is_futile =
                nothing_booked_since && seen.reserve_failed_at == Some(reservations.len());
            (nothing_booked_since, seen.reason, reserving_is_futile)
        });
        let reservations_left = reservations.len() < settings.max_reservations;
        let estimates_left = to_date.len() < settings.max_start_estimates;
        if let Some((true, reason, futile)) = known
            && (!reservations_left || futile)
        {
            if estimates_left {
                to_date.push(job);
            }
            decisions.extend(wait(reason));
            continue;
        }
        let placed = match known {
            Some(_) => None,
            None => fits(true, true, &avoid_reserved),
        };
        // Room now, but on a type it likes less than one on its way: it waits for that one,
        // booking and reserving nothing (what it would take stays free for others).
        if let Some(placement) = &placed
            && type_preference::worth_waiting(&capacity, &running, job, placement, now)
        {
            decisions.extend(wait(WaitReason::PreferredType));
            continue;
        }
        if let Some(placement) = placed {
            capacity.book(&placement);
            owner_gpus.book(&job.owner, &job.qos, &placement);
            if let Some(releases) = &mut releases {
                releases.add(&capacity, &placement, ends_at);
            }
            if let Some((array, _)) = &job.array {
                *array_running.entry(array.clone()).or_default() += 1;
            }
            started.push(RunningJob {
                id: job.id.clone(),
                owner: job.owner.clone(),
                placement: placement.clone(),
                expected_end: ends_at,
                slice_end: None,
                array_id: None,
                started_at: now,
                qos: job.qos.clone(),
                preemptible_from: None,
                stopping: false,
                may_preempt: job.may_preempt,
                reclaimable_from: None,
                reservation: job.reservation.clone(),
                priority_if_requeued: job.effective_priority,
            });
            decisions.push(Decision::Start {
                job: job.id.clone(),
                placement,
            });
            continue;
        }
        waiting_for_room.push((job, reservations.len()));
        // Why it waits: the first constraint whose removal would let it start.
        let reason = if let Some((true, reason, _)) = known {
            reason
        } else if fits(true, true, &nothing_reserved).is_some() {
            WaitReason::Priority
        } else if !windows.is_empty()
            && job.reservation.is_none()
            && fits(true, true, &nothing_at_all).is_some()
        {
            WaitReason::Reserved
        } else if owner_gpus.has_type_caps(&job.owner)
            && fits_within(true, true, &nothing_reserved, &any_type).is_some()
        {
            // Only GPUs of types its owner is capped on would take it.
            WaitReason::UserLimit
        } else if fits(false, true, &nothing_reserved).is_some() {
            WaitReason::GpusPaused
        } else if fits(true, false, &nothing_reserved).is_some() {
            WaitReason::GpusBusy
        } else {
            WaitReason::Resources
        };
        let mut reserve_failed_at = None;
        if reservations_left {
            let releases = releases.get_or_insert_with(|| {
                let holding = running.iter().copied().chain(&started);
                ReleaseTimes::new(&capacity, holding, now)
            });
            let among = reservation::Among {
                reserved: &reserved,
                type_allowed: &type_allowed,
                windows: &windows,
                guest,
            };
            match reservation::reserve(&capacity, nodes, releases, job, &among, now) {
                Some(reservation) => {
                    reserved.add(&capacity, &reservation);
                    reservations.push(reservation);
                }
                None => reserve_failed_at = Some(reservations.len()),
            }
        }
        if (reserve_failed_at.is_some() || !reservations_left) && estimates_left {
            to_date.push(job);
        }
        unplaceable.insert(
            shape,
            Unplaceable {
                bookings: capacity.bookings,
                reason,
                reserve_failed_at,
            },
        );
        decisions.extend(wait(reason));
    }

    let waiting = Waiters {
        jobs: &waiting_for_room,
        reservations: &reservations,
        owner_gpus: &owner_gpus,
        windows: &windows,
    };
    let slices = preemption::slices_over(&capacity, &running, &waiting, settings, now);
    let by_class = preemption::by_class(&capacity, &running, &waiting, settings, now, &slices);
    decisions.extend(slices);
    decisions.extend(by_class);
    let reclaims = idle_reclaim::reclaim(&capacity, &running, &waiting, settings, now, &decisions);
    decisions.extend(reclaims);
    let vacate = windows.to_vacate(&capacity, &running, &decisions);
    decisions.extend(vacate);
    let estimates = match to_date.is_empty() {
        true => Vec::new(),
        false => {
            let releases = releases.unwrap_or_else(|| {
                let holding = running.iter().copied().chain(&started);
                ReleaseTimes::new(&capacity, holding, now)
            });
            let mut timeline = estimate::Timeline::after(&capacity, &releases, &reservations);
            let dates = estimate::Dates {
                capacity: &capacity,
                nodes,
                owner_gpus: &owner_gpus,
                windows: &windows,
                now,
            };
            timeline.date(&to_date, &dates)
        }
    };
    Planned {
        decisions,
        reservations,
        estimates,
    }
}
