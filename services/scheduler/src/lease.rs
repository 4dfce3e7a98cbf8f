//! How long a renewal of the scheduler lease lets this replica act: the one rule the driver
//! and the simulator share, so a stalled scheduler that wakes after a standby took over
//! writes nothing.
//!
//! The lease is a key in a bucket whose entries expire [`LEADER_LEASE_TTL_SECS`] after the
//! server stored them. A renewal *sent* at `t` was stored no earlier than `t`, so the key is
//! ours at least until `t + TTL` on any clock that runs at the server's rate. The monotonic
//! clock keeps counting while the process is stopped (SIGSTOP, a VM paused, a long GC-like
//! stall), which is exactly the case that matters: a replica that resumes past that moment
//! has no lease it can prove, whatever its renewal task has not yet found out, and must not
//! write, acknowledge or assign until a renewal succeeds again or it learns it lost.
//!
//! [`LEADER_LEASE_TTL_SECS`]: mgpu_protocol::subjects::LEADER_LEASE_TTL_SECS

use std::ops::Add;
use std::time::Duration;

use mgpu_protocol::subjects::LEADER_LEASE_TTL_SECS;

/// Taken off the lease's lifetime: the clocks of this host and the server may run at slightly
/// different rates, and the check and the write it guards are not one instant.
pub const SAFETY_MARGIN: Duration = Duration::from_millis(500);

/// How long after a renewal was sent this replica may act on it.
pub const ACTS_FOR: Duration =
    Duration::from_millis(LEADER_LEASE_TTL_SECS * 1000 - SAFETY_MARGIN.as_millis() as u64);

/// Until when a renewal (or the first take) sent at `sent` lets this replica act: any clock
/// that counts while the process is stopped (`Instant`, the simulator's milliseconds).
pub fn acts_until<T: Add<Duration, Output = T>>(sent: T) -> T {
    sent + ACTS_FOR
}

/// Whether a replica whose last confirmed renewal allows acting until `until` may act `now`.
pub fn may_act<T: Ord>(until: T, now: T) -> bool {
    now < until
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_renewal_lets_a_replica_act_for_less_than_the_key_lives() {
        let sent = Duration::from_secs(100);
        let until = acts_until(sent);
        let expires = sent + Duration::from_secs(LEADER_LEASE_TTL_SECS);
        assert!(until < expires);
        assert!(may_act(until, sent + Duration::from_secs(1)));
        // A replica stopped for longer than that, however briefly past it, may not.
        assert!(!may_act(until, until));
        assert!(!may_act(until, expires));
    }
}
