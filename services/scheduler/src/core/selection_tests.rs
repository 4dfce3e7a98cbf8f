//! GPU types and node features: a job gets GPUs of one of its types, the first that fits now;
//! its constraint picks nodes by feature; one no node could ever satisfy is rejected.

use proptest::prelude::*;

use super::tests::{id, job, node, run, started};
use super::*;
use mgpu_protocol::gpu_amount::GpuAmount;
use mgpu_protocol::gpu_type::Constraint;

/// `gpus` GPUs of `gpu_type` on a node with `features`.
fn typed(name: &str, gpus: u32, gpu_type: &str, features: &[&str]) -> NodeView {
    let mut view = node(name, gpus, 81_920);
    for gpu in &mut view.gpus {
        gpu.gpu_type = Some(gpu_type.into());
    }
    view.features = features.iter().map(|f| (*f).to_owned()).collect();
    view
}

fn wanting(n: u32, gpus: u32, types: &[&str]) -> QueuedJob {
    let mut queued = job(n, GpuAmount::whole(gpus));
    queued.gpu_types = types.iter().map(|t| (*t).to_owned()).collect();
    queued
}

fn placed_on(decisions: &[Decision], n: u32) -> Option<String> {
    started(decisions)
        .into_iter()
        .find(|(job, _)| **job == id(n))
        .map(|(_, placement)| placement.node.clone())
}

#[test]
fn a_job_takes_its_first_type_when_one_is_free_and_the_next_when_not() {
    let nodes = [typed("a", 2, "a100", &[]), typed("h", 1, "h100", &[])];
    let first = wanting(1, 1, &["h100", "a100"]);
    let second = wanting(2, 1, &["h100", "a100"]);
    let decisions = run(&nodes, &[], &[first, second]);
    assert_eq!(placed_on(&decisions, 1).as_deref(), Some("h"));
    assert_eq!(placed_on(&decisions, 2).as_deref(), Some("a"));
}

#[test]
fn all_of_a_job_s_gpus_are_of_one_type() {
    let mut mixed = node("m", 2, 81_920);
    mixed.gpus[0].gpu_type = Some("h100".into());
    mixed.gpus[1].gpu_type = Some("a100".into());
    let decisions = run(&[mixed], &[], &[wanting(1, 2, &["h100", "a100"])]);
    assert!(started(&decisions).is_empty(), "{decisions:?}");
}

#[test]
fn a_constraint_picks_nodes_by_feature() {
    let nodes = [
        typed("plain", 4, "a100", &[]),
        typed("fast", 4, "a100", &["ib", "nvlink"]),
    ];
    let mut picky = wanting(1, 1, &[]);
    picky.constraint = Constraint::parse("ib&nvlink").ok();
    let decisions = run(&nodes, &[], &[picky]);
    assert_eq!(placed_on(&decisions, 1).as_deref(), Some("fast"));
}

