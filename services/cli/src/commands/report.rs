//! `mgpu report`: accounting over a period, like Slurm's `sreport`: jobs, how they ended,
//! GPU-hours and the idle part of them, by user, node, state or GPU type, as a table, `--json`
//! or `--csv` for spreadsheets; and
//! with `--fairshare`, each user's usage as the scheduler's fair-share ledger decays it, their
//! share of all, and the priority points it takes off their waiting jobs.

use std::collections::BTreeMap;
use std::io::{BufWriter, Write};
use std::process::ExitCode;

use anyhow::Result;
use clap::Args;
use mgpu_protocol::Timestamp;
use serde_json::json;

use crate::client::session::{ConnectionArgs, Session};
use crate::model::accounting::{self, GroupBy, Totals};
use crate::model::cluster::Cluster;
use crate::model::history::{self, HistoryFilter};
use crate::parse;
use crate::tables::Table;

#[derive(Debug, Args)]
pub struct ReportArgs {
    /// Jobs that ended at or after this time: a date (2026-11-01), a date and time, an age
    /// (30d), today or yesterday. Default: 30 days ago.
    #[arg(long, value_name = "WHEN", value_parser = parse::point_in_time)]
    pub since: Option<Timestamp>,

    /// Jobs that ended before this time (same forms). Default: now.
    #[arg(long, value_name = "WHEN", value_parser = parse::point_in_time)]
    pub until: Option<Timestamp>,

    /// Only this user's jobs (admins; a user reports on their own with --mine).
    #[arg(long, value_name = "USER", conflicts_with = "mine")]
    pub user: Option<String>,

    /// Only your own jobs (every user may; everyone's jobs are for admins).
    #[arg(long)]
    pub mine: bool,

    /// What to sum by.
    #[arg(long, value_enum, default_value = "user")]
    pub by: GroupBy,

    /// The report as JSON: the period, one object per group and the total.
    #[arg(long, conflicts_with = "csv")]
    pub json: bool,

    /// The report as CSV, a header line first.
    #[arg(long)]
    pub csv: bool,

    /// Each user's GPU-hours as the fair-share ledger counts them (halving every half-life),
    /// their share of all, and the points taken off their jobs' effective priority.
    #[arg(long, conflicts_with_all = ["since", "until", "by", "user", "mine"])]
    pub fairshare: bool,
}

