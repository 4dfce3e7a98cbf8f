//! task-spooler (`tsp`) in the same sitting as mgpu, so each run prints mgpu's ratio to the
//! tool people pick for ease on one host: its drain (`tsp -S 8`, 1 000 `tsp true` one after
//! another, from the first submit until all finished) and its listing (`tsp -l` with as many
//! jobs waiting behind a busy slot as it holds: 990 of the 1 000 mgpu lists). Each measurement runs a task-spooler server of its own
//! (`TS_SOCKET` in a directory of its own), which `tsp -K` stops at the end. Where `tsp` is
//! not installed (`scripts/setup.sh` installs the Debian package), the comparison is skipped
//! with a note.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::common::*;

/// A task-spooler server of its own, stopped when dropped.
pub(crate) struct Spooler {
    socket: PathBuf,
    _dir: tempfile::TempDir,
}

impl Spooler {
    /// A new server with `slots` jobs at once; None when `tsp` is not installed.
    pub fn start(slots: u32) -> Result<Option<Spooler>> {
        if Command::new("tsp").arg("-V").output().is_err() {
            progress("  tsp (task-spooler) not installed: its comparison is skipped");
            return Ok(None);
        }
        let dir = tempfile::tempdir().context("a directory for task-spooler")?;
        let spooler = Spooler {
            socket: dir.path().join("socket"),
            _dir: dir,
        };
        spooler.run(&["-S", &slots.to_string()])?;
        Ok(Some(spooler))
    }

    /// Runs `tsp ARGS` against this server; its standard output. Into a file, not a pipe:
    /// a queued job's `tsp` leaves a process behind that holds its output open until the job
    /// ran, and reading a pipe to its end would wait for that.
    pub fn run(&self, args: &[&str]) -> Result<String> {
        let dir = self.socket.parent().unwrap_or(Path::new("/tmp"));
        let (out_path, err_path) = (dir.join("stdout"), dir.join("stderr"));
        let out = std::fs::File::create(&out_path).context("tsp's output file")?;
        let err = std::fs::File::create(&err_path).context("tsp's error file")?;
        let status = Command::new("tsp")
            .args(args)
            .env("TS_SOCKET", &self.socket)
            .env("TMPDIR", dir)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .status()
            .with_context(|| format!("running tsp {args:?}"))?;
        if !status.success() {
            let said = std::fs::read_to_string(&err_path).unwrap_or_default();
            bail!("tsp {args:?} failed: {said}");
        }
        std::fs::read_to_string(&out_path).context("reading tsp's output")
    }
}

impl Drop for Spooler {
    fn drop(&mut self) {
        let _ = self.run(&["-K"]);
    }
}

/// `jobs` × `tsp true` one after another on 8 slots, until all finished: jobs per second.
pub(crate) fn drain_rate(jobs: usize) -> Result<Option<f64>> {
    let Some(spooler) = Spooler::start(8)? else {
        return Ok(None);
    };
    let began = Instant::now();
    let mut last = String::new();
    for _ in 0..jobs {
        last = spooler.run(&["true"])?.trim().to_owned();
    }
    // `-w ID` waits for that job; the slots run in order of submission, so once the last
    // started and ended, the listing says whether any is left.
    spooler.run(&["-w", &last])?;
    wait_until(
        "task-spooler to finish every job",
        Duration::from_secs(60),
        Duration::from_millis(5),
        || {
            let listing = spooler.run(&["-l"])?;
            let busy = listing
                .lines()
                .skip(1)
                .any(|line| line.contains("queued") || line.contains("running"));
            Ok((!busy).then_some(()))
        },
    )?;
    Ok(Some(jobs as f64 / began.elapsed().as_secs_f64()))
}

/// Most jobs task-spooler holds waiting: its server keeps a connection to each job's waiting
/// client and takes at most 1 000 (`MAXCONN`), the busy one's included; past that, a new
/// `tsp` waits for a slot.
pub(crate) const MOST_WAITING: usize = 990;

/// `tsp -l` with `waiting` jobs (at most [`MOST_WAITING`]) behind one busy slot, `samples`
/// times: each run in ms, and how many waited.
pub(crate) fn list_latency(waiting: usize, samples: usize) -> Result<Option<(Vec<f64>, usize)>> {
    let waiting = waiting.min(MOST_WAITING);
    let Some(spooler) = Spooler::start(1)? else {
        return Ok(None);
    };
    spooler.run(&["sleep", "600"])?;
    for _ in 0..waiting {
        spooler.run(&["true"])?;
    }
    let mut taken = Vec::with_capacity(samples);
    for _ in 0..samples {
        let t = Instant::now();
        let listing = spooler.run(&["-l"])?;
        taken.push(t.elapsed().as_secs_f64() * 1000.0);
        if listing.lines().count() < waiting {
            bail!(
                "tsp -l listed {} lines, not the {waiting} jobs waiting",
                listing.lines().count()
            );
        }
    }
    Ok(Some((taken, waiting)))
}
