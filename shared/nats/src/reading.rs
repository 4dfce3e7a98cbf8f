//! Reading a stream's messages through short-lived ordered consumers: the last message of
//! every subject (the latest records of a KV bucket, each node's last heartbeat), or every
//! message since a time (history); a KV bucket looked up through an election, and whether a
//! message is a deletion. Every reader here tries again where a NATS cluster that
//! lost a server fails a request for a moment, and starts over where it loses its consumer.

use async_nats::jetstream::{self, consumer, kv, stream};
use futures::StreamExt;

use crate::error::StateError;
use mgpu_protocol::ids::JobId;

/// How long one try to create a reader (an ordered consumer, a KV watch) may take.
const READER_TRY: std::time::Duration = std::time::Duration::from_secs(1);
/// Tries to create a reader before giving up.
pub(crate) const READER_TRIES: u32 = 10;

/// Runs `create` (which makes an ephemeral reader: an ordered consumer, a KV watch) until it
/// answers within [`READER_TRY`], at most [`READER_TRIES`] times. In a NATS cluster with a
/// server down, the server may place such a consumer on the missing one, and the request
/// then times out (nats-io/natscli#1067); the next try lands elsewhere.
pub async fn create_reader<T, E, F, Fut>(what: &str, mut create: F) -> Result<T, StateError>
where
    E: std::fmt::Display,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let mut last = String::new();
    for _ in 0..READER_TRIES {
        match tokio::time::timeout(READER_TRY, create()).await {
            Ok(Ok(reader)) => return Ok(reader),
            Ok(Err(err)) => {
                let text = err.to_string();
                // A refusal (stream missing, bad request) will not change on a retry; JetStream
                // "temporarily unavailable" (10008, a cluster that lost a server re-electing
                // its leaders) will.
                let passing = ["timed out", "no responders", "temporarily unavailable"];
                if !passing.iter().any(|why| text.contains(why)) {
                    return Err(StateError::JetStream(format!("{what}: {text}")));
                }
                last = text;
                // An answer that came at once comes again at once: give the election a moment.
                tokio::time::sleep(READER_TRY / 4).await;
            }
            Err(_) => last = format!("no answer within {READER_TRY:?}"),
        }
    }
    Err(StateError::JetStream(format!(
        "{what}: {last} ({READER_TRIES} tries)"
    )))
}

/// How long a read of the latest records may wait for its next message, while the consumer
/// says more are due, before it starts over with a new consumer.
const READ_STALL: std::time::Duration = std::time::Duration::from_secs(5);
/// The same for its first message, on a read's first try. A consumer made just as its stream's
/// leader changed can be gone before it delivers anything (its pull unanswered): `mgpu queue`
/// after a fault campaign waited the whole READ_STALL for one, once in five tries. The tries
/// after it wait READ_STALL, so a server merely slow to start delivering costs one more try,
/// not a failed read.
const FIRST_DELIVERY_STALL: std::time::Duration = std::time::Duration::from_secs(1);
/// Reads started before giving up.
const READ_ATTEMPTS: u32 = 5;

/// The last message of every subject matching `filter` in `stream_name`, oldest subject first.
/// Returns at once when the stream holds nothing.
pub async fn last_per_subject(
    js: &jetstream::Context,
    stream_name: &str,
    filter: &str,
    headers_only: bool,
) -> Result<Vec<jetstream::Message>, StateError> {
    let mut out = Vec::new();
    for_each_last_per_subject(js, stream_name, filter, headers_only, |delivery| {
        match delivery {
            Delivery::Message(message, left) => {
                out.reserve(usize::try_from(left).unwrap_or(0).saturating_add(1));
                out.push(message);
            }
            Delivery::StartOver => out.clear(),
        }
        Ok(())
    })
    .await?;
    Ok(latest_of_each(out, |message| message.subject.as_str()))
}

