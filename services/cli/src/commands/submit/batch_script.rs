//! Batch scripts: `mgpu submit train.sh`, where the command's first word names a script in
//! the current directory (or a path with a `/`) whose first line is a `#!` line or whose
//! leading lines are comments. Its content is captured now and travels in the spec
//! ([`BatchScript`]), as `sbatch` stores the script it is given: the job runs the script as it
//! was at submit, whatever becomes of the file. The `#MGPU` lines of its leading comment block
//! are submit options ([`directives`]), which `directives.rs` merges with the command line's.
//!
//! A command given as one shell line with shell syntax in it (`"train.sh > log"`) is left to
//! the shell on the node, as before: the file then runs as it is when the job starts.

use std::io::Read as _;
use std::path::{Path, PathBuf};

use anyhow::{Result, anyhow, bail};
use mgpu_protocol::job::{BatchScript, JobSpec, MAX_SCRIPT_BYTES, is_plain_word};

use super::shell_words;
use crate::console;

/// What starts a directive: at the very start of a line, followed by a blank (as `#SBATCH`).
/// `# MGPU` (with a space) is an ordinary comment, handy for switching one off.
pub const DIRECTIVE: &str = "#MGPU";

/// A batch script found in the command.
#[derive(Debug)]
pub struct Batch {
    pub script: BatchScript,
    /// The command as words: the script's name as typed, then its arguments.
    pub command: Vec<String>,
    pub directives: Vec<Directive>,
}

/// One `#MGPU` line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Directive {
    /// 1-based, as editors count.
    pub line: usize,
    /// The line as written.
    pub text: String,
    /// Its options, split as a shell would.
    pub words: Vec<String>,
}

impl Batch {
    /// Puts the script into the spec: its content, and the command as separate words, which
    /// is what the node expects of a job with a script.
    pub fn attach_to(self, spec: &mut JobSpec) {
        spec.command = self.command;
        spec.script = Some(self.script);
    }

    /// Where a directive's error is reported: `train.sh line 3 (#MGPU --gpus two)`.
    pub fn place(&self, directive: &Directive) -> String {
        format!(
            "{} line {} ({})",
            self.script.path, directive.line, directive.text
        )
    }
}

/// The batch script `command` runs, if its first word names one here. An error for a file
/// that looks like a script but cannot be carried (not UTF-8, too large, unreadable), or for
/// a directive that does not split.
pub fn detect(command: &[String], cwd: &Path) -> Result<Option<Batch>> {
    let Some(words) = command_words(command) else {
        warn_if_shell_line_runs_a_script(command, cwd);
        return Ok(None);
    };
    let Some(path) = words.first().and_then(|first| resolve(first, cwd)) else {
        return Ok(None);
    };
    let Some(content) = read_script(&path)? else {
        return Ok(None);
    };
    let path_text = path
        .to_str()
        .ok_or_else(|| anyhow!("the script's path {} is not valid UTF-8", path.display()))?
        .to_owned();
    let directives =
        directives(&content).map_err(|(line, err)| anyhow!("{path_text} line {line}: {err}"))?;
    Ok(Some(Batch {
        script: BatchScript {
            path: path_text,
            content,
        },
        command: words,
        directives,
    }))
}

/// The command as words: several elements are words already; one element is a line, split
/// at blanks when every word in it is plain. None for a line with shell syntax.
fn command_words(command: &[String]) -> Option<Vec<String>> {
    let [line] = command else {
        return Some(command.to_vec());
    };
    let words: Vec<&str> = line.split([' ', '\t']).filter(|w| !w.is_empty()).collect();
    words
        .iter()
        .all(|w| is_plain_word(w))
        .then(|| words.into_iter().map(str::to_owned).collect())
}

/// A shell line whose first word is a script with directives would silently lose them.
fn warn_if_shell_line_runs_a_script(command: &[String], cwd: &Path) {
    let first = command
        .first()
        .and_then(|line| line.split_whitespace().next());
    let Some(path) = first.and_then(|word| resolve(word, cwd)) else {
        return;
    };
    let has_directives = read_script(&path)
        .ok()
        .flatten()
        .and_then(|content| directives(&content).ok())
        .is_some_and(|found| !found.is_empty());
    if has_directives {
        console::stderr_line(&format!(
            "warning: the command is a shell line, so {} is not captured and its {DIRECTIVE} \
             lines are not read; give the script and its arguments as separate words \
             (`mgpu submit {} ARG…`) to submit it as a batch script",
            path.display(),
            first.unwrap_or_default()
        ));
    }
}

