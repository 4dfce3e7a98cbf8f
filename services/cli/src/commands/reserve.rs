//! `mgpu reserve NAME …` and `mgpu reserve --cancel NAME`: book GPUs for a window of time,
//! or cancel a booking (its owner or an admin).
//!
//! The request (a [`ReservationRequest`]) goes to `reservations.requests` on the request path
//! ([`crate::client::request`]) and names a subject of the user's inbox for the scheduler's
//! answer, as a submission does ([`crate::client::verdict`]). The scheduler decides it, stores
//! the reservation in the cluster bucket (where `mgpu reservations` reads it) and then says
//! there what came of it: booked (with the GPUs it took), or refused and why. A refusal is the
//! command's error (exit status 1). With no scheduler answering, the request waits in
//! JetStream: the command says so and exits 0, as `mgpu submit` does for a job it could not
//! have checked yet.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Result, anyhow, bail};
use clap::Args;
use mgpu_protocol::Timestamp;
use mgpu_protocol::duration::{format_duration, parse_duration};
use mgpu_protocol::reservation::{
    BookingAsk, Reservation, ReservationRequest, ReservationVerdict, check_name,
};
use mgpu_protocol::subjects;
use serde_json::json;

use crate::client::request::{self, Request};
use crate::client::session::{ConnectionArgs, Session};
use crate::client::verdict::Verdicts;
use crate::console::{self, print_json, println};
use crate::errors::plain;
use crate::human;
use crate::parse;

/// The booking options, which `--cancel` goes without.
const BOOKING: [&str; 9] = [
    "name", "gpus", "gpu_type", "nodes", "nodelist", "start", "length", "users", "group",
];

#[derive(Debug, Args)]
#[command(after_long_help = "\
WHEN, for --start (UTC): now, `tomorrow 09:00`, `today 14:00`, `14:00` (today), a date
(2026-11-28, midnight), a date and time (`2026-11-28 09:00`, 2026-11-28T09:00:00Z), or a
time from now (2h, `in 90m`).

Caps (the scheduler's [reservations] table) limit how many GPUs, how long and how far ahead
a user books; admins book without them. A booking that overlaps another on the GPUs it needs
is refused at once, naming the one in the way. Only jobs submitted with --reservation NAME by
its owner, --users and members of --group run on its GPUs inside the window, each with a time
limit that ends before the window closes.

Examples:
  mgpu reserve deadline --gpus 8 --nodes 2 --start 'tomorrow 09:00' --for 8h
  mgpu reserve demo --gpus 2 --gpu-type h100 --start now --for 90m --users bob,carol
  mgpu reserve course --gpus 4 --nodelist node003 --start 2026-12-01T08:00:00Z --for 1d --group students
  mgpu submit --reservation deadline --time-limit 4h -- python train.py
  mgpu reserve --cancel deadline")]
pub struct ReserveArgs {
    /// The reservation's name: letters, digits, `-` and `_` (what `--reservation` names).
    #[arg(value_name = "NAME", value_parser = reservation_name,
          required_unless_present = "cancel")]
    pub name: Option<String>,

    /// Cancel reservation NAME instead of booking one (its owner or an admin): its GPUs go
    /// back to everyone at once.
    #[arg(long, value_name = "NAME", value_parser = reservation_name,
          conflicts_with_all = BOOKING)]
    pub cancel: Option<String>,

    /// GPUs in all; with --nodes K, spread evenly over K nodes (N must divide by K).
    #[arg(long, value_name = "N", required_unless_present = "cancel")]
    pub gpus: Option<u32>,

    /// Only GPUs of this type (`mgpu nodes` lists the types).
    #[arg(long, value_name = "TYPE", value_parser = gpu_type)]
    pub gpu_type: Option<String>,

    /// On exactly K nodes (default: as few as hold the GPUs).
    #[arg(long, value_name = "K", conflicts_with = "nodelist")]
    pub nodes: Option<u32>,

    /// Only on these nodes.
    #[arg(long, value_name = "NODE[,NODE…]", value_delimiter = ',', value_parser = parse::node_name)]
    pub nodelist: Vec<String>,

    /// When the window opens (UTC; the forms are below): `tomorrow 09:00`, now, `in 2h`.
    #[arg(long, value_name = "WHEN", value_parser = parse::start_time,
          required_unless_present = "cancel")]
    pub start: Option<Timestamp>,

    /// How long the window lasts: 90m, 8h, 1d, 1h30m.
    #[arg(long = "for", value_name = "DURATION", value_parser = window_length,
          required_unless_present = "cancel")]
    pub length: Option<Duration>,

    /// Users besides you whose jobs may run in it.
    #[arg(long, value_name = "USER[,USER…]", value_delimiter = ',')]
    pub users: Vec<String>,

    /// A group whose members' jobs may run in it.
    #[arg(long, value_name = "GROUP")]
    pub group: Option<String>,

    /// Print the reservation as stored (JSON) instead of a sentence.
    #[arg(long)]
    pub json: bool,
}

