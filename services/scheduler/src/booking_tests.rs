//! What may be booked, by whom, and on which GPUs (`booking.rs`).

use super::*;

fn t0() -> Timestamp {
    // Friday 2027-01-15 08:00 UTC.
    chrono::DateTime::from_timestamp(1_800_000_000, 0).unwrap_or_default()
}

fn nodes() -> Vec<NodeGpus> {
    let node = |name: &str, gpus: u32, gpu_type: &str| NodeGpus {
        name: name.into(),
        gpus: (0..gpus).map(|i| (i, Some(gpu_type.to_owned()))).collect(),
    };
    vec![
        node("a1", 4, "a100"),
        node("h1", 8, "h100"),
        node("h2", 8, "h100"),
    ]
}

fn ask(name: &str, gpus: u32, opens_in_hours: i64, hours: u64) -> BookingAsk {
    BookingAsk {
        name: name.into(),
        gpus,
        gpu_type: None,
        nodes: None,
        nodelist: Vec::new(),
        start: t0() + Duration::hours(opens_in_hours),
        duration_secs: hours * 3600,
        users: Vec::new(),
        group: None,
    }
}

const ALICE: Asker<'static> = Asker {
    name: "alice",
    admin: false,
};
const ROOT: Asker<'static> = Asker {
    name: "root",
    admin: true,
};

fn book_as(
    asker: Asker<'_>,
    ask: &BookingAsk,
    known: &[Reservation],
) -> Result<Reservation, String> {
    let known: Vec<&Reservation> = known.iter().collect();
    book(
        ask,
        asker,
        &known,
        &nodes(),
        &ReservationPolicy::default(),
        t0(),
    )
}

fn where_(reservation: &Reservation) -> Vec<String> {
    reservation
        .gpus
        .iter()
        .map(|g| format!("{}:{}", g.node, g.index))
        .collect()
}

#[test]
fn a_booking_packs_on_the_node_it_fills_best_and_spreads_when_asked() {
    let four = book_as(ALICE, &ask("x", 4, 1, 2), &[]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(where_(&four), ["a1:0", "a1:1", "a1:2", "a1:3"]);
    let mut h100 = ask("y", 2, 1, 2);
    h100.gpu_type = Some("h100".into());
    let typed = book_as(ALICE, &h100, &[]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(where_(&typed), ["h1:0", "h1:1"]);
    let mut spread = ask("z", 8, 1, 2);
    spread.nodes = Some(2);
    spread.nodelist = vec!["h1".into(), "h2".into()];
    let spread = book_as(ROOT, &spread, &[]).unwrap_or_else(|e| panic!("{e}"));
    let nodes: std::collections::BTreeSet<&str> =
        spread.gpus.iter().map(|g| g.node.as_str()).collect();
    assert_eq!(nodes.into_iter().collect::<Vec<_>>(), ["h1", "h2"]);
    assert_eq!(spread.gpus.len(), 8);
}

#[test]
fn overlapping_bookings_take_other_gpus_and_a_full_window_names_who_holds_it() {
    let mut all_h100 = ask("all", 16, 1, 4);
    all_h100.gpu_type = Some("h100".into());
    let first = book_as(ROOT, &all_h100, &[]).unwrap_or_else(|e| panic!("{e}"));
    let mut more = ask("more", 1, 3, 4);
    more.gpu_type = Some("h100".into());
    let refused = book_as(ROOT, &more, std::slice::from_ref(&first))
        .err()
        .unwrap_or_default();
    assert!(refused.contains("booked then by all (root"), "{refused}");
    assert!(refused.contains("0 of the 16"), "{refused}");
    // After the window, the same GPUs are free again.
    let later = ask("later", 8, 5, 1);
    assert!(book_as(ROOT, &later, std::slice::from_ref(&first)).is_ok());
    // The name is taken while the booking holds.
    let same = book_as(ROOT, &ask("all", 1, 10, 1), &[first])
        .err()
        .unwrap_or_default();
    assert!(same.contains("exists already"), "{same}");
}

#[test]
fn users_book_within_the_caps_and_admins_without() {
    // Default: one node's GPUs (8 here) at once, 24 h at most.
    let nine = book_as(ALICE, &ask("x", 9, 1, 2), &[])
        .err()
        .unwrap_or_default();
    assert!(nine.contains("more than the 8 one user may book"), "{nine}");
    let long = book_as(ALICE, &ask("x", 1, 1, 25), &[])
        .err()
        .unwrap_or_default();
    assert!(long.contains("max_duration"), "{long}");
    assert!(book_as(ROOT, &ask("x", 9, 1, 48), &[]).is_ok());
    // Her bookings overlapping this one count against her cap.
    let six = book_as(ALICE, &ask("six", 6, 1, 4), &[]).unwrap_or_else(|e| panic!("{e}"));
    let three = book_as(ALICE, &ask("three", 3, 2, 1), std::slice::from_ref(&six))
        .err()
        .unwrap_or_default();
    assert!(three.contains("with the 6 alice holds"), "{three}");
    assert!(book_as(ALICE, &ask("three", 3, 6, 1), &[six]).is_ok());
}

#[test]
fn notice_and_weekly_gpu_hours_are_capped_when_set() {
    let policy = ReservationPolicy {
        min_notice_secs: 3600,
        max_gpu_hours_per_week: Some(20.0),
        ..ReservationPolicy::default()
    };
    let known: Vec<&Reservation> = Vec::new();
    let soon = book(&ask("x", 1, 0, 1), ALICE, &known, &nodes(), &policy, t0());
    assert!(soon.err().unwrap_or_default().contains("min_notice"));
    let ten = book(&ask("ten", 2, 2, 5), ALICE, &known, &nodes(), &policy, t0())
        .unwrap_or_else(|e| panic!("{e}"));
    let booked = vec![&ten];
    // 10 GPU-hours booked this week; 12 more is past 20.
    let twelve = book(
        &ask("more", 2, 10, 6),
        ALICE,
        &booked,
        &nodes(),
        &policy,
        t0(),
    );
    let reason = twelve.err().unwrap_or_default();
    assert!(reason.contains("max_gpu_hours_per_week"), "{reason}");
    // Next week it fits (seven days on is always another calendar week).
    let next_week = book(
        &ask("more", 2, 24 * 7, 6),
        ALICE,
        &booked,
        &nodes(),
        &policy,
        t0(),
    );
    assert!(next_week.is_ok(), "{next_week:?}");
    // A cancelled booking counts only up to its cancel.
    let mut cancelled = ten.clone();
    cancelled.standing = Standing::Cancelled {
        by: "alice".into(),
        at: t0(),
    };
    let after_cancel = book(
        &ask("more", 2, 10, 6),
        ALICE,
        &[&cancelled],
        &nodes(),
        &policy,
        t0(),
    );
    assert!(after_cancel.is_ok(), "{after_cancel:?}");
}

#[test]
fn a_window_in_the_past_or_on_an_unknown_node_is_refused() {
    let past = book_as(ALICE, &ask("x", 1, -1, 1), &[])
        .err()
        .unwrap_or_default();
    assert!(past.contains("in the past"), "{past}");
    let mut nowhere = ask("x", 1, 1, 1);
    nowhere.nodelist = vec!["zz".into()];
    let unknown = book_as(ALICE, &nowhere, &[]).err().unwrap_or_default();
    assert_eq!(unknown, "no node is named zz");
    // A start a moment ago is now.
    let mut now = ask("x", 1, 0, 1);
    now.start = t0() - Duration::seconds(30);
    let booked = book_as(ALICE, &now, &[]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(booked.start, t0());
}
