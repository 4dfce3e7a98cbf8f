//! Stories of an exit report against a lost node: the job it ended is not requeued as lost,
//! whether its record could not be stored yet or an earlier scheduler died handling it.

use mgpu_protocol::Timestamp;
use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::JobState;
use mgpu_protocol::priority::Policy;
use mgpu_protocol::report::{AgentReport, Exit, ReportKind};

use super::messages::WriteOutcome;
use super::tests::{Rig, one_gpu, running_job, t0, tick};
use super::{Command, Input};

fn at(seconds: i64) -> Timestamp {
    t0() + chrono::Duration::seconds(seconds)
}

fn exited(id: &JobId) -> Input {
    let report = AgentReport {
        job: id.clone(),
        attempt: 1,
        node: "node1".into(),
        at: t0(),
        kind: ReportKind::Exited(Exit::default()),
    };
    Input::Report { token: 7, report }
}

/// Ticks from `from` to `to` seconds with no heartbeat from node1.
fn silence(rig: &mut Rig, from: u64, to: u64) {
    for second in from..=to {
        rig.feed(at(second as i64), tick(second));
    }
}

#[test]
fn an_exit_whose_record_could_not_be_stored_stands_when_its_node_is_then_lost() {
    let mut rig = Rig::new(Policy::default());
    let id = running_job(&mut rig, one_gpu());
    let commands = rig.machine.handle(at(1), exited(&id));
    let Some(Command::Write { op, .. }) = commands.first() else {
        panic!("{commands:?}");
    };
    let failed = WriteOutcome::Failed {
        error: "store unavailable".into(),
    };
    let op = *op;
    rig.feed(
        at(1),
        Input::Written {
            op,
            outcome: failed,
        },
    );
    assert!(matches!(rig.state(&id), Some(JobState::Running(_))));
    // The node falls silent before JetStream hands the report out again.
    silence(&mut rig, 1, 15);
    let record = rig.machine.job(&id);
    assert!(
        matches!(record.map(|r| &r.state), Some(JobState::Succeeded(_))),
        "{record:?}"
    );
    assert_eq!(record.map(|r| r.attempt), Some(1));
}

#[test]
fn a_node_silent_while_reports_wait_to_come_again_is_lost_only_after_the_ack_wait() {
    let mut rig = Rig::new(Policy::default());
    let id = running_job(&mut rig, one_gpu());
    rig.feed(at(1), Input::ReportsUnacknowledged);
    silence(&mut rig, 1, 20);
    assert!(
        matches!(rig.state(&id), Some(JobState::Running(_))),
        "its exit may be among them"
    );
    // The report came again and said nothing of this job: the silence counts from then.
    silence(&mut rig, 21, 45);
    let record = rig.machine.job(&id);
    assert_eq!(record.map(|r| r.attempt), Some(2), "{record:?}");
}
