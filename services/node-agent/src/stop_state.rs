//! The pure rules for stopping one running job attempt: [`StopState::step`] takes where its
//! stopping stands and what happened (its time limit, the warning before it, a stop request
//! of the running table, a grace that ran out) and returns the new state and the effect to
//! carry out (warn the job, SIGTERM, SIGKILL). `stopping.rs` feeds it the live process's
//! events and carries the effects out.
//!
//! A stop request without warning (a cancel, a requeue, the agent shutting down, fencing)
//! sends SIGTERM at once, SIGKILL after the kill grace. One with a warning (preemption's
//! handshake) warns the job first and sends SIGTERM only when the warning's grace is over; the
//! time limit and a later stop that will not wait cut that grace short. A job that asked for
//! `--signal SIG@SECONDS` is warned that long before its time limit, once.

use std::time::Duration;

use mgpu_protocol::stop::{
    DEFAULT_SIGNAL, MAX_WARNING_SECS, StopCause, StopSignal, StopWarning, signal_number,
};
use tokio::time::Instant;

use crate::running::{StopReason, StopRequest};

/// Why the agent stopped a job; all false when it ended by itself.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stopped {
    pub cancelled: bool,
    pub timed_out: bool,
    /// Stopped so that it goes back to the queue (a Kill with `requeue`).
    pub preempted: bool,
    /// Stopped by the agent itself (shutdown, fencing): the scheduler treats it like a job
    /// whose node was lost.
    pub lost: bool,
}

impl Stopped {
    /// What a stop request for `reason` makes of the job's end.
    fn by(reason: StopReason) -> Self {
        Stopped {
            cancelled: reason == StopReason::Cancelled,
            timed_out: false,
            preempted: reason == StopReason::Requeued,
            lost: matches!(reason, StopReason::AgentShutdown | StopReason::Fenced),
        }
    }
}

/// Where the stopping of a job stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Running,
    /// Warned of a stop (its signal, its stop file): it may end by itself until `term_at`,
    /// when SIGTERM is due (None: a grace too long to ever end).
    Warned {
        term_at: Option<Instant>,
    },
    /// SIGTERM sent; SIGKILL is due at `kill_at` (None: a kill grace too long to ever end).
    Terminating {
        kill_at: Option<Instant>,
    },
    /// SIGKILL sent; only the exit is left to wait for.
    Killed,
}

/// What happened to a running job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// Its `--signal`'s seconds before its time limit: `signal` is the one it asked for.
    LimitWarning {
        signal: i32,
    },
    TimeLimit,
    Stop(StopRequest),
    /// The grace a warning gave is over.
    TermDue,
    KillDue,
}

/// What a transition asks for: a warning (the cause in the stop file, `signal` to the job's
/// processes), or a signal to the job's process group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Effect {
    Warn { signal: i32, cause: StopCause },
    Terminate,
    Kill,
}

/// The state of one job's stopping: its phase, why it was stopped, and whether the warning
/// before its time limit was sent (it goes once).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StopState {
    pub phase: Phase,
    pub stopped: Stopped,
    pub limit_warned: bool,
}

impl StopState {
    pub const RUNNING: StopState = StopState {
        phase: Phase::Running,
        stopped: Stopped {
            cancelled: false,
            timed_out: false,
            preempted: false,
            lost: false,
        },
        limit_warned: false,
    };

    /// The first time limit or stop request stops the job (later ones change nothing: the
    /// first reason is the one reported): at once, or warned first when the request carries a
    /// warning, with SIGTERM once its grace is over. The time limit, and a stop that will not
    /// wait, cut a grace short. SIGKILL follows SIGTERM once, when due.
    pub fn step(
        self,
        event: Event,
        now: Instant,
        kill_grace: Duration,
    ) -> (StopState, Option<Effect>) {
        // Checked: `Instant + Duration` panics on overflow, and the grace is the operator's.
        let terminating = StopState {
            phase: Phase::Terminating {
                kill_at: now.checked_add(kill_grace),
            },
            ..self
        };
        match (self.phase, event) {
            (Phase::Running, Event::LimitWarning { signal }) if !self.limit_warned => {
                let next = StopState {
                    limit_warned: true,
                    ..self
                };
                let cause = StopCause::TimeLimit;
                (next, Some(Effect::Warn { signal, cause }))
            }
            (Phase::Running, Event::TimeLimit) => {
                let stopped = Stopped {
                    timed_out: true,
                    ..self.stopped
                };
                (
                    StopState {
                        stopped,
                        ..terminating
                    },
                    Some(Effect::Terminate),
                )
            }
            (Phase::Running, Event::Stop(request)) => {
                let stopped = Stopped::by(request.reason);
                match request.warning.map(bounded) {
                    Some(warning) => {
                        let grace = Duration::from_secs(warning.grace_secs);
                        let next = StopState {
                            phase: Phase::Warned {
                                term_at: now.checked_add(grace),
                            },
                            stopped,
                            ..self
                        };
                        let (signal, cause) = (warning.signal, warning.cause);
                        (next, Some(Effect::Warn { signal, cause }))
                    }
                    None => (
                        StopState {
                            stopped,
                            ..terminating
                        },
                        Some(Effect::Terminate),
                    ),
                }
            }
            (Phase::Warned { .. }, Event::TimeLimit | Event::TermDue) => {
                (terminating, Some(Effect::Terminate))
            }
            (Phase::Warned { .. }, Event::Stop(request)) if request.warning.is_none() => {
                (terminating, Some(Effect::Terminate))
            }
            (Phase::Terminating { .. }, Event::KillDue) => {
                let next = StopState {
                    phase: Phase::Killed,
                    ..self
                };
                (next, Some(Effect::Kill))
            }
            _ => (self, None),
        }
    }

