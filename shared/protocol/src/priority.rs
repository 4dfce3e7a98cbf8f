//! Effective priority: the order in which queued jobs are considered.
//!
//! ```text
//! effective = priority × PRIORITY_SCALE
//!           + age_weight × min(hours waiting, age_cap_hours)
//!           − fairshare_weight × (the user's decayed GPU-hours)
//! ```
//!
//! - `priority` is what the user asked for (`--priority`, higher first). Its scale dwarfs the
//!   other terms, so an explicit priority always wins over age and fair share.
//! - Age raises a waiting job by `age_weight` points per hour, up to `age_cap_hours`, so nothing
//!   waits forever behind a stream of newer work.
//! - Usage lowers it: each GPU-second a user's jobs ran counts, halved every `half_life`
//!   (exponential decay), so heavy recent users yield to light ones and the effect fades.
//!
//! The scheduler keeps usage in the cluster bucket (`usage`) and the weights in force
//! (`policy`), so `mgpu queue` shows the same numbers while the scheduler is down.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::Timestamp;

/// One point of `--priority` is worth this much effective priority.
pub const PRIORITY_SCALE: i64 = 1_000_000;

/// Where a job goes when several nodes could take it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PlacementPolicy {
    /// Pack: the node with the fewest free GPUs that fits, keeping whole nodes free for big jobs.
    #[default]
    FillFirst,
    /// Spread: the node with the most free GPUs, spreading load and heat.
    Spread,
}

/// The scheduling policy in force, as configured on the scheduler.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Policy {
    pub placement: PlacementPolicy,
    /// Effective-priority points per hour of waiting.
    pub age_weight: f64,
    /// Age stops counting after this many hours.
    pub age_cap_hours: f64,
    /// Effective-priority points taken per decayed GPU-hour of the user's usage.
    pub fairshare_weight: f64,
    /// Usage halves every this many seconds.
    pub half_life_secs: u64,
    /// Cluster-wide time limit in seconds: jobs without one, or with a longer one, get this.
    pub max_job_time_secs: Option<u64>,
    /// Blocked jobs at the head of the queue that get a backfill reservation, at most.
    pub max_reservations: usize,
    /// Waiting jobs past those that also get an expected start (`mgpu queue`'s START).
    pub max_start_estimates: usize,
    /// Heartbeats a node may miss before it counts as offline and its jobs as lost.
    pub missed_heartbeats: u32,
    /// A job whose node is lost is requeued until it has run this many attempts.
    pub max_attempts: u32,
    /// Multi-node jobs prefer nodes sharing this label's value (agents' `--label rack=r1`);
    /// empty: no topology preference.
    pub topology_label: String,
    /// CPU cores a job that does not say (`--cpus`) gets per GPU it asks for; 0: not counted.
    pub cpus_per_gpu: u32,
    /// Host memory in MiB a job that does not say (`--mem-host`) gets per GPU; 0: no limit.
    pub mem_per_gpu_mib: u64,
    /// Place jobs only on nodes whose agent isolates GPUs (a job opens only its own).
    pub require_gpu_isolation: bool,
    /// Finished jobs leave the live bucket for the history stream this long after they ended.
    pub keep_finished_secs: u64,
    /// Every job's output goes to its owner's private subject, as with `mgpu submit --private`.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub private_output: bool,
    /// Quality-of-service classes (`[qos.<name>]`); empty: `normal` alone.
    #[serde(default, skip_serializing_if = "crate::qos::QosClasses::is_empty")]
    pub qos: crate::qos::QosClasses,
    /// Idle GPUs reclaimed (`[idle]`); None: idleness is only measured and accounted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle: Option<crate::idle::IdlePolicy>,
    /// Caps on bookings and how windows are kept (`[reservations]`).
    #[serde(default)]
    pub reservations: crate::reservation::ReservationPolicy,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            placement: PlacementPolicy::FillFirst,
            age_weight: 100.0,
            age_cap_hours: 24.0 * 7.0,
            fairshare_weight: 100.0,
            half_life_secs: 24 * 3600,
            max_job_time_secs: None,
            max_reservations: 16,
            max_start_estimates: 256,
            missed_heartbeats: crate::node::MISSED_HEARTBEATS_OFFLINE,
            max_attempts: 3,
            topology_label: "rack".into(),
            cpus_per_gpu: 0,
            mem_per_gpu_mib: 0,
            require_gpu_isolation: false,
            keep_finished_secs: 24 * 3600,
            private_output: false,
            qos: crate::qos::QosClasses::default(),
            idle: None,
            reservations: crate::reservation::ReservationPolicy::default(),
        }
    }
}

