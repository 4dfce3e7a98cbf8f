//! Stories of finished jobs moving to history: an array's environment, stored once for all
//! its tasks, goes with the last of them and not before.

use mgpu_protocol::Timestamp;
use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::{ArrayMember, JobSpec, JobState};
use mgpu_protocol::priority::Policy;
use mgpu_protocol::report::{AgentReport, ReportKind};

use super::tests::{Rig, beat, one_gpu, running_job, t0, tick};
use super::{Command, Input};

fn at(seconds: i64) -> Timestamp {
    t0() + chrono::Duration::seconds(seconds)
}

fn task(array: &JobId, index: u32) -> JobSpec {
    let mut spec = one_gpu();
    spec.private_env = true;
    spec.array = Some(ArrayMember {
        array_id: array.clone(),
        index,
        max_running: None,
    });
    spec
}

fn exits(rig: &mut Rig, id: &JobId, seconds: i64) {
    let report = AgentReport {
        job: id.clone(),
        attempt: 1,
        node: "node1".into(),
        at: at(seconds),
        kind: ReportKind::Exited(Default::default()),
    };
    rig.feed(at(seconds), Input::Report { token: 7, report });
    assert!(matches!(rig.state(id), Some(JobState::Succeeded(_))));
}

/// The moves a sweep at `seconds` asks for: each job and whether it is its array's last.
/// Node1's heartbeat (listing `running`) comes just before, so that it stays online.
fn sweep(rig: &mut Rig, seconds: u64, running: &[&JobId]) -> Vec<(JobId, bool)> {
    let now = at(seconds as i64);
    let listed: Vec<(&JobId, u32)> = running.iter().map(|id| (*id, 1)).collect();
    let heartbeat = Input::Heartbeat(Box::new(beat("node1", now, &listed)));
    rig.feed(now, heartbeat);
    let commands = rig.feed(now, tick(seconds));
    commands
        .into_iter()
        .filter_map(|command| match command {
            Command::Archive {
                record,
                last_of_array,
            } => Some((record.id, last_of_array)),
            _ => None,
        })
        .collect()
}

fn moved(rig: &mut Rig, id: &JobId) {
    let id = id.clone();
    rig.feed(t0(), Input::Archived { id, moved: true });
}

fn keeping_a_minute() -> Rig {
    Rig::new(Policy {
        keep_finished_secs: 60,
        ..Policy::default()
    })
}

#[test]
fn an_array_s_environment_goes_with_its_last_task_not_while_another_still_runs() {
    let mut rig = keeping_a_minute();
    let array = JobId::random();
    let first = running_job(&mut rig, task(&array, 0));
    exits(&mut rig, &first, 0);
    let second = running_job(&mut rig, task(&array, 1));
    assert_eq!(
        sweep(&mut rig, 120, &[&second]),
        vec![(first.clone(), false)]
    );
    moved(&mut rig, &first);
    exits(&mut rig, &second, 130);
    assert_eq!(sweep(&mut rig, 240, &[]), vec![(second, true)]);
}

#[test]
fn of_an_array_s_tasks_moving_together_only_the_last_takes_the_environment() {
    let mut rig = keeping_a_minute();
    let array = JobId::random();
    let first = running_job(&mut rig, task(&array, 0));
    exits(&mut rig, &first, 0);
    let second = running_job(&mut rig, task(&array, 1));
    exits(&mut rig, &second, 0);
    let moves = sweep(&mut rig, 120, &[]);
    assert_eq!(moves.len(), 2, "{moves:?}");
    assert_eq!(
        moves.iter().filter(|(_, last)| *last).count(),
        1,
        "{moves:?}"
    );
    // A job outside any array, or one whose environment is in its record, takes none.
    let plain = running_job(&mut rig, one_gpu());
    exits(&mut rig, &plain, 200);
    let mut inline = task(&JobId::random(), 0);
    inline.private_env = false;
    let inline = running_job(&mut rig, inline);
    exits(&mut rig, &inline, 200);
    let moves = sweep(&mut rig, 300, &[]);
    assert_eq!(moves.len(), 2, "{moves:?}");
    assert!(moves.iter().all(|(_, last)| !last), "{moves:?}");
}

#[test]
fn an_array_s_last_task_waits_for_any_task_of_it_still_to_come() {
    let mut rig = Rig::new(Policy {
        keep_finished_secs: 10,
        ..Policy::default()
    });
    let array = JobId::random();
    let only = running_job(&mut rig, task(&array, 0));
    exits(&mut rig, &only, 5);
    // Past keep_finished, within the grace since the array was submitted: it stays.
    assert_eq!(sweep(&mut rig, 60, &[]), vec![]);
    let grace = super::retention::ARRAY_ENVIRONMENT_GRACE.as_secs();
    assert_eq!(sweep(&mut rig, grace + 1, &[]), vec![(only, true)]);
}

#[test]
fn a_failed_move_of_the_last_task_asks_again_for_the_environment() {
    let mut rig = keeping_a_minute();
    let array = JobId::random();
    let only = running_job(&mut rig, task(&array, 0));
    exits(&mut rig, &only, 0);
    assert_eq!(sweep(&mut rig, 120, &[]), vec![(only.clone(), true)]);
    rig.feed(
        t0(),
        Input::Archived {
            id: only.clone(),
            moved: false,
        },
    );
    assert_eq!(sweep(&mut rig, 240, &[]), vec![(only, true)]);
}
