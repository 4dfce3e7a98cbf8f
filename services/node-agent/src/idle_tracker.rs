//! How idle each running job's GPUs are: the current idle stretch of an attempt and the
//! GPU-time it spent idle, updated from each GPU sample. Pure: a state and a sample in, the
//! next state out; the running table (`running.rs`) keeps one state per attempt, the
//! heartbeat feeds it its samples, and the job's usage report takes its total when it ends.
//!
//! An attempt is idle at a sample when every GPU it holds is below its assignment's threshold
//! (`Assignment::idle_below_pct`) and its memory on them has not grown by more than
//! [`IDLE_MEMORY_GROWTH_MIB`] over the stretch. Its memory is what its own processes hold
//! (attributed as for peak memory, `gpu_peaks.rs`); on a GPU whose processes cannot be listed,
//! the GPU's whole used memory stands in.
//!
//! Samples come at the heartbeat interval, so idleness is measured at that resolution: an
//! interval counts as idle when the sample ending it is idle, and a stretch starts at the first
//! idle sample.

use std::collections::BTreeMap;
use std::time::Instant;

use mgpu_protocol::assign::Assignment;
use mgpu_protocol::gpu_amount::GpuAmount;
use mgpu_protocol::idle::{IDLE_MEMORY_GROWTH_MIB, IdleSample};
use mgpu_protocol::node::GpuStatus;

/// What an attempt's idleness is measured against, from its assignment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Watched {
    /// A GPU below this utilisation (percent) is idle.
    pub below_pct: u32,
    /// Each GPU it holds on this node: its index, and its share in [`GpuAmount`] units.
    pub gpus: Vec<(u32, u32)>,
}

impl Watched {
    /// What to watch for the assignment's rank on `node`; None when the scheduler asked for no
    /// measurement or the rank holds no GPU here.
    pub fn of(assignment: &Assignment, node: &str) -> Option<Watched> {
        let below_pct = assignment.idle_below_pct?;
        let (_, _, shares) = assignment
            .placement
            .ranks()
            .find(|(rank, on, _)| *rank == assignment.rank && *on == node)?;
        let gpus: Vec<(u32, u32)> = shares
            .iter()
            .map(|share| (share.index, share.amount.units()))
            .collect();
        (!gpus.is_empty()).then_some(Watched { below_pct, gpus })
    }

    /// The GPUs held, in [`GpuAmount`] units (a half share counts half).
    fn units(&self) -> u128 {
        self.gpus.iter().map(|(_, units)| u128::from(*units)).sum()
    }
}

/// What one GPU sample shows of one attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reading {
    pub at: Instant,
    /// Whether every GPU it holds is below the threshold (one missing from the sample is not:
    /// what cannot be seen is not called idle).
    pub quiet: bool,
    /// Its memory on its GPUs, in MiB.
    pub memory_mib: u64,
}

impl Reading {
    /// The attempt's reading in a sample taken `at`: `gpus` as sampled, `own_mib` its
    /// processes' memory per GPU, `listed_gpus` the GPUs whose processes could be listed.
    pub fn of(
        watched: &Watched,
        at: Instant,
        gpus: &[GpuStatus],
        own_mib: Option<&BTreeMap<u32, u64>>,
        listed_gpus: &[u32],
    ) -> Reading {
        let gpu = |index: u32| gpus.iter().find(|gpu| gpu.index == index);
        let quiet = watched.gpus.iter().all(|(index, _)| {
            gpu(*index).is_some_and(|gpu| gpu.utilization_pct < watched.below_pct)
        });
        let memory_mib = watched
            .gpus
            .iter()
            .map(|(index, _)| {
                if listed_gpus.contains(index) {
                    own_mib.and_then(|own| own.get(index)).copied().unwrap_or(0)
                } else {
                    gpu(*index).map_or(0, |gpu| gpu.memory_used_mib)
                }
            })
            .fold(0u64, u64::saturating_add);
        Reading {
            at,
            quiet,
            memory_mib,
        }
    }
}

/// The idle stretch under way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stretch {
    /// The first idle sample of the stretch.
    since: Instant,
    /// The least memory the attempt held during it: memory freed and loaded again is work
    /// too, so growth is measured from the lowest point rather than from the start.
    lowest_mib: u64,
}

/// One attempt's idleness so far.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IdleState {
    watched: Watched,
    /// The latest sample seen (None before the first).
    last: Option<Instant>,
    stretch: Option<Stretch>,
    /// Idle time so far, in nanoseconds × GPU units: exact, so that short heartbeat intervals
    /// do not round away and a whole GPU's total is never below its stretch.
    idle_unit_ns: u128,
}

impl IdleState {
    pub fn new(watched: Watched) -> Self {
        IdleState {
            watched,
            last: None,
            stretch: None,
            idle_unit_ns: 0,
        }
    }

    /// The state after a sample taken `at`, as `Reading::of` reads it.
    pub fn observe(
        &self,
        at: Instant,
        gpus: &[GpuStatus],
        own_mib: Option<&BTreeMap<u32, u64>>,
        listed_gpus: &[u32],
    ) -> IdleState {
        self.next(Reading::of(&self.watched, at, gpus, own_mib, listed_gpus))
    }

    /// The state after `reading`. A reading older than the last one (samples overtaking each
    /// other) counts as taken at the last one: time never runs backwards here.
    pub fn next(&self, reading: Reading) -> IdleState {
        let at = self.last.map_or(reading.at, |last| last.max(reading.at));
        let elapsed_ns = self.last.map_or(0, |last| (at - last).as_nanos());
        let within_allowance = self.stretch.is_none_or(|stretch| {
            reading.memory_mib <= stretch.lowest_mib.saturating_add(IDLE_MEMORY_GROWTH_MIB)
        });
        let idle = reading.quiet && within_allowance;
        let stretch = idle.then(|| match self.stretch {
            Some(stretch) => Stretch {
                since: stretch.since,
                lowest_mib: stretch.lowest_mib.min(reading.memory_mib),
            },
            None => Stretch {
                since: at,
                lowest_mib: reading.memory_mib,
            },
        });
        let idle_unit_ns = if idle {
            let added = elapsed_ns.saturating_mul(self.watched.units());
            self.idle_unit_ns.saturating_add(added)
        } else {
            self.idle_unit_ns
        };
        IdleState {
            watched: self.watched.clone(),
            last: Some(at),
            stretch,
            idle_unit_ns,
        }
    }

    /// What the heartbeat reports: the stretch as of the latest sample, and the total.
    pub fn sample(&self) -> IdleSample {
        let idle_for_secs = match (self.stretch, self.last) {
            (Some(stretch), Some(last)) => last.saturating_duration_since(stretch.since).as_secs(),
            _ => 0,
        };
        IdleSample {
            idle_for_secs,
            idle_gpu_secs: self.idle_gpu_secs(),
        }
    }

    /// GPU-seconds idle so far (a whole GPU for a second is 1).
    pub fn idle_gpu_secs(&self) -> u64 {
        let per_gpu_sec = 1_000_000_000 * u128::from(GpuAmount::UNITS_PER_GPU);
        u64::try_from(self.idle_unit_ns / per_gpu_sec).unwrap_or(u64::MAX)
    }
}

#[cfg(test)]
#[path = "idle_tracker_tests.rs"]
mod tests;
