//! What the liveness checks remember between runs: when they last looked (a long gap means
//! the scheduler's own loop stalled, which is not the nodes' silence), when they last sent
//! possibly lost messages again, and which kills went out when (so a heartbeat a second does
//! not repeat a kill a second). Times are readings of a monotonic clock the driver hands in
//! (`Tick::monotonic`), as durations since some fixed start.

use std::collections::HashMap;
use std::time::Duration;

use mgpu_protocol::Timestamp;
use mgpu_protocol::ids::JobId;

/// A kill for a stale attempt is repeated at most this often while heartbeats still list it.
pub(crate) const KILL_REPEAT: Duration = Duration::from_secs(5);
/// The liveness check runs every second; a longer gap means this loop was stalled.
const LIVENESS_STALL: Duration = Duration::from_secs(3);
/// How often assignments and kills that may have been lost are sent again.
pub(crate) const REPAIR_EVERY: Duration = Duration::from_secs(5);

/// One attempt of one job.
pub(crate) type AttemptKey = (JobId, u32);

#[derive(Default)]
pub(crate) struct LivenessMemory {
    /// When liveness was last checked.
    last_check: Option<Duration>,
    /// When possibly lost assignments and kills were last sent again.
    last_repair: Option<Duration>,
    /// The earliest moment a job held for fencing may start (the pass sets it).
    pub(crate) next_release: Option<Timestamp>,
    /// The same on the monotonic clock, for jobs held by [`LivenessMemory::fenced_until`].
    pub(crate) next_release_monotonic: Option<Duration>,
    /// When each node's latest heartbeat was heard (at the latest tick before it).
    heard_from: HashMap<String, Duration>,
    /// Jobs requeued off a lost node, and when its agent surely stopped them, measured from
    /// when its last heartbeat was heard: the wall-clock `not_before` comes from the node's
    /// clock and ours, and a step of either would make it early.
    fenced_until: HashMap<JobId, Duration>,
    /// Stale attempts we told a node to kill, and when.
    kills_sent: HashMap<AttemptKey, Duration>,
    /// How many `kills_sent` kept at its last pruning.
    kills_kept: usize,
    /// When a cancel's or preemption's kill was last repeated, by attempt.
    stops_sent: HashMap<AttemptKey, Duration>,
}

/// Ticks come every second: a heartbeat heard at a tick's reading may have come up to this
/// much later.
const TICK: Duration = Duration::from_secs(1);

impl LivenessMemory {
    /// Notes that `node`'s heartbeat was heard at `now` (the latest tick's reading).
    pub(crate) fn heard(&mut self, node: &str, now: Duration) {
        match self.heard_from.get_mut(node) {
            Some(at) => *at = now,
            None => {
                self.heard_from.insert(node.to_owned(), now);
            }
        }
    }

    /// Holds `job`, requeued off a node whose agent fences itself `fence_span` after the
    /// heartbeat last heard from it, until that has surely passed on our monotonic clock;
    /// `since` instead of that heartbeat when the node may have heard from us later (it
    /// may have taken the job's assignment after its last heartbeat, up to now).
    pub(crate) fn hold_until_fenced(
        &mut self,
        job: JobId,
        node: &str,
        fence_span: Duration,
        since: Option<Duration>,
    ) {
        if let Some(from) = since.or_else(|| self.heard_from.get(node).copied()) {
            self.fenced_until.insert(job, from + TICK + fence_span);
        }
    }

    /// Whether `job` is still held for its lost node's fence at `now`.
    pub(crate) fn fencing(&self, job: &JobId, now: Duration) -> bool {
        self.fenced_until.get(job).is_some_and(|until| *until > now)
    }

    /// Forgets the holds that are over at `now`; the earliest one left, if any.
    pub(crate) fn prune_fenced(&mut self, now: Duration) -> Option<Duration> {
        self.fenced_until.retain(|_, until| *until > now);
        self.fenced_until.values().min().copied()
    }

    /// Notes a check at `now`; true when the previous one is so long ago that this loop was
    /// stalled in between.
    pub(crate) fn stalled(&mut self, now: Duration) -> bool {
        self.last_check
            .replace(now)
            .is_some_and(|last| now.saturating_sub(last) > LIVENESS_STALL)
    }

    /// Whether lost messages are due to be sent again at `now` (noted as done if so).
    pub(crate) fn repair_due(&mut self, now: Duration) -> bool {
        let due = self
            .last_repair
            .is_none_or(|last| now.saturating_sub(last) >= REPAIR_EVERY);
        if due {
            self.last_repair = Some(now);
        }
        due
    }

    /// Whether a kill for the stale attempt `key` should go out at `now`: not when one went
    /// out less than [`KILL_REPEAT`] ago.
    pub(crate) fn kill_due(&self, key: &AttemptKey, now: Duration) -> bool {
        self.kills_sent
            .get(key)
            .is_none_or(|sent| now.saturating_sub(*sent) >= KILL_REPEAT)
    }

