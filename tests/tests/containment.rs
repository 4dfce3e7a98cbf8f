//! Containment, told as stories: a job whose processes leave its process group (`setsid`, a
//! double-forked daemon) is still stopped whole, when it is cancelled, when it ends by itself
//! and when its agent is killed and restarted, because the agent puts each job in a cgroup of its own and empties it. Run as root
//! (the agent must make cgroups), against the real kernel: this machine's v1 freezer hierarchy
//! and its unified (v2) hierarchy both; elsewhere the stories say why they are skipped.

use std::path::Path;
use std::time::Duration;

use mgpu_tests::{Cluster, NodeSpec, process_alive, process_running, wait_for};

const T: Duration = Duration::from_secs(30);

/// A job that starts two processes outside its process group and writes their pids, then
/// sleeps (or, with `then_exit`, ends at once with code 0).
fn escaping_job(dir: &Path, then_exit: bool) -> String {
    let dir = dir.display();
    let end = if then_exit { "exit 0" } else { "sleep 1000" };
    format!(
        "setsid sleep 1000 & echo $! > {dir}/setsid.pid; \
         ( setsid sh -c 'echo $$ > {dir}/daemon.pid.tmp; mv {dir}/daemon.pid.tmp {dir}/daemon.pid; exec sleep 1000' & ); \
         while [ ! -s {dir}/daemon.pid ] || [ ! -s {dir}/setsid.pid ]; do sleep 0.05; done; \
         {end}"
    )
}

fn pid_in(path: &Path) -> i32 {
    wait_for(&format!("{} to be written", path.display()), T, || {
        std::fs::read_to_string(path)
            .ok()
            .and_then(|text| text.trim().parse().ok())
    })
}

/// Whether this process may make cgroups (the agent it starts runs as the same user).
fn can_contain() -> bool {
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("skipped: the agent must run as root to make cgroups");
        return false;
    }
    true
}

/// The containment the node announces (`mgpu nodes`).
fn containment_of(cluster: &Cluster) -> String {
    let nodes = cluster.mgpu_ok(&["nodes"]);
    nodes
        .lines()
        .find_map(|line| line.trim().strip_prefix("containment: "))
        .unwrap_or_else(|| panic!("no containment line in\n{nodes}"))
        .to_owned()
}

/// The story under `--cgroup version`: cancelled, then ending by itself, nothing survives.
fn nothing_outlives_its_job(version: &str) {
    if !can_contain() {
        return;
    }
    let cluster =
        Cluster::start(&[NodeSpec::new("node001", "1x24GiB").agent_args(&["--cgroup", version])]);
    cluster.wait_nodes_online(1);
    let announced = containment_of(&cluster);
    assert!(
        announced.starts_with(&format!("cgroup {version}")),
        "{announced}"
    );

    let cancelled_dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let job = cluster.submit(&[], &escaping_job(cancelled_dir.path(), false));
    let escaped = [
        pid_in(&cancelled_dir.path().join("setsid.pid")),
        pid_in(&cancelled_dir.path().join("daemon.pid")),
    ];
    assert!(escaped.iter().all(|pid| process_alive(*pid)));
    cluster.mgpu_ok(&["cancel", &job]);
    cluster.finished_as(&job, "cancelled", T);
    for pid in escaped {
        assert!(
            !process_running(pid),
            "process {pid} outlived its cancelled job: {:?} {:?}",
            std::fs::read_to_string(format!("/proc/{pid}/stat")),
            std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        );
    }

    let finished_dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let job = cluster.submit(&[], &escaping_job(finished_dir.path(), true));
    let escaped = [
        pid_in(&finished_dir.path().join("setsid.pid")),
        pid_in(&finished_dir.path().join("daemon.pid")),
    ];
    cluster.finished_as(&job, "succeeded", T);
    for pid in escaped {
        assert!(!process_running(pid), "process {pid} outlived its job");
    }
}

#[test]
fn a_job_escaping_its_process_group_dies_whole_in_a_v1_cgroup() {
    nothing_outlives_its_job("v1");
}

