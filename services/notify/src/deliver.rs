//! Notices out to destinations: the durable consumer `notify-notices` on `MGPU_NOTICES`, one
//! notice at a time, to each destination of its owner that has not had it (a mark in
//! `mgpu-notify-sent` per owner, destination and notice), within each destination's throttle.
//!
//! A notice is acknowledged once every destination has had it, been refused it for good, or
//! holds it for a summary; a delivery that may pass later is retried by a negative
//! acknowledgement with a growing delay, so retries survive a restart too. A mark is written
//! right after the receiver accepted the notice and before the next one is sent: killed at
//! any point, the service sends again only a notice no receiver had accepted.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use async_nats::jetstream::{self, AckKind, consumer, kv};

use mgpu_nats::pull::Pull;
use mgpu_protocol::idle::{Notice, NoticeKind};
use mgpu_protocol::notify::destination::{Destination, parse_url};
use mgpu_protocol::notify::{MAX_NOTICE_BYTES, NOTICES_CONSUMER, NOTICES_STREAM, wanted_by};

use crate::config::NotifySettings;
use crate::deliver_error::DeliveryError;
use crate::destinations::Destinations;
use crate::render::{self, Outgoing};
use crate::throttle::Throttle;
use crate::{http, sign, smtp};

/// How long one delivery may take.
const SEND_TIMEOUT: Duration = Duration::from_secs(10);
/// Tries of a notice before it is given up (the last ones hours apart).
const MAX_DELIVERIES: i64 = 20;
/// The longest pause between two tries.
const MAX_BACKOFF: Duration = Duration::from_secs(600);
/// How long a delivered notice may stay unacknowledged before JetStream delivers it again.
const ACK_WAIT: Duration = Duration::from_secs(15);

/// Creates (or finds) the durable consumer of notices, from those stored from now on when new.
pub async fn consumer(js: &jetstream::Context) -> Result<consumer::PullConsumer> {
    let stream = js
        .get_stream(NOTICES_STREAM)
        .await
        .context("the notices stream")?;
    let config = consumer::pull::Config {
        durable_name: Some(NOTICES_CONSUMER.to_owned()),
        deliver_policy: consumer::DeliverPolicy::New,
        ack_policy: consumer::AckPolicy::Explicit,
        // Short, so a notice a killed service was sending goes out again soon after its
        // restart; one held for a summary is kept alive by progress acknowledgements.
        ack_wait: ACK_WAIT,
        max_ack_pending: 10_000,
        ..Default::default()
    };
    stream
        .get_or_create_consumer(NOTICES_CONSUMER, config)
        .await
        .context("creating the notices consumer")
}

/// Notices a throttled destination has not had, waiting for its summary.
struct Held {
    owner: String,
    destination: Destination,
    /// Each notice's id, the notice, and the stream sequence of its message.
    notices: Vec<(String, Notice, u64)>,
}

pub struct Deliverer {
    js: jetstream::Context,
    sent: kv::Store,
    destinations: Destinations,
    settings: NotifySettings,
    throttle: Throttle,
    /// By `<owner>.<destination id>`.
    held: HashMap<String, Held>,
    /// Messages acknowledged once their held notices went: by stream sequence, with how many
    /// destinations still hold it.
    waiting: HashMap<u64, (jetstream::Message, usize)>,
    /// When the waiting messages were last said to be in progress.
    progress_at: Instant,
}

/// One delivery's outcome for the message it came of.
#[derive(Default)]
struct Tally {
    retry: bool,
    held: usize,
}

impl Deliverer {
    pub fn new(
        js: jetstream::Context,
        sent: kv::Store,
        destinations: Destinations,
        settings: NotifySettings,
    ) -> Deliverer {
        Deliverer {
            throttle: Throttle::new(settings.max_per_minute, settings.window),
            js,
            sent,
            destinations,
            settings,
            held: HashMap::new(),
            waiting: HashMap::new(),
            progress_at: Instant::now(),
        }
    }

    /// Delivers for ever; summaries go out as their destinations' windows make room.
    pub async fn run(mut self, consumer: consumer::PullConsumer) -> Result<()> {
        let mut pull = Pull::new(consumer, "notices").await?;
        let mut tick = tokio::time::interval(Duration::from_millis(500));
        loop {
            tokio::select! {
                message = pull.next() => self.on_message(message).await,
                _ = tick.tick() => self.flush().await,
            }
        }
    }

