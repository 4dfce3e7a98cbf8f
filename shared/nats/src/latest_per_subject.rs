//! Messages where only the latest of each subject matters (the scheduler's heartbeats), read
//! off their subscription by a task of their own and kept as the latest of each subject until
//! the reader's event loop takes them.
//!
//! The scheduler's loop handles one input at a time, and a burst of submissions written with
//! `sync_interval: always` can keep it from the heartbeats for seconds. Left in the
//! subscription, they piled up past its capacity and NATS dropped the newest (a slow
//! consumer): once the loop came back it read only stale beats, and declared healthy nodes
//! offline by the hundred. Here a node's beat replaces its previous one at once, so what waits
//! is bounded by the number of subjects, and what the loop reads is each one's latest.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures::StreamExt;
use tokio::sync::Notify;

/// The latest message of each subject, waiting for the loop.
#[derive(Clone, Default)]
pub struct LatestPerSubject {
    waiting: Arc<Mutex<Waiting>>,
    arrived: Arc<Notify>,
}

#[derive(Default)]
struct Waiting {
    latest: HashMap<String, Bytes>,
    /// Messages replaced by a newer one of the same subject before the loop took them.
    superseded: u64,
}

/// Ends the reading task when the loop that takes the messages is gone.
pub struct Reader(tokio::task::JoinHandle<()>);

impl Drop for Reader {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl LatestPerSubject {
    /// Reads `subscription` into a new inbox from now on; `what` names its messages in the
    /// log line of a subscription that ends.
    pub fn follow(
        mut subscription: async_nats::Subscriber,
        what: &'static str,
    ) -> (LatestPerSubject, Reader) {
        let inbox = LatestPerSubject::default();
        let filled = inbox.clone();
        let task = tokio::spawn(async move {
            while let Some(message) = subscription.next().await {
                filled.put(message.subject.as_str(), message.payload);
            }
            tracing::error!("the subscription to {what} ended");
        });
        (inbox, Reader(task))
    }

    /// A message arrived on `subject`: it replaces the one waiting there, if any.
    fn put(&self, subject: &str, payload: Bytes) {
        if let Ok(mut waiting) = self.waiting.lock()
            && waiting.latest.insert(subject.to_owned(), payload).is_some()
        {
            waiting.superseded += 1;
        }
        self.arrived.notify_one();
    }

    /// Waits until a message arrived since the last [`LatestPerSubject::take`] (at once if
    /// one did).
    pub async fn arrived(&self) {
        self.arrived.notified().await;
    }

    /// The waiting messages, in subject order, and how many were superseded since the last
    /// take.
    pub fn take(&self) -> (Vec<(String, Bytes)>, u64) {
        let Ok(mut waiting) = self.waiting.lock() else {
            return (Vec::new(), 0);
        };
        let mut latest: Vec<(String, Bytes)> = waiting.latest.drain().collect();
        latest.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        (latest, std::mem::take(&mut waiting.superseded))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_node_keeps_only_its_latest_beat_until_taken() {
        let inbox = LatestPerSubject::default();
        for beat in 0..1_000u32 {
            for node in ["nodes.heartbeat.b", "nodes.heartbeat.a"] {
                inbox.put(node, Bytes::from(beat.to_string()));
            }
        }
        let (beats, superseded) = inbox.take();
        assert_eq!(
            beats,
            vec![
                ("nodes.heartbeat.a".to_owned(), Bytes::from("999")),
                ("nodes.heartbeat.b".to_owned(), Bytes::from("999")),
            ]
        );
        assert_eq!(superseded, 2 * 999);
        assert_eq!(inbox.take(), (Vec::new(), 0));
    }

    #[tokio::test]
    async fn a_beat_put_before_the_wait_still_wakes_it() {
        let inbox = LatestPerSubject::default();
        inbox.put("nodes.heartbeat.a", Bytes::from("1"));
        let woke = tokio::time::timeout(std::time::Duration::from_secs(1), inbox.arrived()).await;
        assert!(woke.is_ok(), "the loop would sleep with a beat waiting");
    }
}