#[test]
fn a_job_escaping_its_process_group_dies_whole_in_a_v2_cgroup() {
    if !Path::new("/sys/fs/cgroup/cgroup.controllers").exists()
        && !Path::new("/sys/fs/cgroup/unified/cgroup.controllers").exists()
    {
        eprintln!("skipped: no cgroup v2 hierarchy on this machine");
        return;
    }
    nothing_outlives_its_job("v2");
}

/// The agent SIGKILLed under a job that escaped its process group: its guard, told of the
/// agent's death, stops the job and what left the group with it.
#[test]
fn a_killed_agents_guard_stops_the_escaped_processes_too() {
    if !can_contain() {
        return;
    }
    let mut cluster = Cluster::start(&[NodeSpec::new("node001", "1x24GiB")]);
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    cluster.submit(&["--no-requeue"], &escaping_job(dir.path(), false));
    let escaped = [
        pid_in(&dir.path().join("setsid.pid")),
        pid_in(&dir.path().join("daemon.pid")),
    ];
    cluster.kill_agent("node001");
    wait_for("the escaped processes to die with the job", T, || {
        escaped
            .iter()
            .all(|pid| !process_running(*pid))
            .then_some(())
    });
}

/// Freezes (`true`) or thaws the cgroup `pid` is in, and waits until it is so: v1's freezer
/// where the process has one, else v2's `cgroup.freeze`.
fn freeze_cgroup_of(pid: i32, frozen: bool) {
    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    // In the root freezer cgroup (a hybrid host's v2 job): contained by v2.
    let v1 = cgroups.lines().find_map(|line| {
        line.split_once(":freezer:")
            .map(|(_, path)| path.to_owned())
            .filter(|path| path != "/")
    });
    let (file, value, settled) = match v1 {
        Some(path) => (
            format!("/sys/fs/cgroup/freezer{path}/freezer.state"),
            if frozen { "FROZEN" } else { "THAWED" },
            if frozen { "FROZEN" } else { "THAWED" },
        ),
        None => {
            let path = cgroups
                .lines()
                .find_map(|line| line.strip_prefix("0::"))
                .unwrap_or("/")
                .to_owned();
            let mount = if Path::new("/sys/fs/cgroup/unified").is_dir() {
                "/sys/fs/cgroup/unified"
            } else {
                "/sys/fs/cgroup"
            };
            let file = format!("{mount}{path}/cgroup.freeze");
            (
                file,
                if frozen { "1" } else { "0" },
                if frozen { "1" } else { "0" },
            )
        }
    };
    std::fs::write(&file, value).unwrap_or_else(|e| panic!("{file}: {e}"));
    wait_for("the job's cgroup to settle", T, || {
        std::fs::read_to_string(&file)
            .ok()
            .filter(|state| state.trim() == settled)
    });
}

/// The agent and the job's guard both SIGKILLed, the guard unable to act first (its cgroup
/// frozen: a merely stopped guard is woken by the kernel's SIGCONT to a newly orphaned process
/// group when its agent dies): the escaped processes outlive both, and the restarted agent
/// empties the cgroup its predecessor left before it reports the attempt lost.
fn a_restarted_agent_empties_the_cgroup_its_predecessor_left(version: &str) {
    if !can_contain() || !has_hierarchy(version) {
        return;
    }
    let mut cluster =
        Cluster::start(&[NodeSpec::new("node001", "1x24GiB").agent_args(&["--cgroup", version])]);
    let first_agent = cluster.agent_pid("node001");
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let job = cluster.submit(&["--no-requeue"], &escaping_job(dir.path(), false));
    let escaped = [
        pid_in(&dir.path().join("setsid.pid")),
        pid_in(&dir.path().join("daemon.pid")),
    ];
    let guard = wait_for("the job's guard pid", T, || {
        cluster.show(&job)["record"]["pid"].as_i64()
    });
    let guard = i32::try_from(guard).unwrap_or(0);
    freeze_cgroup_of(guard, true);
    cluster.kill_agent("node001");
    use nix::sys::signal::{Signal, kill};
    kill(nix::unistd::Pid::from_raw(guard), Signal::SIGKILL).unwrap_or_else(|e| panic!("{e}"));
    // Thawed, the guard dies of its SIGKILL before it could act on its agent's death.
    freeze_cgroup_of(escaped[0], false);
    wait_for("the guard to be gone", T, || {
        (!process_running(guard)).then_some(())
    });
    assert!(escaped.iter().all(|pid| process_running(*pid)));
    let parent = cgroup_parent(escaped[0]);
    cluster.start_agent("node001");
    cluster.finished_as(&job, "node_failed", T);
    for pid in escaped {
        assert!(
            !process_running(pid),
            "process {pid} outlived its agent's restart"
        );
    }
    // The guards its predecessor kept waiting died with it; their cgroups are removed too.
    wait_for("the predecessor's pooled cgroups to be removed", T, || {
        pooled_cgroups(&parent, first_agent)
            .is_empty()
            .then_some(())
    });
}

