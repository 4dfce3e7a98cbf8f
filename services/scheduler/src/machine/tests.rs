//! Stories of the machine alone: inputs in, commands out, the store played by the
//! simulator's compare-and-set map. Each names the rule it checks.

use std::collections::BTreeMap;
use std::time::Duration;

use mgpu_protocol::Timestamp;
use mgpu_protocol::assign::NodeControl;
use mgpu_protocol::cancel::CancelRequest;
use mgpu_protocol::event::JobEventKind;
use mgpu_protocol::gpu_amount::GpuAmount;
use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::{JobSpec, JobState, OnTimeout};
use mgpu_protocol::node::{GpuSource, GpuStatus, NodeHeartbeat, RunningJob};
use mgpu_protocol::node_admin::AdminRequest;
use mgpu_protocol::principals::{Principal, Registry, Role};
use mgpu_protocol::priority::Policy;
use mgpu_protocol::report::{AgentReport, ReportKind};
use mgpu_protocol::request::Request;
use mgpu_protocol::submit::SubmitRequest;

use super::messages::{Admitted, Identity, Tick, WriteOutcome};
use super::{Command, Input, Loaded, SchedulerState};
use crate::lifecycle::StreamOrder;
use crate::simulation::store::SimStore;

pub(super) fn t0() -> Timestamp {
    chrono::DateTime::from_timestamp(1_800_000_000, 0).unwrap_or_default()
}

pub(super) fn alice() -> Identity {
    Identity {
        name: "alice".into(),
        key: "UALICE".into(),
        admin: false,
    }
}

pub(super) fn root() -> Identity {
    Identity {
        name: "root".into(),
        key: "UROOT".into(),
        admin: true,
    }
}

pub(super) fn beat(node: &str, sent_at: Timestamp, running: &[(&JobId, u32)]) -> NodeHeartbeat {
    NodeHeartbeat {
        node: node.into(),
        sent_at,
        interval_ms: 1000,
        gpu_source: GpuSource::Declared,
        gpu_note: None,
        gpus: vec![GpuStatus {
            index: 0,
            uuid: "GPU-0".into(),
            name: "Declared".into(),
            memory_total_mib: 24_576,
            memory_used_mib: 0,
            utilization_pct: 0,
            temperature_c: None,
            power_w: None,
            foreign_processes: Vec::new(),
            gpu_type: None,
        }],
        running: running
            .iter()
            .map(|(id, attempt)| RunningJob {
                id: (*id).clone(),
                attempt: *attempt,
                pid: 1,
                idle: None,
            })
            .collect(),
        address: node.into(),
        runs_jobs_as: "root".into(),
        containment: None,
        agent_version: "test".into(),
        protocol: mgpu_protocol::version::PROTOCOL,
        mem_threshold: 1.0,
        load_threshold: 1.0,
        labels: BTreeMap::new(),
        fence_after_ms: None,
        kill_grace_ms: 0,
        gpu_isolation: true,
        cpus: None,
        mem_host_mib: None,
        features: Vec::new(),
    }
}

/// The machine with a store that carries its writes out at once.
pub(super) struct Rig {
    pub(super) machine: SchedulerState,
    pub(super) store: SimStore,
    next_token: u64,
}

impl Rig {
    pub(super) fn new(policy: Policy) -> Self {
        let principals = Registry {
            principals: [alice(), root()]
                .into_iter()
                .map(|who| Principal {
                    role: if who.admin { Role::Admin } else { Role::User },
                    name: who.name,
                    public_key: who.key,
                    unix_user: Some("u-alice".into()).filter(|_| !who.admin),
                    group: None,
                })
                .collect(),
        };
        let machine = SchedulerState::new(Loaded {
            records: Vec::new(),
            heartbeats: vec![beat("node1", t0(), &[])],
            admin: BTreeMap::new(),
            reservations: Vec::new(),
            usage: Default::default(),
            principals,
            limits: Default::default(),
            policy,
            now: t0(),
        });
        Rig {
            machine,
            store: SimStore::default(),
            next_token: 1,
        }
    }

    /// Feeds `input` at `now`; writes are carried out against the store and their results fed
    /// back; every other command comes back, in order.
    pub(super) fn feed(&mut self, now: Timestamp, input: Input) -> Vec<Command> {
        let commands = self.machine.handle(now, input);
        self.settle(now, commands)
    }