/// `items`, in their order, less each one a later item of the same key replaces. A read goes
/// on until its consumer has nothing left, so a subject written during it (a node's next
/// heartbeat, a rewritten record) comes twice: once as it was, once at the stream's end.
fn latest_of_each<T>(items: Vec<T>, key: impl Fn(&T) -> &str) -> Vec<T> {
    let keep: Vec<bool> = {
        let mut seen = std::collections::HashSet::with_capacity(items.len());
        // From the newest back: the first of a key met is its latest.
        let mut keep: Vec<bool> = items
            .iter()
            .rev()
            .map(|item| seen.insert(key(item)))
            .collect();
        keep.reverse();
        keep
    };
    if keep.iter().all(|kept| *kept) {
        return items;
    }
    items
        .into_iter()
        .zip(keep)
        .filter_map(|(item, kept)| kept.then_some(item))
        .collect()
}

/// What [`for_each_last_per_subject`] hands its reader.
// Moved straight into the reader's callback and never stored: boxing the message would only
// add an allocation for each of up to 100 000 records.
#[allow(clippy::large_enum_variant)]
pub enum Delivery {
    /// The next message, and how many are still to come after it.
    Message(jetstream::Message, u64),
    /// The read starts over from the first message: forget what came so far.
    StartOver,
}

/// [`last_per_subject`], handing each message to `each` as it arrives instead of collecting
/// them: a reader of many large records decodes them while the rest are on their way, and
/// never holds every raw message at once. Stops at the first error `each` returns.
///
/// A read whose consumer is lost (its server died) starts over with a new one, after
/// [`Delivery::StartOver`]. It is not left to async-nats's own recovery of an ordered consumer,
/// which goes on from the last stream sequence seen: that delivers every later message,
/// older revisions of later subjects included, not the last per subject; and a user may not
/// delete consumers, which that recovery tries first.
pub async fn for_each_last_per_subject(
    js: &jetstream::Context,
    stream_name: &str,
    filter: &str,
    headers_only: bool,
    each: impl FnMut(Delivery) -> Result<(), StateError>,
) -> Result<(), StateError> {
    let stream = look_up(js, stream_name).await?;
    for_each_last_per_subject_in(&stream, filter, headers_only, each).await
}

/// [`for_each_last_per_subject`] in a stream already looked up ([`look_up`]): a caller that
/// must read something else first overlaps the lookup with it.
pub async fn for_each_last_per_subject_in(
    stream: &stream::Stream,
    filter: &str,
    headers_only: bool,
    each: impl FnMut(Delivery) -> Result<(), StateError>,
) -> Result<(), StateError> {
    let (filter, deliver) = last_per_subject_read(&stream.cached_info().config, filter);
    let plan = ReadPlan {
        filter,
        headers_only,
        deliver,
        // A whole bucket read: records rewritten meanwhile must not go missing.
        confirm_end: filter.is_empty(),
    };
    for_each_delivered(stream, plan, each).await
}

/// The filter and delivery a read of the last message per subject asks the server for.
///
/// Where the stream keeps one message per subject (a KV bucket with a history of one) and the
/// filter is the stream's only subject, every message stored is already the last of its
/// subject: reading them all, unfiltered, delivers the same messages. The server then neither
/// works out each subject's last sequence first nor matches every message against the filter,
/// which was much of its work for `mgpu queue`'s thousand records.
fn last_per_subject_read<'a>(
    config: &stream::Config,
    filter: &'a str,
) -> (&'a str, consumer::DeliverPolicy) {
    let whole_stream = config.max_messages_per_subject == 1
        && matches!(config.subjects.as_slice(), [only] if only == filter);
    if whole_stream {
        ("", consumer::DeliverPolicy::All)
    } else {
        (filter, consumer::DeliverPolicy::LastPerSubject)
    }
}

