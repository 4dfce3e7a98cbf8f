//! Reconciliation at start, before the agent takes any assignment: the job attempts a previous
//! agent of this node recorded in the state file ([`crate::state_file`]) and never reported.
//!
//! A recorded attempt whose process group still has live processes is an orphan: its output
//! pipes died with the old agent, so it can no longer be streamed, and the scheduler puts its
//! job back in the queue (it may already run elsewhere). It is stopped as a cancel would stop
//! it (SIGTERM to the group, the kill grace, SIGKILL). Every recorded attempt, stopped here or
//! found already gone, is then reported as `Exited { lost: true }`, retried until stored, and
//! only then removed from the file: a crash half-way leaves it for the next start. The
//! scheduler ignores the report when the attempt is no longer the job's current one.
//!
//! Two steps, so that heartbeats tell the truth meanwhile: [`survey`] runs before the first
//! heartbeat and lists the orphans in the running table (they do run here, and their
//! processes hold GPUs), so a quickly restarted agent's node does not look as if it had lost
//! them while they still run, which would let the scheduler start the job again elsewhere
//! during the kill grace; [`settle`] then stops them, drops them from the table once they are
//! dead, and reports them. Assignments wait for both, so a requeued attempt of the same job
//! never overlaps its orphan on this node.

use std::time::Duration;

use mgpu_protocol::report::{Exit, ReportKind};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::time::Instant;
use tracing::{info, warn};

use crate::job::JobContext;
use crate::running::{AttemptKey, RunningTable};
use crate::state_file::{self, RecordedAttempt};

/// How often a stopping group is looked at.
const POLL: Duration = Duration::from_millis(50);
/// How long SIGKILLed processes may take to disappear before the agent stops waiting (a
/// process in uninterruptible sleep on a dead NFS mount can take forever).
const KILL_WAIT: Duration = Duration::from_secs(5);

/// What became of one recorded attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fate {
    /// Ended before this agent started (or its pid belongs to someone else now).
    AlreadyGone,
    /// Stopped by SIGTERM within the kill grace.
    Terminated,
    /// Needed SIGKILL.
    Killed,
}

impl Fate {
    /// The exit code and signal reported. The code of a process that ended while no agent
    /// watched it is unknown: -1, as for any status the agent could not read.
    fn exit(self) -> (i32, Option<i32>) {
        match self {
            Fate::AlreadyGone => (-1, None),
            Fate::Terminated => (128 + Signal::SIGTERM as i32, Some(Signal::SIGTERM as i32)),
            Fate::Killed => (128 + Signal::SIGKILL as i32, Some(Signal::SIGKILL as i32)),
        }
    }
}

/// What a previous agent left: attempts still running (listed in the running table until
/// stopped) and attempts already gone.
#[derive(Debug, Default)]
pub struct Leftovers {
    orphans: Vec<RecordedAttempt>,
    gone: Vec<RecordedAttempt>,
}

/// Sorts the recorded attempts into orphans and ended ones, and lists the orphans in `table`
/// so the heartbeat reports them until they are stopped.
pub fn survey(left: Vec<RecordedAttempt>, table: &RunningTable) -> Leftovers {
    let mut leftovers = Leftovers::default();
    if left.is_empty() {
        return leftovers;
    }
    info!(
        attempts = left.len(),
        "a previous agent left job attempts unreported; reconciling before taking assignments"
    );
    let boot = state_file::boot_id();
    for attempt in left {
        match still_running(&attempt, boot.as_deref()) {
            Ok(()) => {
                info!(job = %attempt.job_id, attempt = attempt.attempt, pid = attempt.pid, started_at = %attempt.started_at, "orphaned attempt still running");
                // Nobody listens for stop requests: settle stops it whatever the scheduler says.
                drop(table.insert(attempt.key(), attempt.pid));
                leftovers.orphans.push(attempt);
            }
            Err(why) => {
                info!(job = %attempt.job_id, attempt = attempt.attempt, pid = attempt.pid, "lost attempt already gone: {why}");
                leftovers.gone.push(attempt);
            }
        }
    }
    leftovers
}