    pub(super) fn settle(&mut self, now: Timestamp, mut commands: Vec<Command>) -> Vec<Command> {
        let mut seen = Vec::new();
        while !commands.is_empty() {
            let mut results = Vec::new();
            for command in commands {
                match command {
                    Command::Write {
                        op,
                        record,
                        expected,
                    } => {
                        let record = std::sync::Arc::unwrap_or_clone(record);
                        let outcome = self.store.write(record, expected);
                        results.push(Input::Written { op, outcome });
                    }
                    other => seen.push(other),
                }
            }
            commands = results
                .into_iter()
                .flat_map(|result| self.machine.handle(now, result))
                .collect();
        }
        seen
    }

    pub(super) fn pass(&mut self, now: Timestamp) -> Vec<Command> {
        let (commands, _, _) = self.machine.pass(now, &mut || 0);
        self.settle(now, commands)
    }

    pub(super) fn request(&mut self, who: Identity, request: Request) -> Admitted {
        let token = self.next_token;
        self.next_token += 1;
        Admitted {
            token,
            identity: who,
            request,
            order: Some(StreamOrder {
                sequence: token + 1,
                redelivered: false,
                stored_at: t0(),
            }),
            verdict_to: None,
        }
    }

    /// Submits a job of `spec` as alice (staged until the next pass); its id.
    pub(super) fn submit(&mut self, spec: JobSpec) -> JobId {
        let (id, admitted) = self.submission(spec);
        self.feed(t0(), Input::Submissions(vec![admitted]));
        id
    }

    /// alice's submission of a job of `spec`, admitted, not handed over yet; its id.
    pub(super) fn submission(&mut self, spec: JobSpec) -> (JobId, Admitted) {
        let id = JobId::random();
        let request = Request::Submit(Box::new(SubmitRequest {
            id: id.clone(),
            user: "alice".into(),
            spec,
        }));
        (id, self.request(alice(), request))
    }

    pub(super) fn state(&self, id: &JobId) -> Option<&JobState> {
        self.machine.job(id).map(|r| &r.state)
    }
}

/// alice's cancel of `id`.
pub(super) fn alice_cancels(id: &JobId) -> Request {
    Request::Cancel {
        job: id.clone(),
        request: CancelRequest {
            user: "alice".into(),
            reason: None,
        },
    }
}

pub(super) fn one_gpu() -> JobSpec {
    let mut spec = JobSpec::new(vec!["train".into()], "/tmp");
    spec.gpus = GpuAmount::whole(1);
    spec
}

/// The liveness timer at `seconds` on the monotonic clock, everything visible.
pub(super) fn tick(seconds: u64) -> Input {
    Input::Tick(Tick {
        monotonic: Duration::from_secs(seconds),
        heartbeats_visible: true,
        reports_caught_up: true,
    })
}

pub(super) fn acks(commands: &[Command]) -> usize {
    commands
        .iter()
        .filter(|c| matches!(c, Command::Ack { .. }))
        .count()
}

#[test]
fn a_submission_is_written_once_with_the_pass_s_decision_and_acknowledged_only_once_stored() {
    let mut rig = Rig::new(Policy::default());
    let (id, admitted) = rig.submission(one_gpu());
    let commands = rig.machine.handle(t0(), Input::Submissions(vec![admitted]));
    // Nothing goes out before the pass: no write, no event, no acknowledgement; and the
    // status does not count it as recorded.
    assert!(commands.is_empty(), "{commands:?}");
    assert!(rig.machine.pass_due());
    assert_eq!(rig.machine.counts(), (0, 0, 0));
    assert!(
        rig.machine.gauges(t0()).jobs.is_empty(),
        "a staged job is no gauge"
    );
    let (commands, _, _) = rig.machine.pass(t0(), &mut || 0);
    let writes: Vec<_> = commands
        .iter()
        .filter_map(|c| match c {
            Command::Write {
                record, expected, ..
            } => Some((record.state.name(), *expected)),
            _ => None,
        })
        .collect();
    // One write: the record created as the pass left it (node1's GPU is free).
    assert_eq!(writes, [("running", None)], "{commands:?}");
    assert_eq!(acks(&commands), 0, "{commands:?}");
    let after = rig.settle(t0(), commands);
    assert_eq!(acks(&after), 1, "{after:?}");
    let events: Vec<_> = after
        .iter()
        .filter_map(|c| match c {
            Command::Event(event) => match event.kind {
                JobEventKind::Queued { .. } => Some("queued"),
                JobEventKind::Assigned { .. } => Some("assigned"),
                _ => Some("other"),
            },
            _ => None,
        })
        .collect();
    assert_eq!(events, ["queued", "assigned"], "{after:?}");
    assert!(after.iter().any(|c| matches!(c, Command::Assign { .. })));
    assert!(matches!(rig.state(&id), Some(JobState::Running(_))));
    assert_eq!(
        rig.store.record(&id).map(|r| r.state.name()),
        Some("running")
    );
    assert_eq!(rig.machine.counts(), (0, 1, 1));
    let gauges = rig.machine.gauges(t0());
    assert_eq!(gauges.jobs.get("alice").map(|alice| alice.running), Some(1));
}