/// Maps a failed stream lookup to [`StateError::NotSetUp`] when the stream is missing.
pub fn stream_lookup_error(err: impl std::fmt::Display) -> StateError {
    let text = err.to_string();
    if text.contains("stream not found") || text.contains("10059") {
        StateError::NotSetUp
    } else {
        StateError::JetStream(text)
    }
}

/// A stream, looked up by name; a missing one is [`StateError::NotSetUp`].
pub async fn look_up(
    js: &jetstream::Context,
    stream_name: &str,
) -> Result<stream::Stream, StateError> {
    js.get_stream(stream_name)
        .await
        .map_err(stream_lookup_error)
}

/// The messages of `stream_name` on `filter` stored at or after `since` (every one when
/// None), handed to `each` as they arrive, as [`for_each_last_per_subject`] does.
pub async fn for_each_since(
    js: &jetstream::Context,
    stream_name: &str,
    filter: &str,
    since: Option<mgpu_protocol::Timestamp>,
    each: impl FnMut(Delivery) -> Result<(), StateError>,
) -> Result<(), StateError> {
    let nanos = since.and_then(|t| t.timestamp_nanos_opt()).map(i128::from);
    let deliver = match nanos.and_then(|n| time::OffsetDateTime::from_unix_timestamp_nanos(n).ok())
    {
        Some(start_time) => consumer::DeliverPolicy::ByStartTime { start_time },
        None => consumer::DeliverPolicy::All,
    };
    let stream = look_up(js, stream_name).await?;
    let plan = ReadPlan {
        filter,
        headers_only: false,
        deliver,
        // Messages are only added after the start (the history, the audit trail): what is
        // added after the consumer said it was done comes after the read.
        confirm_end: false,
    };
    for_each_delivered(&stream, plan, each).await
}

/// What one read asks of the server, and how it knows it is done.
#[derive(Clone, Copy)]
struct ReadPlan<'a> {
    /// Empty: the whole stream.
    filter: &'a str,
    headers_only: bool,
    deliver: consumer::DeliverPolicy,
    /// Whether an end the consumer reports is checked with the stream when the stream changed
    /// during the read ([`Tally`]).
    confirm_end: bool,
}

async fn for_each_delivered(
    stream: &stream::Stream,
    plan: ReadPlan<'_>,
    mut each: impl FnMut(Delivery) -> Result<(), StateError>,
) -> Result<(), StateError> {
    let stream_name = &stream.cached_info().config.name;
    let mut why = String::new();
    for attempt in 0..READ_ATTEMPTS {
        if attempt == 1 {
            // The first try's short wait for a first message ends this way during any leader
            // change: not worth a line on a user's terminal.
            tracing::debug!("reading {stream_name} starts over: {why}");
        } else if attempt > 1 {
            tracing::warn!("reading {stream_name} starts over: {why}");
        }
        if attempt > 0 {
            each(Delivery::StartOver)?;
        }
        let first_stall = if attempt == 0 {
            FIRST_DELIVERY_STALL
        } else {
            READ_STALL
        };
        match read_delivered(stream, plan, first_stall, &mut each).await? {
            Read::Done => return Ok(()),
            Read::Lost(reason) => why = reason,
        }
    }
    Err(StateError::JetStream(format!(
        "reading {stream_name}: {why} ({READ_ATTEMPTS} tries)"
    )))
}

/// How one read of [`for_each_last_per_subject`] ended.
enum Read {
    Done,
    /// The consumer stopped delivering, or was replaced: start over.
    Lost(String),
}

