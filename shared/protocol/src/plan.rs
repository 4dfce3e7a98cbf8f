//! When the scheduler expects waiting jobs to start: the snapshot it stores under
//! [`crate::subjects::PLAN_KEY`] in the cluster bucket after its passes (at most every few
//! seconds), which `mgpu queue` and `mgpu show` read, also while the scheduler is down.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::Timestamp;
use crate::ids::JobId;

/// The expected starts of the last pass that changed them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanSnapshot {
    /// When the pass that worked them out ran.
    pub computed_at: Option<Timestamp>,
    /// The waiting jobs the pass could date, by id; a waiting job not listed: unknown.
    pub jobs: BTreeMap<JobId, ExpectedStart>,
}

/// When one waiting job is expected to start, and what that assumes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExpectedStart {
    /// When the GPUs it counts on are all free, if every running job ends by its time limit;
    /// None: a job on them has no time limit.
    pub at: Option<Timestamp>,
    /// The nodes of those GPUs.
    pub nodes: Vec<String>,
    /// Those GPUs are reserved for it: jobs behind it start there only if they end first.
    pub reserved: bool,
}

/// How a waiting job's expected start reads in a listing: `now`, `~14:20` (today),
/// `~Nov 28 09:00` (later) or `unknown`. Times are shown in `zone`.
pub fn start_cell<Tz: chrono::TimeZone>(
    start: Option<&ExpectedStart>,
    now: Timestamp,
    zone: &Tz,
) -> String
where
    Tz::Offset: std::fmt::Display,
{
    match start.and_then(|s| s.at) {
        None => "unknown".to_owned(),
        Some(at) if at <= now => "now".to_owned(),
        Some(at) => {
            let local = at.with_timezone(zone);
            if local.date_naive() == now.with_timezone(zone).date_naive() {
                format!("~{}", local.format("%H:%M"))
            } else {
                format!("~{}", local.format("%b %-d %H:%M"))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{TimeZone, Utc};

    fn at(h: u32, m: u32, day: u32) -> Timestamp {
        Utc.with_ymd_and_hms(2026, 11, day, h, m, 0)
            .single()
            .unwrap_or_default()
    }

    #[test]
    fn cells_say_now_today_later_and_unknown() {
        let now = at(12, 0, 27);
        let start = |when: Option<Timestamp>| ExpectedStart {
            at: when,
            nodes: vec!["n1".into()],
            reserved: true,
        };
        assert_eq!(start_cell(None, now, &Utc), "unknown");
        assert_eq!(start_cell(Some(&start(None)), now, &Utc), "unknown");
        assert_eq!(start_cell(Some(&start(Some(now))), now, &Utc), "now");
        assert_eq!(
            start_cell(Some(&start(Some(at(14, 20, 27)))), now, &Utc),
            "~14:20"
        );
        assert_eq!(
            start_cell(Some(&start(Some(at(9, 5, 28)))), now, &Utc),
            "~Nov 28 09:05"
        );
    }

    #[test]
    fn a_snapshot_round_trips_with_ids_as_keys() {
        let mut snapshot = PlanSnapshot {
            computed_at: Some(at(12, 0, 27)),
            ..PlanSnapshot::default()
        };
        snapshot.jobs.insert(
            JobId::random(),
            ExpectedStart {
                at: None,
                nodes: vec![],
                reserved: false,
            },
        );
        let text = serde_json::to_string(&snapshot).unwrap_or_default();
        let back: PlanSnapshot = serde_json::from_str(&text).unwrap_or_default();
        assert_eq!(back, snapshot);
    }
}
