//! Whether a reservation may be booked, and on which GPUs: a pure function of the request,
//! who asks, the reservations already held, the nodes' GPUs, the `[reservations]` caps and
//! the time. Admins book without caps; users within them. GPUs that another booking holds
//! at any moment of the window are not taken; when too few are left the refusal names the
//! bookings in the way.

use std::collections::BTreeMap;

use chrono::{Datelike, Duration, TimeZone, Utc};

use mgpu_protocol::Timestamp;
use mgpu_protocol::reservation::{BookedGpu, BookingAsk, Reservation, ReservationPolicy, Standing};

/// A known node's GPUs: (index, type).
#[derive(Clone, Debug, PartialEq)]
pub struct NodeGpus {
    pub name: String,
    pub gpus: Vec<(u32, Option<String>)>,
}

/// Who asks: their name, and whether the caps apply.
#[derive(Clone, Copy, Debug)]
pub struct Asker<'a> {
    pub name: &'a str,
    pub admin: bool,
}

/// How late a start may be and still count as "now" (a typed `now` reaches the scheduler a
/// little after it was read).
const LATE_START: Duration = Duration::minutes(5);

/// The reservation `ask` books for `asker` at `now`, or why not; `known` are the
/// reservations kept (those over, cancelled or released count only for the weekly cap).
pub fn book(
    ask: &BookingAsk,
    asker: Asker<'_>,
    known: &[&Reservation],
    nodes: &[NodeGpus],
    policy: &ReservationPolicy,
    now: Timestamp,
) -> Result<Reservation, String> {
    let held: Vec<&Reservation> = known.iter().copied().filter(|r| r.holds_at(now)).collect();
    let held = held.as_slice();
    if let Some(same) = held.iter().find(|r| r.name == ask.name) {
        return Err(format!(
            "a reservation named {} exists already (booked by {}, until {})",
            ask.name,
            same.owner,
            stamp(same.end)
        ));
    }
    if ask.start + LATE_START < now {
        return Err(format!(
            "the window would start at {}, in the past",
            stamp(ask.start)
        ));
    }
    let start = ask.start.max(now);
    let length = Duration::seconds(i64::try_from(ask.duration_secs).unwrap_or(i64::MAX / 1000));
    let end = start + length;
    if !asker.admin {
        within_caps(ask, asker, (known, held), nodes, policy, (start, end), now)?;
    }
    let gpus = choose_gpus(ask, held, nodes, (start, end))?;
    Ok(Reservation {
        name: ask.name.clone(),
        owner: asker.name.to_owned(),
        gpus,
        start,
        end,
        users: ask.users.clone(),
        group: ask.group.clone(),
        booked_at: now,
        standing: Standing::Booked,
        first_used_at: None,
    })
}

/// `max_duration`, `min_notice`, `max_gpus` (with the user's bookings overlapping this one)
/// and `max_gpu_hours_per_week` (in every calendar week the window touches).
fn within_caps(
    ask: &BookingAsk,
    asker: Asker<'_>,
    (known, held): (&[&Reservation], &[&Reservation]),
    nodes: &[NodeGpus],
    policy: &ReservationPolicy,
    (start, end): (Timestamp, Timestamp),
    now: Timestamp,
) -> Result<(), String> {
    if ask.duration_secs > policy.max_duration_secs {
        return Err(format!(
            "{} is longer than the {} a user may book ([reservations] max_duration)",
            hours(ask.duration_secs),
            hours(policy.max_duration_secs)
        ));
    }
    let notice = (start - now).num_seconds().max(0) as u64;
    if notice < policy.min_notice_secs {
        return Err(format!(
            "the window starts in {}; bookings need {} notice ([reservations] min_notice)",
            hours(notice),
            hours(policy.min_notice_secs)
        ));
    }
    let largest_node = nodes.iter().map(|n| n.gpus.len() as u32).max().unwrap_or(0);
    let max_gpus = policy.max_gpus.unwrap_or(largest_node);
    let overlapping: u32 = held
        .iter()
        .filter(|r| r.owner == asker.name)
        .filter(|r| r.start < end && start < r.end)
        .map(|r| r.gpus.len() as u32)
        .sum();
    if overlapping + ask.gpus > max_gpus {
        let cap = match policy.max_gpus {
            Some(_) => "[reservations] max_gpus".to_owned(),
            None => "one node's GPUs, without a [reservations] max_gpus".to_owned(),
        };
        return Err(format!(
            "{} GPUs with the {overlapping} {} holds in bookings then is more than the \
             {max_gpus} one user may book ({cap})",
            ask.gpus, asker.name
        ));
    }
    if let Some(cap) = policy.max_gpu_hours_per_week {
        let mut week = week_start(start);
        while week < end {
            let next = week + Duration::days(7);
            let booked: f64 = known
                .iter()
                .filter(|r| r.owner == asker.name)
                .map(|r| r.gpu_hours_within(week, next))
                .sum();
            let asked = (end.min(next) - start.max(week)).num_seconds() as f64 / 3600.0
                * f64::from(ask.gpus);
            if booked + asked > cap + 1e-9 {
                return Err(format!(
                    "{asked:.1} GPU-hours in the week of {} with the {booked:.1} {} booked \
                     there already is more than the {cap} a user may book a week \
                     ([reservations] max_gpu_hours_per_week)",
                    week.format("%Y-%m-%d"),
                    asker.name
                ));
            }
            week = next;
        }
    }
    Ok(())
}

