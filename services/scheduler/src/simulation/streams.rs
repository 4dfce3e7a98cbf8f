//! A simulated JetStream stream with one consumer, as the scheduler reads requests and agents'
//! reports: every message is kept until acknowledged; one that is handed out and not
//! acknowledged comes again once the acknowledgement wait is over; handed out in stream order
//! among those ready.
//!
//! Kept apart from the world so that a pump costs what it delivers, not what the run ever
//! published: the messages waiting are indexed by when they can be delivered.

use std::collections::BTreeSet;

/// A stream's messages and where each stands.
pub struct Stream<T> {
    messages: Vec<T>,
    acked: Vec<bool>,
    /// Messages neither acknowledged nor handed out, by when they can be delivered (again).
    waiting: BTreeSet<(u64, usize)>,
    unacked: usize,
}

impl<T> Default for Stream<T> {
    fn default() -> Self {
        Stream {
            messages: Vec::new(),
            acked: Vec::new(),
            waiting: BTreeSet::new(),
            unacked: 0,
        }
    }
}

impl<T: Clone> Stream<T> {
    /// Stores `message`; it can be delivered from `available_at` on. Its index.
    pub fn publish(&mut self, message: T, available_at: u64) -> usize {
        let index = self.messages.len();
        self.messages.push(message);
        self.acked.push(false);
        self.waiting.insert((available_at, index));
        self.unacked += 1;
        index
    }

    /// Hands out up to `most` messages ready at `now`, in stream order: they are held by
    /// the consumer until acknowledged or delivered again.
    pub fn take_ready(&mut self, now: u64, most: usize) -> Vec<(usize, T)> {
        let mut ready: Vec<(u64, usize)> = self
            .waiting
            .range(..(now.saturating_add(1), 0))
            .copied()
            .collect();
        ready.sort_unstable_by_key(|&(_, index)| index);
        ready.truncate(most);
        for key in &ready {
            self.waiting.remove(key);
        }
        ready
            .into_iter()
            .filter(|&(_, index)| self.acked.get(index) == Some(&false))
            .filter_map(|(_, index)| Some((index, self.messages.get(index)?.clone())))
            .collect()
    }

    /// A message handed out and not acknowledged comes again at `at`.
    pub fn redeliver_at(&mut self, index: usize, at: u64) {
        if self.acked.get(index) == Some(&false) {
            self.waiting.insert((at, index));
        }
    }

    /// The consumer acknowledged message `index`.
    pub fn ack(&mut self, index: usize) {
        if let Some(acked) = self.acked.get_mut(index)
            && !*acked
        {
            *acked = true;
            self.unacked -= 1;
        }
    }

    /// Whether every message stored so far was acknowledged.
    pub fn all_acked(&self) -> bool {
        self.unacked == 0
    }

    /// Every message ever stored, in stream order.
    pub fn messages(&self) -> impl Iterator<Item = &T> {
        self.messages.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_comes_again_until_acknowledged() {
        let mut stream = Stream::default();
        let first = stream.publish("a", 10);
        stream.publish("b", 5);
        assert!(stream.take_ready(4, 10).is_empty());
        // Ready ones in stream order, whenever each became ready.
        let both: Vec<&str> = stream.take_ready(10, 10).into_iter().map(|m| m.1).collect();
        assert_eq!(both, vec!["a", "b"]);
        assert!(stream.take_ready(100, 10).is_empty(), "held until acked");
        stream.redeliver_at(first, 40);
        stream.ack(1);
        assert!(!stream.all_acked());
        assert_eq!(stream.take_ready(40, 10), vec![(first, "a")]);
        stream.ack(first);
        assert!(stream.all_acked());
        stream.redeliver_at(first, 50);
        assert!(
            stream.take_ready(60, 10).is_empty(),
            "an acked message never comes again"
        );
    }
}