    /// Whether stop requests and the time limit still matter: nothing was signalled yet but
    /// perhaps a warning.
    pub fn before_terminate(&self) -> bool {
        matches!(self.phase, Phase::Running | Phase::Warned { .. })
    }

    pub fn running(&self) -> bool {
        self.phase == Phase::Running
    }

    /// When SIGTERM is due after a warning, while it is still to be sent.
    pub fn term_at(&self) -> Option<Instant> {
        match self.phase {
            Phase::Warned { term_at } => term_at,
            _ => None,
        }
    }

    pub fn warned(&self) -> bool {
        matches!(self.phase, Phase::Warned { .. })
    }

    /// When SIGKILL is due, while it is still to be sent.
    pub fn kill_at(&self) -> Option<Instant> {
        match self.phase {
            Phase::Terminating { kill_at } => kill_at,
            Phase::Running | Phase::Warned { .. } | Phase::Killed => None,
        }
    }

    pub fn terminating(&self) -> bool {
        matches!(self.phase, Phase::Terminating { .. })
    }
}

/// A warning as the agent carries it out: a signal a job may be warned with (else SIGUSR1:
/// never SIGKILL or SIGSTOP, which no job can catch), and a grace of at most
/// [`MAX_WARNING_SECS`].
pub fn bounded(warning: StopWarning) -> StopWarning {
    let signal = if signal_number(&warning.signal.to_string()) == Some(warning.signal) {
        warning.signal
    } else {
        DEFAULT_SIGNAL
    };
    StopWarning {
        signal,
        grace_secs: warning.grace_secs.min(MAX_WARNING_SECS),
        cause: warning.cause,
    }
}

