//! `mgpu wait ID…`: block until jobs end, and say through the exit status how they ended.
//!
//! Each job is found first (by id or unique prefix, live or in history); an id that names no
//! job ends the command at once with [`UNKNOWN_JOB`], before anything is waited for. Then the
//! records of the jobs still unfinished are watched in the jobs bucket
//! ([`record::watch_records`]), and read again every [`RECHECK`] as well (every [`POLL`]
//! without a watch): a finished job moves to history without leaving a trace in the bucket,
//! so a watch started after it finished would never hear of it. On a terminal, stderr shows a
//! status line rewritten in place and a line per job that ends; elsewhere `wait` prints
//! nothing, its exit status says it all.

use std::io::{IsTerminal as _, Write as _};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Result;
use clap::Args;
use futures::StreamExt;
use futures::future::join_all;
use mgpu_protocol::duration::format_duration;
use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::{JobRecord, JobState, WaitReason};
use tokio::time::Instant;

use crate::client::follow::record::{self, RecordsChanges};
use crate::client::session::{ConnectionArgs, Session};
use crate::console;
use crate::human;
use crate::model::jobs;

/// The exit status when an id names no job (or several): nothing was waited for.
pub const UNKNOWN_JOB: u8 = 2;

/// The exit status of a job that did not succeed and has no exit code of its own (cancelled
/// before it started, lost with its node, failed to start), or exited 0 all the same.
pub const FAILED_WITHOUT_CODE: u8 = 1;

/// How often unfinished jobs are read again, watch or no watch.
const RECHECK: Duration = Duration::from_secs(10);

/// How often unfinished jobs are read again when there is no watch.
const POLL: Duration = Duration::from_secs(2);

/// How often the status line is redrawn on a terminal.
const REDRAW: Duration = Duration::from_secs(1);

#[derive(Debug, Args)]
#[command(after_long_help = "\
Exit status:
  0    every job succeeded (with --any: the job that ended first succeeded)
  N    the exit code (1-255) of the job that failed first (the earliest to end; with --any,
       the job that ended first); a job killed by signal S exited 128+S
  1    that job failed without an exit code (cancelled before it started, lost with its
       node, could not start), or mgpu itself failed (no connection)
  2    an ID names no job, or several (nothing was waited for)

On a terminal, stderr shows how many jobs still run or wait, and a line per job that ends.

Examples:
  mgpu wait 3f2a9c1e                  # until it ends; its exit code is ours
  mgpu wait $(mgpu submit -q train.sh) && echo trained
  mgpu wait --any 3f2a 8b41 && echo 'one of them succeeded'")]
pub struct WaitArgs {
    /// The jobs: ids, or unique prefixes of them.
    #[arg(required = true, value_name = "ID")]
    pub ids: Vec<String>,

    /// Return as soon as one of the jobs ends, with that job's exit status.
    #[arg(long)]
    pub any: bool,
}

pub async fn run(connection: &ConnectionArgs, args: &WaitArgs) -> Result<ExitCode> {
    let session = Session::connect(connection).await?;
    let Some(found) = find_all(&session, &args.ids).await? else {
        return Ok(ExitCode::from(UNKNOWN_JOB));
    };
    let mut waiting = Waiting::new(found, args.any);
    waiting.run(&session).await
}

/// Every job the ids name, in order and without repeats; None (the errors printed) when an id
/// names no job or several. Failing to read is an error, not an unknown job.
async fn find_all(session: &Session, typed: &[String]) -> Result<Option<Vec<JobRecord>>> {
    let found = join_all(typed.iter().map(|t| jobs::find_anywhere(session, t))).await;
    let mut records: Vec<JobRecord> = Vec::with_capacity(found.len());
    let mut unknown = false;
    for result in found {
        match result {
            Ok(record) if records.iter().any(|r| r.id == record.id) => {}
            Ok(record) => records.push(record),
            Err(err) if names_no_job(&err) => {
                unknown = true;
                console::stderr_line(&format!("error: {err:#}"));
            }
            Err(err) => return Err(err),
        }
    }
    Ok((!unknown).then_some(records))
}

/// Whether a failed lookup says the id names no job (none, several, or it is no id at all),
/// rather than that reading failed. The lookups' errors reach here as their text only.
fn names_no_job(err: &anyhow::Error) -> bool {
    let text = err.to_string();
    is_not_found(err) || text.contains("is ambiguous") || text.contains("is not a job id")
}

/// Whether a failed lookup says the job is not there.
fn is_not_found(err: &anyhow::Error) -> bool {
    let text = err.to_string();
    text.starts_with("no job matches") || text.contains("no longer exists")
}

/// How a job ended, as `wait` counts it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Ended {
    id: JobId,
    ended_at: mgpu_protocol::Timestamp,
    code: u8,
}

