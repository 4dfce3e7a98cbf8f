//! `mgpu show`: everything the scheduler recorded about one job, as aligned `key: value` lines
//! (what the job asked for, GPU types and node constraint included, here; where it runs or
//! ran, its state's times, its idle warning and usage, in `state`) or as JSON.

mod state;

use std::process::ExitCode;

use anyhow::Result;
use clap::Args;
use mgpu_protocol::Timestamp;
use mgpu_protocol::duration::format_duration;
use mgpu_protocol::host::format_mib;
use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::{JobRecord, JobSpec, JobState, OnTimeout, Waiting};
use mgpu_protocol::plan::ExpectedStart;

use crate::client::session::{ConnectionArgs, Session};
use crate::console::{print, print_json};
use crate::human;
use crate::model::environment::{self, Environment};
use crate::model::jobs;

#[derive(Debug, Args)]
pub struct ShowArgs {
    /// Job id, or a unique prefix of it.
    #[arg(value_name = "ID")]
    pub id: String,

    /// Print the job summary and the full record as JSON.
    #[arg(long)]
    pub json: bool,
}

pub async fn run(connection: &ConnectionArgs, args: &ShowArgs) -> Result<ExitCode> {
    let session = Session::connect(connection).await?;
    let mut record = jobs::find_anywhere(&session, &args.id).await?;
    let environment = environment::read(&session, &record).await;
    // Only a waiting job has an expected start; the plan is not read for others.
    let start = match &record.state {
        JobState::Queued(_) => mgpu_nats::records::plan(&session.js)
            .await
            .ok()
            .and_then(|plan| plan.jobs.get(&record.id).cloned()),
        _ => None,
    };
    if args.json {
        if let Environment::Shown(env) = &environment {
            record.spec.env = env.clone();
        }
        let mut value = serde_json::to_value(record.summary())?;
        if let Some(object) = value.as_object_mut() {
            object.insert("environment".to_owned(), environment_json(&environment));
            let expected = start.as_ref().and_then(|s| s.at);
            object.insert("expected_start".to_owned(), serde_json::to_value(expected)?);
            object.insert("record".to_owned(), serde_json::to_value(&record)?);
        }
        print_json(&value)?;
    } else {
        let now = mgpu_protocol::now();
        print(&render(&record, &environment, start.as_ref(), now))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `environment` in `show --json`: `shown` (the record's `spec.env` holds it), `withheld`,
/// or `not available: why`.
fn environment_json(environment: &Environment) -> serde_json::Value {
    match environment {
        Environment::Shown(_) => "shown".into(),
        Environment::Withheld => "withheld".into(),
        other => other.describe().into(),
    }
}

/// One line of the listing: its key and its value.
type Line = (&'static str, String);

/// Aligned `key: value` lines; lines that do not apply to the job's state are left out.
fn render(
    record: &JobRecord,
    environment: &Environment,
    start: Option<&ExpectedStart>,
    now: Timestamp,
) -> String {
    let mut lines: Vec<Line> = vec![
        ("id", record.id.to_string()),
        ("name", record.spec.display_name()),
        ("user", record.user.clone()),
        ("state", record.state.name().to_owned()),
    ];
    request_lines(&record.spec, &mut lines);
    lines.push(("environment", environment.describe()));
    launch_lines(&record.spec, &mut lines);
    if let Some(placement) = record.state.placement() {
        state::placement_lines(placement, &mut lines);
    }
    lines.push(("attempt", record.attempt.to_string()));
    for preemption in &record.preemptions {
        lines.push(("preempted", preemption_text(preemption)));
    }
    if let JobState::Queued(Waiting {
        previous_stop: Some(why),
        ..
    }) = &record.state
    {
        lines.push(("last stopped", why.clone()));
    }
    lines.push(("submitted", human::time_with_age(record.submitted_at, now)));
    match &record.state {
        JobState::Queued(waiting) => {
            state::waiting_lines(waiting, record, now, &mut lines);
            lines.push(("expected start", state::expected_start(start, now)));
        }
        JobState::Running(run) => state::running_lines(run, now, &mut lines),
        JobState::Succeeded(end)
        | JobState::Failed(end)
        | JobState::Cancelled(end)
        | JobState::TimedOut(end)
        | JobState::NodeFailed(end) => state::ending_lines(end, now, &mut lines),
    }
    let width = lines.iter().map(|(k, _)| k.len()).max().unwrap_or(0) + 1;
    lines
        .iter()
        .map(|(key, value)| format!("{:<width$} {}\n", format!("{key}:"), one_line(value)))
        .collect()
}

/// What the job asked for: command, resources (GPU types in order of preference, the node
/// constraint), limits, environment, dependencies.
fn request_lines(spec: &JobSpec, lines: &mut Vec<Line>) {
    lines.push(("command", spec.command_line()));
    if let Some(script) = &spec.script {
        let size = script.content.len();
        lines.push((
            "script",
            format!("{} ({size} bytes, as submitted)", script.path),
        ));
    }
    lines.push(("workdir", spec.workdir.clone()));
    lines.push(("gpus requested", spec.gpus.to_string()));
    if !spec.gpu_types.is_empty() {
        lines.push(("gpu type", spec.gpu_types.join(", then ")));
    }
    if let Some(constraint) = &spec.constraint {
        lines.push(("constraint", constraint.clone()));
    }
    if let Some(ids) = &spec.gpu_ids {
        lines.push(("gpu ids pinned", human::index_list(ids)));
    }
    if let Some(ids) = &spec.allowed_gpus {
        lines.push(("allowed gpus", human::index_list(ids)));
    }
    if let Some(profile) = &spec.profile {
        lines.push(("profile", profile.clone()));
    }
    if let Some(mem) = spec.mem_mib {
        lines.push(("mem", format!("{mem} MiB per GPU")));
    }
    if let Some(cpus) = spec.cpus {
        lines.push(("cpus requested", format!("{cpus} per node")));
    }
    if let Some(mib) = spec.mem_host_mib {
        lines.push(("mem host", format!("{} per node", format_mib(mib))));
    }
    lines.push(("priority", spec.priority.to_string()));
    lines.push((
        "time limit",
        spec.time_limit()
            .map(format_duration)
            .unwrap_or_else(|| "none".to_owned()),
    ));
    lines.push((
        "on timeout",
        match spec.on_timeout {
            OnTimeout::Requeue => "requeue (back to the end of the queue when others wait)",
            OnTimeout::Fail => "fail (ends as timed_out)",
        }
        .to_owned(),
    ));
    if let Some(qos) = &spec.qos {
        lines.push(("qos", qos.clone()));
    }
    if let Some(reservation) = &spec.reservation {
        lines.push(("reservation", reservation.clone()));
    }
    if let Some(signal) = &spec.signal {
        lines.push(("signal", signal_text(signal)));
    }
    if spec.no_requeue {
        lines.push((
            "no requeue",
            "yes (ends as node_failed if its node is lost)".to_owned(),
        ));
    }
    if spec.idle_ok {
        lines.push((
            "idle ok",
            "yes (the idle policy leaves it alone, where its class allows that)".to_owned(),
        ));
    }
    if let Some(setup) = &spec.env_setup_cmd {
        lines.push(("env setup", setup.clone()));
    }
    if let Some(env) = &spec.conda_env {
        lines.push(("conda env", env.clone()));
    }
    if !spec.after.is_empty() {
        lines.push(("after", id_list(&spec.after)));
    }
    if !spec.after_any.is_empty() {
        lines.push(("after any", id_list(&spec.after_any)));
    }
}

/// One preempted attempt, said in words: `attempt 1 by 4f2a1b2c3d (bob) after 1.50
/// GPU-hours; it left within its grace`.
fn preemption_text(preemption: &mgpu_protocol::stop::Preemption) -> String {
    let how = if preemption.within_grace {
        "it left within its grace"
    } else {
        "stopped at its grace's end"
    };
    format!(
        "attempt {} by {} after {:.2} GPU-hours; {how}",
        preemption.attempt,
        preemption.by,
        preemption.gpu_seconds as f64 / 3600.0
    )
}

/// `--signal`, said in words: `USR1, 300 s before a stop`.
fn signal_text(signal: &mgpu_protocol::stop::StopSignal) -> String {
    match signal.seconds {
        0 => format!(
            "{} (at the class's grace before a preemption)",
            signal.name()
        ),
        secs => format!("{}, {secs} s before a stop ({signal})", signal.name()),
    }
}

/// How the job is launched: its array, dedup and interactive flags, and the nodes asked for.
fn launch_lines(spec: &JobSpec, lines: &mut Vec<Line>) {
    if let Some(member) = &spec.array {
        lines.push(("array", member.array_id.to_string()));
        lines.push(("array index", member.index.to_string()));
        if let Some(limit) = member.max_running {
            lines.push(("array limit", format!("{limit} at once")));
        }
    }
    if spec.dedup {
        lines.push(("dedup", "yes".to_owned()));
    }
    if spec.interactive {
        lines.push(("interactive", "yes".to_owned()));
    }
    if spec.is_multi_node() || spec.distributed {
        let launch = if spec.distributed {
            "distributed: the command runs on every node"
        } else {
            "the command runs on the first node"
        };
        lines.push(("nodes asked", format!("{} ({launch})", spec.nodes)));
    }
    if !spec.nodelist.is_empty() {
        lines.push(("nodelist", spec.nodelist.join(",")));
    }
    if !spec.exclude.is_empty() {
        lines.push(("exclude", spec.exclude.join(",")));
    }
}

/// Job ids in full: they are what `mgpu show` and `mgpu cancel` take.
fn id_list(ids: &[JobId]) -> String {
    ids.iter()
        .map(JobId::to_string)
        .collect::<Vec<_>>()
        .join(", ")
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
    use mgpu_protocol::job::{ArrayMember, Ending, WaitReason};

    /// Alice's `python train.py`, queued for GPUs 75 s before `now`.
    fn queued_train(now: mgpu_protocol::Timestamp) -> JobRecord {
        JobRecord {
            id: JobId::random(),
            user: "alice".into(),
            user_key: None,
            spec: JobSpec::new(vec!["python".into(), "train.py".into()], "/tmp"),
            submitted_at: now - chrono::Duration::seconds(75),
            attempt: 1,
            state: JobState::Queued(Waiting::new(WaitReason::Resources)),
            last_request: None,
            preemptions: Vec::new(),
        }
    }

    #[test]
    fn a_queued_job_shows_its_reason_aligned() {
        let now = mgpu_protocol::now();
        let record = queued_train(now);
        let text = render(
            &record,
            &Environment::Shown(record.spec.env.clone()),
            None,
            now,
        );
        assert!(text.contains("\nstate:          queued\n"), "{text}");
        assert!(text.contains("\nwaiting:        1m15s\n"), "{text}");
        assert!(
            text.contains("reason:         waiting for GPUs to become free"),
            "{text}"
        );
        assert!(!text.contains("exit code"));
        assert!(!text.contains("held by"));
    }

    #[test]
    fn a_queued_job_shows_when_it_is_expected_to_start_and_what_that_assumes() {
        let now = mgpu_protocol::now();
        let record = queued_train(now);
        let env = Environment::Shown(record.spec.env.clone());
        let text = render(&record, &env, None, now);
        assert!(text.contains("\nexpected start: unknown ("), "{text}");
        let start = ExpectedStart {
            at: Some(now + chrono::Duration::minutes(35)),
            nodes: vec!["node001".into()],
            reserved: true,
        };
        let text = render(&record, &env, Some(&start), now);
        assert!(text.contains("(in 35m"), "{text}");
        assert!(
            text.contains("end by their time limits); on node001, GPUs reserved for it\n"),
            "{text}"
        );
        let unlimited = ExpectedStart { at: None, ..start };
        let text = render(&record, &env, Some(&unlimited), now);
        assert!(text.contains("a job without a time limit holds"), "{text}");
    }

    #[test]
    fn new_fields_show_when_set() {
        let now = mgpu_protocol::now();
        let dependency = JobId::random();
        let array_id = JobId::random();
        let mut spec = JobSpec::new(vec!["python a.py --cuda {gpus}".into()], "/tmp");
        spec.after = vec![dependency.clone()];
        spec.array = Some(ArrayMember {
            array_id: array_id.clone(),
            index: 7,
            max_running: Some(4),
        });
        spec.on_timeout = OnTimeout::Fail;
        spec.conda_env = Some("pytorch_env".into());
        spec.profile = Some("qwen2.5-7b-inst".into());
        spec.allowed_gpus = Some(vec![4, 5]);
        let mut waiting = Waiting::new(WaitReason::Held);
        waiting.held_by = Some("bob".into());
        waiting.enqueued_at = Some(now - chrono::Duration::seconds(5));
        let record = JobRecord {
            id: JobId::random(),
            user: "alice".into(),
            user_key: None,
            spec,
            submitted_at: now - chrono::Duration::seconds(75),
            attempt: 2,
            state: JobState::Queued(waiting),
            last_request: None,
            preemptions: Vec::new(),
        };
        let text = render(
            &record,
            &Environment::Shown(record.spec.env.clone()),
            None,
            now,
        );
        for expected in [
            format!("after:          {dependency}\n"),
            format!("array:          {array_id}\n"),
            "array index:    7\n".to_owned(),
            "array limit:    4 at once\n".to_owned(),
            "on timeout:     fail (ends as timed_out)\n".to_owned(),
            "conda env:      pytorch_env\n".to_owned(),
            "profile:        qwen2.5-7b-inst\n".to_owned(),
            "allowed gpus:   4,5\n".to_owned(),
            "held by:        bob\n".to_owned(),
            "waiting:        5s\n".to_owned(),
            "name:           python[7]\n".to_owned(),
        ] {
            assert!(
                text.contains(&expected),
                "{expected:?} missing from\n{text}"
            );
        }
        assert!(text.contains("\nenqueued:"), "{text}");
    }

    #[test]
    fn a_timed_out_job_shows_why() {
        let now = mgpu_protocol::now();
        let record = JobRecord {
            id: JobId::random(),
            user: "alice".into(),
            user_key: None,
            spec: JobSpec::new(vec!["sleep 99".into()], "/tmp"),
            submitted_at: now - chrono::Duration::seconds(75),
            attempt: 1,
            state: JobState::TimedOut(Ending {
                placement: None,
                started_at: Some(now - chrono::Duration::seconds(70)),
                ended_at: now,
                exit_code: Some(143),
                signal: Some(15),
                reason: Some("time limit of 1m reached".into()),
                usage: None,
            }),
            last_request: None,
            preemptions: Vec::new(),
        };
        let text = render(
            &record,
            &Environment::Shown(record.spec.env.clone()),
            None,
            now,
        );
        assert!(text.contains("\nstate:          timed_out\n"), "{text}");
        assert!(
            text.contains("\nreason:         time limit of 1m reached\n"),
            "{text}"
        );
    }

    #[test]
    fn a_node_failed_job_says_why_it_was_not_requeued() {
        let now = mgpu_protocol::now();
        let mut spec = JobSpec::new(vec!["send-mail".into()], "/tmp");
        spec.no_requeue = true;
        let record = JobRecord {
            id: JobId::random(),
            user: "alice".into(),
            user_key: None,
            spec,
            submitted_at: now - chrono::Duration::seconds(75),
            attempt: 1,
            state: JobState::NodeFailed(Ending {
                placement: None,
                started_at: Some(now - chrono::Duration::seconds(70)),
                ended_at: now,
                exit_code: None,
                signal: None,
                reason: Some("node node001 went offline; not requeued (--no-requeue)".into()),
                usage: None,
            }),
            last_request: None,
            preemptions: Vec::new(),
        };
        let text = render(
            &record,
            &Environment::Shown(record.spec.env.clone()),
            None,
            now,
        );
        assert!(text.contains("\nstate:          node_failed\n"), "{text}");
        assert!(text.contains("\nno requeue:     yes"), "{text}");
        assert!(
            text.contains("\nreason:         node node001 went offline; not requeued"),
            "{text}"
        );
        assert!(text.contains("\nran for:"), "{text}");
    }

    /// `mgpu show` of `record` to its owner at `now`.
    fn shown_at(record: &JobRecord, now: Timestamp) -> String {
        render(
            record,
            &Environment::Shown(record.spec.env.clone()),
            None,
            now,
        )
    }

    #[test]
    fn gpu_types_and_the_constraint_show_when_set_and_are_in_the_json() {
        let now = mgpu_protocol::now();
        let mut record = queued_train(now);
        let shown = |record: &JobRecord| shown_at(record, now);
        // Any type on any node: neither line.
        let text = shown(&record);
        assert!(
            !text.contains("gpu type") && !text.contains("constraint"),
            "{text}"
        );
        record.spec.gpu_types = vec!["h100".into()];
        assert!(shown(&record).contains("\ngpu type:       h100\n"));
        record.spec.gpu_types.push("a100-80gb".into());
        record.spec.constraint = Some("ib&nvlink".into());
        let text = shown(&record);
        assert!(
            text.contains("\ngpus requested: 1\ngpu type:       h100, then a100-80gb\n"),
            "{text}"
        );
        assert!(text.contains("\nconstraint:     ib&nvlink\n"), "{text}");
        // `--json` carries the record as stored.
        let json = serde_json::to_value(&record).unwrap_or_default();
        assert_eq!(
            json["spec"]["gpu_types"],
            serde_json::json!(["h100", "a100-80gb"])
        );
        assert_eq!(json["spec"]["constraint"], "ib&nvlink");
    }

    #[test]
    fn qos_and_signal_show_when_set_and_are_in_the_json() {
        let now = mgpu_protocol::now();
        let mut record = queued_train(now);
        let shown = |record: &JobRecord| shown_at(record, now);
        let text = shown(&record);
        assert!(
            !text.contains("\nqos:") && !text.contains("\nsignal:"),
            "{text}"
        );
        record.preemptions.push(mgpu_protocol::stop::Preemption {
            attempt: 1,
            by: "4f2a1b2c3d (bob)".into(),
            gpu_seconds: 5400,
            within_grace: true,
        });
        record.spec.qos = Some("scavenger".into());
        record.spec.signal = mgpu_protocol::stop::StopSignal::parse("USR1@300").ok();
        record.spec.reservation = Some("deadline".into());
        let text = shown(&record);
        assert!(text.contains("\nqos:            scavenger\n"), "{text}");
        assert!(text.contains("\nreservation:    deadline\n"), "{text}");
        assert!(
            text.contains(
                "\npreempted:      attempt 1 by 4f2a1b2c3d (bob) after 1.50 GPU-hours; it left \
                 within its grace\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("\nsignal:         USR1, 300 s before a stop (USR1@300)\n"),
            "{text}"
        );
        let json = serde_json::to_value(&record).unwrap_or_default();
        assert_eq!(json["spec"]["qos"], "scavenger");
        assert_eq!(json["spec"]["signal"]["signal"], 10);
        assert_eq!(json["spec"]["signal"]["seconds"], 300);
    }

    #[test]
    fn a_warned_idle_job_says_since_when_and_what_comes_next() {
        use mgpu_protocol::idle::{IdleAction, IdleWarning};
        let now = mgpu_protocol::now();
        let mut record = queued_train(now);
        record.spec.idle_ok = true;
        let one = [(0, mgpu_protocol::gpu_amount::GpuAmount::ONE)];
        let JobState::Running(mut run) = crate::fixtures::running("n1", &one) else {
            panic!("the fixture runs")
        };
        let warning = IdleWarning {
            idle_since: now - chrono::Duration::minutes(130),
            warned_at: now - chrono::Duration::minutes(10),
            action: IdleAction::Warn,
            action_from: now + chrono::Duration::minutes(20),
        };
        run.idle_warning = Some(warning.clone());
        record.state = JobState::Running(run);
        let text = shown_at(&record, now);
        let expected = format!("\nidle:           {}\n", human::idle_warning(&warning, now));
        assert!(
            text.contains(&expected),
            "{expected:?} missing from\n{text}"
        );
        assert!(text.contains("(2h10m), warned "), "{text}");
        assert!(text.contains("; warned only\n"), "{text}");
        assert!(text.contains("\nidle ok:        yes ("), "{text}");
        // `--json` carries the warning in the record as stored.
        let json = serde_json::to_value(&record).unwrap_or_default();
        assert_eq!(json["idle_warning"]["action"], "warn");
        assert_eq!(json["spec"]["idle_ok"], true);
    }

    #[test]
    fn an_ended_job_s_usage_says_its_idle_gpu_time() {
        let now = mgpu_protocol::now();
        let mut record = queued_train(now);
        let ending = |idle_gpu_secs| Ending {
            placement: None,
            started_at: Some(now - chrono::Duration::hours(3)),
            ended_at: now,
            exit_code: Some(0),
            signal: None,
            reason: None,
            usage: Some(mgpu_protocol::host::JobUsage {
                cpu_time_ms: Some(1_500),
                idle_gpu_secs,
                ..mgpu_protocol::host::JobUsage::default()
            }),
        };
        record.state = JobState::Succeeded(ending(None));
        let text = shown_at(&record, now);
        assert!(!text.contains("idle"), "{text}");
        record.state = JobState::Succeeded(ending(Some(3_720)));
        let text = shown_at(&record, now);
        assert!(text.contains("\nidle GPU time:  1h02m\n"), "{text}");
        let json = serde_json::to_value(&record).unwrap_or_default();
        assert_eq!(json["usage"]["idle_gpu_secs"], 3_720);
    }
}