    async fn on_message(&mut self, message: jetstream::Message) {
        let (sequence, delivered) = message
            .info()
            .map(|i| (i.stream_sequence, i.delivered))
            .unwrap_or((0, 1));
        tracing::debug!(sequence, delivered, "a notice to deliver");
        let Some((owner, id, notice)) = parse(&message, sequence) else {
            return acknowledge(&message, AckKind::Ack).await;
        };
        let tally = match self.wanted(&owner, &notice).await {
            Ok(true) => self.deliver_each(&owner, &id, &notice, sequence).await,
            Ok(false) => Tally::default(),
            Err(err) => {
                tracing::warn!(notice = %id, "reading the job of a notice: {err:#}");
                Tally {
                    retry: true,
                    held: 0,
                }
            }
        };
        if tally.retry && delivered < MAX_DELIVERIES {
            let exponent = u32::try_from(delivered.clamp(1, 20) - 1).unwrap_or(0);
            let delay = Duration::from_secs(1u64 << exponent).min(MAX_BACKOFF);
            return acknowledge(&message, AckKind::Nak(Some(delay))).await;
        }
        if tally.retry {
            tracing::error!(notice = %id, "giving up a notice after {delivered} tries");
        }
        if tally.held > 0 && !tally.retry {
            self.waiting.insert(sequence, (message, tally.held));
        } else {
            acknowledge(&message, AckKind::Ack).await;
        }
    }

    /// Whether the owner asked for `notice`: the scheduler's idle notices go to those whose
    /// job asked for `idle`; the rest were made for the owner already (or by them).
    async fn wanted(&self, owner: &str, notice: &Notice) -> Result<bool> {
        let idle = matches!(
            notice.kind,
            NoticeKind::IdleWarning { .. }
                | NoticeKind::IdleCleared
                | NoticeKind::IdleReclaimed { .. }
        );
        if !idle {
            return Ok(true);
        }
        let Some(job) = &notice.job else {
            return Ok(false);
        };
        let record = mgpu_nats::records::get_job(&self.js, job).await?;
        Ok(record.is_some_and(|r| {
            r.user_key.as_deref() == Some(owner) && wanted_by(&notice.kind, &r.spec.notify)
        }))
    }

    /// Sends `notice` to each of `owner`'s destinations that has not had it.
    async fn deliver_each(
        &mut self,
        owner: &str,
        id: &str,
        notice: &Notice,
        sequence: u64,
    ) -> Tally {
        let mut tally = Tally::default();
        let entries = match self.destinations.of(&self.js, owner).await {
            Ok(entries) => entries,
            Err(err) => {
                tracing::warn!(notice = id, "{err}; will retry");
                tally.retry = true;
                return tally;
            }
        };
        for (dest_id, destination) in &entries.destinations {
            let key = format!("{owner}.{dest_id}");
            let mark = format!("{key}.{id}");
            match self.sent.get(&mark).await {
                Ok(Some(_)) => continue,
                Ok(None) => {}
                Err(err) => {
                    tracing::warn!("reading a sent mark: {err}");
                    tally.retry = true;
                    continue;
                }
            }
            if let Err(err) = destination.validate() {
                tracing::warn!(
                    owner,
                    destination = dest_id,
                    "skipping a destination: {err}"
                );
                continue;
            }
            let now = Instant::now();
            if self.held.contains_key(&key) || !self.throttle.has_room(&key, now) {
                self.hold(&key, owner, destination, id, notice, sequence);
                tally.held += 1;
                continue;
            }
            self.throttle.record(&key, now);
            let outgoing = Outgoing::single(id.to_owned(), owner.to_owned(), notice.clone());
            let sent = self
                .send(destination, entries.secret.as_deref(), &outgoing)
                .await;
            tracing::debug!(
                notice = id,
                destination = dest_id,
                ok = sent.is_ok(),
                "sent"
            );
            if self.settle(&mark, dest_id, sent).await {
                tally.retry = true;
            }
        }
        tally
    }

    /// Marks a delivery done (or refused for good); true when it is to be tried again.
    async fn settle(&self, mark: &str, dest_id: &str, sent: Result<(), DeliveryError>) -> bool {
        match sent {
            Ok(()) => self.mark(mark, "sent").await,
            Err(err) if err.retry => {
                tracing::warn!(destination = dest_id, "delivery failed, will retry: {err}");
                return true;
            }
            Err(err) => {
                tracing::warn!(
                    destination = dest_id,
                    "delivery refused, not retried: {err}"
                );
                self.mark(mark, "refused").await;
            }
        }
        false
    }

    fn hold(&mut self, key: &str, owner: &str, dest: &Destination, id: &str, n: &Notice, seq: u64) {
        let held = self.held.entry(key.to_owned()).or_insert_with(|| Held {
            owner: owner.to_owned(),
            destination: dest.clone(),
            notices: Vec::new(),
        });
        if !held.notices.iter().any(|(known, _, _)| known == id) {
            held.notices.push((id.to_owned(), n.clone(), seq));
        }
    }

    /// Sends each held summary whose destination has room again.
    async fn flush(&mut self) {
        let now = Instant::now();
        if now.saturating_duration_since(self.progress_at) >= ACK_WAIT / 3 {
            self.progress_at = now;
            for (message, _) in self.waiting.values() {
                acknowledge(message, AckKind::Progress).await;
            }
        }
        let keys: Vec<String> = self.held.keys().cloned().collect();
        for key in keys {
            if !self.throttle.has_room(&key, now) {
                continue;
            }
            let Some(held) = self.held.remove(&key) else {
                continue;
            };
            self.throttle.record(&key, now);
            let secret = match self.destinations.of(&self.js, &held.owner).await {
                Ok(entries) => entries.secret,
                Err(err) => {
                    tracing::warn!("a summary waits: {err}");
                    self.held.insert(key, held);
                    continue;
                }
            };
            let outgoing = summary_of(&held);
            let sent = self
                .send(&held.destination, secret.as_deref(), &outgoing)
                .await;
            if let Err(err) = &sent
                && err.retry
            {
                tracing::warn!("a summary could not be sent, will retry: {err}");
                self.held.insert(key, held);
                continue;
            }
            let value = if sent.is_ok() {
                "summarised"
            } else {
                "refused"
            };
            for (id, _, sequence) in &held.notices {
                self.mark(&format!("{key}.{id}"), value).await;
                self.release(*sequence).await;
            }
        }
    }

