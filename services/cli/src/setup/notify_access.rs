//! The server-side permissions notifications need: the `mgpu-notify` service's own (least
//! privilege: its two durable consumers, the job records, the destinations it reads, the sent
//! marks it writes, notices it publishes) and what users gain (their own destinations and
//! secret, their own notices for `mgpu notify test`). `super::auth` puts them into each role's
//! permissions; this file only names subjects, so the two do not import each other.
//!
//! A user's destinations are private by the server's rules alone: their entries live under
//! their own public key in the bucket, and every subject a user may use to read or write the
//! bucket names that key (a direct get names the entry; a consumer's create request names its
//! filter), as `mgpu-job-env` is kept.

use mgpu_protocol::notify::{
    DESTINATIONS_BUCKET_STREAM, EVENTS_CONSUMER, NOTICES_CONSUMER, NOTICES_STREAM, SENT_BUCKET,
    SENT_BUCKET_STREAM, user_entries,
};
use mgpu_protocol::subjects;

/// What `mgpu-notify` may publish: creating its stream and buckets, its durable consumers
/// (pulled and acknowledged), reading job records and every destination, writing sent marks,
/// and publishing notices.
pub fn service_publish() -> Vec<String> {
    let mut publish = vec![
        "$JS.API.INFO".to_owned(),
        "$JS.FC.>".to_owned(),
        subjects::ALL_NOTICES.to_owned(),
        format!("$KV.{SENT_BUCKET}.>"),
        // A job not in the bucket yet is looked for among pending submissions, as users may.
        "$JS.API.STREAM.INFO.MGPU_REQUESTS".to_owned(),
        "$JS.API.DIRECT.GET.MGPU_REQUESTS".to_owned(),
        "$JS.API.DIRECT.GET.MGPU_REQUESTS.>".to_owned(),
    ];
    for stream in [
        NOTICES_STREAM,
        DESTINATIONS_BUCKET_STREAM,
        SENT_BUCKET_STREAM,
    ] {
        publish.extend([
            format!("$JS.API.STREAM.CREATE.{stream}"),
            format!("$JS.API.STREAM.UPDATE.{stream}"),
        ]);
    }
    for (stream, consumer) in [
        (subjects::EVENTS_STREAM, EVENTS_CONSUMER),
        (NOTICES_STREAM, NOTICES_CONSUMER),
    ] {
        publish.extend([
            format!("$JS.API.STREAM.INFO.{stream}"),
            format!("$JS.API.CONSUMER.CREATE.{stream}.{consumer}"),
            format!("$JS.API.CONSUMER.CREATE.{stream}.{consumer}.>"),
            format!("$JS.API.CONSUMER.INFO.{stream}.{consumer}"),
            format!("$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}"),
            format!("$JS.ACK.{stream}.{consumer}.>"),
        ]);
    }
    for stream in [
        subjects::JOBS_BUCKET_STREAM,
        DESTINATIONS_BUCKET_STREAM,
        SENT_BUCKET_STREAM,
    ] {
        publish.extend(reader_subjects(stream));
    }
    publish
}

/// What a user may publish for notifications: their own entries of the destinations bucket
/// (written, read by name, listed through a consumer whose filter names their key) and their
/// own notices subject.
pub fn user_publish(public_key: &str) -> Vec<String> {
    let entries = user_entries(public_key);
    let stream = DESTINATIONS_BUCKET_STREAM;
    vec![
        subjects::notices(public_key),
        entries.clone(),
        format!("$JS.API.STREAM.INFO.{stream}"),
        format!("$JS.API.DIRECT.GET.{stream}.{entries}"),
        format!("$JS.API.CONSUMER.CREATE.{stream}.*.{entries}"),
        format!("$JS.API.CONSUMER.INFO.{stream}.*"),
        format!("$JS.API.CONSUMER.MSG.NEXT.{stream}.*"),
    ]
}

/// What a user may not do although their reading of the events stream would allow it: take
/// or change the service's durable consumer of events (a user pulling from it would take
/// notices away from everyone).
pub fn user_deny_publish() -> Vec<String> {
    let events = subjects::EVENTS_STREAM;
    vec![
        format!("$JS.API.CONSUMER.CREATE.{events}.{EVENTS_CONSUMER}"),
        format!("$JS.API.CONSUMER.CREATE.{events}.{EVENTS_CONSUMER}.>"),
        format!("$JS.API.CONSUMER.MSG.NEXT.{events}.{EVENTS_CONSUMER}"),
    ]
}

/// The JetStream API subjects that read `stream`: its info, consumers, direct gets.
fn reader_subjects(stream: &str) -> [String; 7] {
    [
        format!("$JS.API.STREAM.INFO.{stream}"),
        format!("$JS.API.CONSUMER.CREATE.{stream}"),
        format!("$JS.API.CONSUMER.CREATE.{stream}.>"),
        format!("$JS.API.CONSUMER.INFO.{stream}.*"),
        format!("$JS.API.CONSUMER.MSG.NEXT.{stream}.*"),
        format!("$JS.API.DIRECT.GET.{stream}.>"),
        format!("$JS.API.DIRECT.GET.{stream}"),
    ]
}
