//! Continuous pulls from a durable consumer that keep delivering across a lost server.
//!
//! A continuous pull (`messages()`) keeps one pull request waiting at the server that leads
//! the consumer. Should that request be lost (its server killed), async-nats asks again only
//! once the request would have expired, or reports missed idle heartbeats, which with its
//! defaults (30 s expiry, 15 s heartbeat) takes half a minute. And a pull can end (consumer
//! deleted, a request refused), after which a `select!` arm waiting on it never fires again:
//! a scheduler would stop hearing agents' reports without a word.
//!
//! [`start`] asks for an idle heartbeat every [`IDLE_HEARTBEAT`], so a lost request shows as
//! missed heartbeats within two of them, and [`must_restart`] says which errors mean the
//! pull has to be started again. [`Pull`] does both for a consumer whose messages are read
//! in a `select!` loop: it never ends, logs what went wrong, and starts the pull again. When
//! the reader stops acting (a scheduler stepping down), [`Pull::give_back`] returns what it had
//! pulled and not handled, for the next reader to get at once.

use std::time::Duration;

use async_nats::jetstream::AckKind;
use async_nats::jetstream::{
    self,
    consumer::{
        PullConsumer, StreamError,
        pull::{MessagesErrorKind, Stream},
    },
};
use futures::{FutureExt, StreamExt};
use tokio::time::Instant;

/// How often the server says "nothing for you yet" on a waiting pull request. Two missed
/// ones end the pull. Cheap: one small message per consumer every two seconds, only while
/// it has nothing to deliver.
pub const IDLE_HEARTBEAT: Duration = Duration::from_secs(2);

/// How long one pull request waits at the server before the client asks again.
pub const PULL_EXPIRES: Duration = Duration::from_secs(20);

/// First pause before starting a pull again; it doubles up to [`MAX_RESTART_DELAY`] while
/// starts keep failing (no leader yet), and resets once a message arrives.
const FIRST_RESTART_DELAY: Duration = Duration::from_millis(250);
const MAX_RESTART_DELAY: Duration = Duration::from_secs(4);

/// Starts a continuous pull on `consumer` with a short idle heartbeat (see the module doc).
pub async fn start(consumer: &PullConsumer) -> Result<Stream, StreamError> {
    consumer
        .stream()
        .expires(PULL_EXPIRES)
        .heartbeat(IDLE_HEARTBEAT)
        .messages()
        .await
}

/// Whether a continuous pull that yielded an error of this kind must be started again:
/// waiting on it would wait for nothing (or for the request's expiry).
pub fn must_restart(kind: MessagesErrorKind) -> bool {
    match kind {
        // The server leading the consumer is gone, or the consumer has no leader yet.
        MessagesErrorKind::MissingHeartbeat | MessagesErrorKind::NoResponders => true,
        // The stream has ended: only a new one can go on.
        MessagesErrorKind::ConsumerDeleted
        | MessagesErrorKind::PushBasedConsumer
        | MessagesErrorKind::RequestLimitExceeded => true,
        // A failed pull request is retried by the stream itself; anything else is one bad
        // message, not a dead stream.
        MessagesErrorKind::Pull | MessagesErrorKind::Other => false,
    }
}

/// A continuous pull that restarts itself. `next` is cancel-safe: a message is only taken
/// from the underlying stream when it is returned.
pub struct Pull {
    consumer: PullConsumer,
    /// Names the consumer in logs ("job events", "requests").
    what: &'static str,
    stream: Option<Stream>,
    /// When the next start may be tried, after a failed or lost one.
    restart_at: Option<Instant>,
    restart_delay: Duration,
    /// Restarts since the last delivered message, for logs.
    restarts: u32,
}

impl Pull {
    /// Starts pulling from `consumer`; fails only if the very first pull cannot be set up.
    pub async fn new(consumer: PullConsumer, what: &'static str) -> Result<Pull, StreamError> {
        let stream = start(&consumer).await?;
        Ok(Pull {
            consumer,
            what,
            stream: Some(stream),
            restart_at: None,
            restart_delay: FIRST_RESTART_DELAY,
            restarts: 0,
        })
    }

    /// The next message. Never ends: errors are logged, and a pull that cannot deliver any
    /// more is started again, with a growing pause while starting fails.
    pub async fn next(&mut self) -> jetstream::Message {
        loop {
            let Some(stream) = self.stream.as_mut() else {
                if let Some(at) = self.restart_at {
                    tokio::time::sleep_until(at).await;
                }
                match start(&self.consumer).await {
                    Ok(stream) => {
                        self.stream = Some(stream);
                        self.restart_at = None;
                    }
                    Err(err) => {
                        tracing::warn!("{}: cannot start pulling again: {err}", self.what);
                        self.schedule_restart();
                    }
                }
                continue;
            };
            match stream.next().await {
                Some(Ok(message)) => {
                    if self.restarts > 0 {
                        tracing::info!(
                            "{}: receiving again after {} restarts of the pull",
                            self.what,
                            self.restarts
                        );
                        self.restarts = 0;
                    }
                    self.restart_delay = FIRST_RESTART_DELAY;
                    return message;
                }
                Some(Err(err)) if must_restart(err.kind()) => {
                    self.restarts += 1;
                    // The first and then every tenth: a long election says so every half minute.
                    if self.restarts == 1 || self.restarts.is_multiple_of(10) {
                        tracing::warn!(
                            "{}: {err}; pulling again (restart {})",
                            self.what,
                            self.restarts
                        );
                    }
                    self.stream = None;
                    self.schedule_restart();
                }
                Some(Err(err)) => tracing::warn!("{}: {err}", self.what),
                None => {
                    tracing::warn!("{}: the pull ended; pulling again", self.what);
                    self.stream = None;
                    self.schedule_restart();
                }
            }
        }
    }

    /// Hands back, unhandled, every message already pulled to this process but not yet
    /// returned by [`Pull::next`] (negative acknowledgements), and stops pulling. Whoever reads
    /// the consumer next gets them at once; left alone they would wait for the consumer's
    /// acknowledgement wait. Returns how many went back.
    pub async fn give_back(&mut self) -> usize {
        let Some(mut stream) = self.stream.take() else {
            return 0;
        };
        let mut pulled = Vec::new();
        while let Some(Some(next)) = stream.next().now_or_never() {
            if let Ok(message) = next {
                pulled.push(message);
            }
        }
        // The pull's own request goes first: the server redelivers a message handed back at
        // once, and while that request still waits there it would get it again, unread.
        // Unsubscribing before the first negative acknowledgement (in order, on the same
        // connection) leaves the server no one but the next reader.
        drop(stream);
        let mut given_back = 0;
        for message in pulled {
            match message.ack_with(AckKind::Nak(None)).await {
                Ok(()) => given_back += 1,
                Err(err) => tracing::warn!("{}: cannot hand a message back: {err}", self.what),
            }
        }
        given_back
    }

    fn schedule_restart(&mut self) {
        self.restart_at = Some(Instant::now() + self.restart_delay);
        self.restart_delay = (self.restart_delay * 2).min(MAX_RESTART_DELAY);
    }
}
