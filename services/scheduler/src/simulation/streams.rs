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
    /// How many times each message was handed out.
    deliveries: Vec<u32>,
    /// Messages neither acknowledged nor handed out, by when they can be delivered (again).
    waiting: BTreeSet<(u64, usize)>,
    unacked: usize,
    /// When the last message stored can first be delivered.
    last_available: u64,
}

impl<T> Default for Stream<T> {
    fn default() -> Self {
        Stream {
            messages: Vec::new(),
            acked: Vec::new(),
            deliveries: Vec::new(),
            waiting: BTreeSet::new(),
            unacked: 0,
            last_available: 0,
        }
    }
}

impl<T: Clone> Stream<T> {
    /// Stores `message`; it can be delivered from `available_at` on, and not before one
    /// stored earlier: the stream's order is the order messages reached it, and its
    /// sequences (the indexes) follow that order. Its index.
    pub fn publish(&mut self, message: T, available_at: u64) -> usize {
        let available_at = available_at.max(self.last_available);
        self.last_available = available_at;
        let index = self.messages.len();
        self.messages.push(message);
        self.acked.push(false);
        self.deliveries.push(0);
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
        ready.retain(|&(_, index)| self.acked.get(index) == Some(&false));
        for &(_, index) in &ready {
            if let Some(count) = self.deliveries.get_mut(index) {
                *count += 1;
            }
        }
        ready
            .into_iter()
            .filter_map(|(_, index)| Some((index, self.messages.get(index)?.clone())))
            .collect()
    }

    /// The message stored at `index`.
    pub fn get(&self, index: usize) -> Option<&T> {
        self.messages.get(index)
    }

    /// A message handed out and not acknowledged comes again at `at`.
    pub fn redeliver_at(&mut self, index: usize, at: u64) {
        if self.acked.get(index) == Some(&false) {
            self.waiting.insert((at, index));
        }
    }

    /// Whether message `index` was handed out more than once (JetStream's delivery count).
    pub fn redelivered(&self, index: usize) -> bool {
        self.deliveries.get(index).is_some_and(|&count| count > 1)
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

    /// When the last message stored can first be delivered (none stored earlier comes later).
    pub fn last_available(&self) -> u64 {
        self.last_available
    }

    /// Whether a message handed out before (to a scheduler since gone) waits to come again.
    pub fn awaits_redelivery(&self) -> bool {
        self.waiting
            .iter()
            .any(|&(_, index)| self.deliveries.get(index).is_some_and(|&count| count > 0))
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
        assert!(stream.take_ready(9, 10).is_empty(), "b stored after a");
        // Ready ones in stream order, whenever each became ready.
        let both: Vec<&str> = stream.take_ready(10, 10).into_iter().map(|m| m.1).collect();
        assert_eq!(both, vec!["a", "b"]);
        assert!(stream.take_ready(100, 10).is_empty(), "held until acked");
        stream.redeliver_at(first, 40);
        stream.ack(1);
        assert!(!stream.all_acked());
        assert!(!stream.redelivered(first));
        assert_eq!(stream.take_ready(40, 10), vec![(first, "a")]);
        assert!(stream.redelivered(first) && !stream.redelivered(1));
        stream.ack(first);
        assert!(stream.all_acked());
        stream.redeliver_at(first, 50);
        assert!(
            stream.take_ready(60, 10).is_empty(),
            "an acked message never comes again"
        );
    }
}
