//! The usage ledger: every user's decayed GPU time (fair share), kept in memory and stored in
//! the cluster bucket (`usage`) at most once a second, and when the scheduler stops.

use std::time::Duration;

use async_nats::jetstream::kv;

use mgpu_protocol::priority::UsageBook;
use mgpu_protocol::{Timestamp, subjects};

/// The least time between two writes of the usage book. Every pass that saw a job end wrote
/// it, a round trip inside the pass; in a burst of short jobs that is most passes. A scheduler
/// killed between two writes loses at most this much of its users' accounted GPU time (a
/// stopped one stores it before it exits).
const SAVE_EVERY: Duration = Duration::from_secs(1);

pub(crate) struct UsageLedger {
    book: UsageBook,
    /// The cluster bucket it is stored in.
    bucket: kv::Store,
    /// Changed since it was last stored.
    dirty: bool,
    /// When it was last stored.
    saved_at: Option<tokio::time::Instant>,
}

impl UsageLedger {
    pub(crate) fn new(book: UsageBook, bucket: kv::Store) -> Self {
        UsageLedger {
            book,
            bucket,
            dirty: false,
            saved_at: None,
        }
    }

    /// A user's decayed GPU-hours at `now`.
    pub(crate) fn gpu_hours(&self, user: &str, now: Timestamp, half_life_secs: u64) -> f64 {
        self.book.gpu_hours(user, now, half_life_secs)
    }

    /// Adds a finished run's GPU time to its user's usage.
    pub(crate) fn add(&mut self, user: &str, gpu_seconds: f64, at: Timestamp, half_life_secs: u64) {
        self.book.add(user, gpu_seconds, at, half_life_secs);
        self.dirty = true;
    }

    /// Stores the book if it changed: at once when `now_anyway` (shutting down) or when the
    /// last write is [`SAVE_EVERY`] old, else at a later pass or liveness tick.
    pub(crate) async fn save(&mut self, now_anyway: bool) {
        if !self.dirty || (!now_anyway && self.saved_at.is_some_and(|at| at.elapsed() < SAVE_EVERY))
        {
            return;
        }
        match serde_json::to_vec(&self.book) {
            Ok(bytes) => match self.bucket.put(subjects::USAGE_KEY, bytes.into()).await {
                Ok(_) => {
                    self.dirty = false;
                    self.saved_at = Some(tokio::time::Instant::now());
                }
                Err(err) => tracing::warn!(%err, "storing usage"),
            },
            Err(err) => tracing::warn!(%err, "encoding usage"),
        }
    }
}
