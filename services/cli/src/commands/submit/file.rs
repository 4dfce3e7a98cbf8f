//! `mgpu submit --file FILE [--watch]`: submit every job of a job file, and with `--watch` the
//! jobs appended to it later.
//!
//! Each pass over the file parses it, prepares its new entries ([`super::plan`]) and hands them
//! to the pipeline; the printer says per job what became of it (`FILE:LINE: submitted
//! 1a2b3c4d5e`, or on stderr `FILE:LINE: <what is wrong>`) and a bad job does not stop the
//! others. Jobs with dedup on (the default) are skipped when identical to a queued or running
//! job of the user, or to an earlier job of this run.
//!
//! Watching polls the file's size, modification time and inode every second: this is a person's
//! file being tailed, not a scheduling path. A change is read once the file has stopped changing
//! for a tick, so a half-written line is not taken for a bad one. Appended jobs are submitted;
//! a file changed any other way (truncated, edited in the middle) is read again from the top,
//! and dedup keeps the jobs already submitted from going twice.

use std::os::unix::fs::MetadataExt as _;
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use anyhow::{Context as _, Result};

use super::args::SubmitArgs;
use super::pipeline::Pipeline;
use super::plan;
use super::printer::FilePrinter;
use super::spec::FileDefaults;
use crate::client::session::Session;
use crate::console;
use crate::gpu_profiles::LazyProfiles;
use crate::jobfile::{self, Entry, FileError, Format};

/// How often a watched file is looked at.
const POLL: Duration = Duration::from_secs(1);

/// The job file's text; read before connecting, so a mistyped path fails first.
pub fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path)
        .with_context(|| format!("cannot read job file {}", path.display()))
}

/// Submits the jobs of `text` (the file at `path`), then with `--watch` those appended later.
pub async fn submit(
    session: &Session,
    args: &SubmitArgs,
    path: &Path,
    text: String,
) -> Result<ExitCode> {
    let mut run = FileRun {
        format: Format::of(path),
        defaults: FileDefaults::from_args(args, session).await?,
        profiles: LazyProfiles::new(args.profiles.clone()),
        user: session.user.clone(),
        pipeline: Pipeline::new(session),
        printer: FilePrinter::new(path.display().to_string(), args.quiet),
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
                run.printer.name()
            ));
        }
        watch(&mut run, path, consumed).await?;
    }
    Ok(if run.printer.finish()? {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
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

/// One run over a job file: what every pass needs, and what passes remember.
struct FileRun<'s> {
    format: Format,
    defaults: FileDefaults,
    profiles: LazyProfiles,
    user: String,
    /// Remembers the jobs sent, so a later pass does not send an identical one again.
    pipeline: Pipeline<'s>,
    printer: FilePrinter,
    quiet: bool,
    /// A whole-file error already shown, so a watched file is not reported every tick.
    last_file_error: Option<FileError>,
}

impl FileRun<'_> {
    /// Handles the jobs of `text` after the first `skip`. Returns how many jobs `text` holds,
    /// or None when it cannot be read as a whole (a TOML syntax error).
    async fn pass(&mut self, text: &str, skip: usize) -> Result<Option<usize>> {
        let entries = match jobfile::parse(self.format, text) {
            Ok(entries) => entries,
            Err(err) => {
                if self.last_file_error.as_ref() != Some(&err) {
                    self.printer.file_error(&err);
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
        let prepared = plan::file_entries(new, &self.defaults, &mut self.profiles, &self.user);
        let settled = self.pipeline.run(prepared).await?;
        self.printer.pass(settled)?;
        Ok(Some(count))
    }
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
async fn watch(run: &mut FileRun<'_>, path: &Path, mut consumed: Consumed) -> Result<()> {
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
                let text = format!("{}: cannot read: {err}", run.printer.name());
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
                        run.printer.name()
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
}
