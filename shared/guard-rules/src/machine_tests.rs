//! The guard's rules, step by step: stopping on a signal or fencing, the kill sequence and
//! its grace, how long the guard waits, and how it ends.

use std::vec::Vec;

use super::*;
use crate::signal::{SIGKILL, SIGTERM};

const MS: Duration = Duration::from_millis(1);

fn commands(commands: Commands) -> Vec<Command> {
    commands.as_slice().to_vec()
}

fn quiet(now: Duration) -> Look {
    Look {
        now,
        stop_signal: false,
        contact: Contact::NotRead,
    }
}

fn signalled(now: Duration) -> Look {
    Look {
        stop_signal: true,
        ..quiet(now)
    }
}

/// A look that read the contact file, touched `age` before the wall clock's `now` (which
/// has nothing to do with the monotonic clock's).
fn stored_ago(now: Duration, age: Duration) -> Look {
    let wall = Duration::from_secs(1_700_000_000);
    Look {
        contact: Contact::StoredAt {
            stored: wall - age,
            now: wall,
        },
        ..quiet(now)
    }
}

const TERMINATE: [Command; 2] = [
    Command::SignalCgroup(SIGTERM),
    Command::SignalGroup(SIGTERM),
];
const KILL: [Command; 2] = [
    Command::SignalCgroup(SIGKILL),
    Command::SignalGroup(SIGKILL),
];
const STOPPING_WAIT: Command = Command::Wait {
    at_most: Some(STOPPING_PAUSE),
};

#[test]
fn without_fencing_the_guard_waits_for_the_job_or_a_signal_and_never_reads_the_contact() {
    let mut guard = Guard::new(2000 * MS, None);
    assert!(!guard.reads_contact());
    assert_eq!(
        commands(guard.look(quiet(Duration::ZERO))),
        [Command::Wait { at_most: None }]
    );
    // A contact file handed in anyway changes nothing.
    let old = stored_ago(Duration::ZERO, Duration::from_secs(3600));
    assert_eq!(commands(guard.look(old)), [Command::Wait { at_most: None }]);
    assert_eq!(guard.state(), State::Watching);
}

#[test]
fn a_stop_signal_terminates_the_group_then_kills_it_after_the_grace() {
    let grace = Duration::from_secs(2);
    let start = Duration::from_secs(50);
    let mut guard = Guard::new(grace, Some(400 * MS));
    assert_eq!(
        commands(guard.look(quiet(start))),
        [Command::Wait {
            at_most: Some(50 * MS)
        }]
    );
    let stopping = commands(guard.look(signalled(start)));
    assert_eq!(stopping, [TERMINATE[0], TERMINATE[1], STOPPING_WAIT]);
    assert_eq!(guard.state(), State::Stopping { since: start });
    // Stopping: the contact file no longer matters.
    assert!(!guard.reads_contact());
    // Within the grace: no second SIGTERM, no SIGKILL, even when fenced meanwhile.
    let later = stored_ago(start + grace / 2, Duration::from_secs(60));
    assert_eq!(commands(guard.look(later)), [STOPPING_WAIT]);
    assert_eq!(
        commands(guard.look(signalled(start + grace - MS))),
        [STOPPING_WAIT]
    );
    // At the grace's end, and at every look after it until the guard dies of its SIGKILL.
    for now in [start + grace, start + grace + 20 * MS] {
        assert_eq!(
            commands(guard.look(quiet(now))),
            [KILL[0], KILL[1], STOPPING_WAIT]
        );
    }
}

#[test]
fn a_contact_file_older_than_the_fence_stops_the_job_announced_once() {
    let fence = 800 * MS;
    let mut guard = Guard::new(1000 * MS, Some(fence));
    assert!(guard.reads_contact());
    let now = Duration::from_secs(7);
    // Exactly the fence is not older than it; nor is a file touched in the future.
    let fresh = [Duration::ZERO, fence];
    for age in fresh {
        let watching = commands(guard.look(stored_ago(now, age)));
        assert_eq!(
            watching,
            [Command::Wait {
                at_most: Some(100 * MS)
            }]
        );
    }
    let future = Look {
        contact: Contact::StoredAt {
            stored: Duration::from_secs(100),
            now: Duration::from_secs(10),
        },
        ..quiet(now)
    };
    assert_eq!(guard.look(future).as_slice().len(), 1);
    assert_eq!(guard.state(), State::Watching);

    let fenced = commands(guard.look(stored_ago(now, fence + MS)));
    assert_eq!(
        fenced,
        [
            Command::AnnounceFence { after_ms: 800 },
            TERMINATE[0],
            TERMINATE[1],
            STOPPING_WAIT
        ]
    );
    let again = commands(guard.look(stored_ago(now + MS, fence * 2)));
    assert_eq!(again, [STOPPING_WAIT]);
}

