//! Reservations in the simulation: users book windows (a few seconds ahead, for a few
//! seconds, on some GPUs, sometimes naming the other user), cancel them, and submit jobs into
//! them; the store keeps them as the cluster bucket would. The invariants, checked as it
//! happens:
//! - no two reservations holding GPUs hold one GPU at overlapping times;
//! - a job in a reservation starts only inside its open window, only on its GPUs, and with a
//!   time limit that ends before it closes;
//! - any other job starts on a booked GPU only before its window opens, and only when it is
//!   gone by then (its time limit), preemptible, or without a limit further than the horizon;
//! - a reservation released as unused has no job of it running.

use std::sync::Arc;

use mgpu_protocol::gpu_amount::GpuAmount;
use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::{JobRecord, JobState, OnTimeout};
use mgpu_protocol::request::Request;
use mgpu_protocol::reservation::{
    BookingAsk, Reservation, ReservationRequest, ReservationVerdict, Standing,
};

use super::world::World;
use crate::machine::messages::{Input, OpId};

/// Names reservations are booked under (a few, so that bookings collide by name too).
const NAMES: [&str; 3] = ["paper", "demo", "sweep"];

/// A user books a window or cancels one.
pub fn book_or_cancel(world: &mut World) {
    let user = world.rng.below(2) as usize;
    let identity = world.users[user].clone();
    let name = NAMES[world.rng.below(NAMES.len() as u64) as usize].to_owned();
    let request = if world.rng.chance(250) {
        ReservationRequest::Cancel { name }
    } else {
        let most = world
            .agents
            .iter()
            .map(|a| a.gpus)
            .max()
            .unwrap_or(1)
            .max(1);
        let users = match world.rng.chance(500) {
            true => vec![world.users[1 - user].name.clone()],
            false => Vec::new(),
        };
        ReservationRequest::Book(BookingAsk {
            name,
            gpus: world.rng.between(1, u64::from(most)) as u32,
            gpu_type: None,
            nodes: None,
            nodelist: Vec::new(),
            start: world.wall() + chrono::Duration::seconds(world.rng.between(0, 40) as i64),
            duration_secs: world.rng.between(10, 60),
            users,
            group: None,
        })
    };
    world.note(
        format!("{} asks {request:?}", identity.name)
            .chars()
            .take(140)
            .collect(),
    );
    world.publish_request(identity, Request::Reserve(request));
}

/// A job into a reservation and who submits it: mostly one held now, by its owner; else any
/// name, by either user (refused at submission when it is not theirs, or not held).
pub fn member_job(world: &mut World) -> (usize, mgpu_protocol::job::JobSpec) {
    let now = world.wall();
    let held: Vec<(String, String)> = (world.store.reservations.values())
        .filter(|r| r.holds_at(now))
        .map(|r| (r.name.clone(), r.owner.clone()))
        .collect();
    let (name, user) = match world.rng.pick(&held).cloned() {
        Some((name, owner)) if world.rng.chance(800) => {
            let user = world
                .users
                .iter()
                .position(|u| u.name == owner)
                .unwrap_or(0);
            (name, user)
        }
        _ => (
            NAMES[world.rng.below(NAMES.len() as u64) as usize].to_owned(),
            world.rng.below(2) as usize,
        ),
    };
    let mut spec = mgpu_protocol::job::JobSpec::new(vec!["train".into()], "/tmp");
    spec.gpus = GpuAmount::whole(1);
    spec.on_timeout = OnTimeout::Fail;
    spec.time_limit_secs = Some(world.rng.between(2, 12));
    spec.reservation = Some(name);
    (user, spec)
}

