//! `mgpu top`'s state and how each input changes it: a job record, a heartbeat, an admin mark,
//! a key, the clock, the terminal's size. [`Model::update`] is pure: it changes the state and
//! returns what should be done outside ([`Effect`]s: cancel, hold, release, follow a log,
//! quit) as data, for the command's loop to carry out; their outcomes come back as inputs.
//!
//! Data inputs only mark the lines stale; [`Model::settle`] works them out again once per
//! frame (and before a key acts on them), so a burst of thousands of records costs one pass.

use crossterm::event::KeyEvent;
use mgpu_protocol::Timestamp;
use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::JobRecord;
use mgpu_protocol::node::{NodeAdmin, NodeHeartbeat};
use mgpu_protocol::priority::{Policy, UsageBook};

use super::data::Data;
use super::filter::Filter;
use super::keys::{self, KeyMode};
use super::layout;
use super::log::LogPane;
pub use super::me::Me;
use super::rows::{self, Rows};

/// Something that happened: read from the cluster, typed, or reported back by an effect.
#[derive(Debug)]
pub enum Input {
    /// A job's record as stored now (a finished one leaves the screen). Boxed, as records
    /// are large and most inputs are not.
    Job(Box<JobRecord>),
    /// A job's record was deleted.
    JobGone(JobId),
    /// Every submission the scheduler has not recorded yet (it may be down), as read now.
    Pending(Vec<JobRecord>),
    Heartbeat(Box<NodeHeartbeat>),
    Policy(Policy),
    Usage(UsageBook),
    /// A node's drain and paused GPUs; None: none any more.
    Marks {
        node: String,
        marks: Option<NodeAdmin>,
    },
    /// Whether the user is an admin (may cancel anyone's jobs).
    Admin(bool),
    Tick(Timestamp),
    Resize {
        cols: u16,
        rows: u16,
    },
    Key(KeyEvent),
    /// A line for the status bar: how a request went, a feed that failed.
    Said(String),
    /// Output of the job whose log is open.
    Log {
        job: JobId,
        bytes: Vec<u8>,
    },
    /// That output ended, or could not be read.
    LogEnded {
        job: JobId,
        note: String,
    },
}

impl Input {
    pub fn job(record: JobRecord) -> Input {
        Input::Job(Box::new(record))
    }

    pub fn heartbeat(beat: NodeHeartbeat) -> Input {
        Input::Heartbeat(Box::new(beat))
    }
}

/// What the loop is asked to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Effect {
    Cancel(JobId),
    Hold(JobId),
    Release(JobId),
    /// Start reading this job's output (on this subject) into the log pane (replacing any
    /// other).
    FollowLog(JobId, String),
    StopLog,
    Quit,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pane {
    Nodes,
    Jobs,
}

/// What is open over the panes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mode {
    Normal,
    /// Typing a filter; Esc goes back to this one.
    Typing {
        before: Filter,
    },
    /// Asking whether to cancel this job.
    Confirm {
        job: JobId,
        question: String,
    },
    /// A job's record, kept up to date while open (also once it finished).
    Detail(Box<JobRecord>),
    Log(LogPane),
}

/// Where a pane's selection is. The selected line is remembered by what it shows, so new
/// lines above it do not move the selection to another job.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Cursor {
    pub index: usize,
    /// The first line shown.
    pub offset: usize,
    pub(super) key: Option<LineKey>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum LineKey {
    Job(JobId),
    Gpu(String, Option<u32>),
}

pub struct Model {
    pub(super) me: Me,
    /// None until known: the scheduler then decides (and says no to non-admins).
    pub(super) admin: Option<bool>,
    pub(super) now: Timestamp,
    pub(super) size: (u16, u16),
    pub(super) data: Data,
    pub(super) filter: Filter,
    pub(super) focus: Pane,
    pub(super) nodes_cursor: Cursor,
    pub(super) jobs_cursor: Cursor,
    pub(super) mode: Mode,
    pub(super) status: Option<String>,
    pub(super) rows: Rows,
    stale: bool,
}

impl Model {
    pub fn new(me: Me, now: Timestamp, size: (u16, u16)) -> Model {
        Model {
            me,
            admin: None,
            now,
            size,
            data: Data::default(),
            filter: Filter::default(),
            focus: Pane::Jobs,
            nodes_cursor: Cursor::default(),
            jobs_cursor: Cursor::default(),
            mode: Mode::Normal,
            status: None,
            rows: Rows::default(),
            stale: true,
        }
    }