/// The exit status a finished job gives `wait`: 0 for success, else its exit code, else
/// [`FAILED_WITHOUT_CODE`]; unlike a follower's ([`record::exit_status`]), a failure never
/// reads as 0, even one whose process exited 0.
fn exit_status_of(record: &JobRecord) -> u8 {
    if matches!(record.state, JobState::Succeeded(_)) {
        return 0;
    }
    match record::exit_status(record) {
        0 => FAILED_WITHOUT_CODE,
        code => code,
    }
}

/// `wait`'s exit status once it is done: with `any`, the status of the job that ended first;
/// otherwise that of the first failure by end time, else 0.
fn verdict(ended: &[Ended], any: bool) -> u8 {
    let mut by_time: Vec<&Ended> = ended.iter().collect();
    by_time.sort_by_key(|e| e.ended_at);
    if any {
        return by_time.first().map_or(0, |e| e.code);
    }
    by_time.iter().find(|e| e.code != 0).map_or(0, |e| e.code)
}

/// How many of the unfinished jobs run, wait or are held.
#[derive(Debug, Default, PartialEq, Eq)]
struct Tally {
    running: usize,
    queued: usize,
    held: usize,
}

impl Tally {
    fn of<'a>(states: impl Iterator<Item = &'a JobState>) -> Tally {
        let mut tally = Tally::default();
        for state in states {
            match state {
                JobState::Running(_) => tally.running += 1,
                JobState::Queued(w) if w.reason == WaitReason::Held => tally.held += 1,
                JobState::Queued(_) => tally.queued += 1,
                _ => {}
            }
        }
        tally
    }
}

/// The status line: `waiting for 3 jobs: 1 running, 2 queued (1m20s)`.
fn status_text(
    total: usize,
    unfinished: usize,
    any: bool,
    tally: &Tally,
    waited: Duration,
) -> String {
    let jobs = if total == 1 { "job" } else { "jobs" };
    let head = match (any, unfinished == total) {
        (true, _) => format!("waiting for the first of {total} {jobs} to end"),
        (false, true) if total == 1 => "waiting for 1 job".to_owned(),
        (false, true) => format!("waiting for {total} jobs"),
        (false, false) => format!("waiting for {unfinished} of {total} jobs"),
    };
    let mut parts = Vec::new();
    for (count, word) in [
        (tally.running, "running"),
        (tally.queued, "queued"),
        (tally.held, "held"),
    ] {
        if count > 0 {
            parts.push(format!("{count} {word}"));
        }
    }
    let parts = if parts.is_empty() {
        String::new()
    } else {
        format!(": {}", parts.join(", "))
    };
    format!("{head}{parts} ({})", format_duration(waited))
}

/// The line printed on a terminal when a job ends: its state, and why (the recorded reason,
/// else the exit code of a job that did not succeed).
fn end_text(record: &JobRecord) -> String {
    let id = record.id.short();
    let name = record.spec.display_name();
    let state = human::state_words(&record.state);
    let ending = record.state.ending();
    let reason = ending.and_then(|e| e.reason.as_deref());
    let code = ending.and_then(|e| e.exit_code);
    let why = match (&record.state, reason, code) {
        (_, Some(reason), _) => format!(": {reason}"),
        (JobState::Succeeded(_), None, _) | (_, None, None) => String::new(),
        (_, None, Some(code)) => format!(": exit code {code}"),
    };
    format!("mgpu: job {id} ({name}) {state}{why}")
}

/// The jobs being waited for and the screen showing it.
struct Waiting {
    any: bool,
    total: usize,
    /// The unfinished jobs' latest records.
    unfinished: Vec<JobRecord>,
    ended: Vec<Ended>,
    terminal: bool,
    /// A status line is on screen without its newline.
    line_open: bool,
    started: Instant,
}

impl Waiting {
    fn new(found: Vec<JobRecord>, any: bool) -> Waiting {
        let mut waiting = Waiting {
            any,
            total: found.len(),
            unfinished: Vec::new(),
            ended: Vec::new(),
            terminal: std::io::stderr().is_terminal(),
            line_open: false,
            started: Instant::now(),
        };
        for record in found {
            waiting.update(record);
        }
        waiting
    }

    fn done(&self) -> bool {
        self.unfinished.is_empty() || (self.any && !self.ended.is_empty())
    }