/// Stops the orphans, reports every leftover attempt as lost and clears it from the file.
pub async fn settle(leftovers: Leftovers, ctx: &JobContext) {
    if leftovers.orphans.is_empty() && leftovers.gone.is_empty() {
        return;
    }
    // Every leftover attempt counts as finished here: its assignment, unacknowledged when the
    // previous agent died, is delivered again, and must not start it once more (the scheduler
    // requeues it on the lost report, perhaps onto another node).
    for attempt in &leftovers.gone {
        ctx.table.finish(&attempt.key());
    }
    let mut fates: Vec<(RecordedAttempt, Fate)> = leftovers
        .gone
        .into_iter()
        .map(|attempt| (attempt, Fate::AlreadyGone))
        .collect();
    let stopped = stop_orphans(leftovers.orphans, ctx.kill_grace).await;
    for (attempt, _) in &stopped {
        ctx.table.finish(&attempt.key());
    }
    if !stopped.is_empty() {
        ctx.heartbeat_now.notify_one();
    }
    fates.extend(stopped);

    for (attempt, fate) in fates {
        let key = attempt.key();
        // What left the attempt's process group is still in its cgroup: emptied before the
        // attempt is reported ended.
        if let Err(err) = ctx
            .containment
            .empty_left_over(&key, attempt.cgroup.as_deref())
            .await
        {
            warn!(job = %key.job_id, attempt = key.attempt, "emptying a previous agent's job cgroup: {err}");
        }
        let (exit_code, signal) = fate.exit();
        let reported = ctx
            .reporter
            .report(
                &key,
                ReportKind::Exited(Exit {
                    exit_code,
                    signal,
                    lost: true,
                    ..Exit::default()
                }),
            )
            .await;
        if reported {
            ctx.state.remove(&key).await;
            info!(job = %key.job_id, attempt = key.attempt, ?fate, exit_code, "reported the attempt as lost");
        }
    }
    info!("reconciliation done; taking assignments");
}

/// Ok when the attempt's process group still has live processes that are the job's; otherwise
/// why not.
fn still_running(attempt: &RecordedAttempt, boot: Option<&str>) -> Result<(), &'static str> {
    if let (Some(recorded), Some(now)) = (attempt.boot_id.as_deref(), boot)
        && recorded != now
    {
        return Err("the host rebooted since it started");
    }
    match group_status(attempt.pid) {
        Group::Gone => return Err("its processes have ended"),
        Group::NotOurs => return Err("its process group now belongs to another user"),
        Group::Live => {}
    }
    // The leader still exists: make sure it is the same process, not a reused pid that made
    // itself a group leader.
    if let (Some(recorded), Some(now)) = (attempt.start_ticks, state_file::start_ticks(attempt.pid))
        && recorded != now
    {
        return Err("its pid now belongs to another process");
    }
    Ok(())
}

/// SIGTERM to every orphan's group, SIGKILL to those still there after the grace, and waits
/// (bounded) until they are gone.
async fn stop_orphans(
    orphans: Vec<RecordedAttempt>,
    kill_grace: Duration,
) -> Vec<(RecordedAttempt, Fate)> {
    if orphans.is_empty() {
        return Vec::new();
    }
    for orphan in &orphans {
        info!(
            job = %orphan.job_id,
            attempt = orphan.attempt,
            pid = orphan.pid,
            started_at = %orphan.started_at,
            "stopping an orphaned job attempt: its output can no longer be streamed"
        );
        signal_group(orphan.pid, Signal::SIGTERM, &orphan.key());
    }
    let pids: Vec<u32> = orphans.iter().map(|o| o.pid).collect();
    let mut left = wait_gone(&pids, kill_grace).await;
    let killed = left.clone();
    if !left.is_empty() {
        for orphan in orphans.iter().filter(|o| left.contains(&o.pid)) {
            warn!(job = %orphan.job_id, attempt = orphan.attempt, grace = ?kill_grace, "the orphan ignored SIGTERM; sending SIGKILL");
            signal_group(orphan.pid, Signal::SIGKILL, &orphan.key());
        }
        left = wait_gone(&left, KILL_WAIT).await;
        for pid in &left {
            warn!(
                pid,
                "processes of an orphaned job survived SIGKILL for {KILL_WAIT:?}; reporting it lost anyway"
            );
        }
    }
    orphans
        .into_iter()
        .map(|orphan| {
            let fate = if killed.contains(&orphan.pid) {
                Fate::Killed
            } else {
                Fate::Terminated
            };
            (orphan, fate)
        })
        .collect()
}

