//! Reservations asked of the machine: a booking stored before it counts and answered, one in
//! the way refused naming it, jobs of it refused or run by its window, a cancel, a window
//! released unused and one a down node cannot honour, each told to whoever must hear.

use mgpu_protocol::idle::NoticeKind;
use mgpu_protocol::job::{JobSpec, JobState, WaitReason};
use mgpu_protocol::priority::Policy;
use mgpu_protocol::request::Request;
use mgpu_protocol::reservation::{BookingAsk, ReservationRequest, ReservationVerdict, Standing};
use mgpu_protocol::why::CauseKind;

use super::messages::{Command, Identity, Input};
use super::tests::{Rig, alice, beat, one_gpu, root, t0, tick};

fn minutes(n: i64) -> chrono::Duration {
    chrono::Duration::minutes(n)
}

fn ask(name: &str, opens_in: i64, minutes_long: u64) -> BookingAsk {
    BookingAsk {
        name: name.into(),
        gpus: 1,
        gpu_type: None,
        nodes: None,
        nodelist: Vec::new(),
        start: t0() + minutes(opens_in),
        duration_secs: minutes_long * 60,
        users: Vec::new(),
        group: None,
    }
}

/// Sends `request` as `who` at `now`, stores what it asks to store; the verdict and every
/// other command.
fn reserve(
    rig: &mut Rig,
    who: Identity,
    request: ReservationRequest,
    now: chrono::DateTime<chrono::Utc>,
) -> (Option<ReservationVerdict>, Vec<Command>) {
    let mut admitted = rig.request(who, Request::Reserve(request));
    admitted.verdict_to = Some("_INBOX.U.verdict".into());
    let mut commands = rig.feed(now, Input::Request(Box::new(admitted)));
    let mut seen = Vec::new();
    let mut verdict = None;
    while let Some(command) = commands.pop() {
        match command {
            Command::StoreReservation { op: Some(op), .. } => {
                commands.extend(rig.feed(now, Input::ReservationStored { op, stored: true }));
            }
            Command::ReservationVerdict { verdict: v, .. } => verdict = Some(v),
            other => seen.push(other),
        }
    }
    (verdict, seen)
}

fn with_limit(minutes_long: u64, reservation: &str) -> JobSpec {
    let mut spec = one_gpu();
    spec.time_limit_secs = Some(minutes_long * 60);
    spec.reservation = Some(reservation.into());
    spec
}

fn waits(rig: &Rig, id: &mgpu_protocol::ids::JobId) -> Option<WaitReason> {
    match rig.state(id) {
        Some(JobState::Queued(waiting)) => Some(waiting.reason),
        _ => None,
    }
}

#[test]
fn a_booking_is_answered_once_stored_and_one_in_its_way_is_refused_naming_it() {
    let mut rig = Rig::new(Policy::default());
    let (verdict, commands) = reserve(
        &mut rig,
        alice(),
        ReservationRequest::Book(ask("paper", 10, 60)),
        t0(),
    );
    let verdict = verdict.unwrap_or_else(|| panic!("no verdict: {commands:?}"));
    assert!(verdict.accepted, "{verdict:?}");
    let booked = verdict.reservation.unwrap_or_else(|| panic!("no record"));
    assert_eq!((booked.owner.as_str(), booked.gpus.len()), ("alice", 1));
    assert!(
        commands
            .iter()
            .any(|c| matches!(c, Command::Audit(a) if a.action == "reserve" && a.accepted)),
        "{commands:?}"
    );
    // node1 has one GPU: an admin's booking overlapping it finds none free, and says whose.
    let (verdict, _) = reserve(
        &mut rig,
        root(),
        ReservationRequest::Book(ask("demo", 30, 60)),
        t0(),
    );
    let verdict = verdict.unwrap_or_else(|| panic!("no verdict"));
    assert!(!verdict.accepted);
    let reason = verdict.reason.unwrap_or_default();
    assert!(reason.contains("paper (alice"), "{reason}");
    // After it, the GPU is free again.
    let (verdict, _) = reserve(
        &mut rig,
        root(),
        ReservationRequest::Book(ask("demo", 70, 60)),
        t0(),
    );
    assert!(verdict.is_some_and(|v| v.accepted));
    // A user past the cap (one node's GPUs at once, by default) is refused by it.
    let (verdict, _) = reserve(
        &mut rig,
        alice(),
        ReservationRequest::Book(ask("more", 20, 5)),
        t0(),
    );
    let reason = verdict.and_then(|v| v.reason).unwrap_or_default();
    assert!(reason.contains("one user may book"), "{reason}");
}

