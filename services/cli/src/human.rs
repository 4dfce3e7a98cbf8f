//! Small formatting helpers for what people read: ages, times, sizes, states, GPU lists, GPU
//! types, idle warnings and reservation windows.

use std::time::Duration;

use mgpu_protocol::Timestamp;
use mgpu_protocol::duration::format_duration;
use mgpu_protocol::idle::{IdleAction, IdleWarning};
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

/// Local wall-clock time to the minute: `14:02` on `now`'s day, `2026-11-26 14:02` on
/// another, so a time from yesterday is not read as today's.
pub fn clock(then: Timestamp, now: Timestamp) -> String {
    let local = then.with_timezone(&chrono::Local);
    if local.date_naive() == now.with_timezone(&chrono::Local).date_naive() {
        local.format("%H:%M").to_string()
    } else {
        local.format("%Y-%m-%d %H:%M").to_string()
    }
}

/// A reservation's edge, in UTC as the times it is booked with: `Fri Nov 28 09:00`, with the
/// year when it is not `now`'s (`Fri Jan 01 2027 09:00`).
pub fn utc_day_time(then: Timestamp, now: Timestamp) -> String {
    use chrono::Datelike as _;
    if then.year() == now.year() {
        then.format("%a %b %d %H:%M").to_string()
    } else {
        then.format("%a %b %d %Y %H:%M").to_string()
    }
}

/// What the idle policy will do to a warned job: `requeue from 16:32 if another job waits`,
/// or `warned only` where its action is only to warn.
pub fn idle_action(warning: &IdleWarning, now: Timestamp) -> String {
    let verb = match warning.action {
        IdleAction::Requeue => "requeue",
        IdleAction::Cancel => "cancel",
        IdleAction::Warn => return "warned only".to_owned(),
    };
    format!(
        "{verb} from {} if another job waits",
        clock(warning.action_from, now)
    )
}

/// A running job's idle warning for `mgpu show`: `since 14:02 (2h10m), warned 16:02; requeue
/// from 16:32 if another job waits`.
pub fn idle_warning(warning: &IdleWarning, now: Timestamp) -> String {
    format!(
        "since {} ({}), warned {}; {}",
        clock(warning.idle_since, now),
        format_duration(elapsed(warning.idle_since, now)),
        clock(warning.warned_at, now),
        idle_action(warning, now)
    )
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

/// Sorted indices with runs folded: `0-2,7` (how an array's thousands of task indices stay
/// one short line).
pub fn index_ranges(indices: &[u32]) -> String {
    let mut sorted = indices.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut runs: Vec<(u32, u32)> = Vec::new();
    for index in sorted {
        match runs.last_mut() {
            Some((_, end)) if end.checked_add(1) == Some(index) => *end = index,
            _ => runs.push((index, index)),
        }
    }
    runs.iter()
        .map(|(start, end)| match start == end {
            true => start.to_string(),
            false => format!("{start}-{end}"),
        })
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
        assert_eq!(index_ranges(&[7, 0, 1, 2, 9, 10]), "0-2,7,9-10");
        assert_eq!(index_ranges(&[]), "");
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

    /// A warning whose job has been idle since 130 minutes before `now`, warned 10 minutes
    /// before `now`, with its action due 20 minutes after `now`.
    fn warning(action: IdleAction, now: Timestamp) -> IdleWarning {
        IdleWarning {
            idle_since: now - chrono::Duration::minutes(130),
            warned_at: now - chrono::Duration::minutes(10),
            action,
            action_from: now + chrono::Duration::minutes(20),
        }
    }

    #[test]
    fn idle_warnings_say_since_when_and_what_comes_next() {
        use chrono::TimeZone as _;
        // Noon local time: every time in the warning falls on the same day.
        let noon = chrono::Local
            .with_ymd_and_hms(2026, 11, 27, 12, 0, 0)
            .single()
            .map(|t| t.with_timezone(&chrono::Utc));
        let Some(now) = noon else { return };
        let text = idle_warning(&warning(IdleAction::Requeue, now), now);
        assert_eq!(
            text,
            "since 09:50 (2h10m), warned 11:50; requeue from 12:20 if another job waits"
        );
        assert_eq!(
            idle_action(&warning(IdleAction::Cancel, now), now),
            "cancel from 12:20 if another job waits"
        );
        assert_eq!(
            idle_action(&warning(IdleAction::Warn, now), now),
            "warned only"
        );
    }

    #[test]
    fn a_window_s_edge_is_a_utc_day_and_time_with_the_year_when_not_this_one() {
        let at = |text: &str| {
            chrono::DateTime::parse_from_rfc3339(text)
                .map(|t| t.with_timezone(&chrono::Utc))
                .unwrap_or_else(|e| panic!("{e}"))
        };
        let now = at("2026-11-27T06:30:00Z");
        assert_eq!(
            utc_day_time(at("2026-11-28T09:00:00Z"), now),
            "Sat Nov 28 09:00"
        );
        assert_eq!(
            utc_day_time(at("2027-01-01T09:00:00+01:00"), now),
            "Fri Jan 01 2027 08:00"
        );
    }

    #[test]
    fn a_clock_time_from_another_day_carries_its_date() {
        use chrono::TimeZone as _;
        let at = |day, hour| {
            chrono::Local
                .with_ymd_and_hms(2026, 11, day, hour, 2, 0)
                .single()
                .map(|t| t.with_timezone(&chrono::Utc))
        };
        let (Some(then), Some(now)) = (at(26, 14), at(27, 9)) else {
            return;
        };
        assert_eq!(clock(then, now), "2026-11-26 14:02");
        assert_eq!(clock(now, now), "09:02");
    }
}
