//! The follower's own lines on stderr, around the job's output: a job's status (queued, and
//! for how long) rewritten in place on a terminal, notes on lines of their own.

use std::io::{IsTerminal as _, Write as _};

use crate::console;

/// Our status messages on stderr. On a terminal the queued status is one line rewritten in
/// place; elsewhere (a log file) every status is its own line.
pub struct StatusLine {
    quiet: bool,
    terminal: bool,
    /// A rewritable line is on screen without its newline.
    open: bool,
}

impl StatusLine {
    pub fn new(quiet: bool) -> StatusLine {
        StatusLine {
            quiet,
            terminal: std::io::stderr().is_terminal(),
            open: false,
        }
    }

    pub fn show(&mut self, text: &str) {
        if self.quiet {
            return;
        }
        if self.terminal {
            let mut err = std::io::stderr().lock();
            // Carriage return and erase-line: replace the previous status.
            let _ = write!(err, "\r\x1b[K{text}");
            let _ = err.flush();
            self.open = true;
        } else {
            console::stderr_line(text);
        }
    }

    /// A status worth keeping on its own line.
    pub fn note(&mut self, text: &str) {
        if self.quiet {
            return;
        }
        self.finish();
        console::stderr_line(text);
    }

    /// Ends a rewritable line so that what follows starts on a line of its own.
    pub fn finish(&mut self) {
        if self.open {
            self.open = false;
            console::stderr_line("");
        }
    }
}