#[test]
fn a_submission_whose_record_is_not_found_after_an_unanswered_write_is_not_acknowledged() {
    let mut rig = Rig::new(Policy::default());
    let (id, admitted) = rig.submission(one_gpu());
    let commands = rig.machine.handle(t0(), Input::Submissions(vec![admitted]));
    assert!(commands.is_empty(), "{commands:?}");
    let (commands, _, _) = rig.machine.pass(t0(), &mut || 0);
    let Some(Command::Write { op, .. }) = commands.first() else {
        panic!("{commands:?}");
    };
    // Nothing under its id (the write never landed, through an election): acknowledging it
    // would lose the job; JetStream must deliver it again. Its start is not sent either.
    let outcome = WriteOutcome::Changed { stored: None };
    let after = rig
        .machine
        .handle(t0(), Input::Written { op: *op, outcome });
    assert_eq!(acks(&after), 0, "{after:?}");
    assert!(!after.iter().any(|c| matches!(c, Command::Assign { .. })));
    assert!(rig.machine.job(&id).is_none());
}

#[test]
fn a_cancel_that_comes_before_the_pass_is_written_with_the_submission_and_both_acknowledged() {
    let mut rig = Rig::new(Policy::default());
    let (id, submitted) = rig.submission(one_gpu());
    let submit_token = submitted.token;
    assert!(
        rig.feed(t0(), Input::Submissions(vec![submitted]))
            .is_empty()
    );
    let cancel = alice_cancels(&id);
    let admitted = rig.request(alice(), cancel);
    let cancel_token = admitted.token;
    let commands = rig.feed(t0(), Input::Request(Box::new(admitted)));
    assert!(commands.is_empty(), "{commands:?}");
    // The driver keeps both messages until the record is stored.
    assert!(rig.machine.keeps_token(submit_token) && rig.machine.keeps_token(cancel_token));
    let after = rig.pass(t0());
    assert_eq!(acks(&after), 2, "{after:?}");
    assert!(!after.iter().any(|c| matches!(c, Command::Assign { .. })));
    assert!(!rig.machine.keeps_token(submit_token));
    assert_eq!(
        rig.store.record(&id).map(|r| r.state.name()),
        Some("cancelled")
    );
}

#[test]
fn a_record_changed_under_the_scheduler_is_decided_again_from_what_is_stored() {
    let mut rig = Rig::new(Policy::default());
    // The second job waits for node1's one GPU, its record stored by the pass.
    rig.submit(one_gpu());
    rig.pass(t0());
    let id = rig.submit(one_gpu());
    rig.pass(t0());
    // Another scheduler rewrote the record: the machine's revision is stale.
    assert!(rig.store.rewrite(&id, t0()));
    let cancel = alice_cancels(&id);
    let admitted = rig.request(alice(), cancel);
    let commands = rig.feed(t0(), Input::Request(Box::new(admitted)));
    assert_eq!(acks(&commands), 1, "{commands:?}");
    assert!(matches!(rig.state(&id), Some(JobState::Cancelled(_))));
    let stored = rig.store.record(&id).map(|r| r.state.name());
    assert_eq!(stored, Some("cancelled"));
}

#[test]
fn a_write_that_fails_leaves_the_request_for_redelivery_and_changes_nothing() {
    let mut rig = Rig::new(Policy::default());
    rig.submit(one_gpu());
    rig.pass(t0());
    let id = rig.submit(one_gpu());
    rig.pass(t0());
    let cancel = alice_cancels(&id);
    let admitted = rig.request(alice(), cancel);
    let commands = rig.machine.handle(t0(), Input::Request(Box::new(admitted)));
    let Some(Command::Write { op, .. }) = commands.first() else {
        panic!("{commands:?}");
    };
    let failed = WriteOutcome::Failed {
        error: "store unavailable".into(),
    };
    let after = rig.machine.handle(
        t0(),
        Input::Written {
            op: *op,
            outcome: failed,
        },
    );
    assert_eq!(acks(&after), 0, "{after:?}");
    assert!(!after.iter().any(|c| matches!(c, Command::Event(_))));
    assert!(matches!(rig.state(&id), Some(JobState::Queued(_))));
}

