//! `mgpu why`, the expected starts and the verdicts, asked of the machine: who may ask, what a
//! waiting job's answer says, that a pass dates the jobs behind a busy GPU, and what a
//! submitter is told.

use mgpu_protocol::job::JobState;
use mgpu_protocol::priority::Policy;
use mgpu_protocol::why::CauseKind;

use mgpu_protocol::hold::HoldRequest;
use mgpu_protocol::request::Request;

use super::messages::{Command, Input};
use super::tests::{Rig, alice, one_gpu, root, running_job, t0};

#[test]
fn a_waiting_job_is_dated_and_explained_to_its_owner_and_admins_only() {
    let mut rig = Rig::new(Policy::default());
    let mut ten_minutes = one_gpu();
    ten_minutes.time_limit_secs = Some(600);
    // node1's one GPU runs a ten-minute job; two more wait behind it.
    let running = running_job(&mut rig, ten_minutes.clone());
    let one = rig.submit(ten_minutes.clone());
    let other = rig.submit(ten_minutes);
    let commands = rig.pass(t0());
    let saved = commands.iter().find_map(|c| match c {
        Command::SavePlan(plan) => Some(plan.clone()),
        _ => None,
    });
    let plan = saved.unwrap_or_else(|| panic!("no plan saved: {commands:?}"));
    let minutes = |m| Some(t0() + chrono::Duration::minutes(m));
    // Submitted at the same moment: the id decides which is first in line.
    let (first, second) = match plan.jobs[&one].at == minutes(10) {
        true => (one, other),
        false => (other, one),
    };
    assert_eq!(plan.jobs[&first].at, minutes(10));
    assert!(plan.jobs[&first].reserved);
    assert_eq!(plan.jobs[&second].at, minutes(20));
    assert_eq!(plan.jobs[&second].nodes, ["node1"]);

    // Its owner asks: the answer places it, dates it, and names what it waits for.
    let answer = rig
        .machine
        .explain(&second, &alice().key, t0())
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((answer.position, answer.queued), (Some(2), 2));
    assert_eq!(answer.expected_start.and_then(|s| s.at), minutes(20));
    let kinds: Vec<CauseKind> = answer.causes.iter().map(|c| c.kind).collect();
    for kind in [
        CauseKind::JobsAhead,
        CauseKind::NoFreeGpus,
        CauseKind::ExpectedStart,
        CauseKind::FairShare,
    ] {
        assert!(
            kinds.contains(&kind),
            "{kind:?} missing: {:#?}",
            answer.causes
        );
    }
    let ahead = answer
        .causes
        .iter()
        .find(|c| c.kind == CauseKind::JobsAhead);
    let ahead = ahead.map(|c| (c.jobs[0].id.clone(), c.text.clone()));
    let (named, text) = ahead.unwrap_or_else(|| unreachable!());
    assert_eq!(named, first);
    assert!(text.contains("node1:0"), "{text}");
    let free = answer
        .causes
        .iter()
        .find(|c| c.kind == CauseKind::NoFreeGpus);
    let free = free.map(|c| c.text.as_str()).unwrap_or_default();
    assert!(free.contains("no GPU is free on any online node"), "{free}");
    let position = answer
        .causes
        .iter()
        .find(|c| c.kind == CauseKind::FairShare);
    let position = position.map(|c| c.text.as_str()).unwrap_or_default();
    assert!(
        position.starts_with("position 2 of 2 in line"),
        "{position}"
    );

    // An admin may ask; another user may not; a running job's answer says where it runs.
    assert!(rig.machine.explain(&second, &root().key, t0()).is_ok());
    let refused = rig.machine.explain(&second, "UBOB", t0());
    assert_eq!(
        refused.err(),
        Some(format!(
            "permission denied: job {} belongs to alice",
            second.short()
        ))
    );
    let runs = rig.machine.explain(&running, &alice().key, t0());
    let runs = runs.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(runs.causes[0].kind, CauseKind::NotWaiting);
    assert!(
        runs.causes[0].text.contains("runs on node1"),
        "{:?}",
        runs.causes
    );
}

#[test]
fn a_held_job_says_who_holds_it_and_how_to_release_it() {
    let mut rig = Rig::new(Policy::default());
    let id = rig.submit(one_gpu());
    let hold = Request::Hold {
        job: id.clone(),
        request: HoldRequest {
            user: "alice".into(),
        },
    };
    let admitted = rig.request(alice(), hold);
    rig.feed(t0(), Input::Request(Box::new(admitted)));
    rig.pass(t0());
    assert!(matches!(rig.state(&id), Some(JobState::Queued(_))));
    let answer = rig
        .machine
        .explain(&id, &alice().key, t0())
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(answer.causes[0].kind, CauseKind::Held);
    assert!(
        answer.causes[0]
            .text
            .contains(&format!("mgpu release {}", id.short())),
        "{:?}",
        answer.causes
    );
}

#[test]
fn a_submitter_is_told_once_the_record_is_stored_whether_the_job_can_ever_run() {
    let mut rig = Rig::new(Policy::default());
    let told = |rig: &mut Rig, gpus: u32| {
        let mut spec = one_gpu();
        spec.gpus = mgpu_protocol::gpu_amount::GpuAmount::whole(gpus);
        let request = Request::Submit(Box::new(mgpu_protocol::submit::SubmitRequest {
            id: mgpu_protocol::ids::JobId::random(),
            user: "alice".into(),
            spec,
        }));
        let mut admitted = rig.request(alice(), request);
        admitted.verdict_to = Some(format!("_INBOX.{}.verdict.1", alice().key));
        let mut commands = rig.feed(t0(), Input::Submissions(vec![admitted]));
        // A job that may run is recorded by the pass that follows.
        commands.extend(rig.pass(t0()));
        let verdicts: Vec<_> = commands
            .into_iter()
            .filter_map(|c| match c {
                Command::Verdict { to, verdict } => Some((to, verdict)),
                _ => None,
            })
            .collect();
        assert_eq!(verdicts.len(), 1, "one verdict per submission");
        verdicts.into_iter().next().map(|(_, v)| v.refused)
    };
    // node1 has one GPU: two can never run there, one can.
    let refused = told(&mut rig, 2).flatten().unwrap_or_default();
    assert!(
        refused.starts_with("cannot run: asks for 2 GPUs on one node"),
        "{refused}"
    );
    assert_eq!(told(&mut rig, 1), Some(None));
}
