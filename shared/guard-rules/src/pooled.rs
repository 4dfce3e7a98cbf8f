//! A pooled guard's start: the message that turns a waiting guard into a job's.
//!
//! The agent keeps a few guards waiting, each already inside a cgroup made for the next job
//! (`mgpu-job-guard --pooled AGENT_PID CGROUP`): moving a process into a cgroup can wait for
//! the kernel's read-copy-update grace period (about 10 ms), and a pooled guard pays that before
//! any job needs it. When a job comes, the agent writes the job's limits into that cgroup and
//! sends the guard, on its standard input, the command line, environment and directory it
//! would otherwise have been started with; the guard reads to the end, enters the directory
//! and executes itself with them (`@` before CGROUP: joined already). An exec keeps the cgroup.
//!
//! The message: the directory, then ARGC in decimal, then ARGC arguments (the first is the
//! guard's path, the program executed), then the environment's `NAME=value` entries to the end;
//! every item followed by a NUL. Arguments may be empty; environment entries never are.

/// `argv[1]` of a pooled guard.
pub const FLAG: &[u8] = b"--pooled";

/// What a pooled guard's command line holds after [`FLAG`]: AGENT_PID and CGROUP.
pub const USAGE: &str = "--pooled AGENT_PID CGROUP";

/// The longest message a pooled guard reads; the agent starts a job with more the usual way.
pub const MESSAGE_MAX: usize = 4 << 20;

/// The most arguments and environment entries together a pooled guard takes.
pub const ITEMS_MAX: usize = 16 * 1024;

/// A start message read: where the items lie in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Start<'a> {
    /// The directory, without its NUL.
    pub workdir: &'a [u8],
    /// The arguments, then the environment, each item with its NUL, in message order.
    pub items: &'a [u8],
    /// How many of the items are arguments (at least one: the program).
    pub argc: usize,
}

/// Why a start message cannot be used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StartError {
    /// Nothing came: the agent gave the guard up (it ends quietly).
    Empty,
    /// Not a message of the form above.
    Malformed,
    /// More items than [`ITEMS_MAX`].
    TooMany,
}

impl StartError {
    pub const fn message(self) -> &'static str {
        match self {
            StartError::Empty => "no job came",
            StartError::Malformed => "a malformed start message",
            StartError::TooMany => "too many arguments and environment entries",
        }
    }
}

/// Reads a whole start message.
pub fn parse(message: &[u8]) -> Result<Start<'_>, StartError> {
    if message.is_empty() {
        return Err(StartError::Empty);
    }
    if message.last() != Some(&0) {
        return Err(StartError::Malformed);
    }
    let (workdir, rest) = split_item(message).ok_or(StartError::Malformed)?;
    let (count, items) = split_item(rest).ok_or(StartError::Malformed)?;
    let argc = decimal(count).ok_or(StartError::Malformed)?;
    let total = items.iter().filter(|byte| **byte == 0).count();
    if argc == 0 || argc > total || workdir.is_empty() {
        return Err(StartError::Malformed);
    }
    if total > ITEMS_MAX {
        return Err(StartError::TooMany);
    }
    let start = Start {
        workdir,
        items,
        argc,
    };
    if start.items().skip(argc).any(<[u8]>::is_empty) {
        return Err(StartError::Malformed);
    }
    Ok(start)
}

impl<'a> Start<'a> {
    /// Every item (arguments, then the environment), each with its NUL.
    pub fn items_with_nul(&self) -> impl Iterator<Item = &'a [u8]> + use<'a> {
        self.items.split_inclusive(|byte| *byte == 0)
    }

    /// Every item without its NUL.
    pub fn items(&self) -> impl Iterator<Item = &'a [u8]> + use<'a> {
        self.items_with_nul()
            .map(|item| item.split_last().map_or(item, |(_, text)| text))
    }
}

/// The first NUL-terminated item (without its NUL) and what follows it.
fn split_item(bytes: &[u8]) -> Option<(&[u8], &[u8])> {
    let end = bytes.iter().position(|byte| *byte == 0)?;
    Some((bytes.get(..end)?, bytes.get(end + 1..)?))
}

fn decimal(text: &[u8]) -> Option<usize> {
    crate::args::number(text).and_then(|n| usize::try_from(n).ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::vec::Vec;

    #[test]
    fn a_message_gives_its_directory_arguments_and_environment() {
        let message = b"/work\x003\x00/guard\x00\x00-c\x00A=1\x00PATH=/bin\x00";
        let start = parse(message).unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(start.workdir, b"/work");
        assert_eq!(start.argc, 3);
        let items: Vec<&[u8]> = start.items().collect();
        assert_eq!(
            items,
            [&b"/guard"[..], b"", b"-c", b"A=1", b"PATH=/bin"].to_vec()
        );
        assert_eq!(start.items_with_nul().next(), Some(&b"/guard\0"[..]));
    }

    #[test]
    fn nothing_sent_is_told_apart_from_a_broken_message() {
        assert_eq!(parse(b""), Err(StartError::Empty));
        for broken in [
            &b"/work"[..],
            b"/work\x00",
            b"/work\x00x\x00/guard\x00",
            b"/work\x000\x00A=1\x00",
            b"/work\x002\x00/guard\x00",
            b"\x001\x00/guard\x00",
            b"/work\x001\x00/guard\x00\x00",
        ] {
            assert_eq!(parse(broken), Err(StartError::Malformed), "{broken:?}");
        }
    }

    #[test]
    fn more_items_than_a_guard_takes_are_refused() {
        let mut message = b"/w\x001\x00/guard\x00".to_vec();
        for _ in 0..ITEMS_MAX {
            message.extend_from_slice(b"A=1\x00");
        }
        assert_eq!(parse(&message), Err(StartError::TooMany));
    }
}