/// Decayed GPU-seconds of one user, as of a moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Usage {
    pub gpu_seconds: f64,
    pub as_of: Option<Timestamp>,
}

impl Usage {
    /// The value decayed to `now`.
    pub fn at(&self, now: Timestamp, half_life_secs: u64) -> f64 {
        let Some(as_of) = self.as_of else {
            return self.gpu_seconds;
        };
        let elapsed = (now - as_of).num_milliseconds().max(0) as f64 / 1000.0;
        self.gpu_seconds * decay(elapsed, half_life_secs)
    }

    /// Adds `gpu_seconds` of use at `now`.
    pub fn add(&mut self, gpu_seconds: f64, now: Timestamp, half_life_secs: u64) {
        self.gpu_seconds = self.at(now, half_life_secs) + gpu_seconds.max(0.0);
        self.as_of = Some(now);
    }
}

fn decay(elapsed_secs: f64, half_life_secs: u64) -> f64 {
    if half_life_secs == 0 {
        return 0.0;
    }
    0.5f64.powf(elapsed_secs / half_life_secs as f64)
}

/// Every user's usage: the value under `usage` in the cluster bucket.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct UsageBook {
    pub users: BTreeMap<String, Usage>,
}

impl UsageBook {
    pub fn gpu_hours(&self, user: &str, now: Timestamp, half_life_secs: u64) -> f64 {
        self.users
            .get(user)
            .map(|u| u.at(now, half_life_secs) / 3600.0)
            .unwrap_or(0.0)
    }

    pub fn add(&mut self, user: &str, gpu_seconds: f64, now: Timestamp, half_life_secs: u64) {
        self.users
            .entry(user.to_owned())
            .or_default()
            .add(gpu_seconds, now, half_life_secs);
    }
}

/// The effective priority of a job that asked for `priority` and has waited since `queued_at`.
pub fn effective_priority(
    priority: i32,
    queued_at: Timestamp,
    user_gpu_hours: f64,
    policy: &Policy,
    now: Timestamp,
) -> i64 {
    effective_priority_after(
        priority,
        now.timestamp() - queued_at.timestamp(),
        user_gpu_hours,
        policy,
    )
}

/// A job's own priority with its quality-of-service class's added (`--priority` and `--qos`).
pub fn base_priority(spec: &crate::job::JobSpec, policy: &Policy) -> i32 {
    spec.priority
        .saturating_add(policy.qos.priority_of(spec.qos.as_deref()))
}

/// [`effective_priority`] for a job that has waited `waited_secs`: the scheduler computes it
/// for every waiting job on every pass, and whole seconds are all the formula uses (calendar
/// arithmetic on timestamps was half of a pass over 100 000 jobs).
pub fn effective_priority_after(
    priority: i32,
    waited_secs: i64,
    user_gpu_hours: f64,
    policy: &Policy,
) -> i64 {
    let waited_hours = waited_secs.max(0) as f64 / 3600.0;
    let age = policy.age_weight * waited_hours.min(policy.age_cap_hours);
    let share = policy.fairshare_weight * user_gpu_hours;
    // Saturating: usage or weights read from the cluster bucket may be absurd (`as` already
    // saturates the float; a plain `+` could still overflow).
    i64::from(priority)
        .saturating_mul(PRIORITY_SCALE)
        .saturating_add((age - share).round() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Duration;

    #[test]
    fn usage_halves_every_half_life() {
        let now = crate::now();
        let mut usage = Usage::default();
        usage.add(7200.0, now, 3600);
        let later = now + Duration::seconds(3600);
        assert!((usage.at(later, 3600) - 3600.0).abs() < 1.0);
    }

    #[test]
    fn explicit_priority_beats_age_and_usage_which_trade_off() {
        let policy = Policy::default();
        let now = crate::now();
        let old = now - Duration::hours(100);
        let high_new = effective_priority(1, now, 500.0, &policy, now);
        let low_old = effective_priority(0, old, 0.0, &policy, now);
        assert!(high_new > low_old);
        let heavy = effective_priority(0, now, 10.0, &policy, now);
        let light = effective_priority(0, now, 0.0, &policy, now);
        assert!(light > heavy);
        let older = effective_priority(0, now - Duration::hours(2), 0.0, &policy, now);
        assert!(older > light);
    }
}
