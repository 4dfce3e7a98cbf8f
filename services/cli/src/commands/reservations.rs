//! `mgpu reservations`: the reservations the scheduler keeps, read straight from the cluster
//! bucket (`reservation.<name>`; it works while the scheduler is down), with each one's state
//! now and, for an open window, how many of its GPUs jobs submitted with `--reservation NAME`
//! hold. What it prints is a pure function of the reservations, the job records and the time
//! ([`lines`], [`json_rows`]).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::process::ExitCode;

use anyhow::Result;
use clap::Args;
use mgpu_nats::records;
use mgpu_protocol::Timestamp;
use mgpu_protocol::job::{JobRecord, JobState};
use mgpu_protocol::reservation::{BookedGpu, Reservation};

use crate::client::session::{ConnectionArgs, Session};
use crate::console::{print, print_json};
use crate::errors::plain;
use crate::human;
use crate::model::cluster::Cluster;
use crate::tables::Table;

/// A listing names at most this many nodes of a reservation; more are counted.
const NODES_SHOWN: usize = 3;

#[derive(Debug, Args)]
#[command(after_long_help = "\
STATE is booked (its window is ahead), active (open now), ended, cancelled, or released (no
job used it within release_unused_after of its start, so its GPUs went back). USED is, for an
active one, how many of its GPUs jobs submitted with --reservation NAME hold now. Times are
UTC.

Examples:
  mgpu reservations
  mgpu reservations --all --json | jq '.[] | select(.state == \"released\") | .reason'")]
pub struct ReservationsArgs {
    /// Also list those ended, cancelled or released (kept for 8 days after their window).
    #[arg(short, long)]
    pub all: bool,

    /// Print a JSON array: each reservation as stored, with `state` read at now and
    /// `gpus_in_use` (null unless active).
    #[arg(long)]
    pub json: bool,
}

