//! The scheduler's limits as its config file says them, re-read when the file changes: the
//! `[limits]` tables and the limits keys of `[qos.<name>]` sections (`limits.rs` reads them).

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use anyhow::{Context, Result};

use crate::limits::Limits;

/// The config file's `[limits]`, re-read when the file changes.
#[derive(Clone)]
pub struct LimitsFile {
    path: Option<PathBuf>,
    modified: Option<SystemTime>,
    pub limits: Limits,
}

impl LimitsFile {
    /// The limits `sections` (the file read at start) set; `path` is re-read when it changes.
    pub fn new(path: Option<&Path>, sections: &toml::Table) -> Result<Self> {
        let limits = Limits::parse(sections.get("limits"))
            .and_then(|limits| limits.with_classes(sections.get("qos")))
            .with_context(|| describe(path))?;
        Ok(LimitsFile {
            path: path.map(Path::to_owned),
            modified: path.and_then(modified),
            limits,
        })
    }

    /// Re-reads the file if it changed: true when the limits did. A file that no longer
    /// parses keeps the limits in force, and says so.
    pub fn refresh(&mut self) -> bool {
        let Some(path) = self.path.clone() else {
            return false;
        };
        let now_modified = modified(&path);
        if now_modified == self.modified {
            return false;
        }
        self.modified = now_modified;
        match read_limits(&path) {
            Ok(limits) if limits == self.limits => false,
            Ok(limits) => {
                tracing::info!(file = %path.display(), "limits changed; in force from now on");
                self.limits = limits;
                true
            }
            Err(err) => {
                tracing::warn!("{err:#}; the limits in force stay");
                false
            }
        }
    }
}

fn read_limits(path: &Path) -> Result<Limits> {
    let text = std::fs::read_to_string(path).with_context(|| describe(Some(path)))?;
    let table: toml::Table = text.parse().with_context(|| describe(Some(path)))?;
    Limits::parse(table.get("limits"))
        .and_then(|limits| limits.with_classes(table.get("qos")))
        .with_context(|| describe(Some(path)))
}

fn describe(path: Option<&Path>) -> String {
    match path {
        Some(path) => format!("reading the limits in {}", path.display()),
        None => "reading the limits".to_owned(),
    }
}

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}
