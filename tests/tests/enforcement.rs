//! Enforcement, told as stories: what a job was given is all it gets. A job over its
//! `--mem-host` is killed and fails with the reason while its neighbour keeps running; a job
//! opens only its own GPUs' device nodes (character devices with NVIDIA's major 195, made in
//! a test directory: without a driver, an allowed node answers ENXIO and a denied one EPERM);
//! `--cpus` jobs are counted and pinned to cores of their own; what a job used is measured;
//! impossible host requests are refused; `require_gpu_isolation` keeps jobs off a node that
//! cannot isolate; and, on a host with an NVIDIA GPU and its driver, a CUDA program reaches
//! only the GPUs its job was given. Run as root against this machine's real cgroups (v1
//! controllers and the unified v2 hierarchy); elsewhere each story says why it is skipped.

use std::path::Path;
use std::time::Duration;

use mgpu_tests::{Cluster, NodeSpec, wait_for};

const T: Duration = Duration::from_secs(30);

fn is_root() -> bool {
    let root = nix::unistd::Uid::effective().is_root();
    if !root {
        eprintln!("skipped: the agent must run as root to make cgroups");
    }
    root
}

/// The node's `containment:` line and its `host:` line (`mgpu nodes`).
fn announced(cluster: &Cluster) -> (String, String) {
    let nodes = cluster.mgpu_ok(&["nodes"]);
    let line = |prefix: &str| {
        nodes
            .lines()
            .find_map(|line| line.trim().strip_prefix(prefix))
            .unwrap_or_else(|| panic!("no `{prefix}` line in\n{nodes}"))
            .to_owned()
    };
    (line("containment: "), line("host: "))
}

fn text_of(job: &serde_json::Value, field: &str) -> String {
    job[field].as_str().unwrap_or("").to_owned()
}

#[test]
fn a_job_over_its_host_memory_fails_out_of_memory_and_its_neighbour_keeps_running() {
    if !is_root() {
        return;
    }
    let cluster = Cluster::start(&[NodeSpec::new("node001", "2x24GiB")]);
    cluster.wait_nodes_online(1);
    let (containment, _) = announced(&cluster);
    if containment.contains("host memory (") {
        eprintln!("skipped: host memory is not enforced here: {containment}");
        return;
    }
    let neighbour = cluster.submit(&["--mem-host", "64MiB"], "sleep 1000");
    cluster.wait_state(&neighbour, "running", T);
    // `tail` keeps a line until it ends: 256 MiB without a newline is held whole.
    let hog = cluster.submit(&["--mem-host", "64MiB"], "head -c 256m /dev/zero | tail");
    let ended = cluster.finished_as(&hog, "failed", T);
    assert_eq!(text_of(&ended, "reason"), "out of memory (host)", "{ended}");
    let shown = cluster.mgpu_ok(&["show", &hog]);
    assert!(shown.contains("out of memory (host)"), "{shown}");
    assert!(shown.contains("64 MiB limit"), "{shown}");
    assert_eq!(cluster.state(&neighbour), "running");
    cluster.mgpu_ok(&["cancel", &neighbour]);
    cluster.finished_as(&neighbour, "cancelled", T);
}

#[test]
fn what_a_job_used_is_measured_from_its_cgroup() {
    if !is_root() {
        return;
    }
    let cluster = Cluster::start(&[NodeSpec::new("node001", "1x24GiB")]);
    cluster.wait_nodes_online(1);
    let (containment, _) = announced(&cluster);
    if containment.contains("host memory (") {
        eprintln!("skipped: no memory controller to measure with: {containment}");
        return;
    }
    let job = cluster.submit(&[], "head -c 200m /dev/zero | tail");
    let ended = cluster.finished_as(&job, "succeeded", T);
    let peak = ended["usage"]["peak_mem_host_bytes"].as_u64().unwrap_or(0);
    assert!(peak >= 200 << 20, "peak {peak} bytes: {ended}");
    assert!(ended["usage"]["cpu_time_ms"].is_u64(), "{ended}");
    let shown = cluster.mgpu_ok(&["show", &job]);
    assert!(shown.contains("peak host memory:"), "{shown}");
    assert!(shown.contains("cpu time:"), "{shown}");
}