pub async fn run(connection: &ConnectionArgs, args: &ReservationsArgs) -> Result<ExitCode> {
    let session = Session::connect(connection).await?;
    let cluster = Cluster::read(&session.js).await?;
    let now = mgpu_protocol::now();
    let listed = listed(&cluster.reservations, args.all, now);
    // The job records are read only when a window is open: no other row counts them. Whole
    // records, since a listing's decoding leaves out the spec's reservation.
    let jobs = match listed.iter().any(|r| r.open_at(now)) {
        true => records::list_jobs(&session.js).await.map_err(plain)?,
        false => Vec::new(),
    };
    let in_use = gpus_in_use(&jobs);
    if args.json {
        print_json(&json_rows(&listed, &in_use, now))?;
    } else {
        print(&lines(&listed, &in_use, now))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// The reservations a listing shows, by start then name: booked and active ones, and with
/// `all` the rest too.
fn listed(kept: &BTreeMap<String, Reservation>, all: bool, now: Timestamp) -> Vec<&Reservation> {
    let mut listed: Vec<&Reservation> = kept
        .values()
        .filter(|r| all || matches!(r.state_at(now), "booked" | "active"))
        .collect();
    listed.sort_by(|a, b| (a.start, &a.name).cmp(&(b.start, &b.name)));
    listed
}

/// The GPUs running jobs hold, by the reservation they were submitted to.
fn gpus_in_use(jobs: &[JobRecord]) -> HashMap<&str, HashSet<(&str, u32)>> {
    let mut held: HashMap<&str, HashSet<(&str, u32)>> = HashMap::new();
    for job in jobs {
        let (Some(name), JobState::Running(run)) = (job.spec.reservation.as_deref(), &job.state)
        else {
            continue;
        };
        let gpus = held.entry(name).or_default();
        for (_, node, shares) in run.placement.ranks() {
            gpus.extend(shares.iter().map(|share| (node, share.index)));
        }
    }
    held
}

/// How many of the reservation's GPUs its jobs hold (shared GPUs count once).
fn used(reservation: &Reservation, in_use: &HashMap<&str, HashSet<(&str, u32)>>) -> usize {
    in_use.get(reservation.name.as_str()).map_or(0, |held| {
        held.iter()
            .filter(|(node, index)| reservation.has_gpu(node, *index))
            .count()
    })
}

/// The table, or `No reservations.`
fn lines(
    listed: &[&Reservation],
    in_use: &HashMap<&str, HashSet<(&str, u32)>>,
    now: Timestamp,
) -> String {
    if listed.is_empty() {
        return "No reservations.\n".to_owned();
    }
    let mut table = Table::new([
        "NAME",
        "OWNER",
        "GPUS",
        "START (UTC)",
        "END (UTC)",
        "STATE",
        "USED",
        "USERS",
    ]);
    for reservation in listed {
        let in_use_cell = match reservation.open_at(now) {
            true => format!("{}/{}", used(reservation, in_use), reservation.gpus.len()),
            false => "-".to_owned(),
        };
        table.row(vec![
            reservation.name.clone(),
            reservation.owner.clone(),
            format!(
                "{} {}",
                reservation.gpus.len(),
                placement(&reservation.gpus)
            ),
            human::utc_day_time(reservation.start, now),
            human::utc_day_time(reservation.end, now),
            reservation.state_at(now).to_owned(),
            in_use_cell,
            members(reservation),
        ]);
    }
    table.render()
}

/// Where the GPUs are: `node1:0-3,node2:0-3`; past [`NODES_SHOWN`] nodes, the first ones and
/// how many more (`node1:0-7,node2:0-7,+3 nodes`).
fn placement(gpus: &[BookedGpu]) -> String {
    let mut nodes: Vec<(&str, Vec<u32>)> = Vec::new();
    for gpu in gpus {
        match nodes.iter_mut().find(|(node, _)| *node == gpu.node) {
            Some((_, indices)) => indices.push(gpu.index),
            None => nodes.push((&gpu.node, vec![gpu.index])),
        }
    }
    let shown = if nodes.len() > NODES_SHOWN {
        NODES_SHOWN - 1
    } else {
        nodes.len()
    };
    let mut cells: Vec<String> = (nodes.iter().take(shown))
        .map(|(node, indices)| format!("{node}:{}", human::index_ranges(indices)))
        .collect();
    if nodes.len() > shown {
        cells.push(format!("+{} nodes", nodes.len() - shown));
    }
    cells.join(",")
}

/// Who besides its owner may run jobs in it: `bob,carol,group:ml`, or `-`.
fn members(reservation: &Reservation) -> String {
    let mut names = reservation.users.clone();
    if let Some(group) = &reservation.group {
        names.push(format!("group:{group}"));
    }
    human::name_list(&names)
}

/// `--json`: each reservation as stored, its `state` read at `now` (`active` and `ended` for
/// a booked one whose window opened or closed), and `gpus_in_use` (null unless active).
fn json_rows(
    listed: &[&Reservation],
    in_use: &HashMap<&str, HashSet<(&str, u32)>>,
    now: Timestamp,
) -> Vec<serde_json::Value> {
    listed
        .iter()
        .map(|reservation| {
            let mut value = serde_json::to_value(reservation).unwrap_or_default();
            if let Some(object) = value.as_object_mut() {
                object.insert("state".into(), reservation.state_at(now).into());
                let gpus = reservation.open_at(now).then(|| used(reservation, in_use));
                object.insert("gpus_in_use".into(), gpus.into());
            }
            value
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{job, queued, running};
    use mgpu_protocol::gpu_amount::GpuAmount;
    use mgpu_protocol::reservation::Standing;

    fn at(text: &str) -> Timestamp {
        chrono::DateTime::parse_from_rfc3339(text)
            .map(|t| t.with_timezone(&chrono::Utc))
            .unwrap_or_else(|e| panic!("{e}"))
    }

    fn reservation(name: &str, nodes: &[&str], per_node: u32, hours: (u32, u32)) -> Reservation {
        let gpus = nodes
            .iter()
            .flat_map(|node| {
                (0..per_node).map(|index| BookedGpu {
                    node: (*node).into(),
                    index,
                    gpu_type: None,
                })
            })
            .collect();
        Reservation {
            name: name.into(),
            owner: "alice".into(),
            gpus,
            start: at(&format!("2026-11-28T{:02}:00:00Z", hours.0)),
            end: at(&format!("2026-11-28T{:02}:00:00Z", hours.1)),
            users: vec![],
            group: None,
            booked_at: at("2026-11-27T06:30:00Z"),
            standing: Standing::Booked,
            first_used_at: None,
        }
    }

    /// Alice's job in reservation `name`, running on `node`'s GPUs `indices`.
    fn member_job(name: Option<&str>, node: &str, indices: &[u32]) -> JobRecord {
        let shares: Vec<(u32, GpuAmount)> = indices.iter().map(|&i| (i, GpuAmount::ONE)).collect();
        let mut record = job("train", running(node, &shares), 0, 60);
        record.spec.reservation = name.map(str::to_owned);
        record
    }

    fn kept(reservations: Vec<Reservation>) -> BTreeMap<String, Reservation> {
        reservations
            .into_iter()
            .map(|r| (r.name.clone(), r))
            .collect()
    }

    #[test]
    fn used_counts_the_reservation_s_gpus_its_running_jobs_hold() {
        let deadline = reservation("deadline", &["node1", "node2"], 4, (9, 17));
        let mut queued_member = job("wait", queued(), 0, 1);
        queued_member.spec.reservation = Some("deadline".into());
        let jobs = vec![
            member_job(Some("deadline"), "node1", &[0, 1]),
            // Two jobs sharing a GPU count it once.
            member_job(Some("deadline"), "node1", &[1]),
            member_job(Some("deadline"), "node2", &[3]),
            // Not in it, or in another one, or not running: not counted.
            member_job(None, "node2", &[0]),
            member_job(Some("other"), "node2", &[1]),
            queued_member,
        ];
        assert_eq!(used(&deadline, &gpus_in_use(&jobs)), 3);
        assert_eq!(used(&deadline, &gpus_in_use(&[])), 0);
    }

    #[test]
    fn the_listing_shows_where_when_state_use_and_members() {
        let mut open = reservation("deadline", &["node1", "node2"], 4, (9, 17));
        open.users = vec!["bob".into()];
        open.group = Some("ml".into());
        let ahead = reservation("demo", &["node3"], 2, (18, 20));
        let mut over = reservation("early", &["node3"], 1, (1, 2));
        over.standing = Standing::Released {
            at: at("2026-11-28T01:30:00Z"),
            reason: "unused for 30m".into(),
        };
        let wide = reservation("wide", &["n1", "n2", "n3", "n4", "n5"], 8, (20, 23));
        let kept = kept(vec![open, ahead, over, wide]);
        let now = at("2026-11-28T10:00:00Z");
        let jobs = vec![member_job(Some("deadline"), "node1", &[0, 1, 2, 3])];
        let in_use = gpus_in_use(&jobs);
        let expected = "\
NAME      OWNER  GPUS                       START (UTC)       END (UTC)         STATE   USED  USERS
deadline  alice  8 node1:0-3,node2:0-3      Sat Nov 28 09:00  Sat Nov 28 17:00  active  4/8   bob,group:ml
demo      alice  2 node3:0-1                Sat Nov 28 18:00  Sat Nov 28 20:00  booked  -     -
wide      alice  40 n1:0-7,n2:0-7,+3 nodes  Sat Nov 28 20:00  Sat Nov 28 23:00  booked  -     -
";
        assert_eq!(lines(&listed(&kept, false, now), &in_use, now), expected);
        let all = lines(&listed(&kept, true, now), &in_use, now);
        assert!(
            all.lines()
                .nth(1)
                .is_some_and(|l| l.starts_with("early ") && l.contains(" released ")),
            "{all}"
        );
        let later = at("2026-11-29T10:00:00Z");
        assert_eq!(
            lines(&listed(&kept, false, later), &in_use, later),
            "No reservations.\n"
        );
    }

    #[test]
    fn the_json_keeps_the_stored_fields_with_the_state_now_and_the_gpus_in_use() {
        let open = reservation("deadline", &["node1"], 2, (9, 17));
        let mut released = reservation("early", &["node3"], 1, (1, 2));
        released.standing = Standing::Released {
            at: at("2026-11-28T01:30:00Z"),
            reason: "unused for 30m".into(),
        };
        let kept = kept(vec![open, released]);
        let now = at("2026-11-28T10:00:00Z");
        let jobs = vec![member_job(Some("deadline"), "node1", &[1])];
        let rows = json_rows(&listed(&kept, true, now), &gpus_in_use(&jobs), now);
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0]["name"], "early");
        assert_eq!(rows[0]["state"], "released");
        assert_eq!(rows[0]["reason"], "unused for 30m");
        assert_eq!(rows[0]["gpus_in_use"], serde_json::Value::Null);
        assert_eq!(rows[1]["state"], "active");
        assert_eq!(rows[1]["gpus_in_use"], 1);
        assert_eq!(rows[1]["owner"], "alice");
        assert_eq!(rows[1]["gpus"][1]["index"], 1);
        assert_eq!(rows[1]["end"], "2026-11-28T17:00:00Z");
    }
}