impl World {
    /// The store takes a reservation (it always does: a failed write is the machine's
    /// business, tested with the driver); a booking is checked against those held.
    pub(super) fn reservation_stored(
        &mut self,
        op: Option<OpId>,
        reservation: Arc<Reservation>,
    ) -> Option<Input> {
        let now = self.wall();
        if reservation.holds_at(now) {
            let clash = self.store.reservations.values().find(|other| {
                other.name != reservation.name
                    && other.holds_at(now)
                    && other.start < reservation.end
                    && reservation.start < other.end
                    && other.gpus.iter().any(|g| reservation.gpus.contains(g))
            });
            if let Some(other) = clash {
                self.ledger.broken.push(format!(
                    "reservations {} and {} hold a GPU at once",
                    reservation.name, other.name
                ));
            }
        }
        if matches!(reservation.standing, Standing::Released { .. }) {
            let running = self.store.records.values().find(|t| {
                matches!(t.record.state, JobState::Running(_))
                    && t.record.spec.reservation.as_ref() == Some(&reservation.name)
            });
            if let Some(job) = running {
                self.ledger.broken.push(format!(
                    "reservation {} released as unused while {} runs in it",
                    reservation.name,
                    job.record.id.short()
                ));
            }
        }
        let reservation = Arc::unwrap_or_clone(reservation);
        self.store
            .reservations
            .insert(reservation.name.clone(), reservation);
        op.map(|op| Input::ReservationStored { op, stored: true })
    }

    /// A booking's or cancel's answer.
    pub(super) fn reservation_answered(&mut self, verdict: &ReservationVerdict) {
        match verdict.accepted {
            true => self.ledger.bookings += 1,
            false => self.ledger.bookings_refused += 1,
        }
    }

    /// What starting attempt `attempt` of `job` breaks among the windows, checked once per
    /// attempt, when its first assignment goes out, at the time the pass decided it.
    pub(super) fn check_start_in_windows(&mut self, job: &JobId) {
        let Some(record) = self.store.records.get(job).map(|t| &t.record) else {
            return;
        };
        let JobState::Running(run) = &record.state else {
            return;
        };
        if !self
            .ledger
            .window_checked
            .insert((job.clone(), record.attempt))
        {
            return;
        }
        if record.spec.reservation.is_some() {
            self.ledger.member_starts += 1;
        }
        let broken = start_breaks(record, &run.placement, run.assigned_at, self);
        self.ledger.broken.extend(broken);
    }
}

/// What a start at `at` of `record`'s job on `placement` breaks, judged by the reservations
/// booked by then and not cancelled or released before.
fn start_breaks(
    record: &JobRecord,
    placement: &mgpu_protocol::job::Placement,
    at: mgpu_protocol::Timestamp,
    world: &World,
) -> Option<String> {
    let short = record.id.short();
    let limit = crate::time_limits::time_limit(&world.policy, &record.spec)
        .and_then(|l| chrono::Duration::from_std(l).ok());
    let class = world.policy.qos.of_job(record.spec.qos.as_deref());
    let least = chrono::Duration::seconds(class.min_runtime_secs as i64);
    let preemptible = class.preemptible && !record.spec.no_requeue;
    let horizon = chrono::Duration::seconds(world.policy.reservations.horizon_secs as i64);
    let in_force = |r: &&Reservation| {
        r.booked_at <= at
            && at < r.end
            && match &r.standing {
                Standing::Booked => true,
                Standing::Cancelled { at: gone, .. } | Standing::Released { at: gone, .. } => {
                    *gone > at
                }
            }
    };
    let gpus: Vec<(&str, u32)> = placement
        .ranks()
        .flat_map(|(_, node, shares)| shares.iter().map(move |s| (node, s.index)))
        .collect();
    if let Some(name) = &record.spec.reservation {
        let window = world.store.reservations.get(name).filter(|r| in_force(r));
        let Some(window) = window else {
            return Some(format!(
                "{short} started in reservation {name}, not in force"
            ));
        };
        if at < window.start || limit.is_none_or(|l| at + l > window.end) {
            return Some(format!(
                "{short} started outside reservation {name}'s window"
            ));
        }
        if let Some((node, index)) = gpus.iter().find(|(n, i)| !window.has_gpu(n, *i)) {
            return Some(format!(
                "{short} of reservation {name} started on {node}:{index}, not one of its GPUs"
            ));
        }
        return None;
    }
    for window in world.store.reservations.values().filter(in_force) {
        let Some((node, index)) = gpus.iter().find(|(n, i)| window.has_gpu(n, *i)) else {
            continue;
        };
        let gone_before = match limit {
            _ if preemptible && at + least <= window.start => true,
            Some(limit) => at + limit <= window.start,
            None => window.start > at + horizon,
        };
        if at >= window.start || !gone_before {
            return Some(format!(
                "{short} started on {node}:{index}, booked by reservation {} from {}",
                window.name, window.start
            ));
        }
    }
    None
}