#[test]
fn a_type_or_feature_no_node_has_is_rejected_with_the_reason() {
    let nodes = [typed("a", 2, "a100", &["ib"])];
    let mut no_feature = wanting(2, 1, &[]);
    no_feature.constraint = Constraint::parse("nvlink").ok();
    let decisions = run(&nodes, &[], &[wanting(1, 1, &["h100"]), no_feature]);
    let reasons: Vec<&str> = decisions
        .iter()
        .filter_map(|d| match d {
            Decision::Reject { reason, .. } => Some(reason.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(
        reasons,
        [
            "asks for GPU type h100; no node has one",
            "no node has the features nvlink"
        ]
    );
}

proptest! {
    /// Whatever the nodes' types and the job's list, a started job's GPUs are all of one of
    /// its types, and it is the first of its list that some free node could give.
    #[test]
    fn a_started_job_has_gpus_of_its_first_fitting_type(
        kinds in proptest::collection::vec(0usize..3, 1..5),
        wanted in proptest::collection::vec(0usize..3, 1..3),
        gpus in 1u32..3,
    ) {
        let names = ["h100", "a100", "l40s"];
        let nodes: Vec<NodeView> = kinds
            .iter()
            .enumerate()
            .map(|(i, k)| typed(&format!("n{i}"), 2, names[*k], &[]))
            .collect();
        let types: Vec<&str> = wanted.iter().map(|w| names[*w]).collect();
        let decisions = run(&nodes, &[], &[wanting(1, gpus, &types)]);
        let first_present = types.iter().find(|t| kinds.iter().any(|k| names[*k] == **t));
        match started(&decisions).first() {
            Some((_, placement)) => {
                let view = nodes.iter().find(|n| n.name == placement.node);
                let got: Vec<Option<&str>> = placement
                    .gpus
                    .iter()
                    .map(|g| view.and_then(|v| v.gpus.iter().find(|x| x.index == g.index))
                        .and_then(|x| x.gpu_type.as_deref()))
                    .collect();
                prop_assert!(got.iter().all(|t| *t == first_present.copied()), "{got:?} {types:?}");
            }
            None => prop_assert!(first_present.is_none(), "{decisions:?}"),
        }
    }
}

#[test]
fn a_cap_per_gpu_type_keeps_a_user_off_that_type_only() {
    let nodes = [typed("h", 2, "h100", &[]), typed("a", 2, "a100", &[])];
    let settings = alice_capped_at_one_h100();
    let mut holding = super::tests::running(1, "h", &[0], None);
    holding.owner = "alice".into();
    let alice = |n| {
        let mut queued = wanting(n, 1, &["h100", "a100"]);
        queued.owner = "alice".into();
        queued
    };
    let mut bob = wanting(3, 1, &["h100"]);
    bob.owner = "bob".into();
    let decisions = plan(
        &nodes,
        &[&holding],
        &[alice(1), bob],
        &settings,
        super::tests::t0(),
    );
    // Alice holds her one H100: her next job takes an A100; Bob gets the free H100.
    assert_eq!(placed_on(&decisions, 1).as_deref(), Some("a"));
    assert_eq!(placed_on(&decisions, 3).as_deref(), Some("h"));
}

#[test]
fn a_job_only_capped_types_would_take_waits_on_its_user_limit_and_spoils_no_one_elses_search() {
    let nodes = [typed("h", 2, "h100", &[])];
    let settings = alice_capped_at_one_h100();
    let mut holding = super::tests::running(1, "h", &[0], None);
    holding.owner = "alice".into();
    // Two jobs of the same shape, naming no type: alice's may take no more H100s, bob's may.
    let mut alice = super::tests::job(2, GpuAmount::ONE);
    alice.owner = "alice".into();
    let mut bob = super::tests::job(3, GpuAmount::ONE);
    bob.owner = "bob".into();
    let decisions = plan(
        &nodes,
        &[&holding],
        &[alice, bob],
        &settings,
        super::tests::t0(),
    );
    assert_eq!(
        super::tests::reason_of(&decisions, &super::tests::id(2)),
        Some(WaitReason::UserLimit)
    );
    assert_eq!(placed_on(&decisions, 3).as_deref(), Some("h"));
}

#[test]
fn a_job_that_only_gpus_of_a_type_capped_below_it_could_hold_is_rejected_naming_the_cap() {
    let nodes = [typed("h", 4, "h100", &[]), typed("a", 1, "a100", &[])];
    let settings = alice_capped_at_one_h100();
    let mut two = job(1, GpuAmount::whole(2));
    two.owner = "alice".into();
    let mut one = job(2, GpuAmount::whole(1));
    one.owner = "alice".into();
    let mut bobs = job(3, GpuAmount::whole(2));
    bobs.owner = "bob".into();
    let none: [&RunningJob; 0] = [];
    let decisions = plan(
        &nodes,
        &none,
        &[two, one, bobs],
        &settings,
        super::tests::t0(),
    );
    let rejected = decisions.iter().find_map(|d| match d {
        Decision::Reject { job, reason } if *job == id(1) => Some(reason.as_str()),
        _ => None,
    });
    assert!(
        rejected.is_some_and(|r| r.contains("h100 = 1") && r.contains("never start")),
        "{decisions:?}"
    );
    // One GPU is within alice's cap; bob has none.
    assert!(placed_on(&decisions, 2).is_some(), "{decisions:?}");
    assert_eq!(placed_on(&decisions, 3).as_deref(), Some("h"));
}

#[test]
fn a_job_waits_for_a_preferred_type_only_while_one_is_on_its_way_and_not_for_long() {
    let nodes = [typed("h", 1, "h100", &[]), typed("a", 1, "a100", &[])];
    let t0 = super::tests::t0();
    let plan_with = |ends_in: Option<i64>, queued_ago: i64| {
        let holding = super::tests::running(1, "h", &[0], ends_in);
        let mut waiter = wanting(2, 1, &["h100", "a100"]);
        waiter.queued_at = t0 - chrono::Duration::seconds(queued_ago);
        plan(
            &nodes,
            &[&holding],
            &[waiter],
            &super::tests::settings(),
            t0,
        )
    };
    // The H100 frees up in five minutes: worth the wait.
    let decisions = plan_with(Some(300), 0);
    assert_eq!(
        super::tests::reason_of(&decisions, &id(2)),
        Some(WaitReason::PreferredType)
    );
    // In an hour, or nobody knows when: the A100 now.
    assert_eq!(
        placed_on(&plan_with(Some(3600), 0), 2).as_deref(),
        Some("a")
    );
    assert_eq!(placed_on(&plan_with(None, 0), 2).as_deref(), Some("a"));
    // Waited long enough already.
    assert_eq!(
        placed_on(&plan_with(Some(300), 700), 2).as_deref(),
        Some("a")
    );
}

#[test]
fn a_job_past_its_slice_does_not_yield_a_gpu_type_the_waiters_owner_is_capped_off() {
    let nodes = [typed("h", 2, "h100", &[])];
    let settings = alice_capped_at_one_h100();
    let mut alices = super::tests::running(1, "h", &[0], None);
    alices.owner = "alice".into();
    let mut over = super::tests::running(2, "h", &[1], None);
    over.owner = "bob".into();
    over.slice_end = Some(super::tests::t0() - chrono::Duration::seconds(1));
    let mut alice = super::tests::job(3, GpuAmount::ONE);
    alice.owner = "alice".into();
    let yields = |queue: &[QueuedJob]| {
        plan(
            &nodes,
            &[&alices, &over],
            queue,
            &settings,
            super::tests::t0(),
        )
        .iter()
        .any(|d| matches!(d, Decision::Preempt { job, .. } if *job == over.id))
    };
    // Alice holds her one H100: the H100 it frees is no room for her job.
    assert!(!yields(std::slice::from_ref(&alice)));
    let mut carol = super::tests::job(4, GpuAmount::ONE);
    carol.owner = "carol".into();
    assert!(yields(&[alice, carol]));
}

/// Settings where alice may run one H100 at a time.
fn alice_capped_at_one_h100() -> CoreSettings {
    let mut caps = TypeCaps::new();
    caps.insert(
        "alice".into(),
        [("h100".to_owned(), u64::from(GpuAmount::UNITS_PER_GPU))].into(),
    );
    CoreSettings {
        gpu_type_caps: std::sync::Arc::new(caps),
        ..super::tests::settings()
    }
}