/// When the warning before the time limit is due, and its signal: `--signal`'s seconds before
/// the limit, for a job that asked for a time (`USR1` alone warns of preemption only).
pub fn limit_warning(
    signal: Option<StopSignal>,
    time_limit_at: Option<Instant>,
) -> Option<(Instant, i32)> {
    let signal = signal.filter(|s| s.seconds > 0)?;
    let at = time_limit_at?.checked_sub(Duration::from_secs(signal.seconds))?;
    Some((at, signal.signal))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GRACE: Duration = Duration::from_secs(5);

    #[test]
    fn each_stop_reason_is_reported_as_what_it_was() {
        let now = Instant::now();
        let stopped = |reason| {
            StopState::RUNNING
                .step(Event::Stop(StopRequest::now(reason)), now, GRACE)
                .0
                .stopped
        };
        let cancelled = stopped(StopReason::Cancelled);
        assert!(cancelled.cancelled && !cancelled.preempted && !cancelled.lost);
        let requeued = stopped(StopReason::Requeued);
        assert!(requeued.preempted && !requeued.cancelled && !requeued.lost);
        assert!(stopped(StopReason::AgentShutdown).lost);
        let fenced = stopped(StopReason::Fenced);
        assert!(fenced.lost && !fenced.cancelled && !fenced.timed_out);
    }

    #[test]
    fn the_first_reason_stops_the_job_and_sigkill_follows_once() {
        let now = Instant::now();
        let (timed_out, effect) = StopState::RUNNING.step(Event::TimeLimit, now, GRACE);
        assert_eq!(effect, Some(Effect::Terminate));
        assert_eq!(
            timed_out.phase,
            Phase::Terminating {
                kill_at: Some(now + GRACE)
            }
        );
        assert!(timed_out.stopped.timed_out);
        // A cancel during the grace neither signals again nor changes what is reported.
        assert_eq!(
            timed_out.step(
                Event::Stop(StopRequest::now(StopReason::Cancelled)),
                now,
                GRACE
            ),
            (timed_out, None)
        );
        let (killed, effect) = timed_out.step(Event::KillDue, now + GRACE, GRACE);
        assert_eq!(effect, Some(Effect::Kill));
        assert_eq!(killed.phase, Phase::Killed);
        assert_eq!(killed.stopped, timed_out.stopped);
        assert_eq!(killed.step(Event::KillDue, now, GRACE), (killed, None));
        assert_eq!(killed.kill_at(), None);
        // Nothing is killed that was never terminated.
        assert_eq!(
            StopState::RUNNING.step(Event::KillDue, now, GRACE),
            (StopState::RUNNING, None)
        );
    }

    #[test]
    fn a_kill_grace_too_long_for_the_clock_never_comes_due() {
        let now = Instant::now();
        let (state, effect) = StopState::RUNNING.step(Event::TimeLimit, now, Duration::MAX);
        assert_eq!(effect, Some(Effect::Terminate));
        assert_eq!(state.phase, Phase::Terminating { kill_at: None });
        assert_eq!(state.kill_at(), None);
    }

    fn warned_request(reason: StopReason, grace_secs: u64) -> StopRequest {
        StopRequest {
            reason,
            warning: Some(StopWarning {
                signal: 10,
                grace_secs,
                cause: StopCause::Preempted,
            }),
        }
    }

    #[test]
    fn a_warned_kill_warns_then_terminates_when_its_grace_is_over() {
        let now = Instant::now();
        let request = warned_request(StopReason::Requeued, 30);
        let (warned, effect) = StopState::RUNNING.step(Event::Stop(request), now, GRACE);
        assert_eq!(
            effect,
            Some(Effect::Warn {
                signal: 10,
                cause: StopCause::Preempted
            })
        );
        let term_at = now + Duration::from_secs(30);
        assert_eq!(
            warned.phase,
            Phase::Warned {
                term_at: Some(term_at)
            }
        );
        assert!(warned.stopped.preempted, "reported as the kill said");
        assert_eq!(warned.term_at(), Some(term_at));
        assert_eq!(warned.kill_at(), None, "nothing to kill before SIGTERM");
        // Another warned request or the time-limit warning during the grace: nothing new.
        assert_eq!(
            warned.step(Event::Stop(request), now, GRACE),
            (warned, None)
        );
        let limit_warning = Event::LimitWarning { signal: 12 };
        assert_eq!(warned.step(limit_warning, now, GRACE), (warned, None));
        let (terminating, effect) = warned.step(Event::TermDue, term_at, GRACE);
        assert_eq!(effect, Some(Effect::Terminate));
        assert_eq!(
            terminating.phase,
            Phase::Terminating {
                kill_at: Some(term_at + GRACE)
            }
        );
        assert_eq!(terminating.stopped, warned.stopped);
        let (killed, effect) = terminating.step(Event::KillDue, term_at + GRACE, GRACE);
        assert_eq!((killed.phase, effect), (Phase::Killed, Some(Effect::Kill)));
    }

    #[test]
    fn the_time_limit_and_a_stop_that_will_not_wait_cut_a_grace_short() {
        let now = Instant::now();
        let request = warned_request(StopReason::Cancelled, 600);
        let (warned, _) = StopState::RUNNING.step(Event::Stop(request), now, GRACE);
        for event in [
            Event::TimeLimit,
            Event::Stop(StopRequest::now(StopReason::Cancelled)),
        ] {
            let (next, effect) = warned.step(event, now, GRACE);
            assert_eq!(effect, Some(Effect::Terminate), "{event:?}");
            assert!(
                next.stopped.cancelled && !next.stopped.timed_out,
                "{event:?}"
            );
        }
    }

    #[test]
    fn a_warning_is_bounded_and_never_uncatchable() {
        let now = Instant::now();
        let mut request = warned_request(StopReason::Requeued, u64::MAX);
        if let Some(warning) = request.warning.as_mut() {
            warning.signal = 9;
        }
        let (warned, effect) = StopState::RUNNING.step(Event::Stop(request), now, GRACE);
        assert_eq!(
            effect,
            Some(Effect::Warn {
                signal: DEFAULT_SIGNAL,
                cause: StopCause::Preempted
            })
        );
        let most = now + Duration::from_secs(MAX_WARNING_SECS);
        assert_eq!(warned.term_at(), Some(most));
        // No grace: SIGTERM is due at once.
        let (warned, _) = StopState::RUNNING.step(
            Event::Stop(warned_request(StopReason::Requeued, 0)),
            now,
            GRACE,
        );
        assert_eq!(warned.term_at(), Some(now));
    }

    #[test]
    fn the_time_limit_warning_goes_once_and_the_limit_still_stops_the_job() {
        let now = Instant::now();
        let event = Event::LimitWarning { signal: 10 };
        let (warned, effect) = StopState::RUNNING.step(event, now, GRACE);
        assert_eq!(
            effect,
            Some(Effect::Warn {
                signal: 10,
                cause: StopCause::TimeLimit
            })
        );
        assert!(warned.running() && warned.limit_warned);
        assert_eq!(warned.step(event, now, GRACE), (warned, None));
        let (stopped, effect) = warned.step(Event::TimeLimit, now, GRACE);
        assert_eq!(effect, Some(Effect::Terminate));
        assert!(stopped.stopped.timed_out);
    }

    #[test]
    fn the_limit_warning_comes_its_seconds_before_the_limit_when_a_time_is_asked() {
        let limit_at = Instant::now() + Duration::from_secs(3600);
        let usr1 = |seconds| StopSignal {
            signal: 10,
            seconds,
        };
        assert_eq!(
            limit_warning(Some(usr1(300)), Some(limit_at)),
            Some((limit_at - Duration::from_secs(300), 10))
        );
        assert_eq!(limit_warning(Some(usr1(0)), Some(limit_at)), None);
        assert_eq!(limit_warning(Some(usr1(300)), None), None);
        assert_eq!(limit_warning(None, Some(limit_at)), None);
    }
}