#[test]
fn a_booking_delivered_again_after_it_was_stored_is_answered_as_booked() {
    let mut rig = Rig::new(Policy::default());
    let book = || ReservationRequest::Book(ask("paper", 10, 60));
    let (first, _) = reserve(&mut rig, alice(), book(), t0());
    assert!(first.as_ref().is_some_and(|v| v.accepted));
    let mut again = rig.request(alice(), Request::Reserve(book()));
    again.verdict_to = Some("_INBOX.U.verdict".into());
    if let Some(order) = &mut again.order {
        order.redelivered = true;
    }
    let commands = rig.feed(t0(), Input::Request(Box::new(again)));
    let verdict = commands.iter().find_map(|c| match c {
        Command::ReservationVerdict { verdict, .. } => Some(verdict.clone()),
        _ => None,
    });
    assert_eq!(verdict, first, "{commands:?}");
    assert!(
        !commands
            .iter()
            .any(|c| matches!(c, Command::Audit(_) | Command::StoreReservation { .. })),
        "{commands:?}"
    );
    // The same booking sent anew (not a redelivery) is another booking of a taken name.
    let (verdict, _) = reserve(&mut rig, alice(), book(), t0());
    assert!(verdict.is_some_and(|v| !v.accepted));
}

#[test]
fn jobs_of_a_reservation_are_checked_at_submission_and_run_in_its_window() {
    let mut rig = Rig::new(Policy::default());
    let (verdict, _) = reserve(
        &mut rig,
        alice(),
        ReservationRequest::Book(ask("paper", 10, 60)),
        t0(),
    );
    assert!(verdict.is_some_and(|v| v.accepted));
    // Too long for the window: failed at once, saying why.
    let outlasting = rig.submit(with_limit(90, "paper"));
    match rig.state(&outlasting) {
        Some(JobState::Failed(ending)) => {
            let reason = ending.reason.clone().unwrap_or_default();
            assert!(reason.contains("outlast reservation paper"), "{reason}");
        }
        other => panic!("not refused: {other:?}"),
    }
    let member = rig.submit(with_limit(30, "paper"));
    // An ordinary job of an hour: the only GPU is booked in ten minutes.
    let mut hour = one_gpu();
    hour.time_limit_secs = Some(3600);
    let other = rig.submit(hour);
    rig.pass(t0());
    assert_eq!(waits(&rig, &member), Some(WaitReason::ReservationWindow));
    assert_eq!(waits(&rig, &other), Some(WaitReason::Reserved));
    // `mgpu why` names the window it waits for, and the booking in the other's way.
    for (job, words) in [
        (&member, "whose window opens at"),
        (&other, "booked by paper (alice"),
    ] {
        let answer = rig
            .machine
            .explain(job, &alice().key, t0())
            .unwrap_or_else(|e| panic!("{e}"));
        let said = answer
            .causes
            .iter()
            .find(|c| c.kind == CauseKind::Reservation)
            .map(|c| c.text.clone())
            .unwrap_or_default();
        assert!(said.contains(words), "{:#?}", answer.causes);
    }
    let later = t0() + minutes(11);
    rig.feed(later, Input::Heartbeat(Box::new(beat("node1", later, &[]))));
    rig.pass(later);
    assert!(
        matches!(rig.state(&member), Some(JobState::Running(_))),
        "{:?}",
        rig.state(&member)
    );
    // Booked for the window, or taken by its job: which, the order of the two in line says.
    let reason = waits(&rig, &other);
    assert!(
        matches!(reason, Some(WaitReason::Reserved | WaitReason::Resources)),
        "{reason:?}"
    );
}