/// The GPUs the window gets: on the nodes asked for, of the type asked for, held by no
/// booking that overlaps it; packed on as few nodes as hold them, or spread evenly over
/// exactly `nodes` nodes.
fn choose_gpus(
    ask: &BookingAsk,
    held: &[&Reservation],
    nodes: &[NodeGpus],
    (start, end): (Timestamp, Timestamp),
) -> Result<Vec<BookedGpu>, String> {
    if let Some(unknown) = ask
        .nodelist
        .iter()
        .find(|name| !nodes.iter().any(|n| &n.name == *name))
    {
        return Err(format!("no node is named {unknown}"));
    }
    let overlapping: Vec<&&Reservation> = held
        .iter()
        .filter(|r| r.start < end && start < r.end)
        .collect();
    // Each candidate node's GPUs free for the whole window.
    let mut free: BTreeMap<&str, Vec<BookedGpu>> = BTreeMap::new();
    let mut in_the_way: Vec<&str> = Vec::new();
    let mut of_kind = 0usize;
    for node in nodes {
        if !ask.nodelist.is_empty() && !ask.nodelist.contains(&node.name) {
            continue;
        }
        for (index, gpu_type) in &node.gpus {
            if ask.gpu_type.is_some() && ask.gpu_type.as_ref() != gpu_type.as_ref() {
                continue;
            }
            of_kind += 1;
            if let Some(other) = overlapping.iter().find(|r| r.has_gpu(&node.name, *index)) {
                if !in_the_way.contains(&other.name.as_str()) {
                    in_the_way.push(&other.name);
                }
                continue;
            }
            free.entry(&node.name).or_default().push(BookedGpu {
                node: node.name.clone(),
                index: *index,
                gpu_type: gpu_type.clone(),
            });
        }
    }
    let picked = match ask.nodes {
        Some(count) => spread(&free, ask.gpus / count.max(1), count),
        None => pack(&free, ask.gpus),
    };
    picked.ok_or_else(|| {
        let kind = ask
            .gpu_type
            .as_ref()
            .map_or_else(|| "GPUs".to_owned(), |t| format!("{t} GPUs"));
        let place = match ask.nodes {
            Some(count) => format!(" on {count} nodes"),
            None => String::new(),
        };
        let free_now: usize = free.values().map(Vec::len).sum();
        let conflicts = match in_the_way.is_empty() {
            true => String::new(),
            false => {
                let named: Vec<String> = in_the_way
                    .iter()
                    .filter_map(|name| overlapping.iter().find(|r| r.name == *name))
                    .map(|r| {
                        format!(
                            "{} ({}, {} to {})",
                            r.name,
                            r.owner,
                            stamp(r.start),
                            stamp(r.end)
                        )
                    })
                    .collect();
                format!("; booked then by {}", named.join(", "))
            }
        };
        format!(
            "{} {kind}{place} are not free from {} to {}: {free_now} of the {of_kind} there \
             are{conflicts}",
            ask.gpus,
            stamp(start),
            stamp(end)
        )
    })
}

/// `gpus` GPUs on as few nodes as hold them: the roomiest nodes first, then by name.
fn pack(free: &BTreeMap<&str, Vec<BookedGpu>>, gpus: u32) -> Option<Vec<BookedGpu>> {
    let mut nodes: Vec<&Vec<BookedGpu>> = free.values().collect();
    // One node that holds them all, the one with the least room left over (keeps big nodes
    // whole for big bookings).
    if let Some(one) = nodes
        .iter()
        .filter(|g| g.len() >= gpus as usize)
        .min_by_key(|g| g.len())
    {
        return Some(one[..gpus as usize].to_vec());
    }
    nodes.sort_by_key(|g| std::cmp::Reverse(g.len()));
    let picked: Vec<BookedGpu> = nodes
        .into_iter()
        .flatten()
        .take(gpus as usize)
        .cloned()
        .collect();
    (picked.len() == gpus as usize).then_some(picked)
}

/// `per_node` GPUs on each of `count` nodes, those with the least room left over first.
fn spread(
    free: &BTreeMap<&str, Vec<BookedGpu>>,
    per_node: u32,
    count: u32,
) -> Option<Vec<BookedGpu>> {
    let mut fitting: Vec<&Vec<BookedGpu>> = free
        .values()
        .filter(|g| g.len() >= per_node as usize)
        .collect();
    if fitting.len() < count as usize {
        return None;
    }
    fitting.sort_by_key(|g| g.len());
    Some(
        fitting
            .into_iter()
            .take(count as usize)
            .flat_map(|g| g[..per_node as usize].iter().cloned())
            .collect(),
    )
}

/// Monday 00:00 UTC of the week holding `at`.
fn week_start(at: Timestamp) -> Timestamp {
    let day = at.date_naive() - Duration::days(i64::from(at.weekday().num_days_from_monday()));
    Utc.from_utc_datetime(&day.and_time(chrono::NaiveTime::MIN))
}

fn stamp(at: Timestamp) -> String {
    at.format("%Y-%m-%d %H:%M UTC").to_string()
}

fn hours(secs: u64) -> String {
    mgpu_protocol::duration::format_duration(std::time::Duration::from_secs(secs))
}

#[cfg(test)]
#[path = "booking_tests.rs"]
mod tests;
