//! What a follower (`mgpu submit -i`, `mgpu attach`) makes of each version of the followed
//! job's record: the status it shows (queued and why, running where), when input may start,
//! and the exit status when the record is all there is to go by.

use std::process::ExitCode;

use mgpu_protocol::duration::format_duration;
use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::{JobRecord, JobState, WaitReason};
use mgpu_protocol::subjects;
use tokio::time::Instant;

use super::input::{self, InputMode, InputTarget};
use super::raw_terminal::RawInput;
use super::record;
use super::status::StatusLine;
use crate::client::session::Session;
use crate::console;
use crate::human;

/// What we know about the followed job, besides its record (the feed keeps that).
pub struct Watcher {
    pub id: JobId,
    queued_since: Instant,
    shown_reason: Option<WaitReason>,
    announced_run: bool,
    attaching: bool,
    /// What to send the job, until sending starts; then None.
    input: Option<(InputMode, tokio::sync::mpsc::Sender<()>)>,
    /// This terminal in raw mode while a terminal job's keys are passed on.
    pub raw_input: Option<RawInput>,
    /// Output arrived after the last record version: a "queued" record is stale, so no
    /// progress line may be drawn into the job's output.
    pub output_since_record: bool,
}

impl Watcher {
    /// `input` goes to the job once it runs; `detach` hears `Ctrl+]` from a terminal viewer.
    pub fn new(
        id: &JobId,
        attaching: bool,
        input: InputMode,
        detach: tokio::sync::mpsc::Sender<()>,
    ) -> Watcher {
        Watcher {
            id: id.clone(),
            queued_since: Instant::now(),
            shown_reason: None,
            announced_run: false,
            attaching,
            input: Some((input, detach)),
            raw_input: None,
            output_since_record: false,
        }
    }

    /// An end-of-output marker ends our wait unless it belongs to an earlier attempt than the
    /// one recorded (a restarted job writes again).
    pub fn is_current_attempt(record: Option<&JobRecord>, attempt: u32) -> bool {
        record.is_none_or(|record| attempt >= record.attempt)
    }

    /// Why the job waits, while it does (as far as we know).
    pub fn queued_reason(&self, record: Option<&JobRecord>) -> Option<WaitReason> {
        if self.output_since_record {
            return None;
        }
        match record {
            None => Some(WaitReason::Submitted),
            Some(JobRecord {
                state: JobState::Queued(waiting),
                ..
            }) => Some(waiting.reason),
            Some(_) => None,
        }
    }

    /// Shows that the job waits and why; with `progress`, for how long so far (otherwise only
    /// when the reason changed).
    pub fn show_queued(&mut self, status: &mut StatusLine, reason: WaitReason, progress: bool) {
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

    /// Takes a new version of the record (`first`: the first one read); returns an exit status
    /// when following is over.
    pub fn update(
        &mut self,
        record: &JobRecord,
        first: bool,
        status: &mut StatusLine,
        session: &Session,
    ) -> Option<ExitCode> {
        self.output_since_record = false;
        match &record.state {
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
                let found_running = self.attaching && first;
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
                    return Some(self.final_status(Some(record), status));
                }
                None
            }
        }
    }

    /// The exit status when the record is all we have: its exit code, or 1 when it has none.
    pub fn final_status(&self, record: Option<&JobRecord>, status: &mut StatusLine) -> ExitCode {
        status.finish();
        let Some(record) = record else {
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
        ExitCode::from(record::exit_status(record))
    }

    /// Starts sending the job input, once.
    pub fn start_stdin(&mut self, session: &Session) {
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
