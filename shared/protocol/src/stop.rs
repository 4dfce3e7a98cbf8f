//! How a job is told it is about to be stopped, so it can save its work: the warning signal
//! it asks for (`--signal SIG@SECONDS`, Slurm's syntax: `USR1@300` sends SIGUSR1 300 s
//! before the stop), why it is stopped (written to the file `$MGPU_STOP_FILE` names:
//! `preempted`, `time_limit`, `cancelled`, `node_drain`), and the warning a kill carries to
//! the agent (the signal, then the grace before SIGTERM).

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::error::InvalidInput;

/// Signals a job may ask to be warned with, by name and number (Linux numbering).
const SIGNALS: [(&str, i32); 8] = [
    ("HUP", 1),
    ("INT", 2),
    ("QUIT", 3),
    ("USR1", 10),
    ("USR2", 12),
    ("ALRM", 14),
    ("TERM", 15),
    ("URG", 23),
];

/// The warning a job asks for: `signal` sent `seconds` before it is stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct StopSignal {
    /// The signal's number (SIGUSR1 is 10).
    pub signal: i32,
    pub seconds: u64,
}

/// The default warning of a preemption: SIGUSR1, at the class's grace.
pub const DEFAULT_SIGNAL: i32 = 10;

/// The longest warning a job may ask for: a day.
pub const MAX_WARNING_SECS: u64 = 24 * 3600;

impl StopSignal {
    /// Parses `USR1@300`, `SIGUSR1@300`, `10@300`, or `USR1` alone (the time is then the
    /// preemption grace, and nothing is sent before a time limit: `seconds` 0).
    pub fn parse(text: &str) -> Result<Self, InvalidInput> {
        let text = text.trim();
        let (name, seconds) = match text.split_once('@') {
            Some((name, seconds)) => {
                let seconds = seconds.trim().parse::<u64>().map_err(|_| {
                    InvalidInput::new(format!(
                        "--signal {text:?}: the time after @ must be whole seconds (USR1@300)"
                    ))
                })?;
                (name, seconds)
            }
            None => (text, 0),
        };
        if seconds > MAX_WARNING_SECS {
            return Err(InvalidInput::new(format!(
                "--signal {text:?}: at most {MAX_WARNING_SECS} s of warning"
            )));
        }
        Ok(StopSignal {
            signal: signal_number(name).ok_or_else(|| {
                InvalidInput::new(format!(
                    "--signal {text:?}: unknown signal {name:?}; one of {} or its number",
                    SIGNALS
                        .iter()
                        .map(|(name, _)| *name)
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            })?,
            seconds,
        })
    }

    /// The signal's name without `SIG` (`USR1`), or its number when it has none here.
    pub fn name(&self) -> String {
        signal_name(self.signal)
    }
}

impl fmt::Display for StopSignal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.seconds {
            0 => write!(f, "{}", self.name()),
            seconds => write!(f, "{}@{seconds}", self.name()),
        }
    }
}

/// A signal's number from its name (`USR1`, `SIGUSR1`, `usr1`) or number (`10`).
pub fn signal_number(name: &str) -> Option<i32> {
    let name = name.trim();
    if let Ok(number) = name.parse::<i32>() {
        return (1..=64)
            .contains(&number)
            .then_some(number)
            .filter(|n| *n != 9 && *n != 19);
    }
    let upper = name.to_ascii_uppercase();
    let bare = upper.strip_prefix("SIG").unwrap_or(&upper);
    SIGNALS
        .iter()
        .find(|(known, _)| *known == bare)
        .map(|(_, number)| *number)
}

/// A signal's name without `SIG`, or its number.
pub fn signal_name(number: i32) -> String {
    SIGNALS
        .iter()
        .find(|(_, n)| *n == number)
        .map_or_else(|| number.to_string(), |(name, _)| (*name).to_owned())
}

/// Why a job is stopped, as written to `$MGPU_STOP_FILE`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopCause {
    Preempted,
    TimeLimit,
    Cancelled,
    NodeDrain,
    /// Its GPUs sat idle past the `[idle]` policy's warning while another job waited.
    Idle,
}

impl StopCause {
    pub fn as_str(self) -> &'static str {
        match self {
            StopCause::Preempted => "preempted",
            StopCause::TimeLimit => "time_limit",
            StopCause::Cancelled => "cancelled",
            StopCause::NodeDrain => "node_drain",
            StopCause::Idle => "idle",
        }
    }
}

/// The warning a kill carries: `signal` to every process of the job and `cause` written to
/// its stop file now, SIGTERM `grace_secs` later (then SIGKILL after the node's kill grace).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StopWarning {
    pub signal: i32,
    pub grace_secs: u64,
    pub cause: StopCause,
}

/// One attempt of a job stopped for another (a preemption by class), as accounting keeps it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Preemption {
    pub attempt: u32,
    /// The job it was stopped for (`4f2a1b2c3d (bob)`).
    pub by: String,
    /// The GPU time the attempt had run when it stopped, in whole GPU-seconds (what a job
    /// that saved nothing lost).
    pub gpu_seconds: u64,
    /// It exited by itself within its grace (it had time to save), rather than by SIGTERM or
    /// SIGKILL.
    pub within_grace: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slurm_s_syntax_parses_and_prints_back() {
        let usr1 = StopSignal::parse("USR1@300").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((usr1.signal, usr1.seconds), (10, 300));
        assert_eq!(usr1.to_string(), "USR1@300");
        assert_eq!(StopSignal::parse("SIGUSR2@5").map(|s| s.signal), Ok(12));
        assert_eq!(
            StopSignal::parse("sigterm").map(|s| s.to_string()),
            Ok("TERM".into())
        );
        assert_eq!(
            StopSignal::parse("10@60").map(|s| s.name()),
            Ok("USR1".into())
        );
    }

    #[test]
    fn nonsense_is_refused_with_the_reason() {
        for bad in [
            "", "USR3@5", "USR1@", "USR1@-5", "USR1@1.5", "9@10", "KILL@10", "0", "65",
        ] {
            assert!(StopSignal::parse(bad).is_err(), "{bad:?} was accepted");
        }
        let long = StopSignal::parse("USR1@999999");
        assert!(long.is_err_and(|e| e.to_string().contains("at most")));
    }
}
