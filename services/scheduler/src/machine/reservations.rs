//! Reservations in the machine: bookings and cancels (`reservations.requests`) decided by
//! [`crate::booking`], stored in the cluster bucket before they count and answered on the
//! requester's verdict inbox; the windows each pass minds; a job's `--reservation` checked
//! at submission; and the upkeep of every tick: a window opened or closed wakes a pass, one
//! no member used `release_unused_after` into it gives its GPUs back, one a down node cannot
//! honour is reported to its owner and the admins at once, and those long over are dropped.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use mgpu_protocol::Timestamp;
use mgpu_protocol::idle::{Notice, NoticeKind};
use mgpu_protocol::job::{JobSpec, JobState};
use mgpu_protocol::request::Action;
use mgpu_protocol::reservation::{Reservation, ReservationRequest, ReservationVerdict, Standing};
use mgpu_protocol::subjects;

use super::announce::Sender;
use super::messages::{Command, Identity, LogLevel, Token};
use super::pending::Pending;
use super::{OpId, SchedulerState};
use crate::booking::{self, Asker, NodeGpus};
use crate::core::Window;
use crate::metrics::RefusalReason;

/// How long a reservation's record is kept after its window closed (`mgpu reservations
/// --all` lists it, and the weekly cap counts it).
const KEEP_ENDED: chrono::TimeDelta = chrono::TimeDelta::days(8);

/// The reservations the scheduler keeps, and what it derived from them.
#[derive(Default)]
pub struct Bookings {
    pub(crate) kept: BTreeMap<String, Reservation>,
    /// The windows of those that hold GPUs, as the core takes them (rebuilt on a change).
    windows: Arc<Vec<Window>>,
    /// (reservation, node) pairs whose down node was reported already.
    reported_down: HashSet<(String, String)>,
    /// When the upkeep last looked: a window edge between then and now wakes a pass.
    looked_at: Option<Timestamp>,
}

impl Bookings {
    pub fn new(loaded: Vec<Reservation>) -> Self {
        let mut bookings = Bookings {
            kept: loaded.into_iter().map(|r| (r.name.clone(), r)).collect(),
            ..Bookings::default()
        };
        bookings.derive_windows();
        bookings
    }

    /// The windows of the reservations that hold GPUs.
    pub fn windows(&self) -> Arc<Vec<Window>> {
        Arc::clone(&self.windows)
    }

    /// Whether any window is open at `now` (a pass must then run even with nobody waiting:
    /// jobs on its GPUs may have to leave).
    pub fn any_open(&self, now: Timestamp) -> bool {
        self.kept.values().any(|r| r.open_at(now))
    }

    fn put(&mut self, reservation: Reservation) {
        self.kept.insert(reservation.name.clone(), reservation);
        self.derive_windows();
    }

    fn derive_windows(&mut self) {
        let windows = self
            .kept
            .values()
            .filter(|r| r.standing == Standing::Booked)
            .map(|r| Window {
                name: r.name.clone(),
                gpus: r.gpus.iter().map(|g| (g.node.clone(), g.index)).collect(),
                start: r.start,
                end: r.end,
            })
            .collect();
        self.windows = Arc::new(windows);
    }
}

impl SchedulerState {
    /// A booking or a cancel: decided, then stored, then answered and audited. A booking
    /// delivered again after it was stored (its acknowledgement lost) is answered as booked
    /// again, not refused for its own name.
    pub(crate) fn on_reservation_request(
        &mut self,
        now: Timestamp,
        request: ReservationRequest,
        identity: Identity,
        (token, verdict_to, redelivered): (Token, Option<String>, bool),
    ) {
        if let ReservationRequest::Book(ask) = &request
            && redelivered
            && let Some(kept) = self
                .bookings
                .kept
                .get(&ask.name)
                .filter(|r| booked_as(r, ask, &identity))
        {
            let kept = kept.clone();
            let said = format!(
                "booking of reservation {} delivered again: already stored",
                kept.name
            );
            self.out.push(Command::log(LogLevel::Debug, None, said));
            self.answer(verdict_to, &ask.name, Ok(kept));
            self.ack(Some(token), None);
            return;
        }
        let decided = self.decide_reservation(&request, &identity, now);
        let name = request.name().to_owned();
        let reservation = match decided {
            Ok(reservation) => reservation,
            Err(reason) => {
                let sender = Sender::Known(&identity);
                let why = RefusalReason::NotPermitted;
                self.refuse(now, Action::Reserve, None, &sender, why, reason.clone());
                self.answer(verdict_to, &name, Err(reason));
                self.ack(Some(token), None);
                return;
            }
        };
        let op = self.op();
        let reservation = Arc::new(reservation);
        self.out.push(Command::StoreReservation {
            op: Some(op),
            reservation: Arc::clone(&reservation),
        });
        let detail = match &request {
            ReservationRequest::Book(_) => describe(&reservation),
            ReservationRequest::Cancel { .. } => format!("reservation {name} cancelled"),
        };
        let pending = Pending::Reservation {
            token,
            reservation,
            identity,
            detail,
            verdict_to,
        };
        self.pending.insert(op, pending);
    }

