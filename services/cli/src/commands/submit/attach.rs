//! Following a job (`mgpu submit -i`, `mgpu attach`): status while it waits, its output while
//! it runs, this terminal's input forwarded to it (`input.rs`), and its exit status as ours.
//!
//! Everything is read from JetStream, so following survives a scheduler restart and shows
//! output written before we attached: for a job on a terminal, replaying it draws the screen
//! so far. Ctrl+C only detaches (`Ctrl+]` on a terminal job, where Ctrl+C is the job's): the
//! job belongs to the cluster.

use std::io::{IsTerminal as _, Write as _};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, Result, anyhow};
use async_nats::jetstream::consumer::{self, pull::Ordered};
use futures::StreamExt;
use mgpu_protocol::duration::format_duration;
use mgpu_protocol::event::{JobEvent, JobEventKind};
use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::{JobRecord, JobState, WaitReason};
use mgpu_protocol::subjects;
use tokio::time::Instant;

use crate::client::session::Session;
use crate::console;
use crate::errors::{lookup, plain};
use crate::follow::{self, Chunk};
use crate::human;
use crate::raw_terminal::RawInput;

use super::input::{self, InputMode, InputTarget};

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
    /// The subjects its output may be on (`follow::output_subjects_of`,
    /// `follow::own_output_subjects`).
    pub output: Vec<String>,
}

/// Follows the job until it ends, and returns its exit status (or 1 if it never ran).
pub async fn follow(session: &Session, id: &JobId, options: FollowOptions) -> Result<ExitCode> {
    let mut output = follow::open_output(&session.js, &options.output)
        .await?
        .messages;
    let mut record_changes = follow::watch_record(&session.js, id).await?;
    let mut events = open_events(session, id).await?;
    let (detach, mut detached) = tokio::sync::mpsc::channel(1);
    let viewer = matches!(options.input, InputMode::Keys { .. });

    let mut follower = Follower {
        session,
        status: StatusLine::new(options.quiet),
        viewer,
        watcher: Watcher {
            id: id.clone(),
            record: None,
            queued_since: Instant::now(),
            shown_reason: None,
            announced_run: false,
            attaching: options.attaching,
            input: Some((options.input, detach)),
            raw_input: None,
            output_since_record: false,
        },
        ends: follow::Ends::default(),
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
    let grace = tokio::time::sleep(Duration::MAX);
    tokio::pin!(grace);
    let mut grace_armed = false;

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
            message = output.next() => follower.on_output(message)?,
            change = record_changes.next() => {
                let exit = follower.on_record(change)?;
                if follower.job_ended() && !grace_armed {
                    grace.as_mut().reset(Instant::now() + OUTPUT_GRACE);
                    grace_armed = true;
                }
                exit
            }
            event = events.next() => follower.on_event(event)?,
            _ = progress.tick() => {
                follower.show_progress();
                None
            }
            () = &mut grace, if grace_armed => {
                // The record says it ended but no end-of-output marker came (the node may have
                // died): end with what the record knows.
                Some(follower.watcher.final_status(&mut follower.status))
            }
        };
        if let Some(code) = exit {
            return Ok(code);
        }
    }
}

/// A message as an ordered consumer yields it; None when the stream ended.
type Received<S> = Option<<S as futures::Stream>::Item>;

