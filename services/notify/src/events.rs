//! Job events in, notices out: the durable consumer `notify-events` on `MGPU_EVENTS` (starts,
//! preemptions, ends), each event turned into a notice by `derive.rs` and published on the
//! owner's `users.<key>.notices` under its id before the event is acknowledged. A crash
//! between the two publishes it again on restart; the notices stream's dedup window and the
//! sent marks keep that from reaching anyone twice. Also the sweep for `time80`, which no
//! event announces.

use std::time::Duration;

use anyhow::{Context as _, Result};
use async_nats::jetstream::{self, AckKind, consumer};

use mgpu_nats::pull::Pull;
use mgpu_nats::records;
use mgpu_protocol::event::JobEvent;
use mgpu_protocol::notify::EVENTS_CONSUMER;
use mgpu_protocol::subjects;
use mgpu_protocol::wire::MAX_EVENT_BYTES;

use crate::derive::{self, Derived};

/// Creates (or finds) the durable consumer of job events. A new one starts at the events
/// stored from now on: a first start does not tell of a week of old jobs.
pub async fn consumer(js: &jetstream::Context) -> Result<consumer::PullConsumer> {
    let stream = js
        .get_stream(subjects::EVENTS_STREAM)
        .await
        .context("the events stream is missing: run the scheduler or `mgpu admin setup` first")?;
    let config = consumer::pull::Config {
        durable_name: Some(EVENTS_CONSUMER.to_owned()),
        filter_subject: subjects::ALL_EVENTS.to_owned(),
        deliver_policy: consumer::DeliverPolicy::New,
        ack_policy: consumer::AckPolicy::Explicit,
        ack_wait: Duration::from_secs(60),
        max_ack_pending: 1000,
        ..Default::default()
    };
    stream
        .get_or_create_consumer(EVENTS_CONSUMER, config)
        .await
        .context("creating the events consumer")
}

/// Takes events for ever.
pub async fn run(js: jetstream::Context, consumer: consumer::PullConsumer) -> Result<()> {
    let mut pull = Pull::new(consumer, "job events").await?;
    loop {
        let message = pull.next().await;
        let outcome = handle(&js, &message.payload).await;
        let ack = match outcome {
            Ok(()) => AckKind::Ack,
            Err(err) => {
                tracing::warn!("a job event's notice could not be published, retrying: {err:#}");
                AckKind::Nak(Some(Duration::from_secs(2)))
            }
        };
        if let Err(err) = message.ack_with(ack).await {
            tracing::warn!("acknowledging a job event: {err}");
        }
    }
}

/// One event: the notices it makes, published. Err only for what trying again can cure.
async fn handle(js: &jetstream::Context, payload: &[u8]) -> Result<()> {
    if payload.len() > MAX_EVENT_BYTES {
        return Ok(());
    }
    // Another program's malformed event is not ours to retry.
    let Ok(event) = serde_json::from_slice::<JobEvent>(payload) else {
        return Ok(());
    };
    if !interesting(&event) {
        return Ok(());
    }
    let Some(record) = records::get_job(js, &event.job_id).await? else {
        return Ok(());
    };
    if record.spec.notify.is_empty() {
        return Ok(());
    }
    if let Some(derived) = derive::from_event(&event, &record) {
        publish(js, &derived).await?;
    }
    if derive::ends_array_task(&event, &record) {
        let all = records::list_jobs(js).await?;
        if let Some(derived) = derive::array_ended(&record, &all, event.at) {
            publish(js, &derived).await?;
        }
    }
    Ok(())
}

/// The events a notice may come of; the rest need no record read.
fn interesting(event: &JobEvent) -> bool {
    use mgpu_protocol::event::JobEventKind as K;
    matches!(
        event.kind,
        K::Started { .. }
            | K::Exited {
                preempted: true,
                ..
            }
            | K::Finished { .. }
            | K::Rejected { .. }
    )
}

/// Publishes a notice on its owner's subject, stored once per id within the stream's window.
pub async fn publish(js: &jetstream::Context, derived: &Derived) -> Result<()> {
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Nats-Msg-Id", derived.id.as_str());
    let payload = serde_json::to_vec(&derived.notice)?;
    js.publish_with_headers(subjects::notices(&derived.owner), headers, payload.into())
        .await?
        .await
        .context("storing a notice")?;
    Ok(())
}

/// Every `interval`, the running jobs that have used 80 % of their time limit: their notice
/// published once (this process remembers which; a restart publishes again, and the sent
/// marks drop the copy).
pub async fn time80_sweep(js: jetstream::Context, interval: Duration) {
    let mut published = std::collections::HashSet::new();
    let mut tick = tokio::time::interval(interval);
    loop {
        tick.tick().await;
        let jobs = match records::list_jobs(&js).await {
            Ok(jobs) => jobs,
            Err(err) => {
                tracing::warn!("reading jobs for time limits: {err}");
                continue;
            }
        };
        let now = mgpu_protocol::now();
        for derived in jobs.iter().filter_map(|job| derive::time80(job, now)) {
            if published.contains(&derived.id) {
                continue;
            }
            match publish(&js, &derived).await {
                Ok(()) => {
                    published.insert(derived.id);
                }
                Err(err) => tracing::warn!("publishing a time-limit notice: {err:#}"),
            }
        }
        // Forget the jobs that no longer run, so the set stays small.
        let running: std::collections::HashSet<String> = jobs
            .iter()
            .map(|j| format!("{}-{}-time80", j.id, j.attempt))
            .collect();
        published.retain(|id| running.contains(id));
    }
}
