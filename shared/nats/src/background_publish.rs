//! Job events and audit records on their way to JetStream, off the scheduler's hot path:
//! they are for watchers and for the audit trail, the job record in KV is the truth, so a
//! pass never waits for them. Yet each must be stored: one that meets an election (the
//! stream's leader lost with its server) is published again, under the same message id,
//! until JetStream stores it or the publisher's retry time has passed.

use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream;
use bytes::Bytes;
use futures::StreamExt;

use crate::retry::Retry;

/// Acknowledgements the background publisher awaits at once: well under async-nats's 5 000,
/// and enough to keep the server busy.
const BACKGROUND_IN_FLIGHT: usize = 1_024;

/// The queue in front of the publishing task. One task publishes with at most
/// [`BACKGROUND_IN_FLIGHT`] acknowledgements awaited at once; what waits behind is a subject
/// and a payload in a queue, where a task per message meant up to 200 000 tasks during a
/// burst of 100 000 submissions (an event and an audit record each). Messages are stored in
/// the order made, except one retried through an election, which lands after those that
/// were stored meanwhile (each carries its own time).
#[derive(Clone)]
pub struct BackgroundPublisher {
    queue: tokio::sync::mpsc::UnboundedSender<Pending>,
}

struct Pending {
    subject: String,
    payload: Bytes,
    /// Names the message in a failure's log line ("a job event").
    what: &'static str,
}

impl BackgroundPublisher {
    /// Starts the publishing task, which retries a message for up to `retry_for`; it ends
    /// once every clone is dropped and the queue is empty.
    pub fn start(js: jetstream::Context, retry_for: Duration) -> Self {
        let (queue, pending) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(publish_pending(js, pending, retry_for));
        BackgroundPublisher { queue }
    }

    /// Queues `payload` for `subject`; a failure is logged as `what`.
    pub fn publish(&self, subject: String, payload: Vec<u8>, what: &'static str) {
        let pending = Pending {
            subject,
            payload: payload.into(),
            what,
        };
        if self.queue.send(pending).is_err() {
            tracing::warn!("{what} not published: the publisher has stopped");
        }
    }
}

async fn publish_pending(
    js: jetstream::Context,
    mut pending: tokio::sync::mpsc::UnboundedReceiver<Pending>,
    retry_for: Duration,
) {
    // Message ids unique to this publisher: a retry whose first try was stored after all is
    // dropped by the stream's duplicate window.
    let prefix = uuid::Uuid::new_v4().simple().to_string();
    let mut sent: u64 = 0;
    let mut in_flight = futures::stream::FuturesUnordered::new();
    let mut open = true;
    while open || !in_flight.is_empty() {
        tokio::select! {
            Some(()) = in_flight.next(), if !in_flight.is_empty() => {}
            next = pending.recv(), if open && in_flight.len() < BACKGROUND_IN_FLIGHT => {
                let Some(message) = next else {
                    open = false;
                    continue;
                };
                sent += 1;
                let mut headers = HeaderMap::new();
                headers.insert("Nats-Msg-Id", format!("{prefix}-{sent}").as_str());
                let first = js
                    .publish_with_headers(message.subject.clone(), headers.clone(), message.payload.clone())
                    .await;
                let js = js.clone();
                in_flight.push(async move {
                    let failure = match first {
                        Ok(ack) => match ack.await {
                            Ok(_) => return,
                            Err(err) => err.to_string(),
                        },
                        Err(err) => err.to_string(),
                    };
                    store_after_all(&js, message, headers, failure, retry_for).await;
                });
            }
        }
    }
}

/// Publishes `message` again, with its first try's `headers`, until it is stored or the
/// retry time is over; the first try failed with `failure`.
async fn store_after_all(
    js: &jetstream::Context,
    message: Pending,
    headers: HeaderMap,
    failure: String,
    retry_for: Duration,
) {
    let mut retry = Retry::new(retry_for);
    let mut failure = failure;
    loop {
        if let Err(err) = retry
            .wait(&format!("{} not stored ({failure})", message.what))
            .await
        {
            tracing::warn!("{err:#}");
            return;
        }
        let stored = async {
            js.publish_with_headers(
                message.subject.clone(),
                headers.clone(),
                message.payload.clone(),
            )
            .await?
            .await
        };
        match stored.await {
            Ok(_) => return,
            Err(err) => failure = err.to_string(),
        }
    }
}