/// NVIDIA-like device nodes in `dir`: `nvidia0`, `nvidia1` and `nvidiactl`.
fn make_device_nodes(dir: &Path) {
    use nix::sys::stat::{Mode, SFlag, makedev, mknod};
    for (name, minor) in [("nvidia0", 0), ("nvidia1", 1), ("nvidiactl", 255)] {
        mknod(
            &dir.join(name),
            SFlag::S_IFCHR,
            Mode::from_bits_truncate(0o666),
            makedev(195, minor),
        )
        .unwrap_or_else(|e| panic!("mknod {name}: {e}"));
    }
}

/// A job script that tries to open each device node, even after widening
/// `CUDA_VISIBLE_DEVICES` itself, and writes what `cat` said to `<tag>-<node>.txt`.
fn probe_devices(dir: &Path, tag: &str) -> String {
    let dir = dir.display();
    format!(
        "export CUDA_VISIBLE_DEVICES=0,1,2,3; \
         for n in nvidia0 nvidia1 nvidiactl; do cat {dir}/$n 2> {dir}/{tag}-$n.txt; done; true"
    )
}

fn said(dir: &Path, tag: &str, node: &str) -> String {
    std::fs::read_to_string(dir.join(format!("{tag}-{node}.txt"))).unwrap_or_default()
}

fn gpus_are_isolated(version: &str) {
    if !is_root() {
        return;
    }
    let cluster =
        Cluster::start(&[NodeSpec::new("node001", "2x24GiB").agent_args(&["--cgroup", version])]);
    cluster.wait_nodes_online(1);
    let (containment, host) = announced(&cluster);
    assert!(
        containment.starts_with(&format!("cgroup {version}")),
        "{containment}"
    );
    if !host.ends_with("gpu isolation: yes") {
        eprintln!("skipped: GPUs are not isolated under cgroup {version} here: {containment}");
        return;
    }
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    make_device_nodes(dir.path());
    // The driver's absence answers ENXIO where the cgroup lets the open through.
    let here = std::fs::File::open(dir.path().join("nvidia0")).err();
    assert_eq!(here.and_then(|e| e.raw_os_error()), Some(libc_enxio()));

    let whole = cluster.submit(&["--gpu-ids", "1"], &probe_devices(dir.path(), "whole"));
    cluster.finished_as(&whole, "succeeded", T);
    assert!(said(dir.path(), "whole", "nvidia0").contains("Operation not permitted"));
    assert!(said(dir.path(), "whole", "nvidia1").contains("No such device or address"));
    assert!(said(dir.path(), "whole", "nvidiactl").contains("No such device or address"));

    // Two halves of GPU 0 both get its node, and not GPU 1's.
    let halves: Vec<String> = ["half-a", "half-b"]
        .iter()
        .map(|tag| {
            cluster.submit(
                &["--gpus", "0.5", "--gpu-ids", "0"],
                &probe_devices(dir.path(), tag),
            )
        })
        .collect();
    for (job, tag) in halves.iter().zip(["half-a", "half-b"]) {
        cluster.finished_as(job, "succeeded", T);
        assert!(said(dir.path(), tag, "nvidia0").contains("No such device or address"));
        assert!(said(dir.path(), tag, "nvidia1").contains("Operation not permitted"));
    }
}

fn libc_enxio() -> i32 {
    nix::errno::Errno::ENXIO as i32
}

#[test]
fn a_job_opens_only_its_own_gpus_under_cgroup_v1() {
    if !Path::new("/sys/fs/cgroup/devices/cgroup.procs").exists() {
        eprintln!("skipped: no cgroup v1 devices controller on this machine");
        return;
    }
    gpus_are_isolated("v1");
}