    /// The reservation as `request` by `identity` leaves it, or why not.
    fn decide_reservation(
        &self,
        request: &ReservationRequest,
        identity: &Identity,
        now: Timestamp,
    ) -> Result<Reservation, String> {
        let ask = match request {
            ReservationRequest::Book(ask) => ask,
            ReservationRequest::Cancel { name } => return self.cancelled(name, identity, now),
        };
        if let Some(unknown) = self.unknown_members(ask.users.iter(), ask.group.as_deref()) {
            return Err(unknown);
        }
        let known: Vec<&Reservation> = self.bookings.kept.values().collect();
        let asker = Asker {
            name: &identity.name,
            admin: identity.admin,
        };
        let nodes = self.bookable_nodes(now);
        booking::book(ask, asker, &known, &nodes, &self.policy.reservations, now)
    }

    /// A booking or cancel was stored (or not: the request is delivered again).
    pub(crate) fn on_reservation_stored(&mut self, now: Timestamp, op: OpId, stored: bool) {
        let Some(Pending::Reservation {
            token,
            reservation,
            identity,
            detail,
            verdict_to,
        }) = self.pending.remove(&op)
        else {
            return;
        };
        if !stored {
            let said = format!("storing reservation {} failed", reservation.name);
            self.out.push(Command::log(LogLevel::Error, None, said));
            return;
        }
        self.out
            .push(Command::log(LogLevel::Info, None, detail.clone()));
        let sender = Sender::Known(&identity);
        let target = Some(format!("reservation {}", reservation.name));
        self.audit(now, Action::Reserve, &sender, target, Ok(detail));
        let reservation = Arc::unwrap_or_clone(reservation);
        self.answer(verdict_to, &reservation.name, Ok(reservation.clone()));
        self.bookings.put(reservation);
        self.pass_due = true;
        self.ack(Some(token), None);
    }

    /// The cancel of `name` by `who`, or why not: only its owner or an admin, only while it
    /// holds its GPUs.
    fn cancelled(&self, name: &str, who: &Identity, now: Timestamp) -> Result<Reservation, String> {
        let Some(kept) = self.bookings.kept.get(name).filter(|r| r.holds_at(now)) else {
            return Err(format!("no reservation {name} holds GPUs now"));
        };
        if kept.owner != who.name && !who.admin {
            return Err(format!(
                "reservation {name} is {}'s: only they or an admin may cancel it",
                kept.owner
            ));
        }
        let mut cancelled = kept.clone();
        cancelled.standing = Standing::Cancelled {
            by: who.name.clone(),
            at: now,
        };
        Ok(cancelled)
    }

