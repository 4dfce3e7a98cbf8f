//! A job's batch script (`JobSpec::script`, captured by `mgpu submit train.sh`) on this node:
//! written before the job starts to a fresh directory of its own in the temporary directory,
//! readable by the job's account alone, run in place of the command's first word, and
//! removed once the job ended (when its [`ScriptFile`] is dropped). The job thus runs the script as it was at submit, whatever
//! became of the file since, with any interpreter its `#!` line names (the kernel reads it,
//! as for any script); one without `#!` runs under `/bin/sh`, as a shell would run it.
//!
//! The directory's name is unpredictable and made with `mkdir` (which never follows a link),
//! so another user of the host cannot plant a file or link where the script goes.

use std::borrow::Cow;
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};

use mgpu_protocol::job::{BatchScript, JobSpec};

use crate::run_as::Account;
use crate::running::AttemptKey;

/// The script written for one attempt. Dropping it removes the script and its directory: the
/// job keeps it until it ended, and a job that failed to start drops it on the way out.
#[derive(Debug)]
pub struct ScriptFile {
    dir: PathBuf,
    path: PathBuf,
}

impl Drop for ScriptFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Writes the spec's script, if it has one, for the attempt `key`, owned by `account` (the
/// agent's own account when None). The error is the `FailedToStart` text.
pub async fn write(
    spec: &JobSpec,
    key: &AttemptKey,
    node: &str,
    account: Option<&Account>,
) -> Result<Option<ScriptFile>, String> {
    let Some(script) = &spec.script else {
        return Ok(None);
    };
    let dir = std::env::temp_dir().join(format!(
        "mgpu-{}-{}-{}",
        key.job_id,
        key.attempt,
        uuid::Uuid::new_v4().simple()
    ));
    let owner = account.map(|a| (a.uid, a.gid));
    let written = {
        let dir = dir.clone();
        let script = script.clone();
        tokio::task::spawn_blocking(move || write_private(&dir, &script, owner)).await
    };
    match written {
        Ok(Ok(path)) => Ok(Some(ScriptFile { dir, path })),
        Ok(Err(err)) => {
            let _ = tokio::fs::remove_dir_all(&dir).await;
            Err(format!(
                "cannot write the job's script to {} on {node}: {err}",
                dir.display()
            ))
        }
        Err(err) => Err(format!("cannot write the job's script on {node}: {err}")),
    }
}

/// Makes `dir` (mode 0700) and the script in it (0700), both owned by `owner` when given.
fn write_private(
    dir: &Path,
    script: &BatchScript,
    owner: Option<(nix::unistd::Uid, nix::unistd::Gid)>,
) -> std::io::Result<PathBuf> {
    use std::io::Write as _;
    std::fs::DirBuilder::new().mode(0o700).create(dir)?;
    let path = dir.join(script.file_name());
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o700)
        .open(&path)?;
    file.write_all(script.content.as_bytes())?;
    file.sync_all()?;
    if let Some((uid, gid)) = owner {
        nix::unistd::chown(dir, Some(uid), Some(gid))?;
        nix::unistd::chown(&path, Some(uid), Some(gid))?;
    }
    Ok(path)
}

/// The spec the job is launched with: the command's first word replaced by the written
/// script (run by `/bin/sh` when it has no `#!` line), its other words kept. The spec itself
/// when there is no script. `mgpu submit` sends a script's command as separate words, so
/// the first element is the script's name alone.
pub fn launched_spec<'a>(spec: &'a JobSpec, script: Option<&ScriptFile>) -> Cow<'a, JobSpec> {
    let (Some(file), Some(batch)) = (script, &spec.script) else {
        return Cow::Borrowed(spec);
    };
    let path = file.path.display().to_string();
    let mut command = Vec::with_capacity(spec.command.len() + 1);
    if !batch.has_shebang() {
        command.push("/bin/sh".to_owned());
    }
    command.push(path);
    command.extend(spec.command.iter().skip(1).cloned());
    if let [line] = command.as_mut_slice() {
        // One element is a shell line: the path must stay one word whatever the temporary
        // directory is called.
        *line = mgpu_protocol::job::shell_quote(line);
    }
    let mut launched = spec.clone();
    launched.command = command;
    Cow::Owned(launched)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};

    use mgpu_protocol::ids::JobId;

    use super::*;

    fn spec(command: &[&str], content: &str) -> JobSpec {
        let mut spec = JobSpec::new(command.iter().map(|s| (*s).to_owned()).collect(), "/tmp");
        spec.script = Some(BatchScript {
            path: "/home/alice/train job.sh".into(),
            content: content.into(),
        });
        spec
    }

    fn key() -> AttemptKey {
        AttemptKey {
            job_id: JobId::random(),
            attempt: 2,
        }
    }

    #[tokio::test]
    async fn the_script_is_written_privately_and_removed_with_its_directory() {
        let spec = spec(&["train.sh"], "#!/bin/sh\necho hi\n");
        let key = key();
        let written = write(&spec, &key, "n1", None).await;
        let Ok(Some(file)) = written else {
            panic!("not written: {written:?}");
        };
        assert_eq!(
            file.path.file_name().and_then(|n| n.to_str()),
            Some("train_job.sh")
        );
        let dir_name = file
            .dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned());
        assert!(
            dir_name.is_some_and(|n| n.starts_with(&format!("mgpu-{}-2-", key.job_id))),
            "{file:?}"
        );
        let text = std::fs::read_to_string(&file.path).unwrap_or_default();
        assert_eq!(text, "#!/bin/sh\necho hi\n");
        let mode = |p: &Path| std::fs::metadata(p).map(|m| m.permissions().mode() & 0o777);
        assert_eq!(mode(&file.path).ok(), Some(0o700));
        assert_eq!(mode(&file.dir).ok(), Some(0o700));
        let uid = std::fs::metadata(&file.path).map(|m| m.uid()).ok();
        assert_eq!(uid, Some(nix::unistd::Uid::effective().as_raw()));
        let dir = file.dir.clone();
        drop(file);
        assert!(!dir.exists());
    }

    #[tokio::test]
    async fn a_spec_without_a_script_writes_nothing() {
        let plain = JobSpec::new(vec!["true".into()], "/tmp");
        assert!(matches!(write(&plain, &key(), "n1", None).await, Ok(None)));
        assert!(matches!(launched_spec(&plain, None), Cow::Borrowed(_)));
    }

    #[test]
    fn the_script_replaces_the_first_word_and_keeps_the_arguments() {
        let file = ScriptFile {
            dir: "/nonexistent-mgpu/d".into(),
            path: "/nonexistent-mgpu/d/train.sh".into(),
        };
        let with_shebang = spec(&["train.sh", "--lr", "{gpus}"], "#!/usr/bin/env python3\n");
        assert_eq!(
            launched_spec(&with_shebang, Some(&file)).command,
            ["/nonexistent-mgpu/d/train.sh", "--lr", "{gpus}"]
        );
        let alone = spec(&["train.sh"], "#!/bin/sh\n");
        let spaced = ScriptFile {
            dir: "/nonexistent-mgpu/my dir".into(),
            path: "/nonexistent-mgpu/my dir/train.sh".into(),
        };
        assert_eq!(
            launched_spec(&alone, Some(&spaced)).command,
            ["'/nonexistent-mgpu/my dir/train.sh'"]
        );
        let without = spec(&["train.sh"], "# MGPU --gpus 1\necho hi\n");
        assert_eq!(
            launched_spec(&without, Some(&file)).command,
            ["/bin/sh", "/nonexistent-mgpu/d/train.sh"]
        );
    }
}
