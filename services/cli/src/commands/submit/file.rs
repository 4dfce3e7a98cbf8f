//! `mgpu submit --file FILE [--watch]`: submit every job of a job file, and with `--watch` the
//! jobs appended to it later.
//!
//! Each job is reported on its own line (`FILE:LINE: submitted 1a2b3c4d5e`); a bad one is
//! reported on stderr (`FILE:LINE: <what is wrong>`) and skipped, the others still go. Jobs
//! with dedup on (the default) are skipped when identical to a queued or running job of the
//! user, or to an earlier job of this run.
//!
//! Watching polls the file's size, modification time and inode every second: this is a person's
//! file being tailed, not a scheduling path. A change is read once the file has stopped changing
//! for a tick, so a half-written line is not taken for a bad one. Appended jobs are submitted;
//! a file changed any other way (truncated, edited in the middle) is read again from the top,
//! and dedup keeps the jobs already submitted from going twice.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt as _;
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use anyhow::{Context as _, Result};
use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::SubmitRequest;

use super::dedup::Existing;
use super::{SubmitArgs, capture_environment, resolve_ids, resolve_workdir};
use crate::console::{self, println};
use crate::jobfile::{self, Defaults, Entry, FileError, Format};
use crate::profiles::LazyProfiles;
use crate::publish;
use crate::session::ConnectionArgs;
use crate::session::Session;

/// How often a watched file is looked at.
const POLL: Duration = Duration::from_secs(1);

pub async fn run(connection: &ConnectionArgs, args: &SubmitArgs, path: &Path) -> Result<ExitCode> {
    // A mistyped path fails before connecting.
    let text = read(path)?;
    let session = Session::connect(connection).await?;
    let defaults = Defaults {
        workdir: resolve_workdir(args.workdir.as_deref())?,
        env: capture_environment(),
        time_limit_secs: args.time_limit.map(|d| d.as_secs()),
        on_timeout: args.on_timeout.map(Into::into),
        env_setup_cmd: args.env_setup_cmd.clone(),
        no_requeue: args.no_requeue,
        after: resolve_ids(&session, &args.after).await?,
        after_any: resolve_ids(&session, &args.after_any).await?,
    };
    let mut run = FileRun {
        name: path.display().to_string(),
        format: Format::of(path),
        session,
        defaults,
        profiles: LazyProfiles::new(args.profiles.clone()),
        seen: HashMap::new(),
        tally: Tally::default(),
        quiet: args.quiet,
        last_file_error: None,
    };
    let mut consumed = Consumed::default();
    if let Some(count) = run.pass(&text, 0).await? {
        consumed = Consumed {
            text,
            entries: count,
        };
    }
    if args.watch {
        if !args.quiet {
            console::stderr_line(&format!(
                "Watching {} for new jobs; Ctrl+C stops.",
                run.name
            ));
        }
        watch(&mut run, path, consumed).await?;
    }
    if !args.quiet {
        println(&run.tally.summary(&run.name))?;
    }
    Ok(if run.tally.bad + run.tally.failed > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path)
        .with_context(|| format!("cannot read job file {}", path.display()))
}

/// What happened to the jobs of this run.
#[derive(Debug, Default)]
struct Tally {
    submitted: usize,
    skipped: usize,
    bad: usize,
    failed: usize,
}

impl Tally {
    fn summary(&self, name: &str) -> String {
        let mut parts = vec![format!("{} submitted", self.submitted)];
        if self.skipped > 0 {
            parts.push(format!("{} skipped as duplicates", self.skipped));
        }
        if self.bad > 0 {
            parts.push(format!("{} bad", self.bad));
        }
        if self.failed > 0 {
            parts.push(format!("{} not stored (see above)", self.failed));
        }
        format!("{name}: {}", parts.join(", "))
    }
}

/// The part of the file already handled: its text and how many jobs it held.
#[derive(Debug, Default)]
struct Consumed {
    text: String,
    entries: usize,
}

impl Consumed {
    /// Jobs of `text` already handled: all of ours when `text` only appends to what was read
    /// (after a complete last line), none when the file was changed in any other way.
    fn handled_in(&self, text: &str) -> Option<usize> {
        let appended = text.starts_with(&self.text)
            && (self.text.is_empty() || self.text.ends_with('\n') || text == self.text);
        appended.then_some(self.entries)
    }
}

