//! Notifications (`mgpu submit --notify …`, `mgpu notify`, the `mgpu-notify` service): which
//! moments of a job its owner asked to hear about ([`NotifyEvent`]), where notices go
//! ([`destination`]), and the names of the stream, buckets and consumers the service keeps its
//! work in. Every notice is an [`crate::idle::Notice`] on `users.<owner key>.notices`; the
//! stream [`NOTICES_STREAM`] keeps them, so `mgpu-notify` loses none across its restarts.
//!
//! # Layout
//! - this file: the events (`end,fail,start,preempt,time80,idle`), parsed as `--notify` takes
//!   them, which notice answers which event, and the names.
//! - [`destination`]: a destination (`slack|mattermost|discord|webhook URL`, `email ADDRESS`),
//!   what makes one acceptable, and its keys in [`DESTINATIONS_BUCKET`].

pub mod destination;

use serde::{Deserialize, Serialize};

use crate::error::InvalidInput;
use crate::idle::NoticeKind;

/// Stream keeping every notice on `users.*.notices` (the scheduler's idle notices, the
/// `mgpu-notify` service's own, `mgpu notify test`) until the service has delivered it.
pub const NOTICES_STREAM: &str = "MGPU_NOTICES";
/// How long a notice is kept in [`NOTICES_STREAM`]: long past any retry's backoff.
pub const NOTICES_MAX_AGE_SECS: u64 = 7 * 24 * 3600;
/// The most notices [`NOTICES_STREAM`] keeps (the oldest go first): a user publishing test
/// notices in a loop cannot fill the server's disk.
pub const NOTICES_MAX_MSGS: i64 = 1_000_000;
/// Largest notice the service takes (a notice is a few hundred bytes).
pub const MAX_NOTICE_BYTES: usize = 16 * 1024;

/// KV bucket of users' destinations and webhook secrets: `<user key>.dest.<id>` (a
/// [`destination::Destination`]) and `<user key>.secret`. A user may read and write their own
/// key's entries only (the server's permissions); the service and admins read all.
pub const DESTINATIONS_BUCKET: &str = "mgpu-notify";
pub const DESTINATIONS_BUCKET_STREAM: &str = "KV_mgpu-notify";
/// KV bucket of what the service has sent: `<user key>.<destination id>.<notice id>`, so a
/// notice delivered again (a redelivery after a restart) is never sent twice to one destination.
pub const SENT_BUCKET: &str = "mgpu-notify-sent";
pub const SENT_BUCKET_STREAM: &str = "KV_mgpu-notify-sent";
/// How long the service remembers a sent notice: longer than a notice stays in the stream.
pub const SENT_MAX_AGE_SECS: u64 = 8 * 24 * 3600;

/// The service's durable consumer of job events (`MGPU_EVENTS`): starts, ends, preemptions.
pub const EVENTS_CONSUMER: &str = "notify-events";
/// The service's durable consumer of notices ([`NOTICES_STREAM`]): what it delivers.
pub const NOTICES_CONSUMER: &str = "notify-notices";

/// The KV key of a user's webhook signing secret in [`DESTINATIONS_BUCKET`].
pub fn secret_key(user_key: &str) -> String {
    format!("{user_key}.secret")
}

/// The KV subjects of every entry of one user in [`DESTINATIONS_BUCKET`] (what their
/// permissions name).
pub fn user_entries(user_key: &str) -> String {
    format!("$KV.{DESTINATIONS_BUCKET}.{user_key}.>")
}

/// A moment of a job its owner may ask to be told about (`--notify`), named as Slurm's
/// `--mail-type` names it where it has the same thing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NotifyEvent {
    /// It ended, however it ended (Slurm's `END`).
    End,
    /// It ended failed, timed out or with its node (Slurm's `FAIL`).
    Fail,
    /// It started running (Slurm's `BEGIN`).
    Start,
    /// It was stopped to make room (preempted, its time slice over, its idle GPUs reclaimed)
    /// and queued again.
    Preempt,
    /// 80 % of its time limit has passed (Slurm's `TIME_LIMIT_80`).
    Time80,
    /// The `[idle]` policy warned about its idle GPUs or reclaimed them.
    Idle,
}

