//! A storm's limit: each destination gets at most `max` deliveries in any `window` (a minute
//! in production); what comes beyond waits, and goes as one summary once the window has room.
//! Pure: the caller gives the time.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

/// Deliveries per destination in the last window.
#[derive(Debug)]
pub struct Throttle {
    max: usize,
    window: Duration,
    sent: HashMap<String, VecDeque<Instant>>,
}

impl Throttle {
    pub fn new(max_per_window: u32, window: Duration) -> Throttle {
        Throttle {
            max: usize::try_from(max_per_window).unwrap_or(usize::MAX).max(1),
            window,
            sent: HashMap::new(),
        }
    }

    /// Whether `destination` may have one more delivery at `now`.
    pub fn has_room(&mut self, destination: &str, now: Instant) -> bool {
        let Some(times) = self.sent.get_mut(destination) else {
            return true;
        };
        while times
            .front()
            .is_some_and(|t| now.saturating_duration_since(*t) >= self.window)
        {
            times.pop_front();
        }
        times.len() < self.max
    }

    /// Counts a delivery to `destination` at `now`.
    pub fn record(&mut self, destination: &str, now: Instant) {
        self.sent
            .entry(destination.to_owned())
            .or_default()
            .push_back(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_most_max_per_window_then_room_again() {
        let start = Instant::now();
        let mut throttle = Throttle::new(3, Duration::from_secs(60));
        for _ in 0..3 {
            assert!(throttle.has_room("a", start));
            throttle.record("a", start);
        }
        assert!(!throttle.has_room("a", start + Duration::from_secs(59)));
        // Another destination has its own count.
        assert!(throttle.has_room("b", start));
        assert!(throttle.has_room("a", start + Duration::from_secs(60)));
    }
}