/// Starts a one-GPU job on node1 and reports it started; its id.
pub(super) fn running_job(rig: &mut Rig, spec: JobSpec) -> JobId {
    let id = rig.submit(spec);
    let commands = rig.pass(t0());
    assert!(
        commands.iter().any(|c| matches!(c, Command::Assign { .. })),
        "{commands:?}"
    );
    let report = AgentReport {
        job: id.clone(),
        attempt: 1,
        node: "node1".into(),
        at: t0(),
        kind: ReportKind::Started { pid: 1 },
    };
    rig.feed(t0(), Input::Report { token: 99, report });
    assert!(matches!(rig.state(&id), Some(JobState::Running(_))));
    id
}

#[test]
fn an_assignment_carries_the_agent_s_limit_the_unix_account_and_whose_input_it_takes() {
    let mut rig = Rig::new(Policy::default());
    let mut spec = one_gpu();
    spec.time_limit_secs = Some(90);
    spec.on_timeout = OnTimeout::Fail;
    let id = rig.submit(spec);
    let commands = rig.pass(t0());
    let Some(Command::Assign { job, ranks, .. }) = commands
        .iter()
        .find(|c| matches!(c, Command::Assign { .. }))
    else {
        panic!("no assignment: {commands:?}");
    };
    assert_eq!(job, &id);
    let [rank] = ranks.as_slice() else {
        panic!("{ranks:?}");
    };
    assert_eq!(rank.node, "node1");
    assert_eq!(rank.msg_id, format!("{id}-1"));
    assert_eq!(rank.assignment.spec.time_limit_secs, Some(90));
    assert_eq!(rank.assignment.unix_user.as_deref(), Some("u-alice"));
    assert!(rank.assignment.input_keys.contains(&"UROOT".to_owned()));
}

#[test]
fn a_warning_longer_than_the_cluster_s_time_cap_comes_a_second_before_it() {
    let mut rig = Rig::new(Policy {
        max_job_time_secs: Some(60),
        ..Policy::default()
    });
    let mut spec = one_gpu();
    spec.signal = mgpu_protocol::stop::StopSignal::parse("USR1@300").ok();
    spec.on_timeout = OnTimeout::Fail;
    rig.submit(spec);
    let commands = rig.pass(t0());
    let sent = commands.iter().find_map(|c| match c {
        Command::Assign { ranks, .. } => ranks.first().map(|r| r.assignment.clone()),
        _ => None,
    });
    let sent = sent.unwrap_or_else(|| panic!("no assignment: {commands:?}"));
    assert_eq!(sent.spec.signal.map(|s| s.seconds), Some(59));
    assert!(sent.validate().is_ok());
}

#[test]
fn a_job_missing_from_a_heartbeat_is_lost_only_once_every_report_was_read() {
    let mut rig = Rig::new(Policy::default());
    let id = running_job(&mut rig, one_gpu());
    let later = t0() + chrono::Duration::seconds(10);
    let commands = rig.feed(later, Input::Heartbeat(Box::new(beat("node1", later, &[]))));
    let Some(Command::AskReportsCaughtUp { op }) = commands
        .iter()
        .find(|c| matches!(c, Command::AskReportsCaughtUp { .. }))
    else {
        panic!("{commands:?}");
    };
    let op = *op;
    rig.feed(
        later,
        Input::ReportsCaughtUp {
            op,
            caught_up: false,
        },
    );
    assert!(
        matches!(rig.state(&id), Some(JobState::Running(_))),
        "a report may still come"
    );
    let commands = rig.feed(later, Input::Heartbeat(Box::new(beat("node1", later, &[]))));
    let op = commands.iter().find_map(|c| match c {
        Command::AskReportsCaughtUp { op } => Some(*op),
        _ => None,
    });
    rig.feed(
        later,
        Input::ReportsCaughtUp {
            op: op.unwrap_or_default(),
            caught_up: true,
        },
    );
    let record = rig.machine.job(&id).cloned();
    assert!(matches!(
        record.as_ref().map(|r| &r.state),
        Some(JobState::Queued(_))
    ));
    assert_eq!(record.map(|r| r.attempt), Some(2));
}

