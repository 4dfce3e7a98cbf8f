//! The Debian packages, built and installed on this machine: `scripts/package.sh` packs the
//! binaries this test runs from (mgpu, mgpu-scheduler, mgpu-node with mgpu-job-guard);
//! `dpkg -i` installs them (the postinst makes the `mgpu` user and the state directories, and
//! must not need systemd as PID 1); `systemd-analyze verify` accepts every unit, the example
//! nats-server one included, and nats-server accepts the example configurations. Then the
//! services start from the installed units' `ExecStart` lines, with the installed
//! configuration files given this test's server URL (the scheduler as the `mgpu` user, as its
//! unit's `User=` says), and a job submitted with the installed CLI runs as its owner's Unix
//! account. Everything is purged at the end, the `mgpu` user too when this test made it.
//!
//! It needs root, dpkg and systemd-analyze, and a machine where no mgpu package is installed
//! and no /etc/mgpu exists (it says why it skips otherwise). A run killed half-way leaves a
//! marker in /etc/mgpu, so the next run cleans up after it first.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use mgpu_tests::installed::{Services, wait_online};
use mgpu_tests::{bin_dir, nats_server_bin, wait_for};

const PACKAGES: [&str; 3] = ["mgpu", "mgpu-scheduler", "mgpu-node"];
const ETC: &str = "/etc/mgpu";
/// Written while the test has the packages installed: what a killed run leaves behind.
const MARKER: &str = "/etc/mgpu/.packaging-test";
/// The job's owner: an account every Debian system has, so the job runs as it.
const OWNER: &str = "nobody";

fn run(program: &str, args: &[&str]) -> Output {
    Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"))
}

fn ok(program: &str, args: &[&str]) -> String {
    let out = run(program, args);
    assert!(
        out.status.success(),
        "{program} {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn installed(package: &str) -> bool {
    let out = run("dpkg-query", &["-W", "-f=${Status}", package]);
    String::from_utf8_lossy(&out.stdout).contains("install ok installed")
}

fn user_exists(name: &str) -> bool {
    run("getent", &["passwd", name]).status.success()
}

/// Why this machine cannot run the story, if it cannot.
fn unsuitable() -> Option<String> {
    if !nix::unistd::geteuid().is_root() {
        return Some("not root".into());
    }
    for tool in ["dpkg", "dpkg-deb", "systemd-analyze", "runuser"] {
        if Command::new(tool).arg("--version").output().is_err() {
            return Some(format!("no {tool}"));
        }
    }
    if Path::new(MARKER).exists() {
        return None;
    }
    if let Some(package) = PACKAGES.iter().find(|p| installed(p)) {
        return Some(format!("{package} is installed here: not touching it"));
    }
    if Path::new(ETC).exists() {
        return Some(format!("{ETC} exists here: not touching it"));
    }
    None
}

/// Puts the machine back as it was: the services stopped (by dropping them first), the
/// packages purged, the files this test put in /etc/mgpu removed, the `mgpu` user deleted if
/// this test's install made it.
struct Cleanup {
    services: Option<Services>,
    remove_user: bool,
}

impl Cleanup {
    fn now(&mut self) {
        drop(self.services.take());
        let _ = run("dpkg", &["--purge", "mgpu", "mgpu-scheduler", "mgpu-node"]);
        let _ = std::fs::remove_dir_all(ETC);
        let _ = std::fs::remove_dir_all("/var/lib/mgpu");
        if self.remove_user && user_exists("mgpu") {
            let _ = run("userdel", &["mgpu"]);
            let _ = run("groupdel", &["mgpu"]);
        }
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        self.now();
    }
}

/// A killed earlier run's leftovers: the marker names whether it made the `mgpu` user.
fn clean_up_after_an_earlier_run() {
    if let Ok(text) = std::fs::read_to_string(MARKER) {
        eprintln!("cleaning up after an earlier run of this test");
        Cleanup {
            services: None,
            remove_user: text.contains("made-user"),
        }
        .now();
    }
}

/// `scripts/package.sh` on this test's binaries; the three packages' paths.
fn build_packages(out: &Path) -> Vec<PathBuf> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/package.sh");
    let bins = bin_dir();
    let stdout = ok(
        &script.display().to_string(),
        &[
            "--bin-dir",
            &bins.display().to_string(),
            "--out",
            &out.display().to_string(),
            "--fast",
        ],
    );
    let debs: Vec<PathBuf> = stdout.lines().map(PathBuf::from).collect();
    assert_eq!(debs.len(), 3, "{stdout}");
    for (deb, package) in debs.iter().zip(PACKAGES) {
        let name = deb.file_name().map(|n| n.to_string_lossy().into_owned());
        assert!(
            name.as_deref()
                .is_some_and(|n| n.starts_with(&format!("{package}_")) && n.ends_with(".deb")),
            "{deb:?}"
        );
        let fields = ok("dpkg-deb", &["-f", &deb.display().to_string(), "Depends"]);
        // scripts/setup.sh links the CLI statically where it can: then it depends on nothing.
        let static_cli = package == "mgpu" && !is_dynamic(&bins.join("mgpu"));
        if static_cli {
            assert!(fields.trim().is_empty(), "{package}: Depends: {fields}");
        } else {
            assert!(fields.contains("libc6"), "{package}: Depends: {fields}");
        }
    }
    debs
}