fn reservation_name(text: &str) -> Result<String, String> {
    check_name(text).map_err(|e| e.to_string())?;
    Ok(text.to_owned())
}

fn gpu_type(text: &str) -> Result<String, String> {
    let gpu_type = text.trim().to_ascii_lowercase();
    mgpu_protocol::gpu_type::check_name(&gpu_type, "GPU type").map_err(|e| e.to_string())?;
    Ok(gpu_type)
}

fn window_length(text: &str) -> Result<Duration, String> {
    parse_duration(text).map_err(|e| e.to_string())
}

impl ReserveArgs {
    /// The request the options make, checked as the scheduler will check its payload.
    fn request(&self) -> Result<ReservationRequest> {
        let request = match (&self.cancel, &self.name) {
            (Some(name), _) => ReservationRequest::Cancel { name: name.clone() },
            (None, Some(name)) => {
                // clap requires these without --cancel; the messages are for a caller that
                // built the options by hand.
                let gpus = self.gpus.ok_or_else(|| anyhow!("--gpus N is required"))?;
                let start = self
                    .start
                    .ok_or_else(|| anyhow!("--start WHEN is required"))?;
                let length = self
                    .length
                    .ok_or_else(|| anyhow!("--for DURATION is required"))?;
                ReservationRequest::Book(BookingAsk {
                    name: name.clone(),
                    gpus,
                    gpu_type: self.gpu_type.clone(),
                    nodes: self.nodes,
                    nodelist: self.nodelist.clone(),
                    start,
                    duration_secs: length.as_secs(),
                    users: self.users.clone(),
                    group: self.group.clone(),
                })
            }
            (None, None) => bail!("name the reservation: mgpu reserve NAME …"),
        };
        request.validate().map_err(plain)?;
        Ok(request)
    }
}

pub async fn run(connection: &ConnectionArgs, args: &ReserveArgs) -> Result<ExitCode> {
    // A mistake in the request is reported before (and without) reaching the server.
    let asked = args.request()?;
    let session = Session::connect(connection).await?;
    let name = asked.name().to_owned();
    // Listening before sending, so the answer is not missed.
    let verdicts = Verdicts::listen(&session).await?;
    let request = Request::fresh(subjects::RESERVATION_REQUESTS, &asked)?
        .with_verdict_to(Some(verdicts.subject()));
    // A refused publish is never acknowledged: the refusal ends the tries at once.
    tokio::select! {
        biased;
        _ = session.publish_refused(&[subjects::RESERVATION_REQUESTS]) => {
            bail!(
                "permission denied: your credentials may not publish {} (the site's \
                 configuration predates reservations: an admin regenerates it)",
                subjects::RESERVATION_REQUESTS
            );
        }
        stored = request::publish(&session, &request) => { stored?; }
    }
    let progress = |_: usize| format!("waiting for the scheduler to decide on reservation {name}");
    let mut heard = verdicts
        .answers::<ReservationVerdict>(&session, std::slice::from_ref(&name), progress)
        .await;
    report(args, &asked, heard.remove(&name), mgpu_protocol::now())
}

