//! Log throttling for failures that repeat on every loop turn (a heartbeat stream that does not
//! exist yet, a NATS outage): the first occurrence is logged, a changed message is logged, and an
//! unchanged one at most once per period, with a count of what was left out. Logs stay readable
//! through an outage of hours.

use std::time::{Duration, Instant};

#[derive(Debug)]
pub struct Throttle {
    period: Duration,
    last_message: Option<String>,
    last_logged: Option<Instant>,
    suppressed: u64,
}

/// What the caller should do with a failure it just saw.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Log it; `suppressed` identical messages were left out since the last one logged.
    Log { suppressed: u64 },
    /// Leave it out.
    Skip,
}

impl Throttle {
    pub fn new(period: Duration) -> Self {
        Throttle {
            period,
            last_message: None,
            last_logged: None,
            suppressed: 0,
        }
    }

    /// Records a failure described by `message` and says whether to log it now.
    pub fn failure(&mut self, message: &str) -> Verdict {
        self.failure_at(message, Instant::now())
    }

    fn failure_at(&mut self, message: &str, now: Instant) -> Verdict {
        let same = self.last_message.as_deref() == Some(message);
        let recent = self
            .last_logged
            .is_some_and(|at| now.saturating_duration_since(at) < self.period);
        if same && recent {
            self.suppressed += 1;
            return Verdict::Skip;
        }
        let suppressed = std::mem::take(&mut self.suppressed);
        self.last_message = Some(message.to_owned());
        self.last_logged = Some(now);
        Verdict::Log { suppressed }
    }

    /// Records a success. Returns true when failures had been logged before it, so the caller
    /// can say that things work again.
    pub fn success(&mut self) -> bool {
        self.suppressed = 0;
        self.last_logged = None;
        self.last_message.take().is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeats_are_left_out_until_the_period_ends_or_the_message_changes() {
        let mut throttle = Throttle::new(Duration::from_secs(60));
        let start = Instant::now();
        assert_eq!(
            throttle.failure_at("down", start),
            Verdict::Log { suppressed: 0 }
        );
        assert_eq!(
            throttle.failure_at("down", start + Duration::from_secs(1)),
            Verdict::Skip
        );
        assert_eq!(
            throttle.failure_at("other", start + Duration::from_secs(2)),
            Verdict::Log { suppressed: 1 }
        );
        assert_eq!(
            throttle.failure_at("other", start + Duration::from_secs(70)),
            Verdict::Log { suppressed: 0 }
        );
        assert!(throttle.success());
        assert!(!throttle.success());
        assert_eq!(
            throttle.failure_at("other", start + Duration::from_secs(71)),
            Verdict::Log { suppressed: 0 }
        );
    }
}
