//! Pass statistics: how many passes ran, the latest passes' sizes and durations (published
//! as [`Status`] for `mgpu.scheduler.status`), and the churn of records after which freed
//! memory is handed back to the operating system.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::status::{PassSample, RECENT_PASSES, Status};

/// Changed records after which freed memory is handed back (see
/// [`PassStats::give_back_memory_after_bursts`]), and the least time between two such.
const TRIM_AFTER_CHANGES: usize = 10_000;
const TRIM_EVERY: Duration = Duration::from_secs(10);

pub(crate) struct PassStats {
    passes: u64,
    /// The latest passes, oldest first.
    recent: VecDeque<PassSample>,
    /// Records changed since memory was last given back, and when that was.
    churn: usize,
    last_trim: Option<Instant>,
    status: watch::Sender<Status>,
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
    pub(crate) fn new(status: watch::Sender<Status>) -> Self {
        PassStats {
            passes: 0,
            recent: VecDeque::with_capacity(RECENT_PASSES),
            churn: 0,
            last_trim: None,
            status,
        }
    }

    /// Counts records whose views a pass rebuilt.
    pub(crate) fn add_churn(&mut self, changed: usize) {
        self.churn += changed;
    }

    /// Records a finished pass and publishes the status.
    pub(crate) fn record(&mut self, sample: PassSample, counts: Counts) {
        self.passes += 1;
        if self.recent.len() >= RECENT_PASSES {
            self.recent.pop_front();
        }
        self.recent.push_back(sample);
        self.status.send_replace(Status {
            jobs_queued: counts.jobs_queued,
            jobs_running: counts.jobs_running,
            jobs_total: counts.jobs_total,
            nodes_known: counts.nodes_known,
            nodes_online: counts.nodes_online,
            passes: self.passes,
            recent_passes: self.recent.clone(),
        });
    }

    /// After a burst (thousands of records changed: a flood of submissions, a cluster's worth
    /// of starts), hands the heap memory freed since back to the operating system, at most
    /// every [`TRIM_EVERY`]. glibc keeps freed memory in its arenas otherwise: after 100 000
    /// submissions the scheduler held about 130 MiB more than its live data.
    pub(crate) fn give_back_memory_after_bursts(&mut self) {
        if self.churn < TRIM_AFTER_CHANGES
            || self.last_trim.is_some_and(|at| at.elapsed() < TRIM_EVERY)
        {
            return;
        }
        self.churn = 0;
        self.last_trim = Some(Instant::now());
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        // SAFETY: malloc_trim only releases free memory of the allocator's own arenas; it
        // reads no pointer of ours and is thread-safe.
        unsafe {
            libc::malloc_trim(0);
        }
    }
}
