//! The table of job attempts on this node, shared by the assignment loop (redelivery dedup,
//! kill requests), the heartbeat (what runs, which process groups are ours) and shutdown
//! (stop everything).
//!
//! An attempt is *running* from the moment its process is spawned until its `Exited` report
//! was published; then it is remembered as *finished* for a while, so that an assignment
//! redelivered after its job already ended does not run it twice.
//!
//! A running attempt whose assignment asks for it also carries its idleness
//! (`idle_tracker.rs`), which lives and ends with its entry: the heartbeat updates it from each
//! GPU sample and reports it, and the job takes its total for its usage report.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use mgpu_protocol::ids::JobId;
use mgpu_protocol::node::{GpuStatus, RunningJob};
use mgpu_protocol::stop::StopWarning;
use tokio::sync::watch;

use crate::idle_tracker::{IdleState, Watched};

/// One run of one job: attempts of the same job are distinct.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct AttemptKey {
    pub job_id: JobId,
    pub attempt: u32,
}

impl std::fmt::Display for AttemptKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "job {} attempt {}", self.job_id, self.attempt)
    }
}

/// Why the agent stops a job before it ends by itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// The scheduler sent a Kill (the user cancelled): the job ends as cancelled.
    Cancelled,
    /// The scheduler sent a Kill with `requeue` (its time slice is over and others wait): the
    /// job is stopped exactly as for a cancel, but reported as preempted, not cancelled.
    Requeued,
    /// The agent is shutting down: reported `lost`, so the job goes back to the queue.
    AgentShutdown,
    /// The agent could not store a heartbeat for `--fence-after`: the scheduler may already
    /// run the job elsewhere. Reported `lost` once NATS is reachable again.
    Fenced,
}

/// A stop asked for: why, and whether the job is warned first (its signal and stop file, then
/// the grace before SIGTERM) or stopped at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StopRequest {
    pub reason: StopReason,
    pub warning: Option<StopWarning>,
}

impl StopRequest {
    /// A stop without warning: SIGTERM at once.
    pub fn now(reason: StopReason) -> Self {
        StopRequest {
            reason,
            warning: None,
        }
    }

    /// What a later request makes of this one; None when it changes nothing. The first
    /// reason sticks (it is the one reported), but a later stop that will not wait (the
    /// agent shutting down, fencing, a kill without warning) cuts a warning's grace short:
    /// a shutdown cannot wait out a preemption's minutes, and a fenced job may already run
    /// elsewhere.
    pub fn then(self, later: StopRequest) -> Option<StopRequest> {
        (self.warning.is_some() && later.warning.is_none()).then_some(StopRequest {
            reason: self.reason,
            warning: None,
        })
    }
}

/// The job's side of a stop request; `None` until someone asks.
pub type StopRequests = watch::Receiver<Option<StopRequest>>;

/// What the table knows about an attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttemptStatus {
    Running,
    Finished,
    Unknown,
}

/// How many finished attempts are remembered for dedup. Redeliveries come within the consumer's
/// ack wait, so this only needs to outlast a burst of short jobs.
const FINISHED_REMEMBERED: usize = 4096;

struct Entry {
    pid: u32,
    stop: watch::Sender<Option<StopRequest>>,
    /// Its idleness, where its assignment asked for it to be measured.
    idle: Option<IdleState>,
}

#[derive(Default)]
struct Inner {
    running: HashMap<AttemptKey, Entry>,
    finished: HashSet<AttemptKey>,
    finished_order: VecDeque<AttemptKey>,
}

#[derive(Clone, Default)]
pub struct RunningTable {
    inner: Arc<Mutex<Inner>>,
}

impl RunningTable {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // The critical sections cannot panic half-way, so a poisoned lock still holds a
        // consistent table.
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn status(&self, key: &AttemptKey) -> AttemptStatus {
        let inner = self.lock();
        if inner.running.contains_key(key) {
            AttemptStatus::Running
        } else if inner.finished.contains(key) {
            AttemptStatus::Finished
        } else {
            AttemptStatus::Unknown
        }
    }

    /// Records a spawned attempt; the job watches the returned receiver for stop requests.
    pub fn insert(&self, key: AttemptKey, pid: u32) -> StopRequests {
        let (stop, requests) = watch::channel(None);
        let entry = Entry {
            pid,
            stop,
            idle: None,
        };
        self.lock().running.insert(key, entry);
        requests
    }