/// Prints what came of the request; a refusal is the command's error.
fn report(
    args: &ReserveArgs,
    asked: &ReservationRequest,
    verdict: Option<ReservationVerdict>,
    now: Timestamp,
) -> Result<ExitCode> {
    let name = asked.name();
    let Some(verdict) = verdict else {
        if args.json {
            print_json(&json!({ "name": name, "checked": false }))?;
        }
        console::stderr_line(&not_checked(asked));
        return Ok(ExitCode::SUCCESS);
    };
    if !verdict.accepted {
        let why = verdict
            .reason
            .unwrap_or_else(|| "no reason given".to_owned());
        if args.json {
            print_json(&json!({ "name": name, "refused": why }))?;
        }
        bail!("reservation {name} refused: {why}");
    }
    let Some(reservation) = verdict.reservation else {
        bail!("the scheduler accepted reservation {name} but did not say what it stored");
    };
    if args.json {
        print_json(&reservation)?;
    } else {
        for line in done(asked, &reservation, now) {
            println(&line)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The lines saying what was done: the booking and how to use it, or the cancel.
fn done(asked: &ReservationRequest, reservation: &Reservation, now: Timestamp) -> Vec<String> {
    let name = &reservation.name;
    let gpus = reservation.gpus.len();
    if let ReservationRequest::Cancel { .. } = asked {
        return vec![format!(
            "Cancelled reservation {name}: its {gpus} GPU{} go back to everyone",
            plural(gpus)
        )];
    }
    let mut nodes: Vec<&str> = Vec::new();
    for gpu in &reservation.gpus {
        if !nodes.contains(&gpu.node.as_str()) {
            nodes.push(&gpu.node);
        }
    }
    let length = human::elapsed(reservation.start, reservation.end);
    vec![
        format!(
            "Reserved {name}: {gpus} GPU{} on {} from {} to {} (UTC)",
            plural(gpus),
            nodes.join(","),
            human::utc_day_time(reservation.start, now),
            human::utc_day_time(reservation.end, now),
        ),
        format!(
            "Run jobs in it with: mgpu submit --reservation {name} --time-limit {} -- COMMAND",
            format_duration(length)
        ),
    ]
}

fn plural(count: usize) -> &'static str {
    if count == 1 { "" } else { "s" }
}

/// The note for a request stored while no scheduler answered.
fn not_checked(asked: &ReservationRequest) -> String {
    let what = match asked {
        ReservationRequest::Book(_) => "booking",
        ReservationRequest::Cancel { .. } => "cancel",
    };
    format!(
        "Not checked yet: the scheduler did not answer in time (none runs, or it is busy). The \
         {what} of reservation {} is stored and will be decided when it is back; \
         `mgpu reservations` shows the outcome.",
        asked.name()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use mgpu_protocol::reservation::{BookedGpu, Standing};

    #[derive(Debug, Parser)]
    struct ReserveLine {
        #[command(flatten)]
        args: ReserveArgs,
    }

    fn parsed(argv: &[&str]) -> Result<ReserveArgs, String> {
        let mut full = vec!["mgpu-reserve"];
        full.extend_from_slice(argv);
        ReserveLine::try_parse_from(full)
            .map(|line| line.args)
            .map_err(|e| e.to_string())
    }

    fn at(text: &str) -> Timestamp {
        chrono::DateTime::parse_from_rfc3339(text)
            .map(|t| t.with_timezone(&chrono::Utc))
            .unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn a_booking_needs_gpus_a_start_and_a_length() {
        let err = parsed(&["deadline", "--gpus", "8", "--for", "8h"]).err();
        let err = err.unwrap_or_default();
        assert!(err.contains("--start <WHEN>"), "{err}");
        let err = parsed(&["deadline", "--start", "now", "--for", "8h"]).err();
        assert!(err.unwrap_or_default().contains("--gpus <N>"));
        let err = parsed(&["deadline", "--gpus", "8", "--start", "now"]).err();
        assert!(err.unwrap_or_default().contains("--for <DURATION>"));
        let err = parsed(&["--gpus", "8", "--start", "now", "--for", "1h"]).err();
        assert!(err.unwrap_or_default().contains("<NAME>"));
        let err = parsed(&["x", "--gpus", "8", "--start", "someday", "--for", "1h"]).err();
        assert!(err.unwrap_or_default().contains("`someday` is not a time"));
        let err = parsed(&["x", "--gpus", "8", "--start", "now", "--for", "a while"]).err();
        assert!(err.unwrap_or_default().contains("is not a duration"));
        let err = parsed(&["a.b", "--gpus", "8", "--start", "now", "--for", "1h"]).err();
        assert!(err.unwrap_or_default().contains("not a reservation name"));
    }

    #[test]
    fn nodes_and_a_nodelist_conflict_and_cancel_takes_no_booking_option() {
        let base = ["deadline", "--gpus", "8", "--start", "now", "--for", "8h"];
        let mut both = base.to_vec();
        both.extend(["--nodes", "2", "--nodelist", "node1,node2"]);
        let err = parsed(&both).err().unwrap_or_default();
        assert!(
            err.contains("--nodes <K>") && err.contains("cannot be used with"),
            "{err}"
        );
        let cancel = parsed(&["--cancel", "deadline"]).ok();
        let request = cancel
            .as_ref()
            .map(|a| a.request().map_err(|e| e.to_string()));
        assert_eq!(
            request,
            Some(Ok(ReservationRequest::Cancel {
                name: "deadline".into()
            }))
        );
        let err = parsed(&["--cancel", "deadline", "--gpus", "2"]).err();
        assert!(err.unwrap_or_default().contains("cannot be used with"));
        let err = parsed(&["other", "--cancel", "deadline"]).err();
        assert!(err.unwrap_or_default().contains("cannot be used with"));
    }

    #[test]
    fn the_options_make_the_booking_and_the_payload_is_checked_before_sending() {
        let argv = [
            "deadline",
            "--gpus",
            "8",
            "--nodes",
            "2",
            "--start",
            "2026-11-28 09:00",
            "--for",
            "8h",
            "--users",
            "bob,carol",
            "--group",
            "ml",
            "--gpu-type",
            "H100",
        ];
        let request = parsed(&argv).map(|a| a.request().map_err(|e| e.to_string()));
        let Ok(Ok(ReservationRequest::Book(ask))) = request else {
            panic!("{request:?}");
        };
        assert_eq!(ask.gpus, 8);
        assert_eq!(ask.nodes, Some(2));
        assert_eq!(ask.start, at("2026-11-28T09:00:00Z"));
        assert_eq!(ask.duration_secs, 8 * 3600);
        assert_eq!(ask.users, ["bob", "carol"]);
        assert_eq!(ask.group.as_deref(), Some("ml"));
        assert_eq!(ask.gpu_type.as_deref(), Some("h100"));
        // 8 GPUs do not spread evenly over 3 nodes: refused here, not by the scheduler.
        let mut uneven = argv.to_vec();
        uneven[4] = "3";
        let err = parsed(&uneven).map(|a| a.request().map_err(|e| e.to_string()));
        assert!(
            matches!(&err, Ok(Err(e)) if e.contains("do not spread evenly")),
            "{err:?}"
        );
    }

    fn booked() -> Reservation {
        let gpu = |node: &str, index| BookedGpu {
            node: node.into(),
            index,
            gpu_type: None,
        };
        Reservation {
            name: "deadline".into(),
            owner: "alice".into(),
            gpus: vec![
                gpu("node1", 0),
                gpu("node1", 1),
                gpu("node2", 0),
                gpu("node2", 1),
            ],
            start: at("2026-11-28T09:00:00Z"),
            end: at("2026-11-28T17:00:00Z"),
            users: vec![],
            group: None,
            booked_at: at("2026-11-27T06:30:00Z"),
            standing: Standing::Booked,
            first_used_at: None,
        }
    }

    #[test]
    fn a_booking_says_where_and_when_and_how_to_run_in_it() {
        let asked = ReservationRequest::Cancel {
            name: "deadline".into(),
        };
        let now = at("2026-11-27T06:30:00Z");
        assert_eq!(
            done(&asked, &booked(), now),
            ["Cancelled reservation deadline: its 4 GPUs go back to everyone"]
        );
        let book = parsed(&["deadline", "--gpus", "4", "--start", "now", "--for", "8h"])
            .and_then(|a| a.request().map_err(|e| e.to_string()));
        let Ok(book) = book else {
            panic!("{book:?}");
        };
        assert_eq!(
            done(&book, &booked(), now),
            [
                "Reserved deadline: 4 GPUs on node1,node2 from Sat Nov 28 09:00 to Sat Nov 28 \
                 17:00 (UTC)",
                "Run jobs in it with: mgpu submit --reservation deadline --time-limit 8h00m -- \
                 COMMAND",
            ]
        );
        assert!(not_checked(&book).contains("booking of reservation deadline is stored"));
    }

    #[test]
    fn the_hinted_time_limit_reads_back_as_the_window_s_length() {
        for secs in [90 * 60, 8 * 3600, 86_400, 36 * 3600] {
            let shown = format_duration(Duration::from_secs(secs));
            assert_eq!(
                parse_duration(&shown).map(|d| d.as_secs()).ok(),
                Some(secs),
                "{shown}"
            );
        }
    }
}
