//! Reservations' windows as a pass sees them: which GPUs a job may take now, from when a GPU
//! can take it later (for backfill reservations and expected starts), and which running
//! jobs must leave a window that opened.
//!
//! Inside a window its GPUs take only its members' jobs (`--reservation NAME`), and those
//! only there. Before it opens, another job may start on them when it surely ends before
//! (its time limit), when it is preemptible (it is preempted when the window opens), or when
//! it has no time limit and the window is further away than the `horizon`.

use std::collections::HashMap;

use mgpu_protocol::Timestamp;
use mgpu_protocol::ids::JobId;

use super::capacity::Capacity;
use super::{Decision, FastHash, QueuedJob, RunningJob};

/// A reservation's window: its GPUs, from `start` to `end`.
#[derive(Clone, Debug, PartialEq)]
pub struct Window {
    pub name: String,
    /// (node, GPU index) of every GPU it holds.
    pub gpus: Vec<(String, u32)>,
    pub start: Timestamp,
    pub end: Timestamp,
}

/// What a job is to the windows: the one it runs in, how long it may run, whether it may be
/// stopped when a window opens.
#[derive(Clone, Copy)]
pub(super) struct Guest {
    /// Where its window is in [`WindowIndex`]'s list; None: it runs in none.
    member_of: Option<usize>,
    limit: Option<chrono::Duration>,
    /// Preemptible, and how long it runs at least before it may be stopped.
    preemptible: Option<chrono::Duration>,
}

/// The windows not over yet, by GPU.
pub(super) struct WindowIndex<'a> {
    windows: Vec<&'a Window>,
    /// (position in [`Capacity::nodes`], GPU index) → the windows on it, earliest first.
    on_gpu: HashMap<(usize, u32), Vec<usize>, FastHash>,
    horizon: chrono::Duration,
    now: Timestamp,
}

/// Where a job stands with the reservation it names.
pub(super) enum Membership {
    /// It runs in no reservation.
    None,
    Member(usize),
    /// Its reservation is over, cancelled or unknown, or it would outlast the window.
    Refused(String),
    /// Its window (at this place in the list) has not opened.
    NotYet(usize),
}

impl<'a> WindowIndex<'a> {
    pub fn new(
        windows: &'a [Window],
        capacity: &Capacity,
        horizon: chrono::Duration,
        now: Timestamp,
    ) -> Self {
        let windows: Vec<&Window> = windows.iter().filter(|w| w.end > now).collect();
        let mut on_gpu: HashMap<(usize, u32), Vec<usize>, FastHash> = HashMap::default();
        for (n, window) in windows.iter().enumerate() {
            for (node, index) in &window.gpus {
                if let Some(position) = capacity.position_of(node) {
                    on_gpu.entry((position, *index)).or_default().push(n);
                }
            }
        }
        for list in on_gpu.values_mut() {
            list.sort_by_key(|n| windows[*n].start);
        }
        WindowIndex {
            windows,
            on_gpu,
            horizon,
            now,
        }
    }

