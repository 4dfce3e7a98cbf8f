//! A job over several nodes, one of which is lost: its processes elsewhere are stopped at
//! once, even the single one of a job that is not `--distributed`.

use super::tests::{across, at, kills, running, step};
use super::{Input, Kill};

fn lost(node: &str) -> Input {
    Input::NodeLost {
        why: format!("node {node} went offline"),
        at: at(30),
        not_before: None,
    }
}

#[test]
fn a_lost_peer_stops_the_process_of_a_job_that_is_not_distributed() {
    let job = running(across(&["a", "b"], false));
    let transition = step(&job, lost("b"), 30);
    let stops: Vec<&Kill> = kills(&transition);
    assert_eq!(stops.len(), 1, "{:?}", transition.effects);
    assert!(stops[0].best_effort && !stops[0].requeue);
    assert_eq!(stops[0].placement.launched_ranks(), vec![(0, "a")]);
    // A one-node job's node is gone with its process: nothing to stop elsewhere.
    let alone = running(across(&["a"], false));
    assert!(kills(&step(&alone, lost("a"), 30)).is_empty());
}
