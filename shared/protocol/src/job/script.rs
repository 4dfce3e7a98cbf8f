//! Batch scripts (`mgpu submit train.sh`): the script's content is captured at submit and
//! travels in the spec ([`JobSpec::script`]), as `sbatch` stores the script it is given, so
//! editing the file afterwards does not change the queued job. The node agent writes it to a
//! private file and runs that in place of the command's first word.

use serde::{Deserialize, Serialize};

use super::JobSpec;
use crate::error::InvalidInput;

/// Largest script content a job may carry: a submission holds at most 256 KiB in all, and the
/// captured environment needs its share.
pub const MAX_SCRIPT_BYTES: usize = 128 * 1024;

/// A batch script as it was at submit.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchScript {
    /// Where it was read from on the submitting machine (absolute), for `mgpu show`.
    pub path: String,
    /// Its content at submit.
    pub content: String,
}

impl BatchScript {
    /// The file name the script runs under on the node (its `$0`): the name it was read
    /// from, reduced to characters that need no quoting anywhere.
    pub fn file_name(&self) -> String {
        let name = self.path.rsplit('/').next().unwrap_or_default();
        let safe: String = name
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        match safe.trim_start_matches('.') {
            "" => "script".to_owned(),
            _ => safe,
        }
    }

    /// Whether the content starts with `#!` (else the node runs it with `/bin/sh`, as a shell
    /// runs a script without one).
    pub fn has_shebang(&self) -> bool {
        self.content.starts_with("#!")
    }

    pub(super) fn validate(&self) -> Result<(), InvalidInput> {
        crate::wire::check_line("the script's path", &self.path, super::MAX_PATH_BYTES)?;
        if !self.path.starts_with('/') {
            return Err(InvalidInput::new(format!(
                "the script's path `{}` must be absolute",
                self.path
            )));
        }
        if self.content.len() > MAX_SCRIPT_BYTES {
            return Err(InvalidInput::new(format!(
                "the script {} is {} KiB; mgpu carries scripts up to {} KiB",
                self.path,
                self.content.len().div_ceil(1024),
                MAX_SCRIPT_BYTES / 1024
            )));
        }
        if self.content.contains('\0') {
            return Err(InvalidInput::new(format!(
                "the script {} contains a NUL byte: it is not a text file",
                self.path
            )));
        }
        Ok(())
    }
}

impl JobSpec {
    /// The script's content joins the dedup key only where there is a script, so the keys of
    /// every other job stay what they were.
    pub(super) fn script_dedup_part(&self) -> Option<&str> {
        self.script.as_ref().map(|s| s.content.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn script(path: &str, content: &str) -> BatchScript {
        BatchScript {
            path: path.into(),
            content: content.into(),
        }
    }

    #[test]
    fn the_file_name_is_the_scripts_own_made_safe() {
        assert_eq!(script("/home/a/train.sh", "").file_name(), "train.sh");
        assert_eq!(
            script("/home/a/my run (2).sh", "").file_name(),
            "my_run__2_.sh"
        );
        assert_eq!(script("/home/a/.hidden", "").file_name(), ".hidden");
        assert_eq!(script("/", "").file_name(), "script");
        assert_eq!(script("/x/..", "").file_name(), "script");
    }

    #[test]
    fn a_script_is_checked_for_size_and_nul_bytes() {
        assert!(script("/a.sh", "#!/bin/sh\necho hi\n").validate().is_ok());
        let big = "#".repeat(MAX_SCRIPT_BYTES + 1);
        let err = script("/a.sh", &big)
            .validate()
            .err()
            .map(|e| e.to_string());
        assert_eq!(
            err.as_deref(),
            Some("the script /a.sh is 129 KiB; mgpu carries scripts up to 128 KiB")
        );
        assert!(script("/a.sh", "a\0b").validate().is_err());
        assert!(script("", "x").validate().is_err());
        assert!(script("/a.sh", "#!/bin/sh").has_shebang());
        assert!(!script("/a.sh", "# no shebang").has_shebang());
    }
}
