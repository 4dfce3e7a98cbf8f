//! The stopping rules for one running job attempt: its time limit and the stop requests of the
//! running table (cancel, requeue, agent shutdown, fencing) send SIGTERM to its process group,
//! and SIGKILL follows once the kill grace has passed. [`StopState::step`] is the pure
//! transition (old state and an event in, new state and the signal to send out);
//! [`Watch::until_exit`] feeds it the live process's events and sends the signals.

use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::process::Child;
use tokio::time::Instant;
use tracing::{debug, error, info, warn};

use crate::running::{AttemptKey, StopReason, StopRequests};

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

/// How the main process ended, and why the agent stopped it if it did.
pub struct Ending {
    /// `None` when the exit status could not be read.
    pub status: Option<ExitStatus>,
    pub stopped: Stopped,
}

/// Where the stopping of a job stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Running,
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
    TimeLimit,
    Stop(StopReason),
    KillDue,
}

/// The signal a transition asks for, to the job's process group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Effect {
    Terminate,
    Kill,
}

/// The state of one job's stopping: its phase and why it was stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StopState {
    pub phase: Phase,
    pub stopped: Stopped,
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
    };

    /// The first time limit or stop request terminates the job (later ones change nothing:
    /// the first reason is the one reported); SIGKILL follows once, when due.
    pub fn step(
        self,
        event: Event,
        now: Instant,
        kill_grace: Duration,
    ) -> (StopState, Option<Effect>) {
        // Checked: `Instant + Duration` panics on overflow, and the grace is the operator's.
        let terminating = Phase::Terminating {
            kill_at: now.checked_add(kill_grace),
        };
        match (self.phase, event) {
            (Phase::Running, Event::TimeLimit) => {
                let stopped = Stopped {
                    timed_out: true,
                    ..self.stopped
                };
                let next = StopState {
                    phase: terminating,
                    stopped,
                };
                (next, Some(Effect::Terminate))
            }
            (Phase::Running, Event::Stop(reason)) => {
                let next = StopState {
                    phase: terminating,
                    stopped: Stopped::by(reason),
                };
                (next, Some(Effect::Terminate))
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

    fn running(&self) -> bool {
        self.phase == Phase::Running
    }

    /// When SIGKILL is due, while it is still to be sent.
    fn kill_at(&self) -> Option<Instant> {
        match self.phase {
            Phase::Terminating { kill_at } => kill_at,
            Phase::Running | Phase::Killed => None,
        }
    }

    fn terminating(&self) -> bool {
        matches!(self.phase, Phase::Terminating { .. })
    }
}

/// The rules for stopping one running job.
pub struct Watch<'a> {
    pub key: &'a AttemptKey,
    pub pid: u32,
    pub kill_grace: Duration,
    pub time_limit_at: Option<Instant>,
}

impl Watch<'_> {
    /// Waits for the main process to exit. On the time limit or a stop request: SIGTERM to the
    /// process group, then SIGKILL once the kill grace has passed.
    pub async fn until_exit(&self, child: &mut Child, stop_requests: &mut StopRequests) -> Ending {
        let mut state = StopState::RUNNING;
        let mut stop_requests_open = true;
        loop {
            let running = state.running();
            let event = tokio::select! {
                status = child.wait() => {
                    let status = status
                        .inspect_err(|err| error!(job = %self.key.job_id, attempt = self.key.attempt, "cannot read the job's exit status: {err}"))
                        .ok();
                    return Ending { status, stopped: state.stopped };
                }
                () = sleep_until(self.time_limit_at), if running && self.time_limit_at.is_some() => {
                    Event::TimeLimit
                }
                changed = stop_requests.changed(), if running && stop_requests_open => {
                    if changed.is_err() {
                        // The table dropped its side; no stop can come any more.
                        stop_requests_open = false;
                        continue;
                    }
                    let Some(reason) = *stop_requests.borrow_and_update() else { continue };
                    Event::Stop(reason)
                }
                () = sleep_until(state.kill_at()), if state.terminating() => Event::KillDue,
            };
            let (next, effect) = state.step(event, Instant::now(), self.kill_grace);
            state = next;
            if let Some(effect) = effect {
                self.apply(event, effect);
            }
        }
    }

    /// Says why, and signals the job's group.
    fn apply(&self, event: Event, effect: Effect) {
        let key = self.key;
        match event {
            Event::TimeLimit => {
                info!(job = %key.job_id, attempt = key.attempt, "time limit reached; stopping the job")
            }
            Event::Stop(StopReason::Cancelled) => {
                info!(job = %key.job_id, attempt = key.attempt, "cancelling the job")
            }
            Event::Stop(StopReason::AgentShutdown) => {
                info!(job = %key.job_id, attempt = key.attempt, "stopping the job: the agent is shutting down")
            }
            Event::Stop(StopReason::Requeued) => {
                info!(job = %key.job_id, attempt = key.attempt, "stopping the job: the scheduler puts it back in the queue")
            }
            Event::Stop(StopReason::Fenced) => {
                warn!(job = %key.job_id, attempt = key.attempt, "stopping the job: this node lost contact with NATS (fenced)")
            }
            Event::KillDue => {
                warn!(job = %key.job_id, attempt = key.attempt, grace = ?self.kill_grace, "the job ignored SIGTERM; sending SIGKILL")
            }
        }
        let signal = match effect {
            Effect::Terminate => Signal::SIGTERM,
            Effect::Kill => Signal::SIGKILL,
        };
        signal_group(self.pid, signal, key);
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Signals every process in the job's group (the job leads it, so its pid is the group id).
pub fn signal_group(pgid: u32, signal: Signal, key: &AttemptKey) {
    let Ok(raw) = i32::try_from(pgid) else { return };
    match killpg(Pid::from_raw(raw), signal) {
        Ok(()) => {
            debug!(job = %key.job_id, attempt = key.attempt, ?signal, "signalled the job's process group")
        }
        // Nobody left in the group: the usual case after a clean exit.
        Err(nix::errno::Errno::ESRCH) => {}
        Err(err) => {
            warn!(job = %key.job_id, attempt = key.attempt, ?signal, "cannot signal the job's process group: {err}")
        }
    }
}

/// The exit code the shell convention gives (128 + N after signal N) and the signal if any.
/// -1 stands for a status that could not be read.
pub fn exit_code_of(status: Option<ExitStatus>) -> (i32, Option<i32>) {
    let Some(status) = status else {
        return (-1, None);
    };
    match (status.code(), status.signal()) {
        (Some(code), _) => (code, None),
        (None, Some(signal)) => (128 + signal, Some(signal)),
        (None, None) => (-1, None),
    }
}

#[cfg(test)]
mod tests {
    use tokio::process::Command;

    use super::*;
    use crate::running::RunningTable;

    #[test]
    fn exit_codes_follow_the_shell_convention() {
        assert_eq!(exit_code_of(Some(ExitStatus::from_raw(0))), (0, None));
        assert_eq!(exit_code_of(Some(ExitStatus::from_raw(3 << 8))), (3, None));
        // Raw wait status of a process killed by SIGTERM (15) is the signal number itself.
        assert_eq!(
            exit_code_of(Some(ExitStatus::from_raw(15))),
            (143, Some(15))
        );
        assert_eq!(exit_code_of(None), (-1, None));
    }

    const GRACE: Duration = Duration::from_secs(5);

    #[test]
    fn each_stop_reason_is_reported_as_what_it_was() {
        let now = Instant::now();
        let stopped = |reason| {
            StopState::RUNNING
                .step(Event::Stop(reason), now, GRACE)
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
            timed_out.step(Event::Stop(StopReason::Cancelled), now, GRACE),
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

    /// Spawns `sleep` as the agent spawns jobs (own process group), asks the table to stop it
    /// for `reason` and returns how the watch saw it end.
    async fn stop_a_sleeping_job(reason: StopReason) -> Ending {
        let table = RunningTable::default();
        let key = AttemptKey {
            job_id: mgpu_protocol::ids::JobId::random(),
            attempt: 1,
        };
        let mut child = Command::new("sleep")
            .arg("30")
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("spawning sleep: {e}"));
        let pid = child.id().unwrap_or_else(|| panic!("sleep has no pid"));
        let mut stop_requests = table.insert(key.clone(), pid);
        assert!(table.request_stop(&key, reason));
        let watch = Watch {
            key: &key,
            pid,
            kill_grace: Duration::from_secs(5),
            time_limit_at: None,
        };
        tokio::time::timeout(
            Duration::from_secs(10),
            watch.until_exit(&mut child, &mut stop_requests),
        )
        .await
        .unwrap_or_else(|_| panic!("the job was not stopped"))
    }

    #[tokio::test]
    async fn a_requeue_kill_stops_the_job_as_a_cancel_does_but_reports_it_preempted() {
        let requeued = stop_a_sleeping_job(StopReason::Requeued).await;
        let why = requeued.stopped;
        assert!(why.preempted && !why.cancelled && !why.timed_out);
        let cancelled = stop_a_sleeping_job(StopReason::Cancelled).await;
        let why = cancelled.stopped;
        assert!(why.cancelled && !why.preempted && !why.timed_out);
        // Both end the same way: SIGTERM to the group.
        assert_eq!(exit_code_of(requeued.status), (143, Some(15)));
        assert_eq!(exit_code_of(cancelled.status), (143, Some(15)));
    }
}
