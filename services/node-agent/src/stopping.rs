//! Stopping one running job attempt, live: [`Watch::until_exit`] waits for its exit while it
//! turns the clock (its time limit, the warning before it, the graces) and the running
//! table's stop requests into events for the pure rules of `stop_state.rs`, and carries out
//! the effects they return: a warning (the cause in its stop file, its signal to its
//! processes, see `stop_notice.rs`), SIGTERM or SIGKILL to its process group. Also how an
//! exit status reads in the shell's convention.

use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;

use mgpu_protocol::stop::{DEFAULT_SIGNAL, StopCause};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::process::Child;
use tokio::time::Instant;
use tracing::{debug, error, info, warn};

use crate::cgroup::JobCgroup;
use crate::running::{AttemptKey, StopReason, StopRequest, StopRequests};
use crate::stop_notice::{StopFile, warn_processes};
use crate::stop_state::{Effect, Event, StopState, Stopped, bounded};

/// How the main process ended, and why the agent stopped it if it did.
pub struct Ending {
    /// `None` when the exit status could not be read.
    pub status: Option<ExitStatus>,
    pub stopped: Stopped,
}

/// The rules for stopping one running job.
pub struct Watch<'a> {
    pub key: &'a AttemptKey,
    pub pid: u32,
    pub kill_grace: Duration,
    pub time_limit_at: Option<Instant>,
    /// When the warning before the time limit is due, and its signal
    /// ([`crate::stop_state::limit_warning`]).
    pub limit_warning: Option<(Instant, i32)>,
    /// Where a warning writes why, and the cgroup whose processes it also reaches.
    pub notice: Notice<'a>,
}

/// What a warning reaches besides the process group.
#[derive(Clone, Copy)]
pub struct Notice<'a> {
    pub stop_file: Option<&'a StopFile>,
    pub cgroup: Option<&'a JobCgroup>,
}

