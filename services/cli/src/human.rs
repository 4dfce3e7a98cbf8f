//! Small formatting helpers for what people read: ages, times, sizes, states, GPU lists and
//! GPU types.

use std::time::Duration;

use mgpu_protocol::Timestamp;
use mgpu_protocol::duration::format_duration;
use mgpu_protocol::node::{GpuSource, GpuStatus};

use crate::model::nodes::{NodeRow, NodeState};

/// The time from `earlier` to `later`; zero when the clocks disagree about the order.
pub fn elapsed(earlier: Timestamp, later: Timestamp) -> Duration {
    (later - earlier).to_std().unwrap_or(Duration::ZERO)
}

/// `1.2s ago` below a minute (heartbeats are seconds apart), else `5m03s ago`.
pub fn age(then: Timestamp, now: Timestamp) -> String {
    let d = elapsed(then, now);
    if d < Duration::from_secs(60) {
        format!("{:.1}s ago", d.as_secs_f64())
    } else {
        format!("{} ago", format_duration(d))
    }
}

/// Local wall-clock time with the age: `2025-11-22 04:41:12 (5m03s ago)`.
pub fn time_with_age(then: Timestamp, now: Timestamp) -> String {
    let local = then.with_timezone(&chrono::Local);
    format!(
        "{} ({})",
        local.format("%Y-%m-%d %H:%M:%S"),
        age_coarse(then, now)
    )
}

/// Whole seconds are enough for job times.
fn age_coarse(then: Timestamp, now: Timestamp) -> String {
    format!("{} ago", format_duration(elapsed(then, now)))
}

/// `1234/81559`: used over total MiB.
pub fn mib_pair(used: u64, total: u64) -> String {
    format!("{used}/{total}")
}

/// A job state as a sentence says it: `timed out` rather than the wire name `timed_out`.
pub fn state_words(state: &mgpu_protocol::job::JobState) -> &'static str {
    match state {
        mgpu_protocol::job::JobState::TimedOut(_) => "timed out",
        mgpu_protocol::job::JobState::NodeFailed(_) => "lost with its node",
        other => other.name(),
    }
}

/// A list of GPU indices as `0,1,3`.
pub fn index_list(indices: &[u32]) -> String {
    indices
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// A node's state as the tables show it: an offline node that is also drained says both,
/// since the drain outlives the outage.
pub fn node_state(row: &NodeRow) -> String {
    match (row.state, row.admin.drained.is_some()) {
        (NodeState::Offline, true) => "offline, drained".to_owned(),
        (state, _) => state.name().to_owned(),
    }
}

/// Where a node's GPU list comes from: NVML, or the operator's declaration.
pub fn gpu_source(source: GpuSource) -> &'static str {
    match source {
        GpuSource::Nvml => "nvml",
        GpuSource::Declared => "declared",
    }
}

/// A node's GPUs by type, counted in the order the types first appear: `2×h100`, or
/// `1×h100,3×a100-80gb` when mixed. A GPU reporting no type counts as `?` beside typed ones;
/// `-` when none reports a type (an older agent, or no GPUs).
pub fn gpu_types(gpus: &[GpuStatus]) -> String {
    if gpus.iter().all(|gpu| gpu.gpu_type.is_none()) {
        return "-".to_owned();
    }
    let mut counts: Vec<(&str, usize)> = Vec::new();
    for gpu in gpus {
        let name = gpu.gpu_type.as_deref().unwrap_or("?");
        match counts.iter_mut().find(|(seen, _)| *seen == name) {
            Some((_, count)) => *count += 1,
            None => counts.push((name, 1)),
        }
    }
    counts
        .iter()
        .map(|(name, count)| format!("{count}×{name}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// One GPU's type for a table cell: `h100`, or `-` when it reports none.
pub fn gpu_type(gpu: &GpuStatus) -> &str {
    gpu.gpu_type.as_deref().unwrap_or("-")
}

/// Names (a node's features) as `ib,nvlink`; `-` when there are none.
pub fn name_list(names: &[String]) -> String {
    if names.is_empty() {
        "-".to_owned()
    } else {
        names.join(",")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_are_short() {
        let now = mgpu_protocol::now();
        let then = now - chrono::Duration::milliseconds(1_240);
        assert_eq!(age(then, now), "1.2s ago");
        let then = now - chrono::Duration::seconds(303);
        assert_eq!(age(then, now), "5m03s ago");
        // A clock running behind is not a negative age.
        assert_eq!(age(now + chrono::Duration::seconds(3), now), "0.0s ago");
    }

    #[test]
    fn states_read_as_words_in_sentences() {
        use mgpu_protocol::job::{Ending, JobState};
        let ending = Ending {
            placement: None,
            started_at: None,
            ended_at: mgpu_protocol::now(),
            exit_code: None,
            signal: None,
            reason: None,
            usage: None,
        };
        assert_eq!(
            state_words(&JobState::TimedOut(ending.clone())),
            "timed out"
        );
        assert_eq!(
            state_words(&JobState::NodeFailed(ending.clone())),
            "lost with its node"
        );
        assert_eq!(state_words(&JobState::Failed(ending)), "failed");
    }

    #[test]
    fn index_lists_are_comma_separated() {
        assert_eq!(index_list(&[0, 1, 3]), "0,1,3");
        assert_eq!(index_list(&[]), "");
    }

    #[test]
    fn an_offline_drained_node_says_both() {
        use crate::fixtures::heartbeat;
        use mgpu_protocol::node::{AdminMark, NodeAdmin};
        let now = mgpu_protocol::now();
        let mut beat = heartbeat("n1", 1);
        beat.sent_at = now - chrono::Duration::seconds(60);
        let drained = NodeAdmin {
            drained: Some(AdminMark {
                by: "root".into(),
                at: now,
                reason: None,
            }),
            ..NodeAdmin::default()
        };
        let row = |admin: &NodeAdmin, missed| NodeRow::new(&beat, &[], Some(admin), now, missed);
        assert_eq!(node_state(&row(&drained, 3)), "offline, drained");
        assert_eq!(node_state(&row(&NodeAdmin::default(), 3)), "offline");
        beat.sent_at = now;
        let fresh = NodeRow::new(&beat, &[], Some(&drained), now, 3);
        assert_eq!(node_state(&fresh), "drained");
    }

    #[test]
    fn gpu_types_are_counted_and_unknown_ones_say_so() {
        let mut gpus = crate::fixtures::heartbeat("n1", 4).gpus;
        assert_eq!(gpu_types(&gpus), "-");
        assert_eq!(gpu_types(&[]), "-");
        assert_eq!(gpu_type(&gpus[0]), "-");
        for gpu in &mut gpus {
            gpu.gpu_type = Some("h100".into());
        }
        assert_eq!(gpu_types(&gpus), "4×h100");
        assert_eq!(gpu_type(&gpus[0]), "h100");
        gpus[1].gpu_type = Some("a100-80gb".into());
        gpus[3].gpu_type = None;
        assert_eq!(gpu_types(&gpus), "2×h100,1×a100-80gb,1×?");
    }

    #[test]
    fn name_lists_are_comma_separated_or_a_dash() {
        assert_eq!(name_list(&["ib".into(), "nvlink".into()]), "ib,nvlink");
        assert_eq!(name_list(&[]), "-");
    }
}