struct FileRun {
    /// The path as the user gave it, starting every message.
    name: String,
    format: Format,
    session: Session,
    defaults: Defaults,
    profiles: LazyProfiles,
    /// Dedup keys submitted during this run, with the line that submitted them.
    seen: HashMap<String, usize>,
    tally: Tally,
    quiet: bool,
    /// A whole-file error already shown, so a watched file is not reported every tick.
    last_file_error: Option<FileError>,
}

impl FileRun {
    /// Handles the jobs of `text` after the first `skip`. Returns how many jobs `text` holds,
    /// or None when it cannot be read as a whole (a TOML syntax error).
    async fn pass(&mut self, text: &str, skip: usize) -> Result<Option<usize>> {
        let entries = match jobfile::parse(self.format, text) {
            Ok(entries) => entries,
            Err(err) => {
                if self.last_file_error.as_ref() != Some(&err) {
                    console::stderr_line(&format!("{}:{}: {}", self.name, err.line, err.message));
                    self.tally.bad += 1;
                    self.last_file_error = Some(err);
                }
                return Ok(None);
            }
        };
        self.last_file_error = None;
        let count = entries.len();
        let new: Vec<Entry> = entries.into_iter().skip(skip).collect();
        if new.is_empty() {
            return Ok(Some(count));
        }
        let wants_dedup = new
            .iter()
            .any(|entry| entry.draft.as_ref().is_ok_and(|draft| draft.dedup));
        let existing = if wants_dedup {
            Existing::load(&self.session).await?
        } else {
            Existing::default()
        };

        // Decided first, reported after the submissions are stored, in file order.
        let mut outcomes: Vec<(usize, Outcome)> = Vec::new();
        let mut requests: Vec<SubmitRequest> = Vec::new();
        for Entry { line, draft } in new {
            let spec = draft.and_then(|draft| {
                jobfile::finalize(draft, &self.defaults, &mut self.profiles, |dir| {
                    resolve_workdir(Some(dir))
                })
            });
            let spec = match spec {
                Ok(spec) => spec,
                Err(message) => {
                    outcomes.push((line, Outcome::Bad(message)));
                    continue;
                }
            };
            if spec.dedup {
                let key = spec.dedup_key();
                if let Some(earlier) = self.seen.get(&key) {
                    let why = format!("identical to line {earlier}");
                    outcomes.push((line, Outcome::Skipped(why)));
                    continue;
                }
                if let Some(found) = existing.find(&spec) {
                    let why = format!("identical to job {} ({})", found.id.short(), found.state);
                    outcomes.push((line, Outcome::Skipped(why)));
                    continue;
                }
                self.seen.insert(key, line);
            }
            outcomes.push((line, Outcome::Sent(requests.len())));
            requests.push(SubmitRequest {
                id: JobId::random(),
                user: self.session.user.clone(),
                spec,
            });
        }

        let mut results: Vec<Option<Result<()>>> = publish::submit_all(&self.session, &requests)
            .await
            .into_iter()
            .map(Some)
            .collect();
        for (line, outcome) in outcomes {
            match outcome {
                Outcome::Bad(message) => self.bad(line, &message),
                Outcome::Skipped(why) => self.skipped(line, &why)?,
                Outcome::Sent(index) => {
                    let result = results.get_mut(index).and_then(Option::take);
                    let id = requests.get(index).map(|r| &r.id);
                    match (result, id) {
                        (Some(Ok(())), Some(id)) => self.submitted(line, id)?,
                        (Some(Err(err)), _) => {
                            self.tally.failed += 1;
                            console::stderr_line(&format!(
                                "{}:{line}: not submitted: {err:#}",
                                self.name
                            ));
                        }
                        // One result per request: nothing else can happen.
                        _ => {}
                    }
                }
            }
        }
        Ok(Some(count))
    }

    fn submitted(&mut self, line: usize, id: &JobId) -> Result<()> {
        self.tally.submitted += 1;
        if self.quiet {
            println(id.as_str())?;
        } else {
            println(&format!("{}:{line}: submitted {}", self.name, id.short()))?;
        }
        Ok(())
    }

    fn bad(&mut self, line: usize, message: &str) {
        self.tally.bad += 1;
        console::stderr_line(&format!("{}:{line}: {message}", self.name));
    }

    fn skipped(&mut self, line: usize, why: &str) -> Result<()> {
        self.tally.skipped += 1;
        let text = format!("{}:{line}: skipped: {why}", self.name);
        // With -q stdout carries only the ids of submitted jobs.
        if self.quiet {
            console::stderr_line(&text);
        } else {
            println(&text)?;
        }
        Ok(())
    }
}