/// Waits until none of these process groups has a live process, or `limit` passed; returns
/// those still live.
async fn wait_gone(pgids: &[u32], limit: Duration) -> Vec<u32> {
    // Checked: `Instant + Duration` panics on overflow, and the kill grace is the operator's
    // (a grace too long for the clock never ends).
    let deadline = Instant::now().checked_add(limit);
    loop {
        let live: Vec<u32> = pgids
            .iter()
            .copied()
            .filter(|&pgid| group_status(pgid) == Group::Live)
            .collect();
        if live.is_empty() || deadline.is_some_and(|deadline| Instant::now() >= deadline) {
            return live;
        }
        tokio::time::sleep(POLL).await;
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Group {
    /// Some process of the group runs (zombies do not count).
    Live,
    Gone,
    /// Its processes belong to another user: not a job of this agent.
    NotOurs,
}

/// Whether process group `pgid` has live members. Zombies are left out: an orphan's processes
/// are reparented to init, and an init that does not reap (a bare container's) would otherwise
/// make a dead job look alive forever.
fn group_status(pgid: u32) -> Group {
    let Ok(raw) = i32::try_from(pgid) else {
        return Group::Gone;
    };
    // Signal 0 checks existence and permission without sending anything.
    match killpg(Pid::from_raw(raw), None) {
        Ok(()) => {}
        Err(nix::errno::Errno::EPERM) => return Group::NotOurs,
        Err(_) => return Group::Gone,
    }
    match live_members(pgid) {
        Some(0) => Group::Gone,
        // Where /proc cannot say, the signal's answer stands.
        Some(_) | None => Group::Live,
    }
}

/// Processes of group `pgid` that are not zombies, from /proc; None where /proc is unreadable.
fn live_members(pgid: u32) -> Option<usize> {
    let entries = std::fs::read_dir("/proc").ok()?;
    let count = entries
        .flatten()
        .filter(|entry| {
            entry
                .file_name()
                .to_str()
                .is_some_and(|name| name.bytes().all(|b| b.is_ascii_digit()))
        })
        .filter_map(|entry| std::fs::read_to_string(entry.path().join("stat")).ok())
        .filter_map(|stat| parse_state_and_group(&stat))
        .filter(|&(state, group)| group == pgid && state != 'Z' && state != 'X')
        .count();
    Some(count)
}

/// The state (field 3) and process group (field 5) of a /proc/PID/stat line, counted from the
/// last `)` since the command name may hold anything.
fn parse_state_and_group(stat: &str) -> Option<(char, u32)> {
    let mut fields = stat[stat.rfind(')')? + 1..].split_whitespace();
    let state = fields.next()?.chars().next()?;
    let group = fields.nth(1)?.parse().ok()?;
    Some((state, group))
}

fn signal_group(pgid: u32, signal: Signal, key: &AttemptKey) {
    let Ok(raw) = i32::try_from(pgid) else { return };
    match killpg(Pid::from_raw(raw), signal) {
        Ok(()) | Err(nix::errno::Errno::ESRCH) => {}
        Err(err) => {
            warn!(job = %key.job_id, attempt = key.attempt, ?signal, "cannot signal the orphan's process group: {err}")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mgpu_protocol::ids::JobId;
    use std::os::unix::process::CommandExt as _;
    use std::process::{Command, Stdio};

    fn recorded(pid: u32) -> RecordedAttempt {
        RecordedAttempt {
            job_id: JobId::random(),
            attempt: 1,
            pid,
            started_at: mgpu_protocol::now(),
            boot_id: state_file::boot_id(),
            start_ticks: state_file::start_ticks(pid),
            cgroup: None,
        }
    }

    /// A job-like process group: a shell leading its own group with a child, as an agent
    /// starts jobs. `trap` makes it ignore SIGTERM when asked to.
    fn spawn_group(ignore_term: bool) -> std::process::Child {
        let script = if ignore_term {
            "trap '' TERM; sleep 60 & wait"
        } else {
            "sleep 60 & wait"
        };
        Command::new("/bin/sh")
            .args(["-c", script])
            .process_group(0)
            .stdin(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("spawning a job-like group: {e}"))
    }

    #[test]
    fn stat_lines_give_state_and_group() {
        let stat = "4242 (odd ) name) S 1 4240 4240 0 -1";
        assert_eq!(parse_state_and_group(stat), Some(('S', 4240)));
        assert_eq!(parse_state_and_group("nonsense"), None);
    }

    #[test]
    fn only_live_groups_of_the_same_process_count_as_running() {
        let mut child = spawn_group(false);
        let attempt = recorded(child.id());
        assert_eq!(
            still_running(&attempt, state_file::boot_id().as_deref()),
            Ok(())
        );
        // Another boot: the pid means nothing.
        assert!(still_running(&attempt, Some("another-boot")).is_err());
        // A reused pid: a different start time.
        let reused = RecordedAttempt {
            start_ticks: attempt.start_ticks.map(|t| t + 1),
            ..attempt.clone()
        };
        if reused.start_ticks.is_some() {
            assert!(still_running(&reused, None).is_err());
        }
        let _ = killpg(Pid::from_raw(child.id() as i32), Signal::SIGKILL);
        let _ = child.wait();
        let gone = wait_for_group_gone(child.id());
        assert!(gone, "the killed group still looks alive");
        assert!(still_running(&attempt, None).is_err());
    }

    fn wait_for_group_gone(pgid: u32) -> bool {
        for _ in 0..100 {
            if group_status(pgid) == Group::Gone {
                return true;
            }
            std::thread::sleep(POLL);
        }
        false
    }

    #[test]
    fn the_survey_lists_live_orphans_for_the_heartbeat_and_sets_the_dead_aside() {
        let mut live = spawn_group(false);
        let mut dead = spawn_group(false);
        let dead_attempt = recorded(dead.id());
        let _ = killpg(Pid::from_raw(dead.id() as i32), Signal::SIGKILL);
        let _ = dead.wait();
        assert!(wait_for_group_gone(dead.id()));
        let table = RunningTable::default();
        let leftovers = survey(vec![recorded(live.id()), dead_attempt], &table);
        assert_eq!(leftovers.orphans.len(), 1);
        assert_eq!(leftovers.gone.len(), 1);
        assert_eq!(table.process_groups(), vec![live.id()]);
        let _ = killpg(Pid::from_raw(live.id() as i32), Signal::SIGKILL);
        let _ = live.wait();
    }

    #[tokio::test]
    async fn orphans_get_sigterm_then_sigkill_after_the_grace() {
        let mut polite = spawn_group(false);
        let mut stubborn = spawn_group(true);
        // Give the stubborn shell time to install its trap.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let orphans = vec![recorded(polite.id()), recorded(stubborn.id())];
        let started = Instant::now();
        let fates = stop_orphans(orphans, Duration::from_millis(500)).await;
        assert!(started.elapsed() >= Duration::from_millis(500));
        let fate_of = |pid: u32| {
            fates
                .iter()
                .find(|(a, _)| a.pid == pid)
                .map(|(_, fate)| *fate)
        };
        assert_eq!(fate_of(polite.id()), Some(Fate::Terminated));
        assert_eq!(fate_of(stubborn.id()), Some(Fate::Killed));
        assert_eq!(Fate::Killed.exit(), (137, Some(9)));
        assert_eq!(Fate::Terminated.exit(), (143, Some(15)));
        assert_eq!(Fate::AlreadyGone.exit(), (-1, None));
        for child in [&mut polite, &mut stubborn] {
            let _ = child.wait();
            assert_eq!(group_status(child.id()), Group::Gone);
        }
    }
}