#[test]
fn a_stale_attempt_is_killed_at_most_every_five_seconds() {
    let mut rig = Rig::new(Policy::default());
    let stranger = JobId::random();
    let kills = |commands: &[Command]| {
        commands
            .iter()
            .filter(|c| {
                matches!(
                    c,
                    Command::Control {
                        control: NodeControl::Kill { .. },
                        ..
                    }
                )
            })
            .count()
    };
    rig.feed(t0(), tick(1));
    let listed = || Input::Heartbeat(Box::new(beat("node1", t0(), &[(&stranger, 1)])));
    assert_eq!(kills(&rig.feed(t0(), listed())), 1);
    assert_eq!(
        kills(&rig.feed(t0(), listed())),
        0,
        "repeated a second later"
    );
    rig.feed(t0(), tick(2));
    rig.feed(t0(), tick(6));
    assert_eq!(kills(&rig.feed(t0(), listed())), 1, "five seconds on");
}

#[test]
fn node_administration_is_taken_only_once_stored() {
    let mut rig = Rig::new(Policy::default());
    let drain = Request::Admin(AdminRequest::DrainNode {
        node: "node1".into(),
        by: "root".into(),
        reason: None,
    });
    let admitted = rig.request(root(), drain.clone());
    let commands = rig.feed(t0(), Input::Request(Box::new(admitted)));
    let Some(Command::StoreAdmin { op, .. }) = commands.first() else {
        panic!("{commands:?}");
    };
    let after = rig.feed(
        t0(),
        Input::AdminStored {
            op: *op,
            stored: false,
        },
    );
    assert_eq!(acks(&after), 0, "not stored: delivered again");
    assert!(!rig.machine.nodes.admin.contains_key("node1"));
    let admitted = rig.request(root(), drain);
    let commands = rig.feed(t0(), Input::Request(Box::new(admitted)));
    let Some(Command::StoreAdmin { op, .. }) = commands.first() else {
        panic!("{commands:?}");
    };
    let after = rig.feed(
        t0(),
        Input::AdminStored {
            op: *op,
            stored: true,
        },
    );
    assert_eq!(acks(&after), 1);
    assert!(after.iter().any(|c| matches!(c, Command::Audit(_))));
    assert!(
        rig.machine
            .nodes
            .admin
            .get("node1")
            .is_some_and(|a| a.drained.is_some())
    );
    // A drained node takes no new job.
    rig.submit(one_gpu());
    let commands = rig.pass(t0());
    assert!(!commands.iter().any(|c| matches!(c, Command::Assign { .. })));
}

#[test]
fn a_user_who_is_not_an_admin_may_not_drain_a_node() {
    let mut rig = Rig::new(Policy::default());
    let drain = Request::Admin(AdminRequest::DrainNode {
        node: "node1".into(),
        by: "alice".into(),
        reason: None,
    });
    let admitted = rig.request(alice(), drain);
    let commands = rig.feed(t0(), Input::Request(Box::new(admitted)));
    assert!(
        !commands
            .iter()
            .any(|c| matches!(c, Command::StoreAdmin { .. }))
    );
    assert_eq!(acks(&commands), 1);
    assert!(
        commands
            .iter()
            .any(|c| matches!(c, Command::Audit(a) if !a.accepted))
    );
}

#[test]
fn finished_jobs_move_to_history_after_keep_finished_and_are_forgotten_once_moved() {
    let policy = Policy {
        keep_finished_secs: 60,
        ..Policy::default()
    };
    let mut rig = Rig::new(policy);
    let id = running_job(&mut rig, one_gpu());
    let report = AgentReport {
        job: id.clone(),
        attempt: 1,
        node: "node1".into(),
        at: t0(),
        kind: ReportKind::Exited(Default::default()),
    };
    rig.feed(t0(), Input::Report { token: 7, report });
    assert!(matches!(rig.state(&id), Some(JobState::Succeeded(_))));
    let soon = rig.feed(t0() + chrono::Duration::seconds(30), tick(30));
    assert!(!soon.iter().any(|c| matches!(c, Command::Archive { .. })));
    let later = rig.feed(t0() + chrono::Duration::seconds(120), tick(120));
    assert!(
        later
            .iter()
            .any(|c| matches!(c, Command::Archive { record, .. } if record.id == id))
    );
    rig.feed(
        t0(),
        Input::Archived {
            id: id.clone(),
            moved: true,
        },
    );
    assert!(rig.machine.job(&id).is_none());
}