    /// Watches (and re-reads) the unfinished jobs until done; the exit status.
    async fn run(&mut self, session: &Session) -> Result<ExitCode> {
        // Without a watch (the server refused one) the re-reads do the work alone, more often.
        let mut watch = if self.done() {
            None
        } else {
            let ids: Vec<JobId> = self.unfinished.iter().map(|r| r.id.clone()).collect();
            record::watch_records(&session.js, &ids).await.ok()
        };
        let every = if watch.is_some() { RECHECK } else { POLL };
        let mut recheck = tokio::time::interval_at(Instant::now() + every, every);
        let mut redraw = tokio::time::interval(REDRAW);
        while !self.done() {
            tokio::select! {
                change = next_change(&mut watch) => match change {
                    Some(record) => self.update(record),
                    // Lost: the re-reads carry on alone, more often.
                    None => {
                        watch = None;
                        recheck = tokio::time::interval(POLL);
                    }
                },
                _ = recheck.tick() => self.reread(session).await,
                _ = redraw.tick() => self.draw(),
            }
        }
        self.close_line();
        Ok(ExitCode::from(verdict(&self.ended, self.any)))
    }

    /// Takes a job's new record: an unfinished job's is kept, a finished job is counted out.
    fn update(&mut self, record: JobRecord) {
        let index = self.unfinished.iter().position(|r| r.id == record.id);
        if !record.state.is_finished() {
            match index {
                Some(i) => self.unfinished[i] = record,
                None if !self.ended.iter().any(|e| e.id == record.id) => {
                    self.unfinished.push(record)
                }
                None => {}
            }
            return;
        }
        if let Some(i) = index {
            self.unfinished.remove(i);
        } else if self.ended.iter().any(|e| e.id == record.id) {
            return;
        }
        self.print_line(&end_text(&record));
        self.ended.push(Ended {
            id: record.id.clone(),
            ended_at: record
                .state
                .ending()
                .map_or(mgpu_protocol::now(), |e| e.ended_at),
            code: exit_status_of(&record),
        });
    }

    /// Reads every unfinished job again, wherever it is now. A job found nowhere (its record
    /// deleted, or moved to a history this user may not read) ends as a failure.
    async fn reread(&mut self, session: &Session) {
        let ids: Vec<JobId> = self.unfinished.iter().map(|r| r.id.clone()).collect();
        let found = join_all(
            ids.iter()
                .map(|id| jobs::find_anywhere(session, id.as_str())),
        )
        .await;
        for (id, result) in ids.into_iter().zip(found) {
            match result {
                Ok(record) => self.update(record),
                Err(err) if is_not_found(&err) => self.vanished(&id),
                // A read that failed (connection trouble) is tried again next time.
                Err(_) => {}
            }
        }
    }

    fn vanished(&mut self, id: &JobId) {
        self.unfinished.retain(|r| &r.id != id);
        self.print_line(&format!(
            "mgpu: job {} can no longer be found; counted as failed",
            id.short()
        ));
        self.ended.push(Ended {
            id: id.clone(),
            ended_at: mgpu_protocol::now(),
            code: FAILED_WITHOUT_CODE,
        });
    }

    /// A line above the status line, on a terminal only.
    fn print_line(&mut self, text: &str) {
        if !self.terminal {
            return;
        }
        let mut err = std::io::stderr().lock();
        if self.line_open {
            let _ = write!(err, "\r\x1b[K");
            self.line_open = false;
        }
        let _ = writeln!(err, "{text}");
        let _ = err.flush();
    }

    fn draw(&mut self) {
        if !self.terminal || self.done() {
            return;
        }
        let tally = Tally::of(self.unfinished.iter().map(|r| &r.state));
        let text = status_text(
            self.total,
            self.unfinished.len(),
            self.any,
            &tally,
            self.started.elapsed(),
        );
        let mut err = std::io::stderr().lock();
        // Carriage return and erase-line: replace the previous status.
        let _ = write!(err, "\r\x1b[K{text}");
        let _ = err.flush();
        self.line_open = true;
    }

    fn close_line(&mut self) {
        if self.line_open {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[K");
            let _ = err.flush();
            self.line_open = false;
        }
    }
}

/// The next record from the watch; None once the watch ended. Without a watch it never
/// returns.
async fn next_change(watch: &mut Option<RecordsChanges>) -> Option<JobRecord> {
    let Some(changes) = watch.as_mut() else {
        return std::future::pending().await;
    };
    loop {
        match changes.next().await {
            Some(Some(record)) => return Some(record),
            // A deletion: the re-read finds where the job went.
            Some(None) => continue,
            None => return None,
        }
    }
}

#[cfg(test)]
mod tests {
    use chrono::Duration as Ago;
    use mgpu_protocol::job::{Ending, Waiting as Queued};

    use super::*;
    use crate::fixtures;

    fn ending(exit_code: Option<i32>, secs_ago: i64) -> Ending {
        Ending {
            placement: None,
            started_at: None,
            ended_at: mgpu_protocol::now() - Ago::seconds(secs_ago),
            exit_code,
            signal: None,
            reason: None,
            usage: None,
        }
    }

    fn job(state: JobState) -> JobRecord {
        fixtures::job("train.sh", state, 0, 60)
    }

