//! Reservations: GPUs booked for a window of time (`mgpu reserve`), what a booking or a
//! cancel asks on `reservations.requests`, the record the scheduler keeps of each (key
//! `reservation.<name>` of the cluster bucket), the answer its requester hears, and the caps
//! of the scheduler's `[reservations]` table.
//!
//! Inside its window a reservation's GPUs take only jobs submitted with `--reservation NAME`
//! by its members (its owner, the users it names, the members of its group). Before the
//! window, other jobs start on them only if their time limit ends before it opens, or if
//! they are preemptible (then preempted when it opens); jobs without a time limit keep off
//! them within `horizon` of the window.

use serde::{Deserialize, Serialize};

use crate::Timestamp;
use crate::error::InvalidInput;
use crate::gpu_amount::GpuAmount;
use crate::ids::validate_node_name;
use crate::wire::check_user;

/// Longest reservation name (it becomes a KV key and a word in listings).
pub const MAX_NAME_BYTES: usize = 64;
/// Most users one reservation names.
pub const MAX_USERS: usize = 256;
/// Longest window anyone may book, admins included: a year.
pub const MAX_WINDOW_SECS: u64 = 366 * 24 * 3600;

/// The `[reservations]` caps and timings, with the defaults of a scheduler without the table.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReservationPolicy {
    /// Most GPUs one user holds in bookings at any moment; None: one node's GPUs (the
    /// cluster's largest node).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_gpus: Option<u32>,
    /// Longest window a user may book.
    pub max_duration_secs: u64,
    /// Most GPU-hours one user books within any calendar week (Monday 00:00 UTC); None: no cap.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_gpu_hours_per_week: Option<f64>,
    /// Least time between booking and the window's start.
    pub min_notice_secs: u64,
    /// Within this long before a window, jobs without a time limit keep off its GPUs.
    pub horizon_secs: u64,
    /// A window whose GPUs no member job used this long after its start gives them back.
    pub release_unused_after_secs: u64,
}

impl Default for ReservationPolicy {
    fn default() -> Self {
        ReservationPolicy {
            max_gpus: None,
            max_duration_secs: 24 * 3600,
            max_gpu_hours_per_week: None,
            min_notice_secs: 0,
            horizon_secs: 24 * 3600,
            release_unused_after_secs: 30 * 60,
        }
    }
}

/// What a user asks for with `mgpu reserve NAME …`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BookingAsk {
    pub name: String,
    /// GPUs in all (spread evenly over `nodes` nodes when that is given).
    pub gpus: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_type: Option<String>,
    /// On exactly this many nodes; None: as few as hold them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<u32>,
    /// Only on these nodes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodelist: Vec<String>,
    pub start: Timestamp,
    pub duration_secs: u64,
    /// Users besides the owner whose jobs may run in it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub users: Vec<String>,
    /// A group whose members' jobs may run in it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
}

/// Payload of `reservations.requests`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum ReservationRequest {
    Book(BookingAsk),
    Cancel { name: String },
}

impl ReservationRequest {
    pub fn name(&self) -> &str {
        match self {
            ReservationRequest::Book(ask) => &ask.name,
            ReservationRequest::Cancel { name } => name,
        }
    }

    /// What the payload alone shows wrong: a name that is no KV token, no GPUs, an empty or
    /// absurd window, names that are not user or node names.
    pub fn validate(&self) -> Result<(), InvalidInput> {
        check_name(self.name())?;
        let ReservationRequest::Book(ask) = self else {
            return Ok(());
        };
        if ask.gpus == 0 || ask.gpus >= GpuAmount::MAX_GPUS.saturating_mul(1024) {
            return Err(InvalidInput::new(format!(
                "a reservation of {} GPUs is not possible",
                ask.gpus
            )));
        }
        if let Some(nodes) = ask.nodes
            && (nodes == 0 || ask.gpus % nodes != 0)
        {
            return Err(InvalidInput::new(format!(
                "{} GPUs do not spread evenly over {nodes} nodes",
                ask.gpus
            )));
        }
        if ask.duration_secs == 0 || ask.duration_secs > MAX_WINDOW_SECS {
            return Err(InvalidInput::new(
                "a reservation lasts some time, at most a year".to_owned(),
            ));
        }
        for node in &ask.nodelist {
            validate_node_name(node)?;
        }
        if let Some(gpu_type) = &ask.gpu_type {
            crate::gpu_type::check_name(gpu_type, "GPU type")?;
        }
        if ask.users.len() > MAX_USERS {
            return Err(InvalidInput::new(format!(
                "a reservation names at most {MAX_USERS} users"
            )));
        }
        for user in &ask.users {
            check_user("user", user)?;
        }
        if let Some(group) = &ask.group {
            check_user("group", group)?;
        }
        Ok(())
    }
}