    /// The first of `users` (and `group`) nobody is known by, as a refusal.
    fn unknown_members<'a>(
        &self,
        mut users: impl Iterator<Item = &'a String>,
        group: Option<&str>,
    ) -> Option<String> {
        if let Some(user) = users.find(|u| self.user_by_name(u).is_none()) {
            return Some(format!("no user is named {user}"));
        }
        let group = group?;
        let known = self
            .principals
            .principals
            .iter()
            .any(|p| p.group.as_deref() == Some(group));
        (!known).then(|| format!("no user is in a group named {group}"))
    }

    /// The nodes a booking may take GPUs of: online and not drained.
    fn bookable_nodes(&self, now: Timestamp) -> Vec<NodeGpus> {
        self.nodes
            .views(now)
            .into_iter()
            .filter(|view| view.online && !view.drained)
            .map(|view| NodeGpus {
                name: view.name,
                gpus: (view.gpus.iter())
                    .map(|g| (g.index, g.gpu_type.clone()))
                    .collect(),
            })
            .collect()
    }

    /// Tells the requester, when they wait, what came of their request.
    fn answer(&mut self, to: Option<String>, name: &str, outcome: Result<Reservation, String>) {
        let Some(to) = to else {
            return;
        };
        let verdict = match outcome {
            Ok(reservation) => ReservationVerdict {
                name: name.to_owned(),
                accepted: true,
                reason: None,
                reservation: Some(reservation),
            },
            Err(reason) => ReservationVerdict {
                name: name.to_owned(),
                accepted: false,
                reason: Some(reason),
                reservation: None,
            },
        };
        self.out.push(Command::ReservationVerdict { to, verdict });
    }

    /// Why a job submitted by `user` with `--reservation` cannot run in it, if it cannot:
    /// no such reservation holding GPUs, not among its users, no time limit, or one that
    /// outlasts the window.
    pub(crate) fn reservation_refusal(
        &self,
        spec: &JobSpec,
        user: &str,
        now: Timestamp,
    ) -> Option<String> {
        let name = spec.reservation.as_ref()?;
        let Some(reservation) = self.bookings.kept.get(name).filter(|r| r.holds_at(now)) else {
            return Some(format!("no reservation {name} holds GPUs now"));
        };
        if !reservation.admits(user, self.group_of(user)) {
            return Some(format!(
                "{user} is not among the users of reservation {name} (booked by {})",
                reservation.owner
            ));
        }
        let Some(limit) = crate::time_limits::time_limit(&self.policy, spec) else {
            return Some(format!(
                "a job in reservation {name} needs a time limit (--time-limit), so that it ends \
                 before the window closes"
            ));
        };
        let limit = chrono::Duration::from_std(limit).unwrap_or(chrono::TimeDelta::MAX);
        let earliest = now.max(reservation.start);
        if earliest
            .checked_add_signed(limit)
            .is_none_or(|end| end > reservation.end)
        {
            return Some(format!(
                "its time limit would outlast reservation {name}, which closes at {}",
                reservation.end.format("%Y-%m-%d %H:%M UTC")
            ));
        }
        None
    }

    /// What every tick looks at: window edges (a pass), first use, unused windows released,
    /// down nodes reported, records long over dropped.
    pub(crate) fn reservation_upkeep(&mut self, now: Timestamp) {
        let since = self.bookings.looked_at.replace(now).unwrap_or(now);
        if self.bookings.kept.is_empty() {
            // Most clusters book nothing: no node table built, no job looked at, every tick.
            return;
        }
        let edge = |at: Timestamp| since < at && at <= now;
        if (self.bookings.kept.values())
            .any(|r| r.standing == Standing::Booked && (edge(r.start) || edge(r.end)))
        {
            self.pass_due = true;
        }
        self.mark_first_use(now);
        self.release_unused(now);
        self.report_down_nodes(now);
        let over: Vec<String> = (self.bookings.kept.values())
            .filter(|r| r.end + KEEP_ENDED < now)
            .map(|r| r.name.clone())
            .collect();
        for name in over {
            self.bookings.kept.remove(&name);
            self.out.push(Command::DropReservation { name });
        }
    }

    /// Open reservations a member job runs in now get their first use recorded.
    fn mark_first_use(&mut self, now: Timestamp) {
        let unused: Vec<String> = (self.bookings.kept.values())
            .filter(|r| r.open_at(now) && r.first_used_at.is_none())
            .map(|r| r.name.clone())
            .collect();
        if unused.is_empty() {
            return;
        }
        let used: Vec<String> = {
            let running: HashSet<&str> = (self.jobs.running())
                .filter(|r| matches!(r.state, JobState::Running(_)))
                .filter_map(|r| r.spec.reservation.as_deref())
                .collect();
            unused
                .into_iter()
                .filter(|n| running.contains(n.as_str()))
                .collect()
        };
        for name in &used {
            if let Some(mut reservation) = self.bookings.kept.get(name).cloned() {
                reservation.first_used_at = Some(now);
                self.store_quietly(reservation);
            }
        }
    }

    /// Windows no member used `release_unused_after` into them give their GPUs back; their
    /// owner is told.
    fn release_unused(&mut self, now: Timestamp) {
        let after_secs = self.policy.reservations.release_unused_after_secs;
        let after = chrono::Duration::seconds(i64::try_from(after_secs).unwrap_or(i64::MAX / 1000));
        let idle: Vec<Reservation> = (self.bookings.kept.values())
            .filter(|r| r.open_at(now) && r.first_used_at.is_none() && r.start + after <= now)
            .cloned()
            .collect();
        for mut reservation in idle {
            let reason = format!(
                "no job of it ran in the first {} of its window: its GPUs went back to the queue",
                mgpu_protocol::duration::format_duration(std::time::Duration::from_secs(
                    after_secs
                ))
            );
            reservation.standing = Standing::Released {
                at: now,
                reason: reason.clone(),
            };
            let kind = NoticeKind::ReservationReleased {
                name: reservation.name.clone(),
                after_secs,
            };
            let message = format!("reservation {}: {reason}", reservation.name);
            self.tell(&reservation.owner, false, kind, message.clone(), now);
            self.out.push(Command::log(LogLevel::Info, None, message));
            self.store_quietly(reservation);
            self.pass_due = true;
        }
    }

    /// A reservation not over with GPUs on a node that is offline now: its owner and the
    /// admins hear it once per node (again if the node comes back and goes down again).
    fn report_down_nodes(&mut self, now: Timestamp) {
        let offline: HashSet<String> = (self.nodes.views(now).into_iter())
            .filter(|view| !view.online)
            .map(|view| view.name)
            .collect();
        self.bookings
            .reported_down
            .retain(|(_, node)| offline.contains(node));
        let mut news: Vec<(String, String, String)> = Vec::new();
        for reservation in self.bookings.kept.values().filter(|r| r.holds_at(now)) {
            let mut down: Vec<&str> = (reservation.gpus.iter())
                .map(|g| g.node.as_str())
                .filter(|node| offline.contains(*node))
                .collect();
            down.dedup();
            for node in down {
                let key = (reservation.name.clone(), node.to_owned());
                if self.bookings.reported_down.insert(key) {
                    news.push((
                        reservation.name.clone(),
                        reservation.owner.clone(),
                        node.to_owned(),
                    ));
                }
            }
        }
        for (name, owner, node) in news {
            let message = format!(
                "reservation {name}: node {node} is down; the window cannot be honoured in full \
                 unless it comes back"
            );
            let kind = NoticeKind::ReservationAtRisk {
                name,
                node: node.clone(),
            };
            self.tell(&owner, true, kind, message.clone(), now);
            self.out
                .push(Command::node_log(LogLevel::Warn, &node, message));
        }
    }

    /// A notice to `user` (and to every admin, when `admins_too`).
    fn tell(
        &mut self,
        user: &str,
        admins_too: bool,
        kind: NoticeKind,
        message: String,
        now: Timestamp,
    ) {
        let mut keys: Vec<String> = self
            .user_by_name(user)
            .map(|p| p.public_key.clone())
            .into_iter()
            .collect();
        if admins_too {
            keys.extend(self.admin_keys().cloned());
        }
        keys.sort();
        keys.dedup();
        for key in keys {
            let notice = Notice {
                job: None,
                at: now,
                message: message.clone(),
                kind: kind.clone(),
            };
            self.out.push(Command::Notice {
                subject: subjects::notices(&key),
                notice,
            });
        }
    }

    /// Takes `reservation` as it now is and stores it, without waiting for the write (a
    /// failed one is logged; the scheduler after a restart decides the same again).
    fn store_quietly(&mut self, reservation: Reservation) {
        self.out.push(Command::StoreReservation {
            op: None,
            reservation: Arc::new(reservation.clone()),
        });
        self.bookings.put(reservation);
    }
}

/// Whether `kept` is what `ask` by `who` booked: its owner, window, GPUs and members.
fn booked_as(
    kept: &Reservation,
    ask: &mgpu_protocol::reservation::BookingAsk,
    who: &Identity,
) -> bool {
    let length = i64::try_from(ask.duration_secs).unwrap_or(i64::MAX / 1000);
    kept.owner == who.name
        && kept.start >= ask.start
        && kept.end - kept.start == chrono::Duration::seconds(length)
        && kept.gpus.len() == ask.gpus as usize
        && kept.users == ask.users
        && kept.group == ask.group
}

/// A booking in words, for the log and the audit trail.
fn describe(reservation: &Reservation) -> String {
    let mut nodes: Vec<&str> = reservation.gpus.iter().map(|g| g.node.as_str()).collect();
    nodes.dedup();
    format!(
        "reservation {} booked by {}: {} GPUs on {} from {} to {}",
        reservation.name,
        reservation.owner,
        reservation.gpus.len(),
        nodes.join(","),
        reservation.start.format("%Y-%m-%d %H:%M UTC"),
        reservation.end.format("%Y-%m-%d %H:%M UTC"),
    )
}