#[test]
fn a_job_opens_only_its_own_gpus_under_cgroup_v2() {
    if !Path::new("/sys/fs/cgroup/cgroup.controllers").exists()
        && !Path::new("/sys/fs/cgroup/unified/cgroup.controllers").exists()
    {
        eprintln!("skipped: no cgroup v2 hierarchy on this machine");
        return;
    }
    gpus_are_isolated("v2");
}

#[test]
fn one_core_jobs_on_a_two_core_node_get_cores_of_their_own_and_a_third_waits() {
    if !is_root() {
        return;
    }
    if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
        eprintln!("skipped: this machine has fewer than 2 cores to pin to");
        return;
    }
    let cluster =
        Cluster::start(&[NodeSpec::new("node001", "1x24GiB").agent_args(&["--cpus", "2"])]);
    cluster.wait_nodes_online(1);
    let (containment, host) = announced(&cluster);
    assert!(host.starts_with("2 CPU cores"), "{host}");
    if containment.contains("CPU pinning (") {
        eprintln!("skipped: cores cannot be pinned here: {containment}");
        return;
    }
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let job = |n: u32| {
        let out = dir.path().join(format!("cores-{n}"));
        cluster.submit(
            &["--gpus", "0", "--cpus", "1"],
            &format!(
                "grep Cpus_allowed_list /proc/self/status > {0}.tmp; mv {0}.tmp {0}; sleep 1000",
                out.display()
            ),
        )
    };
    let (first, second) = (job(1), job(2));
    let cores: Vec<String> = [1, 2]
        .iter()
        .map(|n| {
            let path = dir.path().join(format!("cores-{n}"));
            wait_for("the job to write its cores", T, || {
                std::fs::read_to_string(&path).ok()
            })
            .trim()
            .trim_start_matches("Cpus_allowed_list:")
            .trim()
            .to_owned()
        })
        .collect();
    assert!(cores.iter().all(|c| c == "0" || c == "1"), "{cores:?}");
    assert_ne!(cores[0], cores[1], "two jobs pinned to the same core");
    let third = job(3);
    cluster.wait_reason(&third, "waiting for GPUs to become free", T);
    let shown = cluster.mgpu_ok(&["show", &first]);
    assert!(shown.contains("1 booked"), "{shown}");
    // A core freed is a core handed out again.
    cluster.mgpu_ok(&["cancel", &first]);
    cluster.wait_state(&third, "running", T);
    for id in [&second, &third] {
        cluster.mgpu_ok(&["cancel", id]);
    }
}