#[test]
fn a_contact_file_that_cannot_be_read_keeps_the_job() {
    let mut guard = Guard::new(MS, Some(100 * MS));
    for _ in 0..3 {
        let look = Look {
            contact: Contact::Unreadable,
            ..quiet(Duration::from_secs(9))
        };
        assert_eq!(
            commands(guard.look(look)),
            [Command::Wait {
                at_most: Some(20 * MS)
            }]
        );
    }
    assert_eq!(guard.state(), State::Watching);
}

#[test]
fn a_fenced_guard_that_was_also_signalled_still_says_why() {
    let mut guard = Guard::new(MS, Some(100 * MS));
    let look = Look {
        stop_signal: true,
        ..stored_ago(Duration::ZERO, Duration::from_secs(1))
    };
    let first = commands(guard.look(look));
    assert_eq!(
        first.first(),
        Some(&Command::AnnounceFence { after_ms: 100 })
    );
    assert_eq!(first.get(1..3), Some(&TERMINATE[..]));
}

#[test]
fn a_zero_grace_kills_at_once_and_every_step_fits() {
    let mut guard = Guard::new(Duration::ZERO, Some(100 * MS));
    let everything = commands(guard.look(Look {
        stop_signal: true,
        ..stored_ago(Duration::ZERO, Duration::from_secs(1))
    }));
    // The longest step there is: every slot used.
    assert_eq!(
        everything,
        [
            Command::AnnounceFence { after_ms: 100 },
            TERMINATE[0],
            TERMINATE[1],
            KILL[0],
            KILL[1],
            STOPPING_WAIT
        ]
    );
    assert_eq!(everything.len(), MOST_COMMANDS);
}

#[test]
fn a_grace_too_long_for_the_clock_never_comes_due() {
    let mut guard = Guard::new(Duration::MAX, None);
    let now = Duration::from_secs(1);
    assert_eq!(
        commands(guard.look(signalled(now))),
        [TERMINATE[0], TERMINATE[1], STOPPING_WAIT]
    );
    assert_eq!(guard.state(), State::Stopping { since: now });
    assert_eq!(commands(guard.look(quiet(Duration::MAX))), [STOPPING_WAIT]);
}

