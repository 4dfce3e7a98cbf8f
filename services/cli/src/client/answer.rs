//! How the scheduler answers a request about one job (a cancellation, a hold, a release): it
//! changes the job's record, or it says no on the job's events subject (`Refused`: neither the
//! owner nor an admin asked; `Rejected`: it cannot be done now). [`Answers`] listens to both,
//! from before the request is published, so a quick answer cannot be missed.

use anyhow::Result;
use futures::StreamExt;
use mgpu_protocol::event::{JobEvent, JobEventKind};
use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::JobRecord;
use mgpu_protocol::subjects;

use super::follow::record::{self, RecordChanges};
use super::session::Session;
use crate::errors::plain;

/// What was heard about the job.
#[derive(Debug)]
pub enum Answer {
    /// The record as it is now: its current value first, then each change (None once it was
    /// deleted), or why it could not be read. Boxed, as records are large and the other
    /// answers are not.
    Record(Result<Option<Box<JobRecord>>>),
    /// The watch on the record ended.
    WatchEnded,
    /// The scheduler refused the request: who asked may not.
    Refused(String),
    /// The scheduler rejected the request: it cannot be done.
    Rejected(String),
}

/// The job's record and events, listened to.
pub struct Answers {
    changes: RecordChanges,
    /// None once the subscription ended: the record alone answers then.
    events: Option<async_nats::Subscriber>,
}

impl Answers {
    /// Starts listening; publish the request after this.
    pub async fn listen(session: &Session, id: &JobId) -> Result<Answers> {
        let changes = record::watch_record(&session.js, id).await?;
        let events = session
            .client
            .subscribe(subjects::events(id))
            .await
            .map_err(plain)?;
        Ok(Answers {
            changes,
            events: Some(events),
        })
    }

    /// The next thing heard; events other than a refusal or a rejection are passed over.
    pub async fn next(&mut self) -> Answer {
        loop {
            tokio::select! {
                change = self.changes.next() => {
                    return match change {
                        Some(change) => Answer::Record(change.map(|record| record.map(Box::new))),
                        None => Answer::WatchEnded,
                    };
                }
                event = next_event(&mut self.events) => match event {
                    Some(payload) => {
                        match serde_json::from_slice::<JobEvent>(&payload) {
                            Ok(JobEvent { kind: JobEventKind::Refused { reason, .. }, .. }) => {
                                return Answer::Refused(reason);
                            }
                            Ok(JobEvent { kind: JobEventKind::Rejected { reason }, .. }) => {
                                return Answer::Rejected(reason);
                            }
                            _ => {}
                        }
                    }
                    None => self.events = None,
                },
            }
        }
    }
}

/// The next event's payload; None once the subscription ended; never without one.
async fn next_event(events: &mut Option<async_nats::Subscriber>) -> Option<bytes::Bytes> {
    match events {
        Some(events) => events.next().await.map(|message| message.payload),
        None => std::future::pending().await,
    }
}
