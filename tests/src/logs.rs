//! The components' logs: one file per process under `<cluster dir>/logs`, and
//! [`Cluster::dump_logs`], which prints them when a story fails.

use std::path::PathBuf;

use crate::Cluster;

impl Cluster {
    /// The log file a component writes to (appending), by name.
    pub(crate) fn log(&self, name: &str) -> std::fs::File {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("logs").join(format!("{name}.log")))
            .unwrap_or_else(|e| panic!("log file: {e}"))
    }

    /// A component's log file (`scheduler`, `nats-server`, a node's name).
    pub fn log_path(&self, name: &str) -> PathBuf {
        self.dir.path().join("logs").join(format!("{name}.log"))
    }

    /// Prints the component logs; call before failing to see what happened.
    ///
    /// The nats-servers' logs come first and mgpu's after them, and the warnings and errors
    /// of every log are repeated at the very end: a CI report that keeps only the head and
    /// the tail of a long output still shows what went wrong.
    pub fn dump_logs(&self) {
        let Ok(entries) = std::fs::read_dir(self.dir.path().join("logs")) else {
            return;
        };
        let mut logs: Vec<(bool, PathBuf, String)> = entries
            .flatten()
            .map(|entry| {
                let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
                let is_nats = text.contains("Starting nats-server");
                (!is_nats, entry.path(), text)
            })
            .collect();
        logs.sort();
        let mut complaints = Vec::new();
        for (_, path, text) in &logs {
            eprintln!("===== {} =====\n{text}", path.display());
            let name = path.file_stem().map(|n| n.to_string_lossy().into_owned());
            for line in text.lines().map(without_colours) {
                if ["WARN", "ERROR", "[ERR]", "[WRN]"]
                    .iter()
                    .any(|w| line.contains(w))
                {
                    complaints.push(format!("{}: {line}", name.as_deref().unwrap_or("?")));
                }
            }
        }
        let skipped = complaints.len().saturating_sub(MAX_COMPLAINTS_SHOWN);
        eprintln!("===== warnings and errors of every log ({skipped} earlier ones left out) =====");
        for line in &complaints[skipped..] {
            eprintln!("{line}");
        }
    }
}

/// How many warning and error lines [`Cluster::dump_logs`] repeats at the end.
const MAX_COMPLAINTS_SHOWN: usize = 150;

/// A log line without its terminal escape sequences (colour codes: `ESC [ … m`).
pub fn without_colours(line: &str) -> String {
    let mut plain = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // A sequence ends with its first letter.
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            plain.push(c);
        }
    }
    plain
}

#[cfg(test)]
mod log_line_tests {
    #[test]
    fn colour_codes_are_taken_out_of_log_lines() {
        assert_eq!(
            super::without_colours(
                "\u{1b}[2m2026-11-23T20:00:00Z\u{1b}[0m \u{1b}[33m WARN\u{1b}[0m x"
            ),
            "2026-11-23T20:00:00Z  WARN x"
        );
        assert_eq!(super::without_colours("plain"), "plain");
    }
}