/// What became of one job of a pass.
enum Outcome {
    Bad(String),
    Skipped(String),
    /// Sent as this request of the pass.
    Sent(usize),
}

/// What identifies a version of the file without reading it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stamp {
    len: u64,
    modified: Option<SystemTime>,
    inode: u64,
}

fn stamp(path: &Path) -> std::io::Result<Stamp> {
    let meta = std::fs::metadata(path)?;
    Ok(Stamp {
        len: meta.len(),
        modified: meta.modified().ok(),
        inode: meta.ino(),
    })
}

/// Polls the file until Ctrl+C, handling each settled change.
async fn watch(run: &mut FileRun, path: &Path, mut consumed: Consumed) -> Result<()> {
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    let mut ctrl_c_armed = true;
    let mut ticks = tokio::time::interval(POLL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Unknown at first, so the file is looked at once more after the first tick: a change
    // between the first read and now is not missed (and an unchanged file adds nothing).
    let mut last: Option<Stamp> = None;
    let mut unsettled = false;
    let mut unreadable: Option<String> = None;
    loop {
        tokio::select! {
            signal = &mut ctrl_c, if ctrl_c_armed => {
                if signal.is_err() {
                    // No handler: Ctrl+C then ends us the default way.
                    ctrl_c_armed = false;
                    continue;
                }
                return Ok(());
            }
            _ = ticks.tick() => {}
        }
        let now = match stamp(path) {
            Ok(now) => now,
            Err(err) => {
                // Editors replace files by renaming; a moment without one is normal, so only a
                // lasting problem is reported, once.
                let text = format!("{}: cannot read: {err}", run.name);
                if unsettled && unreadable.as_deref() != Some(text.as_str()) {
                    console::stderr_line(&text);
                    unreadable = Some(text);
                }
                unsettled = true;
                last = None;
                continue;
            }
        };
        unreadable = None;
        if last != Some(now) {
            last = Some(now);
            unsettled = true;
            continue;
        }
        if !unsettled {
            continue;
        }
        unsettled = false;
        let text = match read(path) {
            Ok(text) => text,
            Err(err) => {
                console::stderr_line(&format!("{err:#}"));
                continue;
            }
        };
        let skip = match consumed.handled_in(&text) {
            Some(skip) => skip,
            None => {
                if !run.quiet {
                    console::stderr_line(&format!(
                        "{} changed other than by appending: reading it again from the top",
                        run.name
                    ));
                }
                0
            }
        };
        if let Some(count) = run.pass(&text, skip).await? {
            consumed = Consumed {
                text,
                entries: count,
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn consumed(text: &str, entries: usize) -> Consumed {
        Consumed {
            text: text.into(),
            entries,
        }
    }

    #[test]
    fn appended_jobs_are_the_only_new_ones() {
        let read = consumed("0,a.py,,,\n1,b.py,,,\n", 2);
        assert_eq!(
            read.handled_in("0,a.py,,,\n1,b.py,,,\n2,c.py,,,\n"),
            Some(2)
        );
        assert_eq!(read.handled_in("0,a.py,,,\n1,b.py,,,\n"), Some(2));
        // Truncated, or changed in the middle: from the top.
        assert_eq!(read.handled_in(""), None);
        assert_eq!(read.handled_in("0,a.py,,,\n"), None);
        assert_eq!(read.handled_in("0,x.py,,,\n1,b.py,,,\n2,c.py,,,\n"), None);
        // A last line read without its newline may since have grown: from the top.
        let open = consumed("0,a.py,,,\n1,b", 2);
        assert_eq!(open.handled_in("0,a.py,,,\n1,b.py,,,\n"), None);
        assert_eq!(open.handled_in("0,a.py,,,\n1,b"), Some(2));
        assert_eq!(Consumed::default().handled_in("0,a.py,,,\n"), Some(0));
    }

    #[test]
    fn the_summary_mentions_only_what_happened() {
        let mut tally = Tally {
            submitted: 3,
            ..Tally::default()
        };
        assert_eq!(tally.summary("jobs.txt"), "jobs.txt: 3 submitted");
        tally.skipped = 1;
        tally.bad = 2;
        assert_eq!(
            tally.summary("jobs.txt"),
            "jobs.txt: 3 submitted, 1 skipped as duplicates, 2 bad"
        );
    }
}
