//! Pass statistics: how many passes ran, the latest passes' sizes and durations (published
//! as [`Status`] for `mgpu.scheduler.status`), and the churn of records after which freed
//! memory is handed back to the operating system.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::status::{PassSample, RECENT_PASSES, Status};

/// Changed records after which freed memory is handed back (see
/// [`PassStats::trim_due`]), and the least time between two such.
const TRIM_AFTER_CHANGES: usize = 10_000;
const TRIM_EVERY: Duration = Duration::from_secs(10);

pub(crate) struct PassStats {
    passes: u64,
    /// The latest passes, oldest first.
    recent: VecDeque<PassSample>,
    /// Records changed since memory was last given back, and when that was.
    churn: usize,
    last_trim: Option<Instant>,
}

/// What the status shows besides the passes.
pub(crate) struct Counts {
    pub jobs_queued: usize,
    pub jobs_running: usize,
    pub jobs_total: usize,
    pub nodes_known: usize,
    pub nodes_online: usize,
}

impl PassStats {
    pub(crate) fn new() -> Self {
        PassStats {
            passes: 0,
            recent: VecDeque::with_capacity(RECENT_PASSES),
            churn: 0,
            last_trim: None,
        }
    }

    /// Counts records whose views a pass rebuilt.
    pub(crate) fn add_churn(&mut self, changed: usize) {
        self.churn += changed;
    }

    /// Records a finished pass; the status to publish.
    pub(crate) fn record(&mut self, sample: PassSample, counts: Counts) -> Status {
        self.passes += 1;
        if self.recent.len() >= RECENT_PASSES {
            self.recent.pop_front();
        }
        self.recent.push_back(sample);
        Status {
            jobs_queued: counts.jobs_queued,
            jobs_running: counts.jobs_running,
            jobs_total: counts.jobs_total,
            nodes_known: counts.nodes_known,
            nodes_online: counts.nodes_online,
            passes: self.passes,
            recent_passes: self.recent.clone(),
        }
    }

    /// Whether heap memory freed since should go back to the operating system at `now`:
    /// after a burst (thousands of records changed: a flood of submissions, a cluster's worth
    /// of starts), at most every [`TRIM_EVERY`]. glibc keeps freed memory in its arenas
    /// otherwise: after 100 000 submissions the scheduler held about 130 MiB more than its
    /// live data. Noted as done when true.
    pub(crate) fn trim_due(&mut self, now: Instant) -> bool {
        if self.churn < TRIM_AFTER_CHANGES
            || self
                .last_trim
                .is_some_and(|at| now.saturating_duration_since(at) < TRIM_EVERY)
        {
            return false;
        }
        self.churn = 0;
        self.last_trim = Some(now);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_goes_back_after_a_burst_and_at_most_every_ten_seconds() {
        let mut stats = PassStats::new();
        let start = Instant::now();
        assert!(!stats.trim_due(start), "no burst yet");
        stats.add_churn(TRIM_AFTER_CHANGES);
        assert!(stats.trim_due(start));
        stats.add_churn(TRIM_AFTER_CHANGES);
        assert!(!stats.trim_due(start + Duration::from_secs(1)));
        assert!(stats.trim_due(start + TRIM_EVERY));
    }
}
