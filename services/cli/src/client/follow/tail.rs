//! A job's output written out as it was stored, stdout to our stdout and stderr to our stderr
//! (`mgpu logs`): what is stored now ([`print_stored`]), or everything, then new output as it
//! comes until the job's current attempt ended ([`print_following`], `mgpu logs -f`).

use std::time::Duration;

use anyhow::{Context as _, Result};
use futures::StreamExt;
use mgpu_protocol::ids::JobId;

use super::feed::{Grace, JobFeed, Update};
use super::output::{self, OutputWriter};
use crate::client::session::Session;
use crate::errors::plain;

/// When the record says the job ended but its end-of-output marker has not been read, how long
/// to wait for it (the node may have died before writing one).
const EOF_GRACE: Duration = Duration::from_secs(2);

/// The most output messages written between two flushes while more keep coming at once, so
/// the record watch gets its turn and a fast job's output still shows every few megabytes.
const MESSAGES_PER_FLUSH: usize = 64;

/// Prints what is stored of the output on `subjects` now, and returns.
pub async fn print_stored(session: &Session, subjects: &[String]) -> Result<()> {
    let mut feed = output::open_output(&session.js, subjects).await?;
    if feed.initially_pending == 0 {
        return Ok(());
    }
    let mut out = OutputWriter::new()?;
    while let Some(message) = feed.messages.next().await {
        let message = message.map_err(plain).context("reading the job's output")?;
        out.write(&output::classify(&message))?;
        if feed.messages.caught_up() {
            break;
        }
    }
    out.flush()?;
    Ok(())
}

/// Prints everything, then new output as it comes, until the job's current attempt ended.
pub async fn print_following(session: &Session, id: &JobId, subjects: &[String]) -> Result<()> {
    let mut out = OutputWriter::new()?;
    let result = follow_into(session, (id, subjects), &mut out).await;
    // Whatever was read is printed, also when following failed.
    out.flush()?;
    result
}

async fn follow_into(
    session: &Session,
    (id, subjects): (&JobId, &[String]),
    out: &mut OutputWriter,
) -> Result<()> {
    let mut feed = JobFeed::open(&session.js, id, subjects).await?;
    let mut grace = Grace::default();
    loop {
        if let Some(record) = feed.record()
            && record.state.is_finished()
        {
            if feed.ends().complete_for(record) {
                return Ok(());
            }
            // Ended without a marker for this attempt (an agent that died): once the stored
            // output is replayed, stop, giving late output a moment if the end was just now.
            if feed.caught_up() {
                if !feed.ended_while_following() {
                    return Ok(());
                }
                grace.arm(EOF_GRACE);
            }
        }
        tokio::select! {
            update = feed.next() => {
                if !write_batch(update?, &mut feed, out)? {
                    return Ok(());
                }
            }
            () = grace.over() => return Ok(()),
        }
    }
}

/// Writes `first` and the output already at hand after it, then flushes once: a job writing
/// fast costs a write per batch, not per message, and nothing waits in the buffer once the
/// feed has no more. Anything but output (an end-of-output marker, a record) ends the batch,
/// so whether the job is over is decided by the caller, as for one update. False once the
/// record was deleted: a deleted record will never finish, so following stops with what was
/// printed.
fn write_batch(first: Update, feed: &mut JobFeed, out: &mut OutputWriter) -> Result<bool> {
    let mut update = first;
    let mut written = 0;
    loop {
        match update {
            Update::Output(message) => {
                out.write(&output::classify(&message))?;
                written += 1;
            }
            Update::Removed => return Ok(false),
            Update::Marker { .. } | Update::Record { .. } => break,
        }
        if written == MESSAGES_PER_FLUSH {
            break;
        }
        match feed.next_at_hand() {
            Some(next) => update = next?,
            None => break,
        }
    }
    out.flush()?;
    Ok(true)
}