/// Checks a reservation name: letters, digits, `-` and `_`, at most [`MAX_NAME_BYTES`].
pub fn check_name(name: &str) -> Result<(), InvalidInput> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_BYTES
        && !name.starts_with('-')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if ok {
        return Ok(());
    }
    Err(InvalidInput::new(format!(
        "`{name}` is not a reservation name (letters, digits, `-` and `_`, at most \
         {MAX_NAME_BYTES})"
    )))
}

/// One GPU a reservation holds.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BookedGpu {
    pub node: String,
    pub index: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_type: Option<String>,
}

/// Where a reservation stands, besides its window.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case", deny_unknown_fields)]
pub enum Standing {
    Booked,
    Cancelled {
        by: String,
        at: Timestamp,
    },
    /// Its GPUs went back to the queue: unused `release_unused_after` into the window.
    Released {
        at: Timestamp,
        reason: String,
    },
}

/// A reservation as the scheduler keeps it (not `deny_unknown_fields`, which serde does not
/// support beside a flattened field: every record would fail to read).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reservation {
    pub name: String,
    pub owner: String,
    pub gpus: Vec<BookedGpu>,
    pub start: Timestamp,
    pub end: Timestamp,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub users: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    pub booked_at: Timestamp,
    #[serde(flatten)]
    pub standing: Standing,
    /// When a member job first started in it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_used_at: Option<Timestamp>,
}

impl Reservation {
    /// Booked (not cancelled nor released) and not over at `now`.
    pub fn holds_at(&self, now: Timestamp) -> bool {
        self.standing == Standing::Booked && now < self.end
    }

    /// Its window is open at `now` and it still holds its GPUs.
    pub fn open_at(&self, now: Timestamp) -> bool {
        self.holds_at(now) && self.start <= now
    }

    /// Whether `user` (in `group`) may run jobs in it.
    pub fn admits(&self, user: &str, group: Option<&str>) -> bool {
        self.owner == user
            || self.users.iter().any(|u| u == user)
            || (self.group.is_some() && self.group.as_deref() == group)
    }

    /// Whether it holds GPU `index` of `node`.
    pub fn has_gpu(&self, node: &str, index: u32) -> bool {
        self.gpus.iter().any(|g| g.node == node && g.index == index)
    }

    /// Its length in hours times its GPUs, up to `until` (a release or cancel ends it early).
    pub fn gpu_hours_within(&self, from: Timestamp, until: Timestamp) -> f64 {
        let end = match &self.standing {
            Standing::Booked => self.end,
            Standing::Cancelled { at, .. } | Standing::Released { at, .. } => {
                (*at).clamp(self.start, self.end)
            }
        };
        let (a, b) = (self.start.max(from), end.min(until));
        if b <= a {
            return 0.0;
        }
        (b - a).num_seconds() as f64 / 3600.0 * self.gpus.len() as f64
    }

    /// The words of a listing's state column at `now`.
    pub fn state_at(&self, now: Timestamp) -> &'static str {
        match &self.standing {
            Standing::Cancelled { .. } => "cancelled",
            Standing::Released { .. } => "released",
            Standing::Booked if now >= self.end => "ended",
            Standing::Booked if now >= self.start => "active",
            Standing::Booked => "booked",
        }
    }
}