#[test]
fn impossible_host_requests_are_refused_with_the_reason() {
    let cluster = Cluster::start(&[NodeSpec::new("node001", "1x24GiB").agent_args(&[
        "--cpus",
        "4",
        "--mem-host",
        "8GiB",
        "--cgroup",
        "off",
    ])]);
    cluster.wait_nodes_online(1);
    for (flag, value) in [("--mem-host", "0"), ("--cpus", "0")] {
        let out = cluster.mgpu(&["submit", flag, value, "--", "true"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{flag} {value} was accepted");
        assert!(
            stderr.starts_with("error:") && stderr.contains(flag),
            "{stderr}"
        );
    }
    let cpus = cluster.submit(&["--cpus", "5"], "true");
    let ended = cluster.finished_as(&cpus, "failed", T);
    assert_eq!(
        text_of(&ended, "reason"),
        "cannot run: asks for 5 CPU cores on one node; the largest node has 4"
    );
    let memory = cluster.submit(&["--mem-host", "9GiB"], "true");
    let ended = cluster.finished_as(&memory, "failed", T);
    assert_eq!(
        text_of(&ended, "reason"),
        "cannot run: asks for 9 GiB of host memory on one node; the largest node has 8 GiB"
    );
    let fits = cluster.submit(&["--cpus", "4", "--mem-host", "8GiB"], "true");
    cluster.finished_as(&fits, "succeeded", T);
}

#[test]
fn require_gpu_isolation_places_nothing_on_a_node_that_cannot_isolate() {
    let config_dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let config = config_dir.path().join("scheduler.toml");
    std::fs::write(&config, "require_gpu_isolation = true\n").unwrap_or_else(|e| panic!("{e}"));
    let config = config.display().to_string();
    let cluster = Cluster::start_with(
        &[NodeSpec::new("open01", "1x24GiB").agent_args(&["--cgroup", "off"])],
        &["--config", &config],
    );
    cluster.wait_nodes_online(1);
    let nodes = cluster.mgpu_ok(&["nodes"]);
    assert!(nodes.contains("gpu isolation: no"), "{nodes}");
    let job = cluster.submit(&[], "true");
    cluster.wait_reason(
        &job,
        "waiting: the GPUs it could use are paused or drained",
        T,
    );
    assert_eq!(cluster.state(&job), "queued");
}

/// A CUDA call through the driver library (`cuInit`, `cuDeviceGetCount`), with the
/// `CUDA_VISIBLE_DEVICES` the job chose itself; prints `cuda <result> <devices>`.
const CUDA_PROBE: &str = r#"export CUDA_VISIBLE_DEVICES=0; python3 -c '
import ctypes
cuda = ctypes.CDLL("libcuda.so.1")
result = cuda.cuInit(0)
count = ctypes.c_int(0)
if result == 0:
    result = cuda.cuDeviceGetCount(ctypes.byref(count))
print("cuda", result, count.value)
'"#;

/// `cuda <result> <devices>` as the probe printed it.
fn cuda_said(text: &str) -> Option<(i64, i64)> {
    let line = text.lines().find(|line| line.starts_with("cuda "))?;
    let mut words = line.split_whitespace().skip(1);
    Some((words.next()?.parse().ok()?, words.next()?.parse().ok()?))
}

/// On a host with an NVIDIA GPU and its driver: the agent reads the GPUs through NVML, and a
/// CUDA program in a job given GPU 0 reaches it, while one in a job given no GPU does not, even
/// though it sets `CUDA_VISIBLE_DEVICES=0` itself. Skipped, saying why, elsewhere.
#[test]
fn on_a_gpu_host_a_cuda_program_reaches_only_the_gpus_its_job_was_given() {
    if !is_root() {
        return;
    }
    if !Path::new("/dev/nvidia0").exists() || !Path::new("/dev/nvidiactl").exists() {
        eprintln!("skipped: no NVIDIA GPU (/dev/nvidia0) on this machine");
        return;
    }
    let here = std::process::Command::new("sh")
        .args(["-c", CUDA_PROBE])
        .output()
        .map(|out| String::from_utf8_lossy(&out.stdout).into_owned())
        .unwrap_or_default();
    if !matches!(cuda_said(&here), Some((0, count)) if count >= 1) {
        eprintln!("skipped: no CUDA driver library or python3 to call it with: {here:?}");
        return;
    }
    let cluster = Cluster::start(&[NodeSpec::new("gpu01", "")]);
    cluster.wait_nodes_online(1);
    let (containment, host) = announced(&cluster);
    eprintln!("containment: {containment}\nhost: {host}");
    assert!(host.ends_with("gpu isolation: yes"), "{containment}");
    let given = cluster.submit(&["--gpu-ids", "0"], CUDA_PROBE);
    cluster.finished_as(&given, "succeeded", T);
    let given_said = cluster.mgpu_ok(&["logs", &given]);
    let not_given = cluster.submit(&["--gpus", "0"], CUDA_PROBE);
    cluster.finished_as(&not_given, "succeeded", T);
    let not_given_said = cluster.mgpu_ok(&["logs", &not_given]);
    eprintln!("given GPU 0: {given_said:?}; given none: {not_given_said:?}");
    assert_eq!(cuda_said(&given_said), Some((0, 1)), "{given_said}");
    assert!(
        !matches!(cuda_said(&not_given_said), Some((0, count)) if count > 0),
        "a job given no GPU reached one: {not_given_said}"
    );
}
