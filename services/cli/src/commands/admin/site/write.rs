//! Writing a site's files into the output directory, touching only those that differ: a file
//! whose contents (and, for a key, mode 0600) are already right is left alone, so running
//! `mgpu admin site` again after adding a user changes only what that user's addition
//! changes, and `rsync`/`scp` copy only that. Files an earlier run wrote that the site no
//! longer has (a node removed) are deleted; the list of what was written is kept in
//! `auth/site-files`.

use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};

use crate::setup::files::{write_atomically, write_secret};

use super::render::SiteFile;

/// The list of files the last run wrote, relative to the output directory.
pub const MANIFEST: &str = "auth/site-files";

/// What [`apply`] did, each path relative to the output directory.
#[derive(Debug, Default)]
pub struct Outcome {
    pub written: Vec<PathBuf>,
    pub unchanged: Vec<PathBuf>,
    /// Written by an earlier run, no longer part of the site: deleted.
    pub removed: Vec<PathBuf>,
}

/// Writes every file of `files` under `out` that differs from what is there, then deletes what
/// an earlier run wrote and the site no longer has.
pub fn apply(out: &Path, files: &[SiteFile]) -> Result<Outcome> {
    let mut outcome = Outcome::default();
    for file in files {
        let path = out.join(&file.path);
        if is_current(&path, file) {
            outcome.unchanged.push(file.path.clone());
            continue;
        }
        write(&path, file).with_context(|| format!("cannot write {}", path.display()))?;
        outcome.written.push(file.path.clone());
    }
    let now: BTreeSet<&Path> = files.iter().map(|f| f.path.as_path()).collect();
    for old in previous(out)? {
        if !now.contains(old.as_path()) {
            remove(out, &old)?;
            outcome.removed.push(old);
        }
    }
    let manifest: String = now.iter().map(|p| format!("{}\n", p.display())).collect();
    let manifest_path = out.join(MANIFEST);
    manifest_path
        .parent()
        .map_or(Ok(()), fs::create_dir_all)
        .and_then(|()| write_atomically(&manifest_path, &manifest))
        .with_context(|| format!("cannot write {}", manifest_path.display()))?;
    Ok(outcome)
}

/// Whether `path` already holds `file`: the same contents and, for a key, mode 0600.
fn is_current(path: &Path, file: &SiteFile) -> bool {
    let same = fs::read(path).is_ok_and(|bytes| bytes == file.contents.as_bytes());
    let private = || fs::metadata(path).is_ok_and(|m| m.permissions().mode() & 0o777 == 0o600);
    same && (!file.secret || private())
}

fn write(path: &Path, file: &SiteFile) -> std::io::Result<()> {
    let Some(parent) = path.parent() else {
        return Err(std::io::Error::other("no parent directory"));
    };
    fs::create_dir_all(parent)?;
    if file.secret {
        // Only a new file gets its mode from the open: a key that exists with another mode
        // is made private before its contents change.
        if path.exists() {
            fs::set_permissions(path, fs::Permissions::from_mode(0o600))?;
        }
        write_secret(path, &file.contents)
    } else {
        write_atomically(path, &file.contents)
    }
}

/// The files the last run wrote (none before the first run).
fn previous(out: &Path) -> Result<Vec<PathBuf>> {
    let path = out.join(MANIFEST);
    match fs::read_to_string(&path) {
        Ok(text) => Ok(text
            .lines()
            .filter(|l| !l.is_empty())
            // Only paths inside the output directory: the manifest is ours, but an edited one
            // must not delete anything else.
            .map(PathBuf::from)
            .filter(|p| {
                p.components()
                    .all(|c| matches!(c, std::path::Component::Normal(_)))
            })
            .collect()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
}

/// Deletes a file an earlier run wrote, then the directories it leaves empty (up to `out`).
fn remove(out: &Path, relative: &Path) -> Result<()> {
    let path = out.join(relative);
    match fs::remove_file(&path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("cannot delete {}", path.display())),
    }
    let mut dir = path.parent();
    while let Some(current) = dir {
        if current == out || fs::remove_dir(current).is_err() {
            break;
        }
        dir = current.parent();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str, contents: &str, secret: bool) -> SiteFile {
        SiteFile {
            path: PathBuf::from(path),
            contents: contents.to_owned(),
            secret,
        }
    }

    #[test]
    fn only_what_differs_is_written_and_what_went_away_is_deleted() {
        let Ok(dir) = tempfile::tempdir() else { return };
        let out = dir.path();
        let first = vec![
            file("h1/etc/mgpu/node.toml", "a", false),
            file("h1/etc/mgpu/keys/node.nk", "SU1", true),
            file("h2/etc/mgpu/node.toml", "b", false),
        ];
        let done = apply(out, &first);
        assert!(done.is_ok(), "{done:?}");
        let done = done.unwrap_or_default();
        assert_eq!(done.written.len(), 3);
        let mode = fs::metadata(out.join("h1/etc/mgpu/keys/node.nk"))
            .map(|m| m.permissions().mode() & 0o777)
            .unwrap_or(0);
        assert_eq!(mode, 0o600);

        let second = vec![
            file("h1/etc/mgpu/node.toml", "a", false),
            file("h1/etc/mgpu/keys/node.nk", "SU1", true),
            file("h3/etc/mgpu/node.toml", "c", false),
        ];
        let done = apply(out, &second).unwrap_or_default();
        assert_eq!(done.written, [PathBuf::from("h3/etc/mgpu/node.toml")]);
        assert_eq!(done.unchanged.len(), 2);
        assert_eq!(done.removed, [PathBuf::from("h2/etc/mgpu/node.toml")]);
        assert!(!out.join("h2").exists());

        // A key whose mode was widened is made private again.
        let _ = fs::set_permissions(
            out.join("h1/etc/mgpu/keys/node.nk"),
            fs::Permissions::from_mode(0o644),
        );
        let done = apply(out, &second).unwrap_or_default();
        assert_eq!(done.written, [PathBuf::from("h1/etc/mgpu/keys/node.nk")]);
    }
}