/// What the requester of a booking or cancel hears on its `Mgpu-Verdict-To` inbox.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReservationVerdict {
    pub name: String,
    /// Done: booked, or cancelled.
    pub accepted: bool,
    /// Why not, when it was refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The reservation as stored, when it was accepted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reservation: Option<Reservation>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ask() -> BookingAsk {
        BookingAsk {
            name: "deadline".into(),
            gpus: 8,
            gpu_type: None,
            nodes: None,
            nodelist: vec![],
            start: chrono::Utc::now(),
            duration_secs: 3600,
            users: vec!["bob".into()],
            group: None,
        }
    }

    #[test]
    fn a_booking_reads_back_with_its_action_tag() {
        let request = ReservationRequest::Book(ask());
        let text = serde_json::to_string(&request).unwrap_or_default();
        assert!(text.contains("\"action\":\"book\""), "{text}");
        let back: Option<ReservationRequest> = serde_json::from_str(&text).ok();
        assert_eq!(back, Some(request));
        let cancel = r#"{"action":"cancel","name":"deadline"}"#;
        let back: Option<ReservationRequest> = serde_json::from_str(cancel).ok();
        assert_eq!(
            back,
            Some(ReservationRequest::Cancel {
                name: "deadline".into()
            })
        );
    }

    #[test]
    fn bad_names_windows_and_spreads_are_refused() {
        for name in ["", "a.b", "a b", "-x", &"n".repeat(65), "a*"] {
            let mut bad = ask();
            bad.name = name.to_owned();
            assert!(ReservationRequest::Book(bad).validate().is_err(), "{name}");
        }
        let mut uneven = ask();
        uneven.nodes = Some(3);
        assert!(ReservationRequest::Book(uneven).validate().is_err());
        let mut empty = ask();
        empty.duration_secs = 0;
        assert!(ReservationRequest::Book(empty).validate().is_err());
        let mut none = ask();
        none.gpus = 0;
        assert!(ReservationRequest::Book(none).validate().is_err());
        assert!(ReservationRequest::Book(ask()).validate().is_ok());
    }

    #[test]
    fn gpu_hours_stop_at_a_cancel_and_at_the_bounds_asked() {
        let start = chrono::Utc::now();
        let mut reservation = Reservation {
            name: "r".into(),
            owner: "alice".into(),
            gpus: vec![
                BookedGpu {
                    node: "n1".into(),
                    index: 0,
                    gpu_type: None,
                },
                BookedGpu {
                    node: "n1".into(),
                    index: 1,
                    gpu_type: None,
                },
            ],
            start,
            end: start + chrono::Duration::hours(10),
            users: vec![],
            group: None,
            booked_at: start,
            standing: Standing::Booked,
            first_used_at: None,
        };
        let far = start + chrono::Duration::days(30);
        assert!((reservation.gpu_hours_within(start, far) - 20.0).abs() < 1e-9);
        let half = start + chrono::Duration::hours(5);
        assert!((reservation.gpu_hours_within(half, far) - 10.0).abs() < 1e-9);
        reservation.standing = Standing::Cancelled {
            by: "alice".into(),
            at: start + chrono::Duration::hours(1),
        };
        assert!((reservation.gpu_hours_within(start, far) - 2.0).abs() < 1e-9);
        assert!(reservation.admits("alice", None));
        assert!(!reservation.admits("carol", Some("x")));
        // Stored and read back in each standing, as the scheduler and `mgpu reservations` do.
        let released = Standing::Released {
            at: start,
            reason: "unused".into(),
        };
        for standing in [Standing::Booked, released, reservation.standing.clone()] {
            let kept = Reservation {
                standing,
                ..reservation.clone()
            };
            let text = serde_json::to_string(&kept).unwrap_or_default();
            let back: Result<Reservation, _> = serde_json::from_str(&text);
            assert_eq!(back.ok(), Some(kept), "{text}");
            let verdict = ReservationVerdict {
                name: "r".into(),
                accepted: true,
                reason: None,
                reservation: Some(reservation.clone()),
            };
            let text = serde_json::to_string(&verdict).unwrap_or_default();
            let back: Result<ReservationVerdict, _> = serde_json::from_str(&text);
            assert_eq!(back.ok(), Some(verdict), "{text}");
        }
    }
}
