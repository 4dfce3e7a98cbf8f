//! Following a job until it ends (`mgpu submit -i`, `mgpu attach`): status while it waits, its
//! output while it runs, this terminal's input forwarded to it (`input`), and its exit status
//! as ours.
//!
//! Everything is read from JetStream, so following survives a scheduler restart and shows
//! output written before we attached: for a job on a terminal, replaying it draws the screen
//! so far. Ctrl+C only detaches (`Ctrl+]` on a terminal job, where Ctrl+C is the job's): the
//! job belongs to the cluster.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, Result, anyhow};
use async_nats::jetstream::consumer::{self, pull::Ordered};
use futures::StreamExt;
use mgpu_protocol::event::{JobEvent, JobEventKind};
use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::WaitReason;
use mgpu_protocol::subjects;
use tokio::time::Instant;

use super::feed::{Grace, JobFeed, Update};
use super::input::InputMode;
use super::output;
use super::record;
use super::status::StatusLine;
use super::watcher::Watcher;
use crate::client::session::Session;
use crate::console;
use crate::errors::{lookup, plain};

/// How often a long wait reports how long it has been.
const PROGRESS_EVERY: Duration = Duration::from_secs(10);
/// After the record says the job ended, how long to wait for the rest of its output.
const OUTPUT_GRACE: Duration = Duration::from_secs(5);

/// How to follow a job.
pub struct FollowOptions {
    /// Print nothing but the job's own output.
    pub quiet: bool,
    /// What to send the job once it runs.
    pub input: InputMode,
    /// Joining a job submitted earlier (`mgpu attach`): no "submitted" status, and a job
    /// found running is not announced in the middle of its replayed screen.
    pub attaching: bool,
    /// The subjects its output may be on (`output::output_subjects_of`,
    /// `output::own_output_subjects`).
    pub output: Vec<String>,
}

/// Follows the job until it ends, and returns its exit status (or 1 if it never ran).
pub async fn follow(session: &Session, id: &JobId, options: FollowOptions) -> Result<ExitCode> {
    let feed = JobFeed::open(&session.js, id, &options.output).await?;
    let mut events = open_events(session, id).await?;
    let (detach, mut detached) = tokio::sync::mpsc::channel(1);
    let viewer = matches!(options.input, InputMode::Keys { .. });
    let mut follower = Follower {
        session,
        feed,
        status: StatusLine::new(options.quiet),
        viewer,
        watcher: Watcher::new(id, options.attaching, options.input, detach),
    };
    if !options.attaching {
        follower
            .watcher
            .show_queued(&mut follower.status, WaitReason::Submitted, false);
    }

    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    let mut ctrl_c_armed = true;
    let mut progress = tokio::time::interval_at(Instant::now() + PROGRESS_EVERY, PROGRESS_EVERY);
    progress.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut grace = Grace::default();

    loop {
        let exit = tokio::select! {
            signal = &mut ctrl_c, if ctrl_c_armed => {
                if signal.is_err() {
                    // No handler could be installed: Ctrl+C then kills us the default way,
                    // which leaves the job running all the same.
                    ctrl_c_armed = false;
                    None
                } else {
                    Some(follower.detach())
                }
            }
            Some(()) = detached.recv() => Some(follower.detach()),
            update = follower.feed.next() => {
                let exit = follower.on_update(update?)?;
                if follower.job_ended() {
                    grace.arm(OUTPUT_GRACE);
                }
                exit
            }
            event = events.next() => follower.on_event(event)?,
            _ = progress.tick() => {
                follower.show_progress();
                None
            }
            () = grace.over() => {
                // The record says it ended but no end-of-output marker came (the node may have
                // died): end with what the record knows.
                Some(follower.watcher.final_status(follower.feed.record(), &mut follower.status))
            }
        };
        if let Some(code) = exit {
            return Ok(code);
        }
    }
}

/// The followed job's feed, what we make of it, and our status line. Each handler returns our
/// exit status once following is over.
struct Follower<'s> {
    session: &'s Session,
    feed: JobFeed,
    status: StatusLine,
    /// Viewing a terminal job: detaching says how to attach again.
    viewer: bool,
    watcher: Watcher,
}