    /// No window to mind: the pass goes as if reservations did not exist.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.windows.is_empty()
    }

    /// Where `job` stands with its reservation, if it names one.
    pub fn membership(&self, job: &QueuedJob) -> Membership {
        let Some(name) = &job.reservation else {
            return Membership::None;
        };
        let Some(n) = self.windows.iter().position(|w| &w.name == name) else {
            return Membership::Refused(format!(
                "reservation {name} is over, cancelled or released"
            ));
        };
        let window = self.windows[n];
        let limit = job
            .time_limit
            .and_then(|l| chrono::Duration::from_std(l).ok());
        let earliest = self.now.max(window.start);
        if limit.is_none_or(|limit| earliest + limit > window.end) {
            return Membership::Refused(format!(
                "its time limit would outlast reservation {name}, which closes at {}",
                window.end.format("%Y-%m-%d %H:%M UTC")
            ));
        }
        if window.start > self.now {
            return Membership::NotYet(n);
        }
        Membership::Member(n)
    }

    /// How `job` stands to the windows.
    #[inline]
    pub fn guest(&self, job: &QueuedJob) -> Guest {
        if self.windows.is_empty() {
            // Nothing to stand to: no conversion per job of a long queue.
            return Guest {
                member_of: None,
                limit: None,
                preemptible: None,
            };
        }
        let member_of = match self.membership(job) {
            Membership::Member(n) | Membership::NotYet(n) => Some(n),
            Membership::None | Membership::Refused(_) => None,
        };
        Guest {
            member_of,
            limit: job
                .time_limit
                .and_then(|l| chrono::Duration::from_std(l).ok()),
            preemptible: job
                .stoppable_after
                .map(|least| chrono::Duration::from_std(least).unwrap_or(chrono::TimeDelta::MAX)),
        }
    }

    /// Whether a job started at `at` is surely off a GPU before `window` opens, or may be
    /// stopped then (it ran its class's minimum by then).
    fn gone_before(&self, guest: &Guest, at: Timestamp, window: &Window) -> bool {
        let stoppable = guest.preemptible.is_some_and(|least| {
            at.checked_add_signed(least)
                .is_some_and(|t| t <= window.start)
        });
        stoppable
            || match guest.limit {
                Some(limit) => at + limit <= window.start,
                None => window.start > at + self.horizon,
            }
    }

    /// Whether `guest` must keep off GPU `index` of the node at `position` if it started now.
    #[inline]
    pub fn blocks_now(&self, guest: &Guest, position: usize, index: u32) -> bool {
        if self.windows.is_empty() {
            return false;
        }
        let on = self.on_gpu.get(&(position, index));
        if let Some(member_of) = guest.member_of {
            return !on.is_some_and(|list| list.contains(&member_of));
        }
        on.is_some_and(|list| {
            list.iter().any(|n| {
                let window = self.windows[*n];
                window.start <= self.now || !self.gone_before(guest, self.now, window)
            })
        })
    }

    /// From when the GPU, free from `release` on (None: not before a job without a time
    /// limit ends), could take `guest`: outside other windows, before one only if it is gone
    /// when that opens; a member only inside its own. None: never.
    #[inline]
    pub fn usable_from(
        &self,
        guest: &Guest,
        position: usize,
        index: u32,
        release: Option<Timestamp>,
    ) -> Option<Option<Timestamp>> {
        let on = self.on_gpu.get(&(position, index));
        if let Some(member_of) = guest.member_of {
            if !on.is_some_and(|list| list.contains(&member_of)) {
                return None;
            }
            let window = self.windows[member_of];
            let Some(release) = release else {
                return Some(None);
            };
            let at = release.max(window.start);
            let fits = guest.limit.is_some_and(|limit| at + limit <= window.end);
            return fits.then_some(Some(at));
        }
        let (Some(list), Some(mut at)) = (on, release) else {
            return Some(release);
        };
        for window in list.iter().map(|n| self.windows[*n]) {
            if window.end <= at {
                continue;
            }
            if window.start > at && self.gone_before(guest, at, window) {
                break;
            }
            at = window.end;
        }
        Some(Some(at))
    }

    /// The running jobs to stop because a window opened on their GPUs: preemptible jobs not
    /// of it, not already stopping (nor by one of the pass's `decided` stops), that ran their
    /// class's minimum.
    pub fn to_vacate(
        &self,
        capacity: &Capacity,
        running: &[&RunningJob],
        decided: &[Decision],
    ) -> Vec<Decision> {
        if self.windows.is_empty() {
            return Vec::new();
        }
        let stopped: std::collections::HashSet<&JobId> = (decided.iter())
            .filter_map(|d| match d {
                Decision::Preempt { job, .. } | Decision::Reclaim { job, .. } => Some(job),
                _ => None,
            })
            .collect();
        let mut stops: Vec<(JobId, String)> = Vec::new();
        for job in running {
            let unstoppable = job.preemptible_from.is_none_or(|from| from > self.now);
            if job.stopping || unstoppable || stopped.contains(&job.id) {
                continue;
            }
            let opened = job.placement.ranks().find_map(|(_, node, shares)| {
                let position = capacity.position_of(node)?;
                shares.iter().find_map(|share| {
                    self.on_gpu
                        .get(&(position, share.index))?
                        .iter()
                        .map(|n| self.windows[*n])
                        .find(|w| w.start <= self.now && job.reservation.as_ref() != Some(&w.name))
                })
            });
            if let Some(window) = opened {
                stops.push((job.id.clone(), window.name.clone()));
            }
        }
        stops
            .into_iter()
            .map(|(job, window)| Decision::Vacate { job, window })
            .collect()
    }
}