    #[test]
    fn a_job_gives_its_exit_code_and_a_failure_never_reads_as_success() {
        let status = |state| exit_status_of(&job(state));
        assert_eq!(status(JobState::Succeeded(ending(Some(0), 1))), 0);
        assert_eq!(status(JobState::Failed(ending(Some(3), 1))), 3);
        assert_eq!(status(JobState::Failed(ending(Some(300), 1))), 255);
        assert_eq!(status(JobState::Cancelled(ending(Some(143), 1))), 143);
        assert_eq!(status(JobState::Cancelled(ending(None, 1))), 1);
        assert_eq!(status(JobState::NodeFailed(ending(Some(0), 1))), 1);
        assert_eq!(status(JobState::TimedOut(ending(Some(-9), 1))), 1);
    }

    fn ended(code: u8, secs_ago: i64) -> Ended {
        Ended {
            id: JobId::random(),
            ended_at: mgpu_protocol::now() - Ago::seconds(secs_ago),
            code,
        }
    }

    #[test]
    fn the_first_failure_by_end_time_decides() {
        assert_eq!(verdict(&[ended(0, 5), ended(0, 1)], false), 0);
        // Listed first, but it failed later than the other.
        assert_eq!(verdict(&[ended(7, 1), ended(0, 9), ended(3, 5)], false), 3);
        assert_eq!(verdict(&[], false), 0);
    }

    #[test]
    fn with_any_the_first_to_end_decides() {
        assert_eq!(verdict(&[ended(4, 1)], true), 4);
        assert_eq!(verdict(&[ended(4, 1), ended(0, 3)], true), 0);
    }

    #[test]
    fn the_status_line_counts_what_runs_and_waits() {
        let held = {
            let mut w = Queued::new(WaitReason::Held);
            w.held_by = Some("alice".into());
            JobState::Queued(w)
        };
        let states = [
            fixtures::running("node001", &[]),
            fixtures::queued(),
            fixtures::queued(),
            held,
        ];
        let tally = Tally::of(states.iter());
        assert_eq!(
            tally,
            Tally {
                running: 1,
                queued: 2,
                held: 1
            }
        );
        let minute = Duration::from_secs(80);
        assert_eq!(
            status_text(4, 4, false, &tally, minute),
            "waiting for 4 jobs: 1 running, 2 queued, 1 held (1m20s)"
        );
        let one = Tally {
            running: 1,
            ..Tally::default()
        };
        assert_eq!(
            status_text(3, 1, false, &one, minute),
            "waiting for 1 of 3 jobs: 1 running (1m20s)"
        );
        assert_eq!(
            status_text(1, 1, false, &one, Duration::from_secs(5)),
            "waiting for 1 job: 1 running (5s)"
        );
        assert_eq!(
            status_text(2, 2, true, &one, minute),
            "waiting for the first of 2 jobs to end: 1 running (1m20s)"
        );
    }

    #[test]
    fn an_ended_job_is_announced_with_its_code_and_reason() {
        let mut failed = ending(Some(3), 1);
        failed.reason = Some("out of memory (host)".into());
        let record = job(JobState::Failed(failed));
        assert_eq!(
            end_text(&record),
            format!(
                "mgpu: job {} (train.sh) failed: out of memory (host)",
                record.id.short()
            )
        );
        let plain = job(JobState::Failed(ending(Some(3), 1)));
        assert_eq!(
            end_text(&plain),
            format!(
                "mgpu: job {} (train.sh) failed: exit code 3",
                plain.id.short()
            )
        );
        let ok = job(JobState::Succeeded(ending(Some(0), 1)));
        assert_eq!(
            end_text(&ok),
            format!("mgpu: job {} (train.sh) succeeded", ok.id.short())
        );
    }

    #[test]
    fn updates_count_each_job_out_once() {
        let queued = job(fixtures::queued());
        let mut waiting = Waiting::new(vec![queued.clone()], false);
        waiting.terminal = false;
        assert!(!waiting.done());
        let mut done = queued.clone();
        done.state = JobState::Failed(ending(Some(2), 1));
        waiting.update(done.clone());
        waiting.update(done);
        // A stale record arriving after the end does not bring the job back.
        waiting.update(queued);
        assert!(waiting.done());
        assert_eq!(waiting.ended.len(), 1);
        assert_eq!(verdict(&waiting.ended, false), 2);
    }

    #[test]
    fn lookups_that_name_no_job_are_told_from_failed_reads() {
        let says = |text: &str| names_no_job(&anyhow::anyhow!("{text}"));
        assert!(says("no job matches `abc`"));
        assert!(says(
            "`ab` is ambiguous: it matches 2 jobs (ab1, ab2); type more of the id"
        ));
        assert!(says(
            "`xyz!` is not a job id or id prefix (job ids are lowercase hex digits)"
        ));
        assert!(!says("reading the latest records: timed out (3 tries)"));
    }
}
