//! The ledger's invariants checked on records built by hand.

use mgpu_protocol::job::{ArrayMember, GpuShare, JobSpec, Placement, Run};

use super::*;

fn record(n: u64, user: &str, spec: JobSpec, placement: Placement) -> Tracked {
    let at = chrono::DateTime::from_timestamp(0, 0).unwrap_or_default();
    Tracked {
        record: JobRecord {
            id: format!("{n:032x}")
                .parse()
                .unwrap_or_else(|e| panic!("job id: {e:?}")),
            user: user.into(),
            user_key: None,
            spec,
            submitted_at: at,
            attempt: 1,
            state: JobState::Running(Run::assigned(placement, at)),
            last_request: None,
            preemptions: Vec::new(),
        },
        revision: n,
    }
}

fn on(node: &str, index: u32) -> Placement {
    let gpu = GpuShare {
        index,
        amount: GpuAmount::ONE,
        mem_mib: 0,
    };
    Placement::single(node, vec![gpu])
}

/// Stores `tracked` as a start in `records` and checks it.
fn start(ledger: &mut Ledger, records: &mut BTreeMap<JobId, Tracked>, tracked: Tracked) {
    records.insert(tracked.record.id.clone(), tracked.clone());
    ledger.stored(None, &tracked.record, records, |_| 81_920);
}

fn one_gpu() -> JobSpec {
    JobSpec::new(vec!["x".into()], "/tmp")
}

#[test]
fn a_start_on_a_gpu_paused_in_an_earlier_round_is_caught() {
    let mut ledger = Ledger::default();
    let mut records = BTreeMap::new();
    ledger.next_round();
    let mut admin = NodeAdmin::default();
    let mark = mgpu_protocol::node::AdminMark {
        by: "root".into(),
        at: chrono::DateTime::from_timestamp(0, 0).unwrap_or_default(),
        reason: None,
    };
    admin.paused_gpus.insert(0, mark);
    ledger.admin_stored("n", &admin);
    // Decided before the pause was known: fine.
    start(
        &mut ledger,
        &mut records,
        record(1, "alice", one_gpu(), on("n", 0)),
    );
    assert!(ledger.broken.is_empty());
    ledger.next_round();
    start(
        &mut ledger,
        &mut records,
        record(2, "alice", one_gpu(), on("n", 1)),
    );
    assert!(ledger.broken.is_empty(), "another GPU");
    start(
        &mut ledger,
        &mut records,
        record(3, "alice", one_gpu(), on("m", 0)),
    );
    assert!(ledger.broken.is_empty(), "another node");
    start(
        &mut ledger,
        &mut records,
        record(4, "alice", one_gpu(), on("n", 0)),
    );
    assert_eq!(
        ledger.broken.len(),
        2,
        "paused, and given twice: {:?}",
        ledger.broken
    );
}

#[test]
fn a_start_past_the_cap_in_force_or_the_arrays_limit_is_caught() {
    let mut ledger = Ledger::default();
    ledger.in_force(
        &super::super::admin::limits_of(Some(1), None),
        &Registry {
            principals: Vec::new(),
        },
    );
    assert_eq!(ledger.cap("bob"), None, "bob is not a principal");
    let bob = mgpu_protocol::principals::Principal {
        name: "bob".into(),
        role: Role::User,
        public_key: "UBOB".into(),
        unix_user: None,
        group: None,
    };
    let registry = Registry {
        principals: vec![bob],
    };
    ledger.in_force(&super::super::admin::limits_of(Some(1), None), &registry);
    let mut records = BTreeMap::new();
    start(
        &mut ledger,
        &mut records,
        record(1, "bob", one_gpu(), on("n", 0)),
    );
    assert!(ledger.broken.is_empty());
    start(
        &mut ledger,
        &mut records,
        record(2, "bob", one_gpu(), on("n", 1)),
    );
    assert_eq!(ledger.broken.len(), 1, "{:?}", ledger.broken);
    let mut task = one_gpu();
    task.array = Some(ArrayMember {
        array_id: JobId::random(),
        index: 0,
        max_running: Some(1),
    });
    start(
        &mut ledger,
        &mut records,
        record(3, "alice", task.clone(), on("n", 2)),
    );
    start(
        &mut ledger,
        &mut records,
        record(4, "alice", task, on("n", 3)),
    );
    assert_eq!(ledger.broken.len(), 2, "{:?}", ledger.broken);
}

#[test]
fn a_gang_half_placed_or_twice_on_a_node_and_a_missing_rank_are_caught() {
    let mut ledger = Ledger::default();
    let mut records = BTreeMap::new();
    let mut gang = one_gpu();
    gang.nodes = 2;
    gang.distributed = true;
    start(
        &mut ledger,
        &mut records,
        record(1, "alice", gang.clone(), on("n", 0)),
    );
    assert_eq!(ledger.broken.len(), 1, "one node of two");
    let mut twice = on("n", 1);
    twice.peers.push(mgpu_protocol::job::NodeShare {
        node: "n".into(),
        gpus: twice.gpus.clone(),
    });
    start(&mut ledger, &mut records, record(2, "alice", gang, twice));
    assert_eq!(ledger.broken.len(), 2, "{:?}", ledger.broken);
    let single = record(3, "alice", one_gpu(), on("m", 0)).record;
    ledger.assigned(Some(&single), 1, &[(0, "m".into())]);
    assert_eq!(ledger.broken.len(), 2, "every launched rank assigned");
    ledger.assigned(Some(&single), 1, &[(0, "n".into())]);
    assert_eq!(ledger.broken.len(), 3, "{:?}", ledger.broken);
}

#[test]
fn two_live_attempts_and_a_no_requeue_job_started_twice_are_caught() {
    let mut ledger = Ledger::default();
    let job = JobId::random();
    ledger.process_started((&job, 1, "n"), &[], true);
    assert!(ledger.broken.is_empty());
    ledger.process_started((&job, 2, "n"), &[], true);
    assert_eq!(ledger.broken.len(), 1, "--no-requeue");
    ledger.process_started((&job, 3, "n"), &[2], false);
    assert_eq!(ledger.broken.len(), 2, "{:?}", ledger.broken);
}