/// Whether `binary` is linked dynamically (it names a program interpreter, as `ldd` reads).
fn is_dynamic(binary: &Path) -> bool {
    let out = Command::new("ldd")
        .arg(binary)
        .output()
        .unwrap_or_else(|e| panic!("ldd: {e}"));
    out.status.success() && String::from_utf8_lossy(&out.stdout).contains("=>")
}

/// `systemd-analyze verify UNIT`: accepted, and without a single warning.
fn verify(unit: &Path) {
    let out = run("systemd-analyze", &["verify", &unit.display().to_string()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stderr.trim().is_empty(),
        "systemd-analyze verify {}: {stderr}",
        unit.display()
    );
}

/// The command line of a unit's `ExecStart=`, split on spaces (mgpu's have no quoting).
fn exec_start(unit: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(unit).unwrap_or_else(|e| panic!("{e}"));
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .unwrap_or_else(|| panic!("no ExecStart in {}", unit.display()));
    line.split_whitespace().map(str::to_owned).collect()
}

/// The example nats-server unit (with the test's nats-server as its binary) passes
/// `systemd-analyze verify`, and each example configuration passes `nats-server -t`, given an
/// auth.conf and the TLS files they name.
fn check_nats_server_examples(tmp: &Path) {
    let examples = Path::new("/usr/share/doc/mgpu-scheduler/examples/nats-server");
    let unit = std::fs::read_to_string(examples.join("nats-server.service"))
        .unwrap_or_else(|e| panic!("{e}"));
    let dir = tmp.join("nats-example");
    std::fs::create_dir_all(dir.join("tls")).unwrap_or_else(|e| panic!("{e}"));
    let local_unit = dir.join("nats-server.service");
    let server = nats_server_bin()
        .canonicalize()
        .unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(
        &local_unit,
        unit.replace("/usr/local/bin/nats-server", &server.display().to_string()),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    verify(&local_unit);

    let made = mgpu_cli::setup::tls::ensure_certificates(&dir, &["localhost".to_owned()])
        .unwrap_or_else(|e| panic!("{e}"));
    for file in [&made.files.cert_file, &made.files.key_file] {
        let name = file.file_name().unwrap_or_default();
        std::fs::copy(file, dir.join("tls").join(name)).unwrap_or_else(|e| panic!("{e}"));
    }
    std::fs::write(dir.join("auth.conf"), "authorization: { users: [] }\n")
        .unwrap_or_else(|e| panic!("{e}"));
    for example in [
        "nats-server.conf",
        "cluster/nats-server-1.conf",
        "cluster/nats-server-2.conf",
        "cluster/nats-server-3.conf",
    ] {
        let text = std::fs::read_to_string(examples.join(example))
            .unwrap_or_else(|e| panic!("{example}: {e}"));
        assert!(text.contains("  sync_interval: always\n"), "{example}");
        let conf = dir.join(example.replace('/', "-"));
        std::fs::write(
            &conf,
            text.replace("/etc/mgpu/", &format!("{}/", dir.display())),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        ok(
            &server.display().to_string(),
            &["-c", &conf.display().to_string(), "-t"],
        );
    }
}

/// Credentials and a server configuration made with the installed `mgpu admin`, the server
/// started; the keys and principals file installed where the packaged configuration looks.
fn start_server(services: &mut Services, tmp: &Path) -> u16 {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("{e}"));
    let auth = tmp.join("auth");
    let dir = auth.display().to_string();
    let store = tmp.join("jetstream").display().to_string();
    let port_text = port.to_string();
    ok(
        "/usr/bin/mgpu",
        &[
            "admin",
            "init",
            "--dir",
            &dir,
            "--port",
            &port_text,
            "--store-dir",
            &store,
        ],
    );
    ok(
        "/usr/bin/mgpu",
        &["admin", "add-node", "node-pkg", "--dir", &dir],
    );
    ok(
        "/usr/bin/mgpu",
        &["admin", "add-user", OWNER, "--dir", &dir],
    );
    let keys = auth.join("keys");
    let install = |from: &str, to: &str, owner: &str| {
        let (from, to) = (keys.join(from), format!("{ETC}/keys/{to}"));
        ok(
            "install",
            &[
                "-m",
                "0600",
                "-o",
                owner,
                "-g",
                owner,
                &from.display().to_string(),
                &to,
            ],
        );
    };
    install("scheduler-scheduler.nk", "scheduler.nk", "mgpu");
    install("node-node-pkg.nk", "node.nk", "root");
    std::fs::copy(
        auth.join("principals.json"),
        format!("{ETC}/principals.json"),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let mut nats = Command::new(nats_server_bin());
    nats.arg("-c").arg(auth.join("server.conf"));
    services.spawn("nats-server", nats);
    wait_for("nats-server to listen", Duration::from_secs(10), || {
        std::net::TcpStream::connect(("127.0.0.1", port)).ok()
    });
    port
}

/// Edits an installed configuration file as an administrator would.
fn edit(file: &str, edits: &[(&str, &str)]) {
    let path = format!("{ETC}/{file}");
    let mut text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    for (from, to) in edits {
        assert!(text.contains(from), "{path} has no {from:?}:\n{text}");
        text = text.replace(from, to);
    }
    std::fs::write(&path, text).unwrap_or_else(|e| panic!("{e}"));
}

/// `mgpu ARGS` with the installed CLI as `user`'s principal.
fn mgpu(port: u16, tmp: &Path, role_and_user: &str, user: &str) -> Command {
    let mut command = Command::new("/usr/bin/mgpu");
    command
        .env("MGPU_SERVER", format!("nats://127.0.0.1:{port}"))
        .env(
            "MGPU_CREDS",
            tmp.join("auth/keys").join(format!("{role_and_user}.nk")),
        )
        .env_remove("MGPU_CA")
        .env("USER", user)
        .current_dir("/tmp");
    command
}

#[test]
fn the_packages_install_verify_run_a_job_and_purge() {
    if let Some(why) = unsuitable() {
        eprintln!("skipped: {why}");
        return;
    }
    clean_up_after_an_earlier_run();
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let debs = build_packages(&tmp.path().join("debs"));

    let mut cleanup = Cleanup {
        services: None,
        remove_user: !user_exists("mgpu"),
    };
    std::fs::create_dir_all(ETC).unwrap_or_else(|e| panic!("{e}"));
    let marker = if cleanup.remove_user {
        "made-user\n"
    } else {
        "\n"
    };
    std::fs::write(MARKER, marker).unwrap_or_else(|e| panic!("{e}"));
    let mut args = vec!["-i".to_owned()];
    args.extend(debs.iter().map(|d| d.display().to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    ok("dpkg", &args);
    assert!(user_exists("mgpu"));
    let owner = ok("stat", &["-c", "%U %a", "/var/lib/mgpu/scheduler"]);
    assert_eq!(owner.trim(), "mgpu 750");
    assert!(Path::new("/usr/bin/mgpu-job-guard").exists());
    let conffiles = ok("dpkg-query", &["-W", "-f=${Conffiles}", "mgpu-node"]);
    assert!(conffiles.contains("/etc/mgpu/node.toml"), "{conffiles}");

    let units = Path::new("/usr/lib/systemd/system");
    let scheduler_unit = units.join("mgpu-scheduler.service");
    let node_unit = units.join("mgpu-node.service");
    verify(&scheduler_unit);
    verify(&node_unit);
    check_nats_server_examples(tmp.path());

    let services = cleanup
        .services
        .insert(Services::new(&tmp.path().join("logs")));
    let port = start_server(services, tmp.path());
    let server = format!("nats://127.0.0.1:{port}");
    let server_line = format!("server = \"{server}\"");
    edit(
        "scheduler.toml",
        &[("server = \"nats://127.0.0.1:4222\"", &server_line)],
    );
    edit(
        "node.toml",
        &[
            ("server = \"nats://127.0.0.1:4222\"", &server_line),
            ("#node = \"gpu01\"", "node = \"node-pkg\""),
            // No NVIDIA driver here.
            ("#gpus = \"2x24GiB\"", "gpus = \"1x24GiB\""),
        ],
    );
    let scheduler = exec_start(&scheduler_unit);
    assert_eq!(
        scheduler,
        [
            "/usr/bin/mgpu-scheduler",
            "--config",
            "/etc/mgpu/scheduler.toml"
        ]
    );
    // As the unit's User=mgpu.
    let mut command = Command::new("runuser");
    command.args(["-u", "mgpu", "--"]).args(&scheduler);
    services.spawn("scheduler", command);
    let node = exec_start(&node_unit);
    assert_eq!(
        node,
        ["/usr/bin/mgpu-node", "--config", "/etc/mgpu/node.toml"]
    );
    let mut command = Command::new(&node[0]);
    command.args(&node[1..]);
    services.spawn("node-pkg", command);

    wait_online(1, || mgpu(port, tmp.path(), "admin-admin", "admin"));
    let submit = mgpu(port, tmp.path(), &format!("user-{OWNER}"), OWNER)
        .args(["submit", "-q", "--", "echo ran-as-$(id -un)"])
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    let id = String::from_utf8_lossy(&submit.stdout).trim().to_owned();
    assert!(
        submit.status.success(),
        "{}",
        String::from_utf8_lossy(&submit.stderr)
    );
    wait_for("the job to succeed", Duration::from_secs(60), || {
        let show = mgpu(port, tmp.path(), &format!("user-{OWNER}"), OWNER)
            .args(["show", &id, "--json"])
            .output()
            .ok()?;
        let job: serde_json::Value = serde_json::from_slice(&show.stdout).ok()?;
        assert!(
            !matches!(job["state"].as_str(), Some("failed" | "cancelled")),
            "{job}"
        );
        (job["state"] == "succeeded").then_some(())
    });
    let logs = mgpu(port, tmp.path(), &format!("user-{OWNER}"), OWNER)
        .args(["logs", &id])
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    let text = String::from_utf8_lossy(&logs.stdout);
    assert!(text.contains(&format!("ran-as-{OWNER}")), "{text}");
    services.assert_running("scheduler");
    services.assert_running("node-pkg");

    cleanup.now();
    for package in PACKAGES {
        assert!(!installed(package), "{package} is still installed");
    }
    assert!(!Path::new(ETC).exists());
    assert!(!Path::new("/var/lib/mgpu").exists());
}