/// The file a command's first word names, as the script to capture: a path with a `/`
/// (relative to `cwd` or absolute), or a file of that name in `cwd`. A bare name is not
/// looked up on `PATH`: programs installed there are not batch scripts.
fn resolve(word: &str, cwd: &Path) -> Option<PathBuf> {
    let path = if word.contains('/') {
        cwd.join(word)
    } else {
        let here = cwd.join(word);
        if !here.is_file() {
            return None;
        }
        here
    };
    path.is_file().then_some(path)
}

/// The file's content if it is a script (see [`looks_like_a_script`]); None for anything
/// else (a compiled program, a data file), which is left to run as it is.
fn read_script(path: &Path) -> Result<Option<String>> {
    let mut bytes = Vec::new();
    let opened = std::fs::File::open(path).and_then(|file| {
        file.take(MAX_SCRIPT_BYTES as u64 + 1)
            .read_to_end(&mut bytes)
    });
    if let Err(err) = opened {
        bail!("cannot read the script {}: {err}", path.display());
    }
    if !looks_like_a_script(&bytes) {
        return Ok(None);
    }
    if bytes.len() > MAX_SCRIPT_BYTES {
        bail!(
            "the script {} is larger than {} KiB, the most mgpu captures at submit; keep the \
             job's code in files it runs and the script short",
            path.display(),
            MAX_SCRIPT_BYTES / 1024
        );
    }
    String::from_utf8(bytes).map(Some).map_err(|_| {
        anyhow!(
            "the script {} is not UTF-8 text; mgpu captures a script's text at submit",
            path.display()
        )
    })
}

/// Whether a file's start reads as a script: a `#!` line, or a comment as its first line
/// that is not blank.
pub fn looks_like_a_script(bytes: &[u8]) -> bool {
    if bytes.starts_with(b"#!") {
        return true;
    }
    bytes
        .split(|&b| b == b'\n')
        .map(|line| line.trim_ascii())
        .find(|line| !line.is_empty())
        .is_some_and(|line| line.starts_with(b"#"))
}

