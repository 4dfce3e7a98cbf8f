//! Backoff between the tries of one operation NATS could not answer (a server lost, a stream
//! electing its leader), until a time given up front has passed: an election takes seconds,
//! and a caller that gave up at the first error would lose what it was storing.

use std::fmt;
use std::time::{Duration, Instant};

/// The tries of one operation: waits growing from 100 ms to 2 s, until `give_up_after`.
pub struct Retry {
    deadline: Instant,
    give_up_after: Duration,
    delay: Duration,
}

/// The time to retry is over; says what last failed.
#[derive(Debug)]
pub struct GaveUp {
    what: String,
    after: Duration,
}

impl fmt::Display for GaveUp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (gave up after {:?})", self.what, self.after)
    }
}

impl std::error::Error for GaveUp {}

impl Retry {
    /// Starts the clock: tries after `give_up_after` from now are refused.
    pub fn new(give_up_after: Duration) -> Self {
        Retry {
            deadline: Instant::now() + give_up_after,
            give_up_after,
            delay: Duration::from_millis(100),
        }
    }

    /// Waits before the next try, or gives up with `what` (the last failure) when the time
    /// is over.
    pub async fn wait(&mut self, what: &str) -> Result<(), GaveUp> {
        if Instant::now() + self.delay > self.deadline {
            return Err(GaveUp {
                what: what.to_owned(),
                after: self.give_up_after,
            });
        }
        tracing::warn!("{what}; retrying in {:?}", self.delay);
        tokio::time::sleep(self.delay).await;
        self.delay = (self.delay * 2).min(Duration::from_secs(2));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn gives_up_once_the_next_wait_would_end_past_its_time() {
        let mut retry = Retry::new(Duration::from_millis(350));
        assert!(retry.wait("first").await.is_ok()); // 100 ms
        assert!(retry.wait("second").await.is_ok()); // 200 ms, 300 in all
        let gave_up = retry.wait("third").await.err().map(|e| e.to_string());
        assert_eq!(gave_up.as_deref(), Some("third (gave up after 350ms)"));
    }
}