    /// Notes a kill for `key` sent at `now`. The memory is pruned once it doubled since the
    /// last pruning: this runs for every heartbeat, and a thousand nodes heartbeat several
    /// hundred times a second.
    pub(crate) fn kill_sent(&mut self, key: AttemptKey, now: Duration) {
        self.kills_sent.insert(key, now);
        if self.kills_sent.len() > 2 * self.kills_kept.max(64) {
            self.kills_sent
                .retain(|_, sent| now.saturating_sub(*sent) < KILL_REPEAT * 12);
            self.kills_kept = self.kills_sent.len();
        }
    }

    /// Whether a cancel's or preemption's kill for `key` should be repeated at `now` (noted
    /// as repeated if so).
    pub(crate) fn stop_due(&mut self, key: AttemptKey, now: Duration) -> bool {
        let due = self
            .stops_sent
            .get(&key)
            .is_none_or(|sent| now.saturating_sub(*sent) >= REPAIR_EVERY);
        if due {
            self.stops_sent.insert(key, now);
        }
        due
    }

    /// Forgets repeated stops of jobs for which `still_running` is false.
    pub(crate) fn forget_stops(&mut self, still_running: impl Fn(&JobId) -> bool) {
        self.stops_sent.retain(|(job, _), _| still_running(job));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gap_of_more_than_three_seconds_between_checks_is_a_stall() {
        let mut watch = LivenessMemory::default();
        let start = Duration::from_secs(1_000);
        assert!(
            !watch.stalled(start),
            "the first check has nothing to compare"
        );
        assert!(!watch.stalled(start + Duration::from_secs(1)));
        assert!(watch.stalled(start + Duration::from_secs(5)));
        assert!(!watch.stalled(start + Duration::from_secs(6)));
    }

    #[test]
    fn a_stale_attempt_is_killed_again_only_after_five_seconds() {
        let mut watch = LivenessMemory::default();
        let key = (JobId::random(), 2);
        let start = Duration::from_secs(1_000);
        assert!(watch.kill_due(&key, start));
        watch.kill_sent(key.clone(), start);
        assert!(!watch.kill_due(&key, start + Duration::from_secs(4)));
        assert!(watch.kill_due(&key, start + KILL_REPEAT));
        assert!(
            watch.kill_due(&(key.0.clone(), 3), start),
            "another attempt is another kill"
        );
    }

    #[test]
    fn old_kills_are_pruned_and_recent_ones_kept() {
        let mut watch = LivenessMemory::default();
        let start = Duration::from_secs(1_000);
        let recent = (JobId::random(), 1);
        for _ in 0..200 {
            watch.kill_sent((JobId::random(), 1), start);
        }
        let later = start + KILL_REPEAT * 13;
        watch.kill_sent(recent.clone(), later);
        for _ in 0..200 {
            watch.kill_sent((JobId::random(), 1), later);
        }
        assert!(
            watch.kills_sent.len() < 300,
            "{} kept",
            watch.kills_sent.len()
        );
        assert!(!watch.kill_due(&recent, later));
    }

    #[test]
    fn stops_and_repairs_repeat_every_five_seconds() {
        let mut watch = LivenessMemory::default();
        let key = (JobId::random(), 1);
        let start = Duration::from_secs(1_000);
        assert!(watch.stop_due(key.clone(), start));
        assert!(!watch.stop_due(key.clone(), start + Duration::from_secs(1)));
        assert!(watch.stop_due(key.clone(), start + REPAIR_EVERY));
        watch.forget_stops(|_| false);
        assert!(watch.stop_due(key, start + REPAIR_EVERY));
        assert!(watch.repair_due(start));
        assert!(!watch.repair_due(start + Duration::from_secs(2)));
        assert!(watch.repair_due(start + REPAIR_EVERY));
    }

    #[test]
    fn a_job_off_a_lost_node_is_held_for_its_fence_on_the_monotonic_clock() {
        let mut watch = LivenessMemory::default();
        let job: JobId = format!("{:032x}", 7)
            .parse()
            .unwrap_or_else(|e| panic!("{e}"));
        let heard = Duration::from_secs(100);
        watch.heard("node1", heard);
        watch.hold_until_fenced(job.clone(), "node1", Duration::from_secs(20), None);
        // Heard at a tick's reading: it may have come up to a tick later.
        let until = heard + TICK + Duration::from_secs(20);
        assert!(watch.fencing(&job, until - Duration::from_millis(1)));
        assert_eq!(watch.prune_fenced(heard), Some(until));
        assert!(!watch.fencing(&job, until));
        assert_eq!(watch.prune_fenced(until), None);
        // A node never heard from holds nothing here (its wall-clock `not_before` does).
        watch.hold_until_fenced(job.clone(), "node9", Duration::from_secs(20), None);
        assert!(!watch.fencing(&job, heard));
        // Assigned after the node's last heartbeat: from now.
        let now = heard + Duration::from_secs(30);
        watch.hold_until_fenced(job.clone(), "node9", Duration::from_secs(20), Some(now));
        assert!(watch.fencing(&job, now + Duration::from_secs(20)));
    }
}