    /// One destination no longer holds the message at `sequence`: acknowledged when none does.
    async fn release(&mut self, sequence: u64) {
        let done = match self.waiting.get_mut(&sequence) {
            Some((_, left)) => {
                *left = left.saturating_sub(1);
                *left == 0
            }
            None => false,
        };
        if done && let Some((message, _)) = self.waiting.remove(&sequence) {
            acknowledge(&message, AckKind::Ack).await;
        }
    }

    /// Records that `mark` went (tried three times: a lost mark could mean a second copy).
    async fn mark(&self, mark: &str, value: &'static str) {
        for _ in 0..3 {
            match self.sent.put(mark, value.into()).await {
                Ok(_) => return,
                Err(err) => tracing::warn!("writing a sent mark: {err}"),
            }
        }
    }

    /// One delivery to one destination.
    async fn send(
        &self,
        destination: &Destination,
        secret: Option<&str>,
        outgoing: &Outgoing,
    ) -> Result<(), DeliveryError> {
        if let Destination::Email { address } = destination {
            let Some(relay) = &self.settings.smtp else {
                return Err(DeliveryError::permanent(
                    "no SMTP relay: set `smtp` in [notify] of the config file".to_owned(),
                ));
            };
            let (subject, body) = render::mail(outgoing);
            let mail = smtp::Mail {
                from: &self.settings.from,
                to: address,
                subject: &subject,
                body: &body,
                id: &outgoing.id,
            };
            return smtp::send(relay, &mail, SEND_TIMEOUT).await;
        }
        let url =
            parse_url(destination.target()).map_err(|e| DeliveryError::permanent(e.to_string()))?;
        let body = render::http_body(destination, outgoing)
            .ok_or_else(|| DeliveryError::permanent("nothing to send".to_owned()))?;
        let mut headers = vec![("X-Mgpu-Notice-Id", outgoing.id.clone())];
        if let Some(secret) = secret {
            headers.push((sign::SIGNATURE_HEADER, sign::signature(secret, &body)));
        }
        http::post(&url, &body, &headers, SEND_TIMEOUT).await
    }
}

/// The delivery of what `held` holds: the notice itself when it is one, else a summary.
fn summary_of(held: &Held) -> Outgoing {
    let owner = held.owner.clone();
    match held.notices.as_slice() {
        [(id, notice, _)] => Outgoing::single(id.clone(), owner, notice.clone()),
        notices => {
            let first = notices
                .first()
                .map(|(id, _, _)| id.as_str())
                .unwrap_or("none");
            let id = format!("summary-{first}-{}", notices.len());
            Outgoing::summary(
                id,
                owner,
                notices.iter().map(|(_, n, _)| n.clone()).collect(),
            )
        }
    }
}

/// The owner (from the subject), the notice's id and the notice; None for what is no notice.
fn parse(message: &jetstream::Message, sequence: u64) -> Option<(String, String, Notice)> {
    if message.payload.len() > MAX_NOTICE_BYTES {
        return None;
    }
    let mut parts = message.subject.as_str().split('.');
    let owner = match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some("users"), Some(owner), Some("notices"), None) => owner,
        _ => return None,
    };
    let notice = serde_json::from_slice::<Notice>(&message.payload).ok()?;
    let given = message
        .headers
        .as_ref()
        .and_then(|h| h.get("Nats-Msg-Id"))
        .map(|v| v.as_str().to_owned());
    Some((
        owner.to_owned(),
        notice_id(given.as_deref(), sequence),
        notice,
    ))
}

/// The notice's id as its publisher named it (a KV-key-safe token), else from its sequence.
fn notice_id(given: Option<&str>, sequence: u64) -> String {
    match given {
        Some(id)
            if !id.is_empty()
                && id.len() <= 128
                && id
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') =>
        {
            id.to_owned()
        }
        _ => format!("n{sequence}"),
    }
}

async fn acknowledge(message: &jetstream::Message, kind: AckKind) {
    if let Err(err) = message.ack_with(kind).await {
        tracing::warn!("acknowledging a notice: {err}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_the_publishers_when_safe() {
        assert_eq!(notice_id(Some("abc-1-start"), 9), "abc-1-start");
        assert_eq!(notice_id(Some("a.b"), 9), "n9");
        assert_eq!(notice_id(Some(""), 9), "n9");
        assert_eq!(notice_id(None, 12), "n12");
    }
}
