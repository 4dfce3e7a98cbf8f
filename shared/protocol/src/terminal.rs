//! Jobs that run under a pseudo-terminal (`mgpu submit --pty`): the terminal's size, and the
//! control messages a viewer (`mgpu attach`, `mgpu submit -i --pty`) sends beside its
//! keystrokes on `jobs.<id>.input`.
//!
//! A control message carries its meaning in the [`TERMINAL`] header (`resize 120x40`,
//! `claim VIEWER`, `keys VIEWER`); its payload is the keystrokes (for `keys`) or empty. The
//! header is part of what is signed ([`signed_subject`]), so nobody can turn a viewer's
//! keystrokes into a resize or claim the keyboard with someone else's signature.
//!
//! Several viewers may watch one job; one types. The keyboard belongs to the viewer that
//! claimed it last (each `mgpu attach` claims it as it starts, unless `--read-only`); keys
//! from any other viewer are dropped by the node. Input without the header (`mgpu submit -i`
//! of a job without a terminal, older clients) is not a viewer's and is always taken.

use serde::{Deserialize, Serialize};

use crate::error::InvalidInput;

/// The header naming what a message on `jobs.<id>.input` is for a terminal job.
pub const TERMINAL: &str = "Mgpu-Terminal";

/// The byte that detaches a viewer: `Ctrl+]`, as in telnet.
pub const DETACH_KEY: u8 = 0x1d;

/// Largest terminal side a job may ask for; anything larger is a mistake, not a screen.
pub const MAX_TERMINAL_SIDE: u16 = 4096;

/// A terminal's size in character cells.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TermSize {
    pub cols: u16,
    pub rows: u16,
}

impl Default for TermSize {
    /// The classic terminal, for a job submitted from a script with no terminal of its own.
    fn default() -> Self {
        TermSize { cols: 80, rows: 24 }
    }
}

impl TermSize {
    pub fn validate(&self) -> Result<(), InvalidInput> {
        let side = 1..=MAX_TERMINAL_SIDE;
        if !side.contains(&self.cols) || !side.contains(&self.rows) {
            return Err(InvalidInput::new(format!(
                "a terminal of {}x{} is outside 1x1..{MAX_TERMINAL_SIDE}x{MAX_TERMINAL_SIDE}",
                self.cols, self.rows
            )));
        }
        Ok(())
    }
}

impl std::fmt::Display for TermSize {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}x{}", self.cols, self.rows)
    }
}

impl std::str::FromStr for TermSize {
    type Err = InvalidInput;

    /// `COLSxROWS`, as [`TermSize`] displays.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bad = || InvalidInput::new(format!("`{text}` is not a terminal size like 120x40"));
        let (cols, rows) = text.split_once('x').ok_or_else(bad)?;
        let size = TermSize {
            cols: cols.parse().map_err(|_| bad())?,
            rows: rows.parse().map_err(|_| bad())?,
        };
        size.validate()?;
        Ok(size)
    }
}

/// What a message with the [`TERMINAL`] header asks of a terminal job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TerminalInput {
    /// The payload is keystrokes typed by this viewer.
    Keys { viewer: String },
    /// This viewer takes the keyboard.
    Claim { viewer: String },
    /// The viewer's window changed size: the job's terminal follows.
    Resize(TermSize),
}

impl TerminalInput {
    /// The header's value.
    pub fn header(&self) -> String {
        match self {
            TerminalInput::Keys { viewer } => format!("keys {viewer}"),
            TerminalInput::Claim { viewer } => format!("claim {viewer}"),
            TerminalInput::Resize(size) => format!("resize {size}"),
        }
    }

    /// Reads a header's value back.
    pub fn parse(header: &str) -> Result<TerminalInput, InvalidInput> {
        let (kind, argument) = header.split_once(' ').unwrap_or((header, ""));
        let viewer = || -> Result<String, InvalidInput> {
            let ok = !argument.is_empty()
                && argument.len() <= 64
                && argument
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-');
            if ok {
                Ok(argument.to_owned())
            } else {
                Err(InvalidInput::new(format!(
                    "`{argument}` is not a viewer id"
                )))
            }
        };
        match kind {
            "keys" => Ok(TerminalInput::Keys { viewer: viewer()? }),
            "claim" => Ok(TerminalInput::Claim { viewer: viewer()? }),
            "resize" => Ok(TerminalInput::Resize(argument.parse()?)),
            _ => Err(InvalidInput::new(format!(
                "`{header}` is no terminal input (keys, claim or resize)"
            ))),
        }
    }
}

/// What a terminal control message's signature covers in place of the bare subject: the
/// subject and the header's value, so neither can be changed without the owner's key.
pub fn signed_subject(subject: &str, header: Option<&str>) -> String {
    match header {
        Some(header) => format!("{subject} {header}"),
        None => subject.to_owned(),
    }
}

/// Who may type into a terminal job: the viewer that claimed the keyboard last. Pure, so the
/// rule is unit-tested without a node.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Keyboard {
    holder: Option<String>,
}

impl Keyboard {
    /// Whether keystrokes from `viewer` (None: not a viewer's) reach the job.
    pub fn admits(&self, viewer: Option<&str>) -> bool {
        match (viewer, &self.holder) {
            (None, _) | (_, None) => true,
            (Some(viewer), Some(holder)) => viewer == holder,
        }
    }

    /// `viewer` takes the keyboard.
    pub fn claim(&mut self, viewer: &str) {
        self.holder = Some(viewer.to_owned());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_back_and_absurd_ones_are_refused() {
        let size: TermSize = "120x40".parse().unwrap_or_default();
        assert_eq!(
            size,
            TermSize {
                cols: 120,
                rows: 40
            }
        );
        assert_eq!(size.to_string(), "120x40");
        for bad in ["120", "0x40", "x", "120x", "99999x2", "a×b"] {
            assert!(bad.parse::<TermSize>().is_err(), "{bad}");
        }
    }

    #[test]
    fn control_headers_read_back_and_garbage_is_refused() {
        for input in [
            TerminalInput::Keys {
                viewer: "ab-12".into(),
            },
            TerminalInput::Claim {
                viewer: "ab-12".into(),
            },
            TerminalInput::Resize(TermSize { cols: 3, rows: 4 }),
        ] {
            assert_eq!(TerminalInput::parse(&input.header()), Ok(input));
        }
        for bad in ["", "keys", "keys a b", "claim", "resize 0x0", "reboot now"] {
            assert!(TerminalInput::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_keyboard_belongs_to_the_last_claim() {
        let mut keyboard = Keyboard::default();
        assert!(
            keyboard.admits(Some("a")),
            "nobody claimed it: anyone types"
        );
        keyboard.claim("a");
        assert!(keyboard.admits(Some("a")));
        keyboard.claim("b");
        assert!(
            !keyboard.admits(Some("a")),
            "a's keys are dropped once b claims"
        );
        assert!(keyboard.admits(Some("b")));
        assert!(keyboard.admits(None), "input that is no viewer's is taken");
    }

    #[test]
    fn the_header_is_part_of_what_is_signed() {
        assert_eq!(signed_subject("jobs.x.input", None), "jobs.x.input");
        assert_eq!(
            signed_subject("jobs.x.input", Some("resize 1x2")),
            "jobs.x.input resize 1x2"
        );
    }
}