    /// Starts measuring a running attempt's idleness (no-op for one not running).
    pub fn watch_idle(&self, key: &AttemptKey, watched: Watched) {
        if let Some(entry) = self.lock().running.get_mut(key) {
            entry.idle = Some(IdleState::new(watched));
        }
    }

    /// Updates every measured attempt's idleness from a GPU sample taken `at`: `gpus` as
    /// sampled, `own` each attempt's processes' memory (MiB) per GPU (`gpu_peaks.rs` adds it
    /// up), `listed_gpus` the GPUs whose processes could be listed.
    pub fn record_idle(
        &self,
        at: Instant,
        gpus: &[GpuStatus],
        own: &HashMap<AttemptKey, BTreeMap<u32, u64>>,
        listed_gpus: &[u32],
    ) {
        for (key, entry) in &mut self.lock().running {
            if let Some(idle) = &entry.idle {
                entry.idle = Some(idle.observe(at, gpus, own.get(key), listed_gpus));
            }
        }
    }

    /// The GPU-seconds an ending attempt spent idle (None where it was not measured), for its
    /// usage report; its measurement stops here.
    pub fn take_idle_gpu_secs(&self, key: &AttemptKey) -> Option<u64> {
        let mut inner = self.lock();
        let idle = inner.running.get_mut(key)?.idle.take()?;
        Some(idle.idle_gpu_secs())
    }

    /// Moves an attempt from running to finished (also used for attempts that never started).
    pub fn finish(&self, key: &AttemptKey) {
        let mut inner = self.lock();
        inner.running.remove(key);
        if inner.finished.insert(key.clone()) {
            inner.finished_order.push_back(key.clone());
        }
        while inner.finished_order.len() > FINISHED_REMEMBERED {
            if let Some(oldest) = inner.finished_order.pop_front() {
                inner.finished.remove(&oldest);
            }
        }
    }

    /// Asks a running attempt to stop at once. False when it does not run here. The first
    /// reason given sticks: a job cancelled and then caught by shutdown still ends as
    /// cancelled.
    pub fn request_stop(&self, key: &AttemptKey, reason: StopReason) -> bool {
        self.request(key, StopRequest::now(reason))
    }

    /// Asks a running attempt to stop, warned first when the request says so; later requests
    /// combine with it as [`StopRequest::then`] says. False when it does not run here.
    pub fn request(&self, key: &AttemptKey, request: StopRequest) -> bool {
        let inner = self.lock();
        let Some(entry) = inner.running.get(key) else {
            return false;
        };
        entry.stop.send_if_modified(|current| {
            let next = match *current {
                None => Some(request),
                Some(earlier) => earlier.then(request),
            };
            let changed = next.is_some();
            if let Some(next) = next {
                *current = Some(next);
            }
            changed
        });
        true
    }

    /// Asks every running attempt to stop; returns how many there were.
    pub fn request_stop_all(&self, reason: StopReason) -> usize {
        let keys: Vec<AttemptKey> = self.lock().running.keys().cloned().collect();
        keys.iter()
            .filter(|key| self.request_stop(key, reason))
            .count()
    }

    /// The running attempts, for the heartbeat.
    pub fn snapshot(&self) -> Vec<RunningJob> {
        let mut jobs: Vec<RunningJob> = self
            .lock()
            .running
            .iter()
            .map(|(key, entry)| RunningJob {
                id: key.job_id.clone(),
                attempt: key.attempt,
                pid: entry.pid,
                idle: entry.idle.as_ref().map(IdleState::sample),
            })
            .collect();
        jobs.sort_by(|a, b| (&a.id, a.attempt).cmp(&(&b.id, b.attempt)));
        jobs
    }

    /// Process groups of the running jobs: each job leads its own group, so its pid is the id.
    /// Each running attempt with its process group (its guard's pid).
    pub fn attempt_groups(&self) -> Vec<(u32, AttemptKey)> {
        self.lock()
            .running
            .iter()
            .map(|(key, entry)| (entry.pid, key.clone()))
            .collect()
    }