pub async fn run(connection: &ConnectionArgs, args: &ReportArgs) -> Result<ExitCode> {
    let session = Session::connect(connection).await?;
    let now = mgpu_protocol::now();
    let mut out = BufWriter::new(std::io::stdout().lock());
    if args.fairshare {
        let cluster = Cluster::read(&session.js).await?;
        fairshare(&cluster, now, args, &mut out)?;
    } else {
        let since = args.since.unwrap_or(now - chrono::Duration::days(30));
        let mine = session.key.public_key();
        let filter = HistoryFilter {
            owner: args.mine.then(|| mine.clone()),
            user: args.user.clone(),
            since: Some(since),
            until: args.until,
            ..HistoryFilter::default()
        };
        if filter.owner.as_ref() != Some(&mine) && !history::may_read(&session.js, &filter).await {
            return Err(anyhow::anyhow!(
                "only admins may report on other users' jobs; yours: `mgpu report --mine`"
            ));
        }
        let jobs = history::read(&session.js, &filter).await?;
        let types = match args.by {
            GroupBy::Type => accounting::gpu_types(
                &mgpu_nats::records::list_nodes(&session.js)
                    .await
                    .map_err(crate::errors::plain)?,
            ),
            _ => accounting::GpuTypes::new(),
        };
        let groups = accounting::totals(&jobs, args.by, &types);
        let period = (since, args.until.unwrap_or(now));
        usage_report(&groups, args, period, &mut out)?;
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

/// The name of the column the groups are in.
fn group_name(by: GroupBy) -> &'static str {
    match by {
        GroupBy::User => "user",
        GroupBy::Node => "node",
        GroupBy::State => "state",
        GroupBy::Type => "type",
    }
}

fn total_of(groups: &BTreeMap<String, Totals>) -> Totals {
    groups.values().fold(Totals::default(), |mut sum, group| {
        sum.jobs += group.jobs;
        sum.succeeded += group.succeeded;
        sum.failed += group.failed;
        sum.cancelled += group.cancelled;
        sum.timed_out += group.timed_out;
        sum.node_failed += group.node_failed;
        sum.gpu_seconds += group.gpu_seconds;
        sum.idle_gpu_seconds += group.idle_gpu_seconds;
        sum.preemptions += group.preemptions;
        sum.preempted_gpu_seconds += group.preempted_gpu_seconds;
        sum
    })
}

fn cells(name: &str, totals: &Totals) -> Vec<String> {
    vec![
        name.to_owned(),
        totals.jobs.to_string(),
        totals.succeeded.to_string(),
        totals.failed.to_string(),
        totals.cancelled.to_string(),
        totals.timed_out.to_string(),
        totals.node_failed.to_string(),
        format!("{:.3}", totals.gpu_hours()),
        format!("{:.3}", totals.idle_gpu_hours()),
        totals.preemptions.to_string(),
        format!("{:.3}", totals.preempted_gpu_hours()),
    ]
}

fn usage_report(
    groups: &BTreeMap<String, Totals>,
    args: &ReportArgs,
    (since, until): (Timestamp, Timestamp),
    out: &mut impl Write,
) -> Result<()> {
    let key = group_name(args.by);
    let total = total_of(groups);
    if args.json {
        let rows: Vec<_> = groups
            .iter()
            .map(|(name, totals)| row_json(key, name, totals))
            .collect();
        let report = json!({
            "since": since, "until": until, "by": key,
            "groups": rows, "total": row_json(key, "total", &total),
        });
        serde_json::to_writer(&mut *out, &report)?;
        out.write_all(b"\n")?;
        return Ok(());
    }
    let header = [
        key,
        "jobs",
        "succeeded",
        "failed",
        "cancelled",
        "timed_out",
        "node_failed",
        "gpu_hours",
        "idle_gpu_hours",
        "preemptions",
        "preempted_gpu_hours",
    ];
    if args.csv {
        writeln!(out, "{}", header.join(","))?;
        for (name, totals) in groups {
            writeln!(out, "{}", csv_line(&cells(name, totals)))?;
        }
        return Ok(());
    }
    let mut table = Table::new(
        header
            .map(str::to_ascii_uppercase)
            .each_ref()
            .map(String::as_str),
    );
    for (name, totals) in groups {
        table.row(cells(name, totals));
    }
    table.row(cells("TOTAL", &total));
    table.write_to(out)?;
    Ok(())
}

fn row_json(key: &str, name: &str, totals: &Totals) -> serde_json::Value {
    let mut value = serde_json::to_value(totals).unwrap_or_default();
    if let Some(object) = value.as_object_mut() {
        object.insert(key.to_owned(), json!(name));
        object.insert("gpu_hours".to_owned(), json!(totals.gpu_hours()));
        object.insert("idle_gpu_hours".to_owned(), json!(totals.idle_gpu_hours()));
        object.insert(
            "preempted_gpu_hours".to_owned(),
            json!(totals.preempted_gpu_hours()),
        );
    }
    value
}

/// One CSV line: a field with a comma, quote or newline is quoted (RFC 4180).
fn csv_line(fields: &[String]) -> String {
    fields
        .iter()
        .map(|field| {
            if field.contains([',', '"', '\n', '\r']) {
                format!("\"{}\"", field.replace('"', "\"\""))
            } else {
                field.clone()
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// Each user's decayed usage, share and priority penalty, as the scheduler computes them.
fn fairshare(
    cluster: &Cluster,
    now: Timestamp,
    args: &ReportArgs,
    out: &mut impl Write,
) -> Result<()> {
    let policy = &cluster.policy;
    let hours: Vec<(&String, f64)> = cluster
        .usage
        .users
        .keys()
        .map(|user| {
            (
                user,
                cluster.usage.gpu_hours(user, now, policy.half_life_secs),
            )
        })
        .collect();
    let all: f64 = hours.iter().map(|(_, h)| h).sum();
    let rows: Vec<(String, f64, f64, f64)> = hours
        .into_iter()
        .map(|(user, h)| {
            let share = if all > 0.0 { h / all } else { 0.0 };
            (user.clone(), h, share, policy.fairshare_weight * h)
        })
        .collect();
    if args.json {
        let users: Vec<_> = rows
            .iter()
            .map(|(user, h, share, penalty)| {
                json!({"user": user, "gpu_hours": h, "share": share, "priority_penalty": penalty})
            })
            .collect();
        let report = json!({
            "half_life_secs": policy.half_life_secs,
            "fairshare_weight": policy.fairshare_weight,
            "users": users,
        });
        serde_json::to_writer(&mut *out, &report)?;
        out.write_all(b"\n")?;
        return Ok(());
    }
    let fields = |(user, h, share, penalty): &(String, f64, f64, f64)| {
        vec![
            user.clone(),
            format!("{h:.3}"),
            format!("{:.1}%", share * 100.0),
            format!("{penalty:.0}"),
        ]
    };
    if args.csv {
        writeln!(out, "user,gpu_hours,share,priority_penalty")?;
        for row in &rows {
            writeln!(out, "{}", csv_line(&fields(row)))?;
        }
        return Ok(());
    }
    let mut table = Table::new(["USER", "GPU-H (DECAYED)", "SHARE", "PRIORITY PENALTY"]);
    for row in &rows {
        table.row(fields(row));
    }
    table.write_to(out)?;
    writeln!(
        out,
        "usage halves every {}; each decayed GPU-hour takes {} points off a job's effective priority",
        mgpu_protocol::duration::format_duration(std::time::Duration::from_secs(
            policy.half_life_secs
        )),
        policy.fairshare_weight
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_fields_with_commas_or_quotes_are_quoted() {
        let line = csv_line(&["a".into(), "b,c".into(), "say \"hi\"".into()]);
        assert_eq!(line, "a,\"b,c\",\"say \"\"hi\"\"\"");
    }

    fn args(json: bool, csv: bool) -> ReportArgs {
        ReportArgs {
            since: None,
            until: None,
            user: None,
            mine: false,
            by: GroupBy::User,
            json,
            csv,
            fairshare: false,
        }
    }

    /// Alice's 3 GPU-hours, one of them idle, and bob's half hour without a measure.
    fn groups() -> BTreeMap<String, Totals> {
        let alice = Totals {
            jobs: 2,
            succeeded: 2,
            gpu_seconds: 10_800.0,
            idle_gpu_seconds: 3_600.0,
            ..Totals::default()
        };
        let bob = Totals {
            jobs: 1,
            failed: 1,
            gpu_seconds: 1_800.0,
            ..Totals::default()
        };
        [("alice".to_owned(), alice), ("bob".to_owned(), bob)].into()
    }

    fn report(json: bool, csv: bool) -> String {
        let now = mgpu_protocol::now();
        let mut out = Vec::new();
        let written = usage_report(&groups(), &args(json, csv), (now, now), &mut out);
        assert!(written.is_ok(), "{written:?}");
        String::from_utf8_lossy(&out).into_owned()
    }

    #[test]
    fn the_table_has_idle_gpu_hours_beside_the_gpu_hours_aligned() {
        let text = report(false, false);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4, "{text}");
        let header = lines[0];
        assert!(
            header.contains("  GPU_HOURS  IDLE_GPU_HOURS  PREEMPTIONS"),
            "{header}"
        );
        // Every row's value starts under its column's name.
        let column = header.find("IDLE_GPU_HOURS").unwrap_or_default();
        let gpu_column = header.find("GPU_HOURS").unwrap_or_default();
        for (line, idle, hours) in [
            (lines[1], "1.000", "3.000"),
            (lines[2], "0.000", "0.500"),
            (lines[3], "1.000", "3.500"),
        ] {
            assert_eq!(line.get(column..column + idle.len()), Some(idle), "{text}");
            assert_eq!(
                line.get(gpu_column..gpu_column + hours.len()),
                Some(hours),
                "{text}"
            );
        }
        assert!(lines[3].starts_with("TOTAL"), "{text}");
    }

    #[test]
    fn csv_and_json_carry_idle_gpu_hours() {
        let csv = report(false, true);
        let mut lines = csv.lines();
        assert_eq!(
            lines.next(),
            Some(
                "user,jobs,succeeded,failed,cancelled,timed_out,node_failed,gpu_hours,\
                 idle_gpu_hours,preemptions,preempted_gpu_hours"
            )
        );
        assert_eq!(lines.next(), Some("alice,2,2,0,0,0,0,3.000,1.000,0,0.000"));
        let json: serde_json::Value =
            serde_json::from_str(&report(true, false)).unwrap_or_default();
        assert_eq!(json["groups"][0]["user"], "alice");
        assert_eq!(json["groups"][0]["idle_gpu_hours"], 1.0);
        assert_eq!(json["groups"][1]["idle_gpu_hours"], 0.0);
        assert_eq!(json["total"]["idle_gpu_hours"], 1.0);
        assert_eq!(json["total"]["idle_gpu_seconds"], 3_600.0);
    }
}