#[test]
fn a_restarted_agent_empties_the_v1_cgroup_its_predecessor_left() {
    a_restarted_agent_empties_the_cgroup_its_predecessor_left("v1");
}

/// On v2 the job's cgroup is a pooled one, which keeps its name: the state file tells the
/// successor which it is.
#[test]
fn a_restarted_agent_empties_the_v2_cgroup_its_predecessor_left() {
    a_restarted_agent_empties_the_cgroup_its_predecessor_left("v2");
}

/// Whether this machine has the hierarchy `--cgroup version` asks for (v1: a freezer).
fn has_hierarchy(version: &str) -> bool {
    let found = match version {
        "v1" => Path::new("/sys/fs/cgroup/freezer/cgroup.procs").exists(),
        _ => {
            Path::new("/sys/fs/cgroup/cgroup.controllers").exists()
                || Path::new("/sys/fs/cgroup/unified/cgroup.controllers").exists()
        }
    };
    if !found {
        eprintln!("skipped: no cgroup {version} hierarchy on this machine");
    }
    found
}

/// The cgroup `pid` is in, as a directory: v1's freezer one where it is in one below the
/// root, else v2's.
fn cgroup_dir(pid: i32) -> std::path::PathBuf {
    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    let v1 = cgroups.lines().find_map(|line| {
        line.split_once(":freezer:")
            .filter(|(_, path)| *path != "/")
            .map(|(_, path)| format!("/sys/fs/cgroup/freezer{path}"))
    });
    v1.unwrap_or_else(|| {
        let path = cgroups
            .lines()
            .find_map(|line| line.strip_prefix("0::"))
            .unwrap_or("/");
        let mount = if Path::new("/sys/fs/cgroup/unified").is_dir() {
            "/sys/fs/cgroup/unified"
        } else {
            "/sys/fs/cgroup"
        };
        format!("{mount}{path}")
    })
    .into()
}

/// The directory the cgroup of `pid` (a job's process) was made in: its node's.
fn cgroup_parent(pid: i32) -> std::path::PathBuf {
    let dir = cgroup_dir(pid);
    dir.parent()
        .unwrap_or_else(|| panic!("{} has no parent", dir.display()))
        .to_owned()
}

