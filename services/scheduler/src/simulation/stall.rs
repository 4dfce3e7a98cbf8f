//! The active scheduler stalled (SIGSTOP, a paused VM): it neither reads nor writes while its
//! lease key ages in the bucket. A stall shorter than the key's life ends with the scheduler
//! going on as before; a longer one lets a standby take the key and load the store, and the
//! stalled replica wakes holding a machine that no longer describes the cluster. What it may
//! do then is [`crate::lease`]'s rule, the driver's too: its last renewal no longer covers
//! the moment, so it writes nothing and steps down when its renewal finds the key taken.
//!
//! `Options::acts_without_lease` turns that rule off, so a test can show what the checks see
//! when a woken replica acts on the requests it pulls (records a submission and acknowledges
//! it, and the active machine never learns of the job).

use std::time::Duration;

use mgpu_protocol::subjects::LEADER_LEASE_TTL_SECS;

use super::world::{Event, Stalled, World};
use crate::lease;
use crate::machine::messages::Input;

/// How often the active scheduler renews its lease, and how often a standby tries to take it.
const RENEW_EVERY_MS: u64 = 1_000;
const STANDBY_TRIES_EVERY_MS: u64 = 500;

impl World {
    /// The active scheduler stops for `stalled_for` ms: a standby tries to take the lease once
    /// the key expired, and the stalled one wakes at the end.
    pub fn stall_scheduler(&mut self, stalled_for: u64) {
        let Some(scheduler) = self.scheduler.take() else {
            return;
        };
        let renewed = self.now.saturating_sub(self.rng.below(RENEW_EVERY_MS));
        let key_expires = renewed + LEADER_LEASE_TTL_SECS * 1000;
        let takeover = key_expires + self.rng.below(STANDBY_TRIES_EVERY_MS);
        self.stall_generation += 1;
        let generation = self.stall_generation;
        self.stalled = Some(Stalled {
            scheduler,
            generation,
            acts_until: lease::acts_until(Duration::from_millis(renewed)),
            superseded: false,
        });
        self.slice_timer = None;
        self.note(format!("the scheduler stalls for {stalled_for} ms"));
        self.at(
            takeover.saturating_sub(self.now),
            Event::StandbyTakesOver(generation),
        );
        self.at(stalled_for, Event::SchedulerWakes(generation));
    }

    /// A standby finds the stalled scheduler's key expired, takes it, and loads the store.
    pub(super) fn standby_takes_over(&mut self, generation: u64) {
        let Some(stalled) = self.stalled.as_mut() else {
            return;
        };
        if stalled.generation != generation || self.scheduler.is_some() {
            return;
        }
        stalled.superseded = true;
        self.note("a standby takes the stalled scheduler's lease".into());
        self.start_scheduler();
    }

    /// The stalled scheduler wakes: it goes on if nobody took its lease (a renewal confirms
    /// it, or takes the expired key again); otherwise it may not act and steps down.
    pub(super) fn stalled_scheduler_wakes(&mut self, generation: u64) {
        let Some(stalled) = self.stalled.take_if(|s| s.generation == generation) else {
            return;
        };
        let now = Duration::from_millis(self.now);
        if !stalled.superseded {
            self.note("the stalled scheduler wakes and renews its lease: it goes on".into());
            self.scheduler = Some(stalled.scheduler);
            // The latest heartbeats, read while it was stopped, then what waits.
            let beats: Vec<_> = self.store.heartbeats.values().cloned().collect();
            for beat in beats {
                self.feed(Input::Heartbeat(Box::new(beat)));
            }
            self.pump();
            self.tick();
            return;
        }
        // A standby takes the key only once it expired, later than the stalled one's last
        // renewal lets it act: only a driver without the gate acts here.
        if !lease::may_act(stalled.acts_until, now) && !self.options.acts_without_lease {
            self.note(
                "the stalled scheduler wakes past its lease: it writes nothing, and steps down when its renewal finds the key taken"
                    .into(),
            );
            return;
        }
        self.note("the stalled scheduler wakes past its lease and acts all the same".into());
        let active = self.scheduler.replace(stalled.scheduler);
        let slice_timer = self.slice_timer;
        self.pump();
        self.scheduler = active;
        self.slice_timer = slice_timer;
    }
}
