//! `mgpu show`: everything the scheduler recorded about one job.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Result, anyhow};
use clap::Args;
use mgpu_shared::Timestamp;
use mgpu_shared::duration::format_duration;
use mgpu_shared::job::{JobRecord, JobState};
use mgpu_shared::records;

use crate::cli::GlobalArgs;
use crate::commands::{print, print_json};
use crate::errors::plain;
use crate::human;
use crate::session::Session;

#[derive(Debug, Args)]
pub struct ShowArgs {
    /// Job id, or a unique prefix of it.
    #[arg(value_name = "ID")]
    pub id: String,

    /// Print the job summary and the full record as JSON.
    #[arg(long)]
    pub json: bool,
}

pub async fn run(global: &GlobalArgs, args: &ShowArgs) -> Result<ExitCode> {
    let session = Session::connect(global).await?;
    let id = records::resolve_job(&session.js, &args.id)
        .await
        .map_err(plain)?;
    let record = records::get_job(&session.js, &id)
        .await
        .map_err(plain)?
        // Resolved a moment ago, so only a deletion in between gets here.
        .ok_or_else(|| anyhow!("job {} no longer exists", id.short()))?;
    if args.json {
        let mut value = serde_json::to_value(record.summary())?;
        if let Some(object) = value.as_object_mut() {
            object.insert("record".to_owned(), serde_json::to_value(&record)?);
        }
        print_json(&value)?;
    } else {
        print(&render(&record, mgpu_shared::now()))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Aligned `key: value` lines; lines that do not apply to the job's state are left out.
fn render(record: &JobRecord, now: Timestamp) -> String {
    let spec = &record.spec;
    let mut lines: Vec<(&str, String)> = vec![
        ("id", record.id.to_string()),
        ("name", spec.display_name()),
        ("user", record.user.clone()),
        ("state", record.state.name().to_owned()),
        ("command", spec.command_line()),
        ("workdir", spec.workdir.clone()),
        ("gpus requested", spec.gpus.to_string()),
    ];
    if let Some(ids) = &spec.gpu_ids {
        lines.push(("gpu ids pinned", human::index_list(ids)));
    }
    if let Some(mem) = spec.mem_mib {
        lines.push(("mem", format!("{mem} MiB per GPU")));
    }
    lines.push(("priority", spec.priority.to_string()));
    lines.push((
        "time limit",
        spec.time_limit()
            .map(format_duration)
            .unwrap_or_else(|| "none".to_owned()),
    ));
    if let Some(setup) = &spec.env_setup_cmd {
        lines.push(("env setup", setup.clone()));
    }
    if spec.interactive {
        lines.push(("interactive", "yes".to_owned()));
    }
    if let Some(placement) = record.state.placement() {
        lines.push(("node", placement.node.clone()));
        let gpus = placement
            .gpus
            .iter()
            .map(|g| {
                if g.amount.is_whole() {
                    g.index.to_string()
                } else {
                    format!("{} ({} of it)", g.index, g.amount)
                }
            })
            .collect::<Vec<_>>()
            .join(", ");
        lines.push(("gpus", if gpus.is_empty() { "none".into() } else { gpus }));
    }
    lines.push(("attempt", record.attempt.to_string()));
    lines.push(("submitted", human::time_with_age(record.submitted_at, now)));
    match &record.state {
        JobState::Queued(waiting) => {
            lines.push((
                "waiting",
                format_duration(human::elapsed(record.submitted_at, now)),
            ));
            lines.push(("reason", waiting.reason.describe().to_owned()));
        }
        JobState::Running(run) => {
            lines.push(("assigned", human::time_with_age(run.assigned_at, now)));
            if let Some(started) = run.started_at {
                lines.push(("started", human::time_with_age(started, now)));
                lines.push(("running for", format_duration(human::elapsed(started, now))));
            }
            if let Some(pid) = run.pid {
                lines.push(("pid", pid.to_string()));
            }
            if let Some(by) = &run.cancel_requested_by {
                lines.push(("cancel requested by", by.clone()));
            }
        }
        JobState::Succeeded(end) | JobState::Failed(end) | JobState::Cancelled(end) => {
            if let Some(started) = end.started_at {
                lines.push(("started", human::time_with_age(started, now)));
            }
            lines.push(("ended", human::time_with_age(end.ended_at, now)));
            if let Some(started) = end.started_at {
                let ran: Duration = human::elapsed(started, end.ended_at);
                lines.push(("ran for", format_duration(ran)));
            }
            if let Some(code) = end.exit_code {
                lines.push(("exit code", code.to_string()));
            }
            if let Some(signal) = end.signal {
                lines.push(("signal", signal.to_string()));
            }
            if let Some(reason) = &end.reason {
                lines.push(("reason", reason.clone()));
            }
        }
    }
    let width = lines.iter().map(|(k, _)| k.len()).max().unwrap_or(0) + 1;
    lines
        .iter()
        .map(|(key, value)| format!("{:<width$} {}\n", format!("{key}:"), one_line(value)))
        .collect()
}

/// Values from users and nodes may hold newlines; each key keeps one line.
fn one_line(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use mgpu_shared::ids::JobId;
    use mgpu_shared::job::{JobSpec, WaitReason, Waiting};

    #[test]
    fn a_queued_job_shows_its_reason_aligned() {
        let now = mgpu_shared::now();
        let record = JobRecord {
            id: JobId::random(),
            user: "alice".into(),
            spec: JobSpec::new(vec!["python".into(), "train.py".into()], "/tmp"),
            submitted_at: now - chrono::Duration::seconds(75),
            attempt: 1,
            state: JobState::Queued(Waiting {
                reason: WaitReason::Resources,
            }),
        };
        let text = render(&record, now);
        assert!(text.contains("\nstate:          queued\n"), "{text}");
        assert!(text.contains("\nwaiting:        1m15s\n"), "{text}");
        assert!(
            text.contains("reason:         waiting for GPUs to become free"),
            "{text}"
        );
        assert!(!text.contains("exit code"));
    }
}