/// The names of the pooled cgroups agent `agent` made in `parent` (`pool-<pid>-<n>`).
fn pooled_cgroups(parent: &Path, agent: u32) -> Vec<String> {
    let prefix = format!("pool-{agent}-");
    let mut names: Vec<String> = std::fs::read_dir(parent)
        .map(|entries| {
            entries
                .flatten()
                .map(|entry| entry.file_name().to_string_lossy().into_owned())
                .filter(|name| name.starts_with(&prefix))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// The story under `--cgroup version`: the agent keeps guards waiting in cgroups of their own;
/// a job takes one (the pool makes another: `pool-<agent>-5` after the first four), runs in
/// that cgroup (renamed after the job on v1; v2 cannot rename), and is contained as any other;
/// a stopped agent leaves no pooled cgroup behind.
fn a_job_starts_under_a_waiting_guard(version: &str) {
    if !can_contain() || !has_hierarchy(version) {
        return;
    }
    let cluster =
        Cluster::start(&[NodeSpec::new("node001", "1x24GiB").agent_args(&["--cgroup", version])]);
    let agent = cluster.agent_pid("node001");
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let job = cluster.submit(&[], &escaping_job(dir.path(), false));
    let escaped = pid_in(&dir.path().join("setsid.pid"));
    let (own, parent) = (cgroup_dir(escaped), cgroup_parent(escaped));
    let name = own.file_name().map(|n| n.to_string_lossy().into_owned());
    let expected = if version == "v1" {
        format!("job-{job}-1")
    } else {
        format!("pool-{agent}-")
    };
    assert!(
        name.as_deref().is_some_and(|n| n.starts_with(&expected)),
        "the job runs in {}",
        own.display()
    );
    wait_for(
        "the pool to make a guard in place of the one taken",
        T,
        || {
            pooled_cgroups(&parent, agent)
                .contains(&format!("pool-{agent}-5"))
                .then_some(())
        },
    );
    for pooled in pooled_cgroups(&parent, agent) {
        if Some(&pooled) == name.as_ref() {
            continue;
        }
        let procs = wait_for("a guard to wait in each pooled cgroup", T, || {
            let procs = std::fs::read_to_string(parent.join(&pooled).join("cgroup.procs")).ok()?;
            (procs.lines().count() == 1).then_some(procs)
        });
        let guard: i32 = procs.trim().parse().unwrap_or_else(|e| panic!("{e}"));
        let cmdline = std::fs::read(format!("/proc/{guard}/cmdline")).unwrap_or_default();
        assert!(
            String::from_utf8_lossy(&cmdline).contains("--pooled"),
            "{pooled} holds {guard}: {cmdline:?}"
        );
    }
    cluster.mgpu_ok(&["cancel", &job]);
    cluster.finished_as(&job, "cancelled", T);
    assert!(!process_running(escaped), "the job's process outlived it");
    wait_for("the job's cgroup to be removed", T, || {
        (!own.exists()).then_some(())
    });
    cluster.signal_agent("node001", nix::sys::signal::Signal::SIGTERM);
    wait_for("the stopped agent to remove its pooled cgroups", T, || {
        pooled_cgroups(&parent, agent).is_empty().then_some(())
    });
}

#[test]
fn a_job_starts_under_a_waiting_guard_in_a_v1_cgroup() {
    a_job_starts_under_a_waiting_guard("v1");
}

#[test]
fn a_job_starts_under_a_waiting_guard_in_a_v2_cgroup() {
    a_job_starts_under_a_waiting_guard("v2");
}

#[test]
fn an_agent_told_not_to_contain_says_so() {
    let cluster =
        Cluster::start(&[NodeSpec::new("node001", "1x24GiB").agent_args(&["--cgroup", "off"])]);
    cluster.wait_nodes_online(1);
    assert_eq!(
        containment_of(&cluster),
        "process group only (cgroups turned off (--cgroup off))"
    );
}

/// The agent frozen under a job that escaped its process group: the job's guard, fencing
/// without its agent, kills the escaped processes too (it empties the job's cgroup), under
/// the slim guard and the built-in one.
fn a_fenced_job_dies_whole(guard: &[&str]) {
    if !can_contain() {
        return;
    }
    let cluster = Cluster::start(&[NodeSpec::new("node001", "1x24GiB").agent_args(guard)]);
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let job = cluster.submit(&[], &escaping_job(dir.path(), false));
    let escaped = [
        pid_in(&dir.path().join("setsid.pid")),
        pid_in(&dir.path().join("daemon.pid")),
    ];
    cluster.wait_state(&job, "running", T);
    cluster.signal_agent("node001", nix::sys::signal::Signal::SIGSTOP);
    wait_for("the fenced job's escaped processes to die", T, || {
        escaped
            .iter()
            .all(|pid| !process_running(*pid))
            .then_some(())
    });
    cluster.signal_agent("node001", nix::sys::signal::Signal::SIGCONT);
}

#[test]
fn a_frozen_agents_fenced_job_takes_its_escaped_processes_with_it() {
    a_fenced_job_dies_whole(&[]);
}

#[test]
fn a_frozen_agents_fenced_job_takes_its_escaped_processes_with_it_under_the_builtin_guard() {
    a_fenced_job_dies_whole(&["--job-guard", "builtin"]);
}