/// The `#MGPU` lines of the script's leading comment block: from the top (after the `#!`
/// line) to the first line that is neither blank nor a comment, as `sbatch` reads
/// `#SBATCH`. The error names the line number.
pub fn directives(content: &str) -> Result<Vec<Directive>, (usize, String)> {
    let mut found = Vec::new();
    for (index, line) in content.lines().enumerate() {
        let number = index + 1;
        if number == 1 && line.starts_with("#!") {
            continue;
        }
        if let Some(rest) = line.strip_prefix(DIRECTIVE)
            && (rest.is_empty() || rest.starts_with([' ', '\t']))
        {
            let words =
                shell_words::split(rest).map_err(|err| (number, format!("{line}: {err}")))?;
            if !words.is_empty() {
                found.push(Directive {
                    line: number,
                    text: line.trim_end().to_owned(),
                    words,
                });
            }
            continue;
        }
        let trimmed = line.trim();
        if !(trimmed.is_empty() || trimmed.starts_with('#')) {
            break;
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn directive_words(content: &str) -> Vec<(usize, Vec<String>)> {
        directives(content)
            .unwrap_or_else(|(line, err)| panic!("line {line}: {err}"))
            .into_iter()
            .map(|d| (d.line, d.words))
            .collect()
    }

    fn owned(words: &[&str]) -> Vec<String> {
        words.iter().map(|w| (*w).to_owned()).collect()
    }

    #[test]
    fn directives_are_read_from_the_leading_comment_block_only() {
        let script = "#!/bin/bash
# Train BERT.
#MGPU --gpus 2
#MGPU --time-limit 2h --name \"bert large\"

#   indented comment
# MGPU --gpus 8
#MGPUX --gpus 9
#MGPU
python train.py
#MGPU --gpus 4
";
        assert_eq!(
            directive_words(script),
            [
                (3, owned(&["--gpus", "2"])),
                (4, owned(&["--time-limit", "2h", "--name", "bert large"])),
            ]
        );
    }

    #[test]
    fn a_script_without_a_shebang_has_directives_too() {
        assert_eq!(
            directive_words("#MGPU --gpus 0\r\necho hi\r\n"),
            [(1, owned(&["--gpus", "0"]))]
        );
        assert_eq!(directive_words("echo hi\n#MGPU --gpus 0\n"), []);
    }

    #[test]
    fn a_directive_that_does_not_split_names_its_line() {
        let err = directives("#!/bin/sh\n#MGPU --name 'bert\n").err();
        assert_eq!(
            err,
            Some((
                2,
                "#MGPU --name 'bert: a single quote (') is not closed".to_owned()
            ))
        );
    }

    #[test]
    fn scripts_are_told_from_programs_and_data() {
        assert!(looks_like_a_script(b"#!/usr/bin/env python3\nprint(1)\n"));
        assert!(looks_like_a_script(b"\n  \n# a comment\necho hi\n"));
        assert!(!looks_like_a_script(b"\x7fELF\x02\x01\x01"));
        assert!(!looks_like_a_script(b"import torch\n"));
        assert!(!looks_like_a_script(b""));
    }

    #[test]
    fn a_shell_line_is_split_only_when_its_words_are_plain() {
        assert_eq!(
            command_words(&owned(&["./train.sh --lr 0.1"])),
            Some(owned(&["./train.sh", "--lr", "0.1"]))
        );
        assert_eq!(command_words(&owned(&["train.sh > log"])), None);
        assert_eq!(
            command_words(&owned(&["train.sh", "a b"])),
            Some(owned(&["train.sh", "a b"]))
        );
    }

    fn write(dir: &Path, name: &str, content: &[u8]) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, content).unwrap_or_else(|e| panic!("{e}"));
        path
    }

    #[test]
    fn the_first_word_is_found_here_or_by_its_path() {
        let Ok(dir) = tempfile::tempdir() else { return };
        write(
            dir.path(),
            "train.sh",
            b"#!/bin/sh\n#MGPU --gpus 2\necho hi\n",
        );
        write(dir.path(), "data.bin", b"\x00\x01");
        std::fs::create_dir(dir.path().join("sub")).unwrap_or_else(|e| panic!("{e}"));
        write(
            &dir.path().join("sub"),
            "run.sh",
            b"# no shebang\necho hi\n",
        );

        let batch = detect(&owned(&["train.sh", "--lr", "1"]), dir.path());
        let batch = batch.ok().flatten().unwrap_or_else(|| panic!("not found"));
        assert_eq!(batch.command, ["train.sh", "--lr", "1"]);
        assert_eq!(batch.directives.len(), 1);
        assert!(
            batch.script.path.ends_with("/train.sh"),
            "{:?}",
            batch.script
        );
        assert!(batch.script.content.contains("echo hi"));

        let sub = detect(&owned(&["sub/run.sh"]), dir.path()).ok().flatten();
        assert_eq!(sub.map(|b| b.directives.len()), Some(0));
        for not_a_script in [
            &["data.bin"][..],
            &["python", "train.sh"],
            &["missing.sh"],
            &["./missing.sh"],
        ] {
            let found = detect(&owned(not_a_script), dir.path());
            assert!(matches!(found, Ok(None)), "{not_a_script:?}: {found:?}");
        }
        // A bare name is this directory's file, never one on PATH.
        assert!(matches!(detect(&owned(&["sh"]), dir.path()), Ok(None)));
    }

    #[test]
    fn a_script_that_cannot_travel_is_refused_with_the_reason() {
        let Ok(dir) = tempfile::tempdir() else { return };
        let mut big = b"#!/bin/sh\n".to_vec();
        big.resize(MAX_SCRIPT_BYTES + 10, b'#');
        write(dir.path(), "big.sh", &big);
        write(dir.path(), "latin1.sh", b"#!/bin/sh\necho caf\xe9\n");
        let err = |name: &str| {
            detect(&owned(&[name]), dir.path())
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default()
        };
        assert!(
            err("big.sh").contains("larger than 128 KiB"),
            "{}",
            err("big.sh")
        );
        assert!(
            err("latin1.sh").contains("is not UTF-8 text"),
            "{}",
            err("latin1.sh")
        );
    }
}