/// The followed job, our status line, and the end-of-output markers seen: what each of the
/// job's feeds updates. Each handler returns our exit status once following is over.
struct Follower<'s> {
    session: &'s Session,
    status: StatusLine,
    /// Viewing a terminal job: detaching says how to attach again.
    viewer: bool,
    watcher: Watcher,
    ends: follow::Ends,
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
    /// rank's, for a distributed job) ends following with its exit status.
    fn on_output(&mut self, message: Received<follow::OutputMessages>) -> Result<Option<ExitCode>> {
        let message = message
            .ok_or_else(|| anyhow!("the job's output stream ended unexpectedly"))?
            .map_err(plain)
            .context("reading the job's output")?;
        let chunk = follow::classify(&message);
        if let Chunk::Eof {
            attempt,
            rank,
            exit_code,
        } = chunk
        {
            let attempt = attempt.unwrap_or(0);
            self.ends.saw(attempt, rank, exit_code);
            let watcher = &self.watcher;
            let all_ranks = watcher
                .record
                .as_ref()
                .is_none_or(|r| self.ends.complete_for(r));
            if watcher.is_current_attempt(Some(attempt)) && all_ranks {
                self.status.finish();
                let code = self.ends.exit_code(attempt).unwrap_or(1);
                return Ok(Some(ExitCode::from(follow::clamp_exit_code(code))));
            }
            return Ok(None);
        }
        self.status.finish();
        // Output means the process runs, so it can take input even if the record has not
        // caught up yet.
        self.watcher.output_since_record = true;
        self.watcher.start_stdin(self.session);
        follow::write_chunk(&chunk)?;
        Ok(None)
    }

    fn on_record(&mut self, change: Option<Result<Option<JobRecord>>>) -> Result<Option<ExitCode>> {
        let Some(change) = change else {
            return Err(anyhow!(
                "lost the watch on job {}'s record",
                self.watcher.id.short()
            ));
        };
        let Some(record) = change? else {
            self.status.finish();
            console::stderr_line(&format!(
                "mgpu: job {} was removed",
                self.watcher.id.short()
            ));
            return Ok(Some(ExitCode::FAILURE));
        };
        Ok(self.watcher.update(record, &mut self.status, self.session))
    }

    /// The scheduler's refusal of the submission ends following.
    fn on_event(&mut self, event: Received<Ordered>) -> Result<Option<ExitCode>> {
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
        if let Some(reason) = self.watcher.queued_reason() {
            self.watcher.show_queued(&mut self.status, reason, true);
        }
    }

    /// Whether the record says the job ended (its last output may still be on its way).
    fn job_ended(&self) -> bool {
        self.watcher
            .record
            .as_ref()
            .is_some_and(|r| r.state.is_finished())
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

/// What we know about the followed job.
struct Watcher {
    id: JobId,
    record: Option<JobRecord>,
    queued_since: Instant,
    shown_reason: Option<WaitReason>,
    announced_run: bool,
    attaching: bool,
    /// What to send the job, until sending starts; then None.
    input: Option<(InputMode, tokio::sync::mpsc::Sender<()>)>,
    /// This terminal in raw mode while a terminal job's keys are passed on.
    raw_input: Option<RawInput>,
    /// Output arrived after the last record version: a "queued" record is stale, so no
    /// progress line may be drawn into the job's output.
    output_since_record: bool,
}

impl Watcher {
    /// An end-of-output marker ends our wait unless it belongs to an earlier attempt than the
    /// one recorded (a restarted job writes again).
    fn is_current_attempt(&self, attempt: Option<u32>) -> bool {
        match (&self.record, attempt) {
            (Some(record), Some(attempt)) => attempt >= record.attempt,
            _ => true,
        }
    }

    fn queued_reason(&self) -> Option<WaitReason> {
        if self.output_since_record {
            return None;
        }
        match &self.record {
            None => Some(WaitReason::Submitted),
            Some(JobRecord {
                state: JobState::Queued(waiting),
                ..
            }) => Some(waiting.reason),
            Some(_) => None,
        }
    }

    fn show_queued(&mut self, status: &mut StatusLine, reason: WaitReason, progress: bool) {
        if !progress && self.shown_reason == Some(reason) {
            return;
        }
        self.shown_reason = Some(reason);
        let waited = self.queued_since.elapsed();
        let text = if progress {
            format!(
                "mgpu: job {} queued: {} ({} so far)",
                self.id.short(),
                reason.describe(),
                format_duration(waited)
            )
        } else {
            format!(
                "mgpu: job {} queued: {}",
                self.id.short(),
                reason.describe()
            )
        };
        status.show(&text);
    }

    /// Takes a new version of the record; returns an exit status when following is over.
    fn update(
        &mut self,
        record: JobRecord,
        status: &mut StatusLine,
        session: &Session,
    ) -> Option<ExitCode> {
        let state = record.state.clone();
        let first_sight = self.record.is_none();
        self.record = Some(record);
        self.output_since_record = false;
        match state {
            JobState::Queued(waiting) => {
                // Queued again after running (its node was lost): it will be announced
                // again when it restarts.
                self.announced_run = false;
                self.show_queued(status, waiting.reason, false);
                None
            }
            JobState::Running(run) => {
                self.shown_reason = None;
                // Found running when attaching: its replayed screen says more than a note.
                let found_running = self.attaching && first_sight;
                let announce = !(self.announced_run || found_running);
                self.announced_run = true;
                if announce {
                    status.note(&format!(
                        "mgpu: job {} running on {} (GPUs {})",
                        self.id.short(),
                        run.placement.node,
                        gpu_list(&run.placement.gpu_indices())
                    ));
                }
                // Input sent before the agent started the process would be lost.
                if run.started_at.is_some() {
                    self.start_stdin(session);
                }
                None
            }
            JobState::Succeeded(end)
            | JobState::Failed(end)
            | JobState::Cancelled(end)
            | JobState::TimedOut(end)
            | JobState::NodeFailed(end) => {
                if end.started_at.is_none() && end.placement.is_none() {
                    // It never ran, so no output will come.
                    return Some(self.final_status(status));
                }
                None
            }
        }
    }

    /// The exit status when the record is all we have: its exit code, or 1 when it has none.
    fn final_status(&self, status: &mut StatusLine) -> ExitCode {
        status.finish();
        let Some(record) = &self.record else {
            return ExitCode::FAILURE;
        };
        let ending = record.state.ending();
        let reason = ending.and_then(|e| e.reason.clone());
        let never_ran = ending.is_some_and(|e| e.started_at.is_none());
        let state = human::state_words(&record.state);
        let what = match (&record.state, never_ran) {
            (JobState::Succeeded(_), _) => None,
            (_, true) => Some(format!("{state} before it started")),
            (_, false) => Some(state.to_owned()),
        };
        if let Some(what) = what {
            let reason = reason.map(|r| format!(": {r}")).unwrap_or_default();
            console::stderr_line(&format!("mgpu: job {} {what}{reason}", self.id.short()));
        }
        if never_ran {
            return ExitCode::FAILURE;
        }
        let succeeded = matches!(record.state, JobState::Succeeded(_));
        let code = record
            .exit_code()
            .map(follow::clamp_exit_code)
            .unwrap_or(if succeeded { 0 } else { 1 });
        ExitCode::from(code)
    }

    /// Starts sending the job input, once.
    fn start_stdin(&mut self, session: &Session) {
        let Some((mode, detach)) = self.input.take() else {
            return;
        };
        let target = InputTarget {
            client: session.client.clone(),
            subject: subjects::input(&self.id),
            key: session.key.clone(),
        };
        self.raw_input = input::start(target, mode, detach);
    }
}

fn gpu_list(indices: &[u32]) -> String {
    if indices.is_empty() {
        "none".to_owned()
    } else {
        human::index_list(indices)
    }
}

/// Our status messages on stderr. On a terminal the queued status is one line rewritten in
/// place; elsewhere (a log file) every status is its own line.
struct StatusLine {
    quiet: bool,
    terminal: bool,
    /// A rewritable line is on screen without its newline.
    open: bool,
}

impl StatusLine {
    fn new(quiet: bool) -> StatusLine {
        StatusLine {
            quiet,
            terminal: std::io::stderr().is_terminal(),
            open: false,
        }
    }

    fn show(&mut self, text: &str) {
        if self.quiet {
            return;
        }
        if self.terminal {
            let mut err = std::io::stderr().lock();
            // Carriage return and erase-line: replace the previous status.
            let _ = write!(err, "\r\x1b[K{text}");
            let _ = err.flush();
            self.open = true;
        } else {
            console::stderr_line(text);
        }
    }

    /// A status worth keeping on its own line.
    fn note(&mut self, text: &str) {
        if self.quiet {
            return;
        }
        self.finish();
        console::stderr_line(text);
    }

    /// Ends a rewritable line so that what follows starts on a line of its own.
    fn finish(&mut self) {
        if self.open {
            self.open = false;
            console::stderr_line("");
        }
    }
}