/// One try of a read; `first_stall` is how long it waits for the first message.
async fn read_delivered(
    stream: &stream::Stream,
    plan: ReadPlan<'_>,
    first_stall: std::time::Duration,
    each: &mut impl FnMut(Delivery) -> Result<(), StateError>,
) -> Result<Read, StateError> {
    let consumer = create_reader("reading the latest records", || {
        stream.create_consumer(consumer::pull::OrderedConfig {
            // Named, so the request names its filter (`CONSUMER.CREATE.<stream>.<name>.<filter>`)
            // and the server's permissions can limit what a reader may filter on: a user
            // reads their own history only.
            name: Some(format!("mgpu-read-{}", JobId::random())),
            deliver_policy: plan.deliver,
            filter_subject: plan.filter.to_owned(),
            headers_only: plan.headers_only,
            ..Default::default()
        })
    })
    .await?;
    // The answer to the creation already says how many messages wait: no second round trip.
    let mut tally = Tally::new(
        consumer.cached_info().num_pending,
        stream.cached_info().state.last_sequence,
    );
    if tally.initial == 0 {
        return Ok(Read::Done);
    }
    let mut messages = match consumer.messages().await {
        Ok(messages) => messages,
        Err(err) => return Ok(Read::Lost(err.to_string())),
    };
    // async-nats replaces a lost ordered consumer by itself, and the replacement numbers its
    // deliveries from 1 again: a number out of turn means this read's consumer is gone.
    let mut expected = 1;
    loop {
        let stall = if expected == 1 {
            first_stall
        } else {
            READ_STALL
        };
        let message = match tokio::time::timeout(stall, messages.next()).await {
            Err(_) => return Ok(Read::Lost(format!("no message for {stall:?}"))),
            Ok(None) => return Ok(Read::Lost("the consumer ended".to_owned())),
            Ok(Some(Err(err))) => return Ok(Read::Lost(err.to_string())),
            Ok(Some(Ok(message))) => message,
        };
        let info = message.info().map_err(StateError::jetstream)?;
        let (sequence, left) = (info.consumer_sequence, info.pending);
        if sequence != expected {
            return Ok(Read::Lost(format!(
                "the consumer was replaced (delivery {sequence}, {expected} expected)"
            )));
        }
        expected += 1;
        tally.delivered(info.stream_sequence);
        each(Delivery::Message(message, left))?;
        if left == 0
            && (!plan.confirm_end
                || tally.undisturbed()
                || nothing_after(stream, tally.last_delivered).await)
        {
            return Ok(Read::Done);
        }
    }
}

/// What a read delivered, against what its stream held when it began.
///
/// A consumer's count of what is left can lag a rewrite: a KV put that replaces a record not
/// yet delivered removes the old revision and appends the new one, and the count may drop
/// for the removal before it rises for the arrival. A read that stopped at that zero would
/// miss the record. It can stop at once when it delivered exactly what its consumer counted
/// at creation, none of it stored after the stream was looked up: a record replaced before its
/// delivery would have left it one short.
struct Tally {
    /// Messages the consumer had to deliver when it was made.
    initial: u64,
    /// The stream's last sequence when it was looked up (before the consumer was made).
    last_at_lookup: u64,
    count: u64,
    last_delivered: u64,
}

impl Tally {
    fn new(initial: u64, last_at_lookup: u64) -> Tally {
        Tally {
            initial,
            last_at_lookup,
            count: 0,
            last_delivered: 0,
        }
    }

    fn delivered(&mut self, stream_sequence: u64) {
        self.count += 1;
        self.last_delivered = self.last_delivered.max(stream_sequence);
    }

    /// Whether nothing written during the read can be missing from it.
    fn undisturbed(&self) -> bool {
        self.count == self.initial && self.last_delivered <= self.last_at_lookup
    }
}

/// Whether the stream holds nothing after `sequence`: asked of the stream itself (one direct
/// get) where a read was disturbed ([`Tally`]). Where it cannot tell, the consumer's count is
/// believed, as a read without the check would.
async fn nothing_after(stream: &stream::Stream, sequence: u64) -> bool {
    match stream
        .direct_get_next_for_subject(">", Some(sequence.saturating_add(1)))
        .await
    {
        Ok(_) => false,
        Err(err) => {
            if err.kind() != stream::DirectGetErrorKind::NotFound {
                tracing::debug!("cannot tell whether a read is complete: {err}");
            }
            true
        }
    }
}