#[test]
fn the_contact_is_read_every_eighth_of_the_fence_within_20_and_100_ms() {
    let every = |fence_ms: u64| {
        let mut guard = Guard::new(Duration::ZERO, Some(Duration::from_millis(fence_ms)));
        match commands(guard.look(quiet(Duration::ZERO))).as_slice() {
            [Command::Wait { at_most }] => *at_most,
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(every(10_000), Some(100 * MS));
    assert_eq!(every(800), Some(100 * MS));
    assert_eq!(every(400), Some(50 * MS));
    assert_eq!(every(80), Some(20 * MS));
    assert_eq!(every(1), Some(20 * MS));
}

#[test]
fn the_guard_ends_the_way_the_job_ended() {
    let mut guard = Guard::new(MS, None);
    assert_eq!(
        commands(guard.job_ended(JobEnd::Exited(3))),
        [Command::Exit(3)]
    );
    assert_eq!(guard.state(), State::Ended);
    // Nothing more to do once ended.
    assert_eq!(commands(guard.look(signalled(Duration::ZERO))), []);

    let mut guard = Guard::new(MS, None);
    assert_eq!(
        commands(guard.job_ended(JobEnd::Signaled(SIGKILL))),
        [Command::DieBy {
            signal: 9,
            otherwise: 137
        }]
    );
}

#[test]
fn a_job_stopped_without_its_agent_takes_its_cgroup_with_it() {
    let mut guard = Guard::new(Duration::from_secs(5), None);
    guard.look(signalled(Duration::ZERO));
    assert_eq!(
        commands(guard.job_ended(JobEnd::Signaled(SIGTERM))),
        [
            Command::SignalCgroup(SIGKILL),
            Command::DieBy {
                signal: SIGTERM,
                otherwise: 143
            }
        ]
    );
}

#[test]
fn wait_statuses_are_read_as_linux_writes_them() {
    assert_eq!(JobEnd::from_wait_status(0), JobEnd::Exited(0));
    assert_eq!(JobEnd::from_wait_status(42 << 8), JobEnd::Exited(42));
    assert_eq!(JobEnd::from_wait_status(255 << 8), JobEnd::Exited(255));
    assert_eq!(JobEnd::from_wait_status(SIGTERM), JobEnd::Signaled(SIGTERM));
    // A core dump (0x80) is still the signal.
    assert_eq!(JobEnd::from_wait_status(0x80 | 11), JobEnd::Signaled(11));
}

#[test]
fn only_sigkill_reaches_the_guards_own_group_through_the_cgroup() {
    assert!(cgroup_signal_spares_group(SIGTERM));
    assert!(!cgroup_signal_spares_group(SIGKILL));
}

#[test]
fn the_fence_message_reads_as_one_sentence() {
    let message = std::format!("{}{}{}", FENCED_MESSAGE[0], 800, FENCED_MESSAGE[1]);
    assert_eq!(
        message,
        "mgpu: this node has not reached the cluster for longer than 800 ms; stopping the job, \
         which may already run elsewhere (fenced)\n"
    );
}

/// A small deterministic generator (xorshift), so the walk below needs no dependency.
struct Walk(u64);

impl Walk {
    fn below(&mut self, bound: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % bound
    }
}

/// Random walks of looks (time going forward, signals, contact readings of any age): one
/// SIGTERM at most, before any SIGKILL; SIGKILL exactly from the grace's end; the fence
/// announced at most once and only when the contact was older than it; every step ends in a
/// wait.
#[test]
fn random_walks_keep_the_kill_sequence() {
    let mut walk = Walk(0x9e37_79b9_7f4a_7c15);
    for _ in 0..2000 {
        let grace = Duration::from_millis(walk.below(3000));
        let fence = (walk.below(3) > 0).then(|| Duration::from_millis(1 + walk.below(2000)));
        let mut guard = Guard::new(grace, fence);
        let mut now = Duration::from_millis(walk.below(1_000_000));
        let (mut terminated_at, mut announced, mut fenced_once) = (None, false, false);
        for _ in 0..40 {
            now += Duration::from_millis(walk.below(400));
            let age = Duration::from_millis(walk.below(3000));
            let contact = match walk.below(3) {
                0 => Contact::NotRead,
                1 => Contact::Unreadable,
                _ => Contact::StoredAt {
                    stored: Duration::from_secs(1_000_000) - age,
                    now: Duration::from_secs(1_000_000),
                },
            };
            let read = guard.reads_contact();
            fenced_once |= read
                && matches!(contact, Contact::StoredAt { .. })
                && fence.is_some_and(|fence| age > fence);
            let look = Look {
                now,
                stop_signal: walk.below(10) == 0,
                contact,
            };
            let step = commands(guard.look(look));
            assert!(
                matches!(step.last(), Some(Command::Wait { .. })),
                "{step:?}"
            );
            for command in &step {
                match *command {
                    Command::SignalGroup(SIGTERM) => {
                        assert_eq!(terminated_at, None, "a second SIGTERM");
                        terminated_at = Some(now);
                    }
                    Command::SignalGroup(SIGKILL) => {
                        let since = terminated_at.map(|at| now - at);
                        assert!(since.is_some_and(|since| since >= grace), "early SIGKILL");
                    }
                    Command::AnnounceFence { .. } => {
                        assert!(!announced && fenced_once, "{step:?}");
                        announced = true;
                    }
                    _ => {}
                }
            }
            let kill_due = terminated_at.is_some_and(|at| now - at >= grace);
            assert_eq!(step.contains(&Command::SignalGroup(SIGKILL)), kill_due);
        }
    }
}