    /// Applies one input; returns what the loop should do.
    pub fn update(&mut self, input: Input) -> Vec<Effect> {
        match input {
            Input::Key(key) => {
                // Keys act on the lines as they are now.
                self.settle();
                return match keys::action(self.key_mode(), &key) {
                    Some(action) => self.act(action),
                    None => Vec::new(),
                };
            }
            Input::Job(record) => {
                if let Mode::Detail(shown) = &mut self.mode
                    && shown.id == record.id
                {
                    shown.clone_from(&record);
                }
                self.data.put_job(*record);
            }
            Input::JobGone(id) => self.data.remove_job(&id),
            Input::Pending(submissions) => self.data.set_pending(submissions),
            Input::Heartbeat(beat) => {
                if !self.data.put_heartbeat(*beat) {
                    return Vec::new();
                }
            }
            Input::Policy(policy) => self.data.policy = policy,
            Input::Usage(usage) => self.data.usage = usage,
            Input::Marks { node, marks } => self.data.put_marks(node, marks),
            Input::Admin(admin) => self.admin = Some(admin),
            Input::Tick(now) => self.now = now,
            Input::Resize { cols, rows } => self.size = (cols, rows),
            Input::Said(text) => self.status = Some(text),
            Input::Log { job, bytes } => {
                if let Mode::Log(pane) = &mut self.mode
                    && pane.job == job
                {
                    pane.push(&bytes);
                }
            }
            Input::LogEnded { job, note } => {
                if let Mode::Log(pane) = &mut self.mode
                    && pane.job == job
                {
                    pane.note = Some(note);
                }
            }
        }
        self.stale = true;
        Vec::new()
    }

    /// Works the lines out again after data changed, and keeps each selection on what it
    /// showed (or, when that is gone, at the same place).
    pub fn settle(&mut self) {
        if !self.stale {
            return;
        }
        self.stale = false;
        self.rows = rows::derive(&self.data, &self.filter, &self.me, self.now);
        // The selection is pinned to what it shows once the user moves it; until then it
        // stays on the first line, whatever loads above it. A pinned line that is gone
        // (filtered out as the filter is typed, say) keeps its key: the selection comes back
        // to it when it shows again.
        let found = self.jobs_cursor.key.as_ref().and_then(|key| {
            self.rows.jobs.iter().position(|line| {
                matches!(key, LineKey::Job(id)
                    if self.data.jobs.get(line.job).is_some_and(|job| &job.id == id))
            })
        });
        place(&mut self.jobs_cursor, found, self.rows.jobs.len());
        let found = self.nodes_cursor.key.as_ref().and_then(|key| {
            self.rows.gpus.iter().position(
                |line| matches!(key, LineKey::Gpu(node, gpu) if self.gpu_line_is(line, node, *gpu)),
            )
        });
        place(&mut self.nodes_cursor, found, self.rows.gpus.len());
        self.scroll_into_view();
    }

    pub fn key_mode(&self) -> KeyMode {
        match self.mode {
            Mode::Normal => KeyMode::Normal,
            Mode::Typing { .. } => KeyMode::Typing,
            Mode::Confirm { .. } => KeyMode::Confirm,
            Mode::Detail(_) | Mode::Log(_) => KeyMode::Overlay,
        }
    }

    pub fn mode(&self) -> &Mode {
        &self.mode
    }

    pub fn status(&self) -> Option<&str> {
        self.status.as_deref()
    }

    /// The job on the selected line of the pane in focus.
    pub fn selected_job(&self) -> Option<&JobRecord> {
        let at = match self.focus {
            Pane::Jobs => self.rows.jobs.get(self.jobs_cursor.index)?.job,
            Pane::Nodes => self.rows.gpus.get(self.nodes_cursor.index)?.job?,
        };
        self.data.jobs.get(at)
    }

    pub(super) fn job_key(&self, index: usize) -> Option<LineKey> {
        let line = self.rows.jobs.get(index)?;
        let job = self.data.jobs.get(line.job)?;
        Some(LineKey::Job(job.id.clone()))
    }