    pub fn process_groups(&self) -> Vec<u32> {
        self.lock()
            .running
            .values()
            .map(|entry| entry.pid)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(attempt: u32) -> AttemptKey {
        AttemptKey {
            job_id: JobId::random(),
            attempt,
        }
    }

    #[test]
    fn an_attempt_goes_from_unknown_to_running_to_finished() {
        let table = RunningTable::default();
        let k = key(1);
        assert_eq!(table.status(&k), AttemptStatus::Unknown);
        let _stop = table.insert(k.clone(), 4242);
        assert_eq!(table.status(&k), AttemptStatus::Running);
        assert_eq!(table.process_groups(), vec![4242]);
        assert_eq!(table.snapshot().len(), 1);
        table.finish(&k);
        assert_eq!(table.status(&k), AttemptStatus::Finished);
        assert!(table.snapshot().is_empty());
        assert!(!table.request_stop(&k, StopReason::Cancelled));
    }

    #[test]
    fn the_first_stop_reason_sticks() {
        let table = RunningTable::default();
        let k = key(2);
        let stop = table.insert(k.clone(), 1);
        assert!(table.request_stop(&k, StopReason::Cancelled));
        assert_eq!(table.request_stop_all(StopReason::AgentShutdown), 1);
        assert_eq!(
            *stop.borrow(),
            Some(StopRequest::now(StopReason::Cancelled))
        );
    }

    #[test]
    fn a_stop_that_will_not_wait_cuts_a_warning_short_but_keeps_its_reason() {
        use mgpu_protocol::stop::StopCause;
        let warning = StopWarning {
            signal: 10,
            grace_secs: 300,
            cause: StopCause::Preempted,
        };
        let preempt = StopRequest {
            reason: StopReason::Requeued,
            warning: Some(warning),
        };
        let table = RunningTable::default();
        let k = key(1);
        let mut stop = table.insert(k.clone(), 1);
        assert!(table.request(&k, preempt));
        assert_eq!(*stop.borrow_and_update(), Some(preempt));
        // Another warned kill changes nothing: the job is being warned already.
        assert!(table.request(
            &k,
            StopRequest {
                reason: StopReason::Cancelled,
                ..preempt
            }
        ));
        assert!(!stop.has_changed().unwrap_or(true));
        // Shutdown will not wait out the grace; the job still ends as preempted.
        assert_eq!(table.request_stop_all(StopReason::AgentShutdown), 1);
        assert_eq!(
            *stop.borrow_and_update(),
            Some(StopRequest::now(StopReason::Requeued))
        );
        assert_eq!(
            StopRequest::now(StopReason::Cancelled).then(preempt),
            None,
            "a warning never slows down a stop already under way"
        );
    }

    #[test]
    fn a_measured_attempt_reports_its_idleness_until_it_ends() {
        use mgpu_protocol::idle::IdleSample;
        let table = RunningTable::default();
        let (measured, plain) = (key(1), key(1));
        let _stops = (
            table.insert(measured.clone(), 1),
            table.insert(plain.clone(), 2),
        );
        let watched = Watched {
            below_pct: 5,
            gpus: vec![(0, mgpu_protocol::gpu_amount::GpuAmount::UNITS_PER_GPU)],
        };
        table.watch_idle(&measured, watched);
        let gpu = GpuStatus {
            index: 0,
            uuid: "GPU-0".into(),
            name: "Declared GPU".into(),
            gpu_type: None,
            memory_total_mib: 1024,
            memory_used_mib: 0,
            utilization_pct: 0,
            temperature_c: None,
            power_w: None,
            foreign_processes: Vec::new(),
        };
        let start = Instant::now();
        for secs in [0, 3] {
            let at = start + std::time::Duration::from_secs(secs);
            table.record_idle(at, std::slice::from_ref(&gpu), &HashMap::new(), &[]);
        }
        let idle_of = |key: &AttemptKey| {
            let jobs = table.snapshot();
            jobs.into_iter()
                .find(|job| job.id == key.job_id)
                .and_then(|job| job.idle)
        };
        let three = IdleSample {
            idle_for_secs: 3,
            idle_gpu_secs: 3,
        };
        assert_eq!(idle_of(&measured), Some(three));
        assert_eq!(idle_of(&plain), None);
        assert_eq!(table.take_idle_gpu_secs(&measured), Some(3));
        assert_eq!(table.take_idle_gpu_secs(&measured), None, "taken once");
        assert_eq!(table.take_idle_gpu_secs(&plain), None);
        assert_eq!(idle_of(&measured), None);
    }

    #[test]
    fn finished_attempts_are_forgotten_oldest_first() {
        let table = RunningTable::default();
        let first = key(1);
        table.finish(&first);
        for _ in 0..FINISHED_REMEMBERED {
            table.finish(&key(1));
        }
        assert_eq!(table.status(&first), AttemptStatus::Unknown);
    }
}