impl Follower<'_> {
    /// Ctrl+C (`Ctrl+]` on a terminal): the job keeps running; say how to follow it again.
    fn detach(&mut self) -> ExitCode {
        self.status.finish();
        // This terminal as it was before the message, which must start on a fresh line.
        self.watcher.raw_input = None;
        let (fresh_line, hint) = if self.viewer {
            // The job's screen may have left the cursor anywhere on a line.
            ("\r\n", "Attach again with: mgpu attach")
        } else {
            ("", "Follow it with: mgpu logs -f")
        };
        console::stderr_line(&format!(
            "{fresh_line}Detached from job {short}; it keeps running. {hint} {short}",
            short = self.watcher.id.short(),
        ));
        ExitCode::SUCCESS
    }

    /// Output is written as it comes; the current attempt's end-of-output marker (every
    /// rank's, for a distributed job) ends following with its exit status. A new record may
    /// end it too (a job that never ran); a deleted one does.
    fn on_update(&mut self, update: Update) -> Result<Option<ExitCode>> {
        match update {
            Update::Marker { attempt } => {
                let record = self.feed.record();
                let all_ranks = record.is_none_or(|r| self.feed.ends().complete_for(r));
                if Watcher::is_current_attempt(record, attempt) && all_ranks {
                    self.status.finish();
                    let code = self.feed.ends().exit_code(attempt).unwrap_or(1);
                    return Ok(Some(ExitCode::from(record::clamp_exit_code(code))));
                }
                Ok(None)
            }
            Update::Output(message) => {
                self.status.finish();
                // Output means the process runs, so it can take input even if the record has
                // not caught up yet.
                self.watcher.output_since_record = true;
                self.watcher.start_stdin(self.session);
                output::write_chunk(&output::classify(&message))?;
                Ok(None)
            }
            Update::Record { first } => Ok(self.feed.record().and_then(|record| {
                self.watcher
                    .update(record, first, &mut self.status, self.session)
            })),
            Update::Removed => {
                self.status.finish();
                console::stderr_line(&format!(
                    "mgpu: job {} was removed",
                    self.watcher.id.short()
                ));
                Ok(Some(ExitCode::FAILURE))
            }
        }
    }

    /// The scheduler's refusal of the submission ends following.
    fn on_event(
        &mut self,
        event: Option<<Ordered as futures::Stream>::Item>,
    ) -> Result<Option<ExitCode>> {
        let Some(event) = event else {
            return Err(anyhow!("the job's event stream ended unexpectedly"));
        };
        let event = event.map_err(plain).context("reading the job's events")?;
        if let Ok(JobEvent {
            kind: JobEventKind::Rejected { reason },
            ..
        }) = serde_json::from_slice::<JobEvent>(&event.payload)
        {
            self.status.finish();
            console::stderr_line(&format!(
                "mgpu: the scheduler rejected job {}: {reason}",
                self.watcher.id.short()
            ));
            return Ok(Some(ExitCode::FAILURE));
        }
        Ok(None)
    }

    /// While the job waits: how long it has been.
    fn show_progress(&mut self) {
        if let Some(reason) = self.watcher.queued_reason(self.feed.record()) {
            self.watcher.show_queued(&mut self.status, reason, true);
        }
    }

    /// Whether the record says the job ended (its last output may still be on its way).
    fn job_ended(&self) -> bool {
        self.feed.record().is_some_and(|r| r.state.is_finished())
    }
}

/// The job's events, from the start: the scheduler's refusal of a submission is only there.
async fn open_events(session: &Session, id: &JobId) -> Result<Ordered> {
    let stream = session
        .js
        .get_stream(subjects::EVENTS_STREAM)
        .await
        .map_err(lookup)?;
    let consumer = mgpu_nats::records::create_reader("reading the job's events", || {
        stream.create_consumer(consumer::pull::OrderedConfig {
            filter_subject: subjects::events(id),
            deliver_policy: consumer::DeliverPolicy::All,
            ..Default::default()
        })
    })
    .await
    .map_err(plain)?;
    consumer
        .messages()
        .await
        .map_err(plain)
        .context("reading the job's events")
}