impl Watch<'_> {
    /// Waits for the main process to exit. On the time limit or a stop request: SIGTERM to the
    /// process group (after a warning and its grace, where asked), then SIGKILL once the kill
    /// grace has passed. A job that ends during a grace is seen at once.
    pub async fn until_exit(&self, child: &mut Child, stop_requests: &mut StopRequests) -> Ending {
        let mut state = StopState::RUNNING;
        let mut stop_requests_open = true;
        let warn_at = self.limit_warning.map(|(at, _)| at);
        loop {
            let open = state.before_terminate();
            let event = tokio::select! {
                status = child.wait() => {
                    let status = status
                        .inspect_err(|err| error!(job = %self.key.job_id, attempt = self.key.attempt, "cannot read the job's exit status: {err}"))
                        .ok();
                    return Ending { status, stopped: state.stopped };
                }
                () = sleep_until(warn_at), if state.running() && !state.limit_warned && warn_at.is_some() => {
                    let signal = self.limit_warning.map_or(DEFAULT_SIGNAL, |(_, signal)| signal);
                    Event::LimitWarning { signal }
                }
                () = sleep_until(self.time_limit_at), if open && self.time_limit_at.is_some() => {
                    Event::TimeLimit
                }
                changed = stop_requests.changed(), if open && stop_requests_open => {
                    if changed.is_err() {
                        // The table dropped its side; no stop can come any more.
                        stop_requests_open = false;
                        continue;
                    }
                    let Some(request) = *stop_requests.borrow_and_update() else { continue };
                    Event::Stop(request)
                }
                () = sleep_until(state.term_at()), if state.warned() => Event::TermDue,
                () = sleep_until(state.kill_at()), if state.terminating() => Event::KillDue,
            };
            let (next, effect) = state.step(event, Instant::now(), self.kill_grace);
            state = next;
            if let Some(effect) = effect {
                self.apply(event, effect);
            }
        }
    }

    /// Says why, and warns or signals the job.
    fn apply(&self, event: Event, effect: Effect) {
        let key = self.key;
        match event {
            Event::LimitWarning { .. } => {
                info!(job = %key.job_id, attempt = key.attempt, "warning the job of its time limit")
            }
            Event::TimeLimit => {
                info!(job = %key.job_id, attempt = key.attempt, "time limit reached; stopping the job")
            }
            Event::Stop(request) => self.say_stop(request),
            Event::TermDue => {
                info!(job = %key.job_id, attempt = key.attempt, "the job's warning grace is over; stopping it")
            }
            Event::KillDue => {
                warn!(job = %key.job_id, attempt = key.attempt, grace = ?self.kill_grace, "the job ignored SIGTERM; sending SIGKILL")
            }
        }
        match effect {
            Effect::Warn { signal, cause } => self.warn(signal, cause),
            Effect::Terminate => signal_group(self.pid, Signal::SIGTERM, key),
            Effect::Kill => signal_group(self.pid, Signal::SIGKILL, key),
        }
    }

    fn say_stop(&self, request: StopRequest) {
        let key = self.key;
        let warned = request.warning.map(|w| bounded(w).grace_secs);
        match request.reason {
            StopReason::Cancelled => {
                info!(job = %key.job_id, attempt = key.attempt, ?warned, "cancelling the job")
            }
            StopReason::AgentShutdown => {
                info!(job = %key.job_id, attempt = key.attempt, "stopping the job: the agent is shutting down")
            }
            StopReason::Requeued => {
                info!(job = %key.job_id, attempt = key.attempt, ?warned, "stopping the job: the scheduler puts it back in the queue")
            }
            StopReason::Fenced => {
                warn!(job = %key.job_id, attempt = key.attempt, "stopping the job: this node lost contact with NATS (fenced)")
            }
        }
    }

    /// Writes the cause to the stop file first, so a job that reads it on the signal finds it.
    fn warn(&self, signal: i32, cause: StopCause) {
        let key = self.key;
        if let Some(file) = self.notice.stop_file
            && let Err(err) = file.announce(cause)
        {
            warn!(job = %key.job_id, attempt = key.attempt, "cannot write the job's stop file {}: {err}", file.path().display());
        }
        let Ok(signal) = Signal::try_from(signal) else {
            warn!(job = %key.job_id, attempt = key.attempt, signal, "not a signal; the job is not warned");
            return;
        };
        let reached = warn_processes(self.pid, signal, self.notice.cgroup);
        debug!(job = %key.job_id, attempt = key.attempt, ?signal, cause = cause.as_str(), reached, "warned the job");
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
            limit_warning: None,
            notice: Notice {
                stop_file: None,
                cgroup: None,
            },
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

    /// A job as the agent runs one: a leader standing for its guard (it must not be warned:
    /// it would die of SIGUSR1), and under it the job's shell, which on SIGUSR1 copies its
    /// stop file to `seen` and ends unless `ignore` (then only SIGTERM ends it).
    fn guarded_job(dir: &std::path::Path, stop_file: &StopFile, ignore: bool) -> Child {
        let seen = dir.join("seen");
        let ready = dir.join("ready");
        let on_usr1 = if ignore { "" } else { "; exit 0" };
        let job = format!(
            "trap 'cat \"$MGPU_STOP_FILE\" > {seen}{on_usr1}' USR1; touch {ready}; \
             while :; do sleep 0.05; done",
            seen = seen.display(),
            ready = ready.display(),
        );
        let child = Command::new("sh")
            .arg("-c")
            .arg("sh -c \"$JOB\" & wait $!")
            .env("JOB", job)
            .env("MGPU_STOP_FILE", stop_file.path())
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("spawning sh: {e}"));
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !ready.exists() {
            assert!(
                std::time::Instant::now() < deadline,
                "the job never got ready"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        child
    }

    /// Runs `guarded_job` to its end after a preemption that warns it with `grace_secs`;
    /// returns how it ended, what it read and how long that took.
    async fn preempt_with_warning(ignore: bool, grace_secs: u64) -> (Ending, String, Duration) {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let key = AttemptKey {
            job_id: mgpu_protocol::ids::JobId::random(),
            attempt: 1,
        };
        let stop_file = StopFile::create(&key, "n1")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let mut child = guarded_job(dir.path(), &stop_file, ignore);
        let pid = child.id().unwrap_or_else(|| panic!("sh has no pid"));
        let table = RunningTable::default();
        let mut stop_requests = table.insert(key.clone(), pid);
        let warning = mgpu_protocol::stop::StopWarning {
            signal: 10,
            grace_secs,
            cause: StopCause::Preempted,
        };
        let request = StopRequest {
            reason: StopReason::Requeued,
            warning: Some(warning),
        };
        assert!(table.request(&key, request));
        let watch = Watch {
            key: &key,
            pid,
            kill_grace: Duration::from_secs(5),
            time_limit_at: None,
            limit_warning: None,
            notice: Notice {
                stop_file: Some(&stop_file),
                cgroup: None,
            },
        };
        let began = Instant::now();
        let ending = tokio::time::timeout(
            Duration::from_secs(20),
            watch.until_exit(&mut child, &mut stop_requests),
        )
        .await
        .unwrap_or_else(|_| panic!("the job was not stopped"));
        let seen = std::fs::read_to_string(dir.path().join("seen")).unwrap_or_default();
        (ending, seen, began.elapsed())
    }

    #[tokio::test]
    async fn a_warned_job_reads_why_and_is_seen_to_end_within_its_grace() {
        let (ending, seen, took) = preempt_with_warning(false, 60).await;
        assert_eq!(seen, "preempted\n");
        assert!(took < Duration::from_secs(10), "took {took:?}");
        assert!(ending.stopped.preempted && !ending.stopped.cancelled);
        // The job's own exit, not SIGTERM's: its guard was never signalled.
        assert_eq!(exit_code_of(ending.status), (0, None));
    }

    #[tokio::test]
    async fn a_job_that_ignores_its_warning_gets_sigterm_when_the_grace_is_over() {
        let (ending, seen, took) = preempt_with_warning(true, 1).await;
        assert_eq!(seen, "preempted\n");
        assert!(
            took >= Duration::from_secs(1),
            "SIGTERM before the grace: {took:?}"
        );
        assert!(ending.stopped.preempted);
        assert_eq!(exit_code_of(ending.status), (143, Some(15)));
    }
}