/// Header JetStream's KV layer puts on deletions.
const KV_OPERATION: &str = "KV-Operation";

/// A KV bucket, asked again while its stream elects a leader and cannot answer.
pub(crate) async fn bucket(js: &jetstream::Context, name: &str) -> Result<kv::Store, StateError> {
    let mut tries = 0;
    loop {
        match js.get_key_value(name).await {
            Ok(store) => return Ok(store),
            Err(err) => {
                let text = err.to_string();
                tries += 1;
                if tries >= READER_TRIES || !text.contains("timed out") {
                    return Err(stream_lookup_error(text));
                }
                tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            }
        }
    }
}

pub(crate) fn is_deletion(message: &jetstream::Message) -> bool {
    message
        .headers
        .as_ref()
        .and_then(|h| h.get(KV_OPERATION))
        .is_some_and(|op| op.as_str() != "PUT")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(subjects: &[&str], per_subject: i64) -> stream::Config {
        stream::Config {
            name: "KV_b".into(),
            subjects: subjects.iter().map(|s| (*s).to_owned()).collect(),
            max_messages_per_subject: per_subject,
            ..Default::default()
        }
    }

    #[test]
    fn a_stream_of_one_revision_per_subject_is_read_whole_when_the_filter_is_all_of_it() {
        let bucket = config(&["$KV.b.>"], 1);
        let (filter, deliver) = last_per_subject_read(&bucket, "$KV.b.>");
        assert_eq!((filter, deliver), ("", consumer::DeliverPolicy::All));
    }

    #[test]
    fn otherwise_the_server_picks_the_last_per_subject() {
        let last = consumer::DeliverPolicy::LastPerSubject;
        // Part of the stream only.
        let bucket = config(&["$KV.b.>"], 1);
        assert_eq!(
            last_per_subject_read(&bucket, "$KV.b.node.*"),
            ("$KV.b.node.*", last)
        );
        // Older revisions kept: reading all would deliver them too.
        let history = config(&["$KV.b.>"], 5);
        assert_eq!(
            last_per_subject_read(&history, "$KV.b.>"),
            ("$KV.b.>", last)
        );
        // No limit per subject.
        let unlimited = config(&["$KV.b.>"], -1);
        assert_eq!(
            last_per_subject_read(&unlimited, "$KV.b.>"),
            ("$KV.b.>", last)
        );
        // A stream of several subjects.
        let several = config(&["a.>", "b.>"], 1);
        assert_eq!(last_per_subject_read(&several, "a.>"), ("a.>", last));
    }

    #[test]
    fn a_read_is_undisturbed_only_when_it_got_what_was_there_and_nothing_newer() {
        // Three records, the stream's last sequence 7 when looked up.
        let read = |sequences: &[u64]| {
            let mut tally = Tally::new(3, 7);
            for &sequence in sequences {
                tally.delivered(sequence);
            }
            tally.undisturbed()
        };
        assert!(read(&[2, 5, 7]));
        // The record at 5 was rewritten (now 8) before its turn: one short, so ask the stream.
        assert!(!read(&[2, 7]));
        // ... and once its new revision came, it is newer than the lookup.
        assert!(!read(&[2, 7, 8]));
        // A record added after the lookup came in place of one rewritten.
        assert!(!read(&[2, 5, 9]));
    }

    #[test]
    fn the_latest_of_each_key_is_kept_in_its_place() {
        let read = vec![("a", 1), ("b", 1), ("c", 1), ("a", 2), ("b", 2), ("a", 3)];
        let latest = latest_of_each(read, |(key, _)| key);
        assert_eq!(latest, [("c", 1), ("b", 2), ("a", 3)]);
        let once_each = vec![("a", 1), ("b", 1)];
        assert_eq!(latest_of_each(once_each.clone(), |(key, _)| key), once_each);
    }
}