#[test]
fn a_cancel_is_for_the_owner_or_an_admin_and_leaves_its_jobs_refused() {
    let mut rig = Rig::new(Policy::default());
    let mut for_alice = ask("paper", 10, 60);
    for_alice.users = vec!["alice".into()];
    let (verdict, _) = reserve(&mut rig, root(), ReservationRequest::Book(for_alice), t0());
    assert!(verdict.is_some_and(|v| v.accepted));
    let member = rig.submit(with_limit(30, "paper"));
    rig.pass(t0());
    assert_eq!(waits(&rig, &member), Some(WaitReason::ReservationWindow));
    let cancel = || ReservationRequest::Cancel {
        name: "paper".into(),
    };
    let (verdict, _) = reserve(&mut rig, alice(), cancel(), t0());
    let reason = verdict.and_then(|v| v.reason).unwrap_or_default();
    assert!(reason.contains("root's"), "{reason}");
    let (verdict, _) = reserve(&mut rig, root(), cancel(), t0());
    let cancelled = verdict.and_then(|v| v.reservation).map(|r| r.standing);
    assert!(
        matches!(cancelled, Some(Standing::Cancelled { .. })),
        "{cancelled:?}"
    );
    let (verdict, _) = reserve(&mut rig, root(), cancel(), t0());
    assert!(
        verdict.is_some_and(|v| !v.accepted),
        "a second cancel finds nothing"
    );
    rig.pass(t0());
    match rig.state(&member) {
        Some(JobState::Failed(ending)) => {
            let reason = ending.reason.clone().unwrap_or_default();
            assert!(
                reason.contains("reservation paper is over, cancelled"),
                "{reason}"
            );
        }
        other => panic!("its job still waits: {other:?}"),
    }
}

#[test]
fn an_unused_window_is_released_and_a_down_node_reported_at_once() {
    let mut rig = Rig::new(Policy::default());
    let (verdict, _) = reserve(
        &mut rig,
        alice(),
        ReservationRequest::Book(ask("paper", 0, 120)),
        t0(),
    );
    assert!(verdict.is_some_and(|v| v.accepted));
    // node1 beat last at t0: it is down within a minute, and the window unused for 30.
    let mut commands = Vec::new();
    for minute in 1..=31 {
        commands.extend(rig.feed(t0() + minutes(minute), tick(minute as u64 * 60)));
    }
    let notices: Vec<(&str, &NoticeKind)> = commands
        .iter()
        .filter_map(|c| match c {
            Command::Notice { subject, notice } => Some((subject.as_str(), &notice.kind)),
            _ => None,
        })
        .collect();
    let at_risk: Vec<&str> = notices
        .iter()
        .filter(|(_, k)| matches!(k, NoticeKind::ReservationAtRisk { .. }))
        .map(|(s, _)| *s)
        .collect();
    assert_eq!(
        at_risk,
        ["users.UALICE.notices", "users.UROOT.notices"],
        "{notices:?}"
    );
    assert!(
        notices.iter().any(|(s, k)| *s == "users.UALICE.notices"
            && matches!(k, NoticeKind::ReservationReleased { name, .. } if name == "paper")),
        "{notices:?}"
    );
    let released = commands.iter().find_map(|c| match c {
        Command::StoreReservation { reservation, .. } => Some(reservation.standing.clone()),
        _ => None,
    });
    assert!(
        matches!(released, Some(Standing::Released { .. })),
        "{released:?}"
    );
    // Told once: the next tick says nothing new.
    let again = rig.feed(t0() + minutes(32), tick(32 * 60));
    assert!(
        !again.iter().any(|c| matches!(c, Command::Notice { .. })),
        "{again:?}"
    );
}
