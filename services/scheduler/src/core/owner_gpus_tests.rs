//! Per-user caps on running GPUs in the core: properties over random clusters and queues of
//! three users, and the cases a lab meets.

use std::collections::HashMap;
use std::sync::Arc;

use proptest::prelude::*;

use super::owner_gpus::placement_units;
use super::tests::{arb_cluster, arb_queue, job, node, run, running, settings, started};
use super::*;
use mgpu_protocol::gpu_amount::GpuAmount;

const UNIT: u64 = GpuAmount::UNITS_PER_GPU as u64;
const OWNERS: [&str; 3] = ["alice", "bob", "carol"];

fn capped(caps: &[(&str, u64)]) -> CoreSettings {
    CoreSettings {
        gpu_caps: Arc::new(caps.iter().map(|(u, c)| ((*u).to_owned(), *c)).collect()),
        gpu_type_caps: Default::default(),
        class_caps: Default::default(),
        ..settings()
    }
}

fn owned(mut queued: QueuedJob, owner: &str) -> QueuedJob {
    queued.owner = owner.into();
    queued
}

/// Units each owner holds: the running jobs' and those the decisions start.
fn held_after(
    holding: &[RunningJob],
    queue: &[QueuedJob],
    decisions: &[Decision],
) -> (HashMap<String, u64>, HashMap<String, u64>) {
    let mut before: HashMap<String, u64> = HashMap::new();
    for job in holding {
        *before.entry(job.owner.clone()).or_default() += placement_units(&job.placement);
    }
    let mut added: HashMap<String, u64> = HashMap::new();
    for (id, placement) in started(decisions) {
        if let Some(job) = queue.iter().find(|q| &q.id == id) {
            *added.entry(job.owner.clone()).or_default() += placement_units(placement);
        }
    }
    (before, added)
}

#[test]
fn a_user_at_their_cap_waits_and_another_users_job_behind_starts() {
    let nodes = [node("n1", 4, 24_000)];
    let queue = [
        owned(job(1, GpuAmount::ONE), "alice"),
        owned(job(2, GpuAmount::ONE), "alice"),
        owned(job(3, GpuAmount::ONE), "alice"),
        owned(job(4, GpuAmount::ONE), "bob"),
    ];
    let settings = capped(&[("alice", 2 * UNIT)]);
    let decisions = plan::<_, RunningJob>(&nodes, &[], &queue, &settings, tests::t0());
    let starts: Vec<&JobId> = started(&decisions).into_iter().map(|(id, _)| id).collect();
    assert_eq!(starts, [&queue[0].id, &queue[1].id, &queue[3].id]);
    assert_eq!(
        tests::reason_of(&decisions, &queue[2].id),
        Some(WaitReason::UserLimit)
    );
    // What alice already runs counts: with one running, one more starts.
    let mut alices = running(1, "n1", &[0], None);
    alices.owner = "alice".into();
    let decisions = run_capped(&nodes, &[alices], &queue, &settings);
    assert_eq!(started(&decisions).len(), 2, "{decisions:?}");
}

fn run_capped(
    nodes: &[NodeView],
    holding: &[RunningJob],
    queue: &[QueuedJob],
    settings: &CoreSettings,
) -> Vec<Decision> {
    plan(nodes, holding, queue, settings, tests::t0())
}

#[test]
fn without_caps_nothing_changes() {
    let nodes = [node("n1", 2, 24_000)];
    let queue = [owned(job(1, GpuAmount::ONE), "alice")];
    assert_eq!(
        run(&nodes, &[], &queue),
        run_capped(&nodes, &[], &queue, &capped(&[]))
    );
}