#[test]
fn a_lost_node_s_waiting_assignments_are_dropped_and_its_job_waits_while_it_still_runs_there() {
    let mut rig = Rig::new(Policy::default());
    let fenced = |sent_at, running: &[(&JobId, u32)]| {
        let mut beat = beat("node1", sent_at, running);
        beat.fence_after_ms = Some(5_000);
        Input::Heartbeat(Box::new(beat))
    };
    rig.feed(t0(), fenced(t0(), &[]));
    let id = running_job(&mut rig, one_gpu());
    let purges = |commands: &[Command]| {
        commands
            .iter()
            .filter(|c| matches!(c, Command::PurgeAssignments { node } if node == "node1"))
            .count()
    };
    let at = |seconds| t0() + chrono::Duration::seconds(seconds);
    // Silent: offline, its job requeued, what waits on its subject dropped.
    let commands: Vec<Command> = (1..=10)
        .flat_map(|second| rig.feed(at(second as i64), tick(second)))
        .collect();
    assert_eq!(purges(&commands), 1, "{commands:?}");
    assert_eq!(rig.machine.job(&id).map(|r| r.attempt), Some(2));
    let failed = Input::AssignmentsPurged {
        node: "node1".into(),
        purged: false,
    };
    rig.feed(at(10), failed);
    assert_eq!(purges(&rig.feed(at(11), tick(11))), 1, "asked again");
    let done = Input::AssignmentsPurged {
        node: "node1".into(),
        purged: true,
    };
    rig.feed(at(11), done);
    assert_eq!(purges(&rig.feed(at(12), tick(12))), 0, "once purged");
    // Back before its agent fenced itself, still running attempt 1: attempt 2 waits.
    rig.feed(at(20), fenced(at(20), &[(&id, 1)]));
    let assigns = |commands: &[Command]| {
        commands
            .iter()
            .filter(|c| matches!(c, Command::Assign { .. }))
            .count()
    };
    assert_eq!(assigns(&rig.pass(at(20))), 0);
    rig.feed(at(21), fenced(at(21), &[]));
    let commands = rig.pass(at(21));
    assert_eq!(
        assigns(&commands),
        1,
        "once it is gone: {commands:?} {:?}",
        rig.state(&id)
    );
}

#[test]
fn a_class_s_limits_apply_to_each_user_s_jobs_of_it_beside_their_own() {
    let classes = mgpu_protocol::qos::QosClasses(BTreeMap::from([(
        "urgent".to_owned(),
        mgpu_protocol::qos::QosClass::default(),
    )]));
    let mut rig = Rig::new(Policy {
        qos: classes,
        ..Policy::default()
    });
    let config: toml::Table = r#"
        [limits.default]
        max_time_limit = "2h"
        [qos.urgent]
        max_jobs_queued = 1
        max_time_limit = "30m"
    "#
    .parse()
    .unwrap_or_else(|e| panic!("{e}"));
    rig.machine.limits = crate::limits::Limits::parse(config.get("limits"))
        .and_then(|limits| limits.with_classes(config.get("qos")))
        .unwrap_or_else(|e| panic!("{e:#}"));
    let mut urgent = one_gpu();
    urgent.qos = Some("urgent".into());
    let time_limit =
        |rig: &Rig, id: &JobId| rig.machine.job(id).and_then(|r| r.spec.time_limit_secs);

    // The shorter of the class's and the user's time caps; one urgent job queued at most.
    let first = rig.submit(urgent.clone());
    assert!(matches!(rig.state(&first), Some(JobState::Queued(_))));
    assert_eq!(time_limit(&rig, &first), Some(1800));
    let second = rig.submit(urgent);
    let reason = rig
        .state(&second)
        .and_then(|s| s.ending())
        .and_then(|e| e.reason.clone())
        .unwrap_or_default();
    assert!(
        reason.contains("max_jobs_queued = 1 ([qos.urgent])"),
        "{reason}"
    );
    // Her other jobs count apart.
    let plain = rig.submit(one_gpu());
    assert!(matches!(rig.state(&plain), Some(JobState::Queued(_))));
    assert_eq!(time_limit(&rig, &plain), Some(7200));
}
