//! Self-fencing: an agent that cannot store a heartbeat for `--fence-after` stops every job it
//! runs, because by then the scheduler counts the node as offline and may start those jobs
//! elsewhere. A partitioned or stalled agent therefore never runs a job a second time beside
//! its replacement.
//!
//! The scheduler knows the fence (it is in every heartbeat, with the kill grace) and holds a
//! job lost with its node until the fence and the grace have passed, so the old attempt is
//! dead before the new one starts. The jobs stopped here are reported `lost` once NATS is back.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tokio::time::Instant;
use tracing::{info, warn};

use crate::running::{RunningTable, StopReason};
use crate::shutdown::Signal;

/// When the last heartbeat that JetStream stored was taken (its `sent_at`, which the
/// scheduler's offline timer counts from), in memory for [`watch`] and as the modification
/// time of the contact file for the job guards (which must fence even when this agent is
/// frozen and [`watch`] with it).
#[derive(Clone)]
pub struct Contact {
    last: Arc<Mutex<Instant>>,
    file: Option<Arc<std::fs::File>>,
}

impl Contact {
    /// In memory only.
    pub fn new() -> Self {
        Contact {
            last: Arc::new(Mutex::new(Instant::now())),
            file: None,
        }
    }

    /// Also kept as the modification time of `path` (created, and touched now).
    pub fn with_file(path: &Path) -> std::io::Result<Self> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)?;
        file.set_modified(SystemTime::now())?;
        Ok(Contact {
            file: Some(Arc::new(file)),
            ..Contact::new()
        })
    }

    /// A heartbeat taken at `taken` was stored.
    pub fn stored(&self, taken: Instant) {
        let mut last = self
            .last
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if taken > *last {
            *last = taken;
        }
        if let Some(file) = &self.file {
            let when = SystemTime::now() - taken.elapsed();
            if let Err(err) = file.set_modified(when) {
                warn!("cannot touch the contact file the job guards watch: {err}");
            }
        }
    }

    fn silent_for(&self) -> Duration {
        let last = *self
            .last
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        last.elapsed()
    }
}

/// Stops every running job whenever no heartbeat was stored for `fence_after`, until `stop`.
pub async fn watch(contact: Contact, fence_after: Duration, table: RunningTable, stop: Signal) {
    let check_every = (fence_after / 4).clamp(Duration::from_millis(50), Duration::from_secs(1));
    let mut fenced = false;
    loop {
        tokio::select! {
            () = stop.fired() => return,
            () = tokio::time::sleep(check_every) => {}
        }
        let silent = contact.silent_for();
        if silent < fence_after {
            if fenced {
                info!("heartbeats are stored again; taking work as usual");
                fenced = false;
            }
            continue;
        }
        let stopped = table.request_stop_all(StopReason::Fenced);
        if stopped == 0 && !fenced {
            info!(silent = ?silent, "no heartbeat stored for longer than --fence-after; no job to stop");
        } else if stopped > 0 {
            warn!(
                silent = ?silent,
                jobs = stopped,
                "no heartbeat stored for longer than --fence-after: the scheduler counts this \
                 node as offline and may run its jobs elsewhere, so they are stopped here"
            );
        }
        fenced = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::running::AttemptKey;
    use mgpu_protocol::ids::JobId;

    #[tokio::test(start_paused = true)]
    async fn jobs_are_stopped_once_heartbeats_fail_for_the_fence_time() {
        let table = RunningTable::default();
        let key = AttemptKey {
            job_id: JobId::random(),
            attempt: 1,
        };
        let stop_requests = table.insert(key, 42);
        let contact = Contact::new();
        let (stop, stopped) = crate::shutdown::signal();
        let watcher = tokio::spawn(watch(
            contact.clone(),
            Duration::from_secs(3),
            table.clone(),
            stopped,
        ));
        // Heartbeats stored for a while: nothing happens.
        for _ in 0..10 {
            tokio::time::sleep(Duration::from_secs(1)).await;
            contact.stored(Instant::now());
        }
        assert_eq!(*stop_requests.borrow(), None);
        // Then silence past the fence.
        tokio::time::sleep(Duration::from_secs(4)).await;
        assert_eq!(
            *stop_requests.borrow(),
            Some(crate::running::StopRequest::now(StopReason::Fenced))
        );
        stop.fire();
        let _ = watcher.await;
    }
}