fn arb_owned()
-> impl Strategy<Value = (Vec<NodeView>, Vec<RunningJob>, Vec<QueuedJob>, CoreSettings)> {
    (
        arb_cluster(),
        arb_queue(),
        prop::collection::vec(0usize..3, 60),
        prop::collection::vec(prop::option::of(0u64..5 * UNIT), 3),
    )
        .prop_map(|((nodes, mut holding), mut queue, owners, caps)| {
            for (i, job) in holding.iter_mut().enumerate() {
                job.owner = OWNERS[owners[i % owners.len()]].into();
            }
            for (i, job) in queue.iter_mut().enumerate() {
                job.owner = OWNERS[owners[(i + 7) % owners.len()]].into();
            }
            let caps: Vec<(&str, u64)> = OWNERS
                .iter()
                .zip(caps)
                .filter_map(|(user, cap)| cap.map(|c| (*user, c)))
                .collect();
            (nodes, holding, queue, capped(&caps))
        })
}

proptest! {
    #[test]
    fn no_user_ever_runs_more_gpus_than_their_cap(
        (nodes, holding, queue, settings) in arb_owned(),
    ) {
        let decisions = run_capped(&nodes, &holding, &queue, &settings);
        let (before, added) = held_after(&holding, &queue, &decisions);
        for (user, cap) in settings.gpu_caps.iter() {
            let started = added.get(user).copied().unwrap_or(0);
            let held = before.get(user).copied().unwrap_or(0);
            // A user already past a cap lowered under them starts nothing more.
            prop_assert!(started == 0 || held + started <= *cap,
                "{user}: held {held}, started {started}, cap {cap}");
        }
    }

    #[test]
    fn a_job_held_back_only_by_its_owners_cap_holds_up_nobody_else(
        (nodes, holding, queue, settings) in arb_owned(),
    ) {
        let decisions = run_capped(&nodes, &holding, &queue, &settings);
        let capped: Vec<&JobId> = queue
            .iter()
            .map(|q| &q.id)
            .filter(|id| tests::reason_of(&decisions, id) == Some(WaitReason::UserLimit))
            .collect();
        let others: Vec<QueuedJob> = queue
            .iter()
            .filter(|q| !capped.contains(&&q.id))
            .cloned()
            .collect();
        let without = run_capped(&nodes, &holding, &others, &settings);
        let about_others: Vec<&Decision> = decisions
            .iter()
            .filter(|d| !matches!(d, Decision::Wait { job, .. } if capped.contains(&job)))
            .collect();
        prop_assert_eq!(about_others, without.iter().collect::<Vec<_>>());
    }
}

#[test]
fn a_class_cap_holds_each_users_jobs_of_that_class_and_leaves_their_other_jobs_alone() {
    let nodes = [node("n1", 4, 24_576)];
    let settings = CoreSettings {
        class_caps: Arc::new([("scavenger".to_owned(), UNIT)].into()),
        ..settings()
    };
    let mut holding = running(1, "n1", &[0], None);
    holding.owner = "alice".into();
    holding.qos = Some("scavenger".into());
    let scavenger = |n, owner| {
        let mut queued = owned(job(n, GpuAmount::ONE), owner);
        queued.qos = Some("scavenger".into());
        queued
    };
    let queue = [
        scavenger(2, "alice"),
        owned(job(3, GpuAmount::ONE), "alice"),
        scavenger(4, "bob"),
        scavenger(5, "bob"),
    ];
    let none: [&RunningJob; 0] = [];
    let decisions = plan(&nodes, &[&holding], &queue, &settings, super::tests::t0());
    let starts: Vec<&JobId> = started(&decisions).into_iter().map(|(id, _)| id).collect();
    // Alice's second scavenger job waits on the class's cap, her normal one starts; bob gets
    // one scavenger job, not two.
    assert_eq!(starts, [&super::tests::id(3), &super::tests::id(4)]);
    assert_eq!(
        super::tests::reason_of(&decisions, &super::tests::id(2)),
        Some(WaitReason::UserLimit)
    );
    let decisions = plan(&nodes, &none, &queue, &settings, super::tests::t0());
    assert_eq!(started(&decisions).len(), 3);
}
