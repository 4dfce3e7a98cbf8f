//! The checker's proof that it can fail: every check run on a made-up history holding one of
//! each violation, each of which must be found, and on one it must let pass.

use std::collections::{BTreeMap, HashMap};

use serde_json::json;

use super::{
    Attempt, Settled, check_after_end, check_arrays, check_dependency, check_gpus, check_job,
    group_by_job,
};
use crate::workload::{Job, Kind, Submitted};

/// The checks above run on a made-up history with one of each violation, each of which must
/// be found (so a campaign's "no violation" means something).
pub fn self_check() -> Result<(), String> {
    let attempt = |node: &str, gpus: &str, start: u128, end: Option<u128>| Attempt {
        node: node.to_owned(),
        gpus: gpus.split(',').map(str::to_owned).collect(),
        start,
        end,
    };
    let mut attempts = BTreeMap::new();
    attempts.insert(("a".to_owned(), 1), attempt("n1", "0", 10, Some(20)));
    attempts.insert(("b".to_owned(), 1), attempt("n1", "0,1", 15, Some(30)));
    attempts.insert(("c".to_owned(), 1), attempt("n2", "0", 10, Some(20)));
    attempts.insert(("c".to_owned(), 2), attempt("n2", "1", 30, Some(40)));
    attempts.insert(("d".to_owned(), 1), attempt("n3", "0", 5, Some(12)));
    attempts.insert(("e".to_owned(), 1), attempt("n3", "1", 11, Some(25)));
    let mut violations = Vec::new();
    let mut unchecked = BTreeMap::new();
    check_gpus(&attempts, &HashMap::new(), &mut violations, &mut unchecked);
    let found = |violations: &[String], text: &str| violations.iter().any(|v| v.contains(text));
    if !found(&violations, "a#1 and b#1 held GPU 0 of n1") || violations.len() != 1 {
        return Err(format!("GPU overlap: {violations:?}"));
    }
    // Two halves share a GPU; a third half is one too many.
    let mut halves = BTreeMap::new();
    halves.insert(("h1".to_owned(), 1), attempt("n4", "0", 10, Some(30)));
    halves.insert(("h2".to_owned(), 1), attempt("n4", "0", 12, Some(20)));
    let shares: HashMap<&str, u32> = [("h1", 50), ("h2", 50), ("h3", 50)].into();
    let mut violations = Vec::new();
    check_gpus(&halves, &shares, &mut violations, &mut unchecked);
    if !violations.is_empty() {
        return Err(format!("two half-GPU jobs on one GPU: {violations:?}"));
    }
    halves.insert(("h3".to_owned(), 1), attempt("n4", "0", 15, Some(25)));
    check_gpus(&halves, &shares, &mut violations, &mut unchecked);
    if !found(&violations, "h1#1 and h2#1 and h3#1 held GPU 0 of n4") {
        return Err(format!("three half-GPU jobs on one GPU: {violations:?}"));
    }
    let settled = Settled {
        records: [(
            "a".to_owned(),
            json!({"state": "cancelled", "ended_at": "1970-01-01T00:00:01Z"}),
        )]
        .into(),
        unacknowledged: Vec::new(),
    };
    let mut late = BTreeMap::new();
    late.insert(
        ("a".to_owned(), 2),
        attempt("n1", "0", 40_000_000_000, None),
    );
    let mut violations = Vec::new();
    check_after_end(&late, &settled, &mut violations);
    if !found(
        &violations,
        "a: attempt 2 started 39.0 s after the job's recorded end",
    ) {
        return Err(format!("an attempt after the end: {violations:?}"));
    }
    let job = |id: &str, kind: Kind| Job {
        id: id.to_owned(),
        user: "alice",
        kind,
        lines: 2,
        cancel_asked: false,
    };
    let by_job = group_by_job(&attempts);
    let mut violations = Vec::new();
    let runs = |id: &str| by_job.get(id).cloned().unwrap_or_default();
    check_job(
        &job("c", Kind::NoRequeue),
        &json!({"state": "succeeded", "attempt": 2}),
        &runs("c"),
        &mut violations,
    );
    check_job(
        &job("a", Kind::Single),
        &json!({"state": "succeeded", "attempt": 2}),
        &runs("a"),
        &mut violations,
    );
    if !found(&violations, "c: --no-requeue, yet it started 2 times")
        || !found(&violations, "a: succeeded, but its attempt 2 wrote no end")
    {
        return Err(format!("job checks: {violations:?}"));
    }
    let settled = Settled {
        records: [("d".to_owned(), json!({"state": "succeeded"}))].into(),
        unacknowledged: Vec::new(),
    };
    let mut violations = Vec::new();
    let dependent = job("e", Kind::Dependent { on: "d".to_owned() });
    check_dependency(&dependent, &runs("e"), &settled, &by_job, &mut violations);
    if !found(&violations, "e: started before d") {
        return Err(format!("dependency: {violations:?}"));
    }
    let array = |id: &str| {
        job(
            id,
            Kind::ArrayTask {
                array: "x".to_owned(),
                max_running: 1,
            },
        )
    };
    let submitted = Submitted {
        jobs: vec![array("d"), array("e")],
        uncertain: 0,
    };
    let mut violations = Vec::new();
    check_arrays(&submitted, &attempts, &mut violations, &mut unchecked);
    if !found(&violations, "array x: 2 tasks ran at once") {
        return Err(format!("array: {violations:?}"));
    }
    Ok(())
}