impl NotifyEvent {
    pub const ALL: [NotifyEvent; 6] = [
        NotifyEvent::End,
        NotifyEvent::Fail,
        NotifyEvent::Start,
        NotifyEvent::Preempt,
        NotifyEvent::Time80,
        NotifyEvent::Idle,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            NotifyEvent::End => "end",
            NotifyEvent::Fail => "fail",
            NotifyEvent::Start => "start",
            NotifyEvent::Preempt => "preempt",
            NotifyEvent::Time80 => "time80",
            NotifyEvent::Idle => "idle",
        }
    }

    /// One name as `--notify` takes it; Slurm's `BEGIN` and `TIME_LIMIT_80` are accepted too.
    fn parse_one(word: &str) -> Result<NotifyEvent, InvalidInput> {
        let lower = word.trim().to_ascii_lowercase();
        let found = match lower.as_str() {
            "begin" => Some(NotifyEvent::Start),
            "time_limit_80" => Some(NotifyEvent::Time80),
            _ => NotifyEvent::ALL.into_iter().find(|e| e.as_str() == lower),
        };
        found.ok_or_else(|| {
            InvalidInput::new(format!(
                "`{}` is not a notice: use end, fail, start, preempt, time80, idle or all",
                word.trim()
            ))
        })
    }
}

/// Parses `--notify end,fail,…` (or `all`) into a sorted list without repeats.
pub fn parse_events(text: &str) -> Result<Vec<NotifyEvent>, InvalidInput> {
    let mut events = Vec::new();
    for word in text.split(',').filter(|w| !w.trim().is_empty()) {
        if word.trim().eq_ignore_ascii_case("all") {
            events.extend(NotifyEvent::ALL);
        } else {
            events.push(NotifyEvent::parse_one(word)?);
        }
    }
    if events.is_empty() {
        return Err(InvalidInput::new(
            "--notify names no notice: use end, fail, start, preempt, time80, idle or all",
        ));
    }
    events.sort();
    events.dedup();
    Ok(events)
}

/// Whether a job whose spec asked for `wanted` is told `kind`. `mgpu notify test` notices
/// always go, as do a reservation's (no job asks for them); a job's end goes for `end`, and
/// for `fail` when it did not succeed.
pub fn wanted_by(kind: &NoticeKind, wanted: &[NotifyEvent]) -> bool {
    let has = |event| wanted.contains(&event);
    match kind {
        NoticeKind::Test
        | NoticeKind::ReservationAtRisk { .. }
        | NoticeKind::ReservationReleased { .. } => true,
        NoticeKind::IdleWarning { .. } | NoticeKind::IdleReclaimed { .. } => has(NotifyEvent::Idle),
        // Withdrawing a warning is news only to whoever heard the warning.
        NoticeKind::IdleCleared => has(NotifyEvent::Idle),
        NoticeKind::Started { .. } => has(NotifyEvent::Start),
        NoticeKind::Preempted { .. } => has(NotifyEvent::Preempt),
        NoticeKind::TimeLimit80 { .. } => has(NotifyEvent::Time80),
        NoticeKind::Ended { state, .. } => {
            has(NotifyEvent::End) || (state != "succeeded" && has(NotifyEvent::Fail))
        }
        NoticeKind::ArrayEnded { failed, other, .. } => {
            has(NotifyEvent::End) || (failed + other > 0 && has(NotifyEvent::Fail))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notify_takes_the_names_slurm_and_all() {
        assert_eq!(
            parse_events("end, fail").ok(),
            Some(vec![NotifyEvent::End, NotifyEvent::Fail])
        );
        assert_eq!(
            parse_events("BEGIN,time_limit_80,begin").ok(),
            Some(vec![NotifyEvent::Start, NotifyEvent::Time80])
        );
        assert_eq!(parse_events("all").ok(), Some(NotifyEvent::ALL.to_vec()));
        let err = parse_events("end,mail")
            .err()
            .map(|e| e.0)
            .unwrap_or_default();
        assert!(err.contains("`mail` is not a notice"), "{err}");
        assert!(parse_events(" , ").is_err());
    }

    #[test]
    fn a_failure_goes_to_end_or_fail_a_success_to_end_only() {
        let ended = |state: &str| NoticeKind::Ended {
            state: state.to_owned(),
            exit_code: None,
            reason: None,
        };
        assert!(wanted_by(&ended("failed"), &[NotifyEvent::Fail]));
        assert!(wanted_by(&ended("failed"), &[NotifyEvent::End]));
        assert!(!wanted_by(&ended("succeeded"), &[NotifyEvent::Fail]));
        assert!(wanted_by(&ended("succeeded"), &[NotifyEvent::End]));
        assert!(!wanted_by(&ended("succeeded"), &[NotifyEvent::Start]));
        assert!(wanted_by(&NoticeKind::Test, &[]));
        assert!(!wanted_by(&NoticeKind::IdleCleared, &[NotifyEvent::End]));
    }
}
