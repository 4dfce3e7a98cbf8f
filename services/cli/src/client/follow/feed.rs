//! A job's output and its record read together, as everything that follows a job until it
//! ends does (`mgpu logs -f`, `mgpu submit -i`, `mgpu attach`): one [`JobFeed`] hands over
//! what comes next, in the order it comes, and keeps what deciding the end takes (the latest
//! record, the end-of-output markers seen, whether the stored output was all read). The
//! followers decide when it is over; [`Grace`] is how long they give late output.

use std::pin::Pin;
use std::time::Duration;

use anyhow::{Context as _, Result, anyhow};
use async_nats::jetstream;
use futures::{FutureExt as _, StreamExt};
use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::JobRecord;
use tokio::time::{Instant, Sleep};

use super::ordered::Ordered;
use super::output::{self, Chunk, Ends};
use super::record::{self, RecordChanges};
use crate::errors::plain;

/// What came next.
#[derive(Debug)]
pub enum Update {
    /// Bytes the job wrote, on its stdout or stderr ([`output::classify`] says which). Boxed,
    /// as a message is large and the other updates are not.
    Output(Box<jetstream::Message>),
    /// The end of one process's output in `attempt` (counted in [`JobFeed::ends`]).
    Marker { attempt: u32 },
    /// A new version of the record ([`JobFeed::record`]); `first`: the first one read.
    Record { first: bool },
    /// The record was deleted: the job will never finish.
    Removed,
}

/// A job's output and record, followed.
pub struct JobFeed {
    id: JobId,
    output: Ordered,
    changes: RecordChanges,
    record: Option<JobRecord>,
    ends: Ends,
    /// Every message stored when following began has been read.
    caught_up: bool,
    /// The record went from unfinished to finished while followed (rather than being found
    /// finished): only then can output still be on its way.
    ended_while_following: bool,
}

impl JobFeed {
    /// Opens the job's output on `subjects` from the first message (see
    /// [`output::open_output`]), then the watch on its record.
    pub async fn open(js: &jetstream::Context, id: &JobId, subjects: &[String]) -> Result<JobFeed> {
        let feed = output::open_output(js, subjects).await?;
        let changes = record::watch_record(js, id).await?;
        Ok(JobFeed {
            id: id.clone(),
            output: feed.messages,
            changes,
            record: None,
            ends: Ends::default(),
            caught_up: feed.initially_pending == 0,
            ended_while_following: false,
        })
    }

    /// What comes next, output or record, whichever is first. Cancel-safe: nothing is taken
    /// from either until it is handed over.
    pub async fn next(&mut self) -> Result<Update> {
        tokio::select! {
            message = self.output.next() => self.take_output(message),
            change = self.changes.next() => self.take_change(change),
        }
    }

    /// What is at hand already, without waiting; None when nothing is.
    pub fn next_at_hand(&mut self) -> Option<Result<Update>> {
        self.next().now_or_never()
    }

    /// The record as last read; None before the first.
    pub fn record(&self) -> Option<&JobRecord> {
        self.record.as_ref()
    }

    /// The end-of-output markers read, by attempt and process.
    pub fn ends(&self) -> &Ends {
        &self.ends
    }

    /// Whether everything stored when following began has been read.
    pub fn caught_up(&self) -> bool {
        self.caught_up
    }

    /// Whether the job ended while it was followed, rather than before.
    pub fn ended_while_following(&self) -> bool {
        self.ended_while_following
    }

    fn take_output(&mut self, message: Option<output::Received>) -> Result<Update> {
        let message = message
            .ok_or_else(|| anyhow!("the job's output stream ended unexpectedly"))?
            .map_err(plain)
            .context("reading the job's output")?;
        self.caught_up |= self.output.caught_up();
        if let Chunk::Eof {
            attempt,
            rank,
            exit_code,
        } = output::classify(&message)
        {
            let attempt = attempt.unwrap_or(0);
            self.ends.saw(attempt, rank, exit_code);
            return Ok(Update::Marker { attempt });
        }
        Ok(Update::Output(Box::new(message)))
    }

    fn take_change(&mut self, change: Option<Result<Option<JobRecord>>>) -> Result<Update> {
        let Some(change) = change else {
            return Err(anyhow!(
                "lost the watch on job {}'s record",
                self.id.short()
            ));
        };
        let Some(new) = change? else {
            return Ok(Update::Removed);
        };
        let was_running = self.record.as_ref().is_some_and(|r| !r.state.is_finished());
        self.ended_while_following |= was_running && new.state.is_finished();
        let first = self.record.is_none();
        self.record = Some(new);
        Ok(Update::Record { first })
    }
}

/// How long a follower waits for the rest of a job's output once the record says it ended (the
/// node may have died before writing its end-of-output marker): armed once, then it fires.
pub struct Grace {
    sleep: Pin<Box<Sleep>>,
    armed: bool,
}

impl Default for Grace {
    fn default() -> Grace {
        Grace {
            sleep: Box::pin(tokio::time::sleep(Duration::MAX)),
            armed: false,
        }
    }
}

impl Grace {
    /// Starts the wait of `length`, unless it was started already.
    pub fn arm(&mut self, length: Duration) {
        if !self.armed {
            self.sleep.as_mut().reset(Instant::now() + length);
            self.armed = true;
        }
    }

    /// Resolves once the armed wait is over; never, unarmed.
    pub async fn over(&mut self) {
        if self.armed {
            self.sleep.as_mut().await;
        } else {
            std::future::pending::<()>().await;
        }
    }
}
