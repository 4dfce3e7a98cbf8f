//! This terminal as a viewer of a job's terminal needs it (`mgpu attach`, `mgpu submit -i
//! --pty`): its size, and raw input, so every key (Ctrl+C, arrows, Ctrl+D) reaches the job as
//! the bytes it types rather than being handled here. Output processing stays on, so our own
//! status lines still start at the left margin. The settings are restored when the guard is
//! dropped, on every way out of the command.

use std::io::IsTerminal as _;

use mgpu_protocol::terminal::TermSize;
use nix::sys::termios::{self, OutputFlags, SetArg, Termios};

/// This terminal's size, when stdout is one.
pub fn size() -> Option<TermSize> {
    if !std::io::stdout().is_terminal() {
        return None;
    }
    let (cols, rows) = crossterm::terminal::size().ok()?;
    let size = TermSize { cols, rows };
    size.validate().ok().map(|()| size)
}

/// This terminal's size, or the classic 80x24 when there is none (a script submitting).
pub fn size_or_default() -> TermSize {
    size().unwrap_or_default()
}

/// Raw input on stdin while it lives; the settings before are put back when dropped.
pub struct RawInput {
    saved: Termios,
}

impl RawInput {
    /// Raw input, when stdin is a terminal; None otherwise (input from a pipe is passed on
    /// as it is read).
    pub fn enable() -> Option<RawInput> {
        let stdin = std::io::stdin();
        if !stdin.is_terminal() {
            return None;
        }
        let saved = termios::tcgetattr(&stdin).ok()?;
        let mut raw = saved.clone();
        termios::cfmakeraw(&mut raw);
        // Our own lines end in "\n" and must still begin at the margin.
        raw.output_flags |= OutputFlags::OPOST | OutputFlags::ONLCR;
        termios::tcsetattr(&stdin, SetArg::TCSANOW, &raw).ok()?;
        Some(RawInput { saved })
    }
}

impl Drop for RawInput {
    fn drop(&mut self) {
        let _ = termios::tcsetattr(std::io::stdin(), SetArg::TCSANOW, &self.saved);
    }
}