    pub(super) fn gpu_key(&self, line: &rows::GpuLine) -> Option<LineKey> {
        let node = self.data.nodes.get(line.node)?;
        let gpu = line
            .gpu
            .and_then(|at| node.gpus.get(at))
            .map(|gpu| gpu.index);
        Some(LineKey::Gpu(node.node.clone(), gpu))
    }

    /// Whether `line` is GPU `gpu` of `node` (without building its key: this runs over every
    /// GPU line).
    fn gpu_line_is(&self, line: &rows::GpuLine, node: &str, gpu: Option<u32>) -> bool {
        self.data.nodes.get(line.node).is_some_and(|beat| {
            beat.node == node && line.gpu.and_then(|at| beat.gpus.get(at)).map(|g| g.index) == gpu
        })
    }

    /// Lines each pane shows at the current size.
    pub(super) fn page_heights(&self) -> (usize, usize) {
        let layout = layout::layout(self.size, self.rows.gpus.len());
        (
            layout::visible_lines(layout.nodes),
            layout::visible_lines(layout.jobs),
        )
    }

    /// Moves each pane's first line shown so that its selection is on screen.
    pub(super) fn scroll_into_view(&mut self) {
        let (nodes, jobs) = self.page_heights();
        for (cursor, height) in [
            (&mut self.nodes_cursor, nodes),
            (&mut self.jobs_cursor, jobs),
        ] {
            let height = height.max(1);
            if cursor.index < cursor.offset {
                cursor.offset = cursor.index;
            } else if cursor.index >= cursor.offset + height {
                cursor.offset = cursor.index + 1 - height;
            }
        }
    }

    pub(super) fn mark_stale(&mut self) {
        self.stale = true;
    }
}

/// Puts a cursor on the line it showed (`found`), else keeps its place within `len` lines.
fn place(cursor: &mut Cursor, found: Option<usize>, len: usize) {
    cursor.index = match found {
        Some(at) => at,
        None => cursor.index.min(len.saturating_sub(1)),
    };
    if cursor.offset >= len {
        cursor.offset = len.saturating_sub(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::top::screen::test_data::{alice, heartbeat, job, queued, running};
    use crossterm::event::{KeyCode, KeyModifiers};

    fn model() -> Model {
        Model::new(alice(), mgpu_protocol::now(), (120, 40))
    }

    #[test]
    fn the_selection_follows_its_job_when_lines_move() {
        let mut model = model();
        let first = job("alice", "first", queued());
        model.update(Input::job(first.clone()));
        model.settle();
        assert_eq!(model.selected_job().map(|j| &j.id), Some(&first.id));
        // Moved (here: to the top), the selection is pinned to its job.
        model.update(Input::Key(KeyEvent::new(
            KeyCode::Char('g'),
            KeyModifiers::NONE,
        )));
        // A running job is listed above every queued one: the selection stays on `first`.
        model.update(Input::job(job("bob", "other", running("n1", &[0]))));
        model.settle();
        assert_eq!(model.jobs_cursor.index, 1);
        assert_eq!(model.selected_job().map(|j| &j.id), Some(&first.id));
        // Once it is gone, the selection stays where it was, on what is there now.
        let mut done = first.clone();
        done.state = crate::commands::top::screen::test_data::finished();
        model.update(Input::job(done));
        model.settle();
        assert_eq!(model.jobs_cursor.index, 0);
        assert_eq!(model.selected_job().map(|j| j.user.as_str()), Some("bob"));
    }

    #[test]
    fn an_unmoved_selection_stays_on_the_first_line() {
        let mut model = model();
        model.update(Input::job(job("alice", "first", queued())));
        model.settle();
        let running = job("bob", "other", running("n1", &[0]));
        model.update(Input::job(running.clone()));
        model.settle();
        assert_eq!(model.jobs_cursor.index, 0);
        assert_eq!(model.selected_job().map(|j| &j.id), Some(&running.id));
    }

    #[test]
    fn an_older_heartbeat_changes_nothing() {
        let mut model = model();
        let beat = heartbeat("n1", 2);
        model.update(Input::heartbeat(beat.clone()));
        model.settle();
        let mut old = beat.clone();
        old.sent_at = beat.sent_at - chrono::Duration::seconds(1);
        old.gpus.clear();
        model.update(Input::heartbeat(old));
        model.settle();
        assert_eq!(model.rows.gpus.len(), 2);
    }
}
