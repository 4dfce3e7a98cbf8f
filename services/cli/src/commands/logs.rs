//! `mgpu logs`: a job's output as it wrote it, stdout to stdout and stderr to stderr.
//!
//! Output is read from JetStream, so it is there after the job ended, and `-f` also shows what
//! was written before it started following.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, Result, anyhow};
use async_nats::jetstream::consumer;
use clap::Args;
use futures::{FutureExt, StreamExt};
use mgpu_protocol::job::JobRecord;
use tokio::time::Instant;

use crate::client::session::{ConnectionArgs, Session};
use crate::errors::plain;
use crate::follow::{self, Chunk, OutputWriter};
use crate::model::jobs;

/// When the record says the job ended but its end-of-output marker has not been read, how long
/// to wait for it (the node may have died before writing one).
const EOF_GRACE: Duration = Duration::from_secs(2);

/// The most output messages written between two flushes while more keep coming at once, so
/// the record watch gets its turn and a fast job's output still shows every few megabytes.
const MESSAGES_PER_FLUSH: usize = 64;

#[derive(Debug, Args)]
pub struct LogsArgs {
    /// Job id, or a unique prefix of it.
    #[arg(value_name = "ID")]
    pub id: String,

    /// Keep printing new output until the job ends.
    #[arg(short, long)]
    pub follow: bool,
}

pub async fn run(connection: &ConnectionArgs, args: &LogsArgs) -> Result<ExitCode> {
    let (session, mut refusals) = Session::connect_watching_permissions(connection).await?;
    let record = jobs::find_anywhere(&session, &args.id).await?;
    follow::check_output_readable(&session, &mut refusals, &record).await?;
    // Public output, or its owner's private subject (which the server lets only them and
    // admins read).
    let output = follow::output_subjects_of(&record);
    if args.follow {
        follow_output(&session, &record.id, &output).await?;
    } else {
        print_stored(&session, &output).await?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Prints what is stored now and returns.
async fn print_stored(session: &Session, output: &[String]) -> Result<()> {
    let mut feed = follow::open_output(&session.js, output).await?;
    if feed.initially_pending == 0 {
        return Ok(());
    }
    let mut out = OutputWriter::new()?;
    while let Some(message) = feed.messages.next().await {
        let message = message.map_err(plain).context("reading the job's output")?;
        out.write(&follow::classify(&message))?;
        let info = message.info().map_err(plain)?;
        if info.pending == 0 {
            break;
        }
    }
    out.flush()?;
    Ok(())
}

/// Prints everything, then new output as it comes, until the job's current attempt ended.
async fn follow_output(
    session: &Session,
    id: &mgpu_protocol::ids::JobId,
    output: &[String],
) -> Result<()> {
    let mut out = OutputWriter::new()?;
    let result = follow_into(session, (id, output), &mut out).await;
    // Whatever was read is printed, also when following failed.
    out.flush()?;
    result
}

async fn follow_into(
    session: &Session,
    (id, output): (&mgpu_protocol::ids::JobId, &[String]),
    out: &mut OutputWriter,
) -> Result<()> {
    let mut feed = follow::open_output(&session.js, output).await?;
    let mut changes = follow::watch_record(&session.js, id).await?;
    let mut record: Option<JobRecord> = None;
    let mut read = OutputRead {
        ends: follow::Ends::default(),
        caught_up: feed.initially_pending == 0,
    };
    let grace = tokio::time::sleep(Duration::MAX);
    tokio::pin!(grace);
    let mut grace_armed = false;
    // Whether we saw the job end while following, rather than finding it ended: only then
    // can output still be on its way.
    let mut ended_while_following = false;

    loop {
        if let Some(record) = &record
            && record.state.is_finished()
        {
            if read.ends.complete_for(record) {
                return Ok(());
            }
            // Ended without a marker for this attempt (an agent that died): once the stored
            // output is replayed, stop, giving late output a moment if the end was just now.
            if read.caught_up && !ended_while_following {
                return Ok(());
            }
            if read.caught_up && !grace_armed {
                grace.as_mut().reset(Instant::now() + EOF_GRACE);
                grace_armed = true;
            }
        }
        tokio::select! {
            message = feed.messages.next() => {
                read.write_batch(message, &mut feed.messages, out)?;
            }
            change = changes.next() => {
                match change {
                    Some(change) => match change? {
                        Some(new) => {
                            let was_running = record.as_ref().is_some_and(|r| !r.state.is_finished());
                            ended_while_following |= was_running && new.state.is_finished();
                            record = Some(new);
                        }
                        // A deleted record will never finish: stop with what was printed.
                        None => return Ok(()),
                    },
                    None => return Err(anyhow!("lost the watch on job {}'s record", id.short())),
                }
            }
            () = &mut grace, if grace_armed => return Ok(()),
        }
    }
}

/// A message as the output feed yields it; None when the feed ended.
type Received = Option<<consumer::pull::Ordered as futures::Stream>::Item>;

/// What has been read of the job's output so far.
struct OutputRead {
    /// End-of-output markers read, by attempt and rank.
    ends: follow::Ends,
    /// Every message stored when following began has been read.
    caught_up: bool,
}

impl OutputRead {
    /// Writes `first` and every message already at hand after it, then flushes once: a job
    /// writing fast costs a write per batch, not per message, and nothing waits in the buffer
    /// once the feed has no more. An end-of-output marker stops the batch, so whether the job
    /// is over is decided by the caller, as for one message.
    fn write_batch(
        &mut self,
        first: Received,
        messages: &mut follow::OutputMessages,
        out: &mut OutputWriter,
    ) -> Result<()> {
        let mut message = first;
        let mut handled = 0;
        loop {
            let received = message
                .ok_or_else(|| anyhow!("the job's output stream ended unexpectedly"))?
                .map_err(plain)
                .context("reading the job's output")?;
            let chunk = follow::classify(&received);
            let eof = matches!(chunk, Chunk::Eof { .. });
            if let Chunk::Eof {
                attempt,
                rank,
                exit_code,
            } = chunk
            {
                self.ends.saw(attempt.unwrap_or(0), rank, exit_code);
            } else {
                out.write(&chunk)?;
            }
            if received.info().map_err(plain)?.pending == 0 {
                self.caught_up = true;
            }
            handled += 1;
            if eof || handled == MESSAGES_PER_FLUSH {
                break;
            }
            match messages.next().now_or_never() {
                Some(next) => message = next,
                None => break,
            }
        }
        out.flush()?;
        Ok(())
    }
}
