//! A whole site written by `mgpu admin site` from one description, then run, once without TLS
//! and once with: one head (its nats-server, the scheduler and mgpu-notify), two GPU hosts and
//! two users.
//! Every process starts from the files written for its host, as they would be copied there,
//! with only what puts several hosts on one machine changed: `/etc/mgpu/` becomes that host's
//! directory in the output, the agents' state directories are temporary, the server listens on
//! 127.0.0.1 only, and the agents run jobs as their own account (the users have none here).
//! Each user submits a job from their own home directory, set up as the user's `mgpu.env`
//! says, and both run; a user's notification destination is hers alone under the site's
//! permissions. Then a user is added to the description: running it again writes only
//! that user's files and those naming every principal, keeps every existing key, and the new
//! user's job runs once the server has reloaded.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use mgpu_tests::installed::{Services, config_args, wait_online};
use mgpu_tests::{bin_dir, nats_server_bin, wait_for};

/// The site's head: its host name is an address here, so the URLs written for it work.
const HEAD: &str = "127.0.0.1";

/// The site description, its WebSocket listener on `websocket` (both stories run at once, so
/// neither may take the default 4280).
fn site_toml(tls: bool, port: u16, websocket: u16, jetstream: &Path, users: &[&str]) -> String {
    let users: Vec<String> = users.iter().map(|u| format!("{u:?}")).collect();
    format!(
        "tls = {tls}\nusers = [{users}]\nadmins = [\"root-admin\"]\nviewers = [\"wall\"]\n\n\
         [[server]]\nname = \"mgpu-site\"\nhost = \"{HEAD}\"\nport = {port}\nstore_dir = {store:?}\n\
         websocket_port = {websocket}\n\n\
         [[node]]\nname = \"gpu01\"\ngpus = \"1x24GiB\"\n\n\
         [[node]]\nname = \"gpu02\"\nhost = \"gpu02.lab\"\ngpus = \"1x24GiB\"\n",
        users = users.join(", "),
        store = jetstream.display().to_string(),
    )
}

/// Runs `mgpu admin site`, returning the files it says it wrote.
fn write_site(description: &Path, out: &Path) -> Vec<String> {
    let run = Command::new(bin_dir().join("mgpu"))
        .args(["admin", "site"])
        .arg(description)
        .arg("--out")
        .arg(out)
        .output()
        .unwrap_or_else(|e| panic!("mgpu admin site: {e}"));
    let stdout = String::from_utf8_lossy(&run.stdout).into_owned();
    assert!(
        run.status.success(),
        "mgpu admin site failed: {stdout}{}",
        String::from_utf8_lossy(&run.stderr)
    );
    stdout
        .lines()
        .filter_map(|line| line.strip_prefix("wrote"))
        .map(|path| path.trim().to_owned())
        .collect()
}

/// Every key file under `dir` with its contents and mode.
fn seeds(dir: &Path) -> BTreeMap<PathBuf, (String, u32)> {
    use std::os::unix::fs::PermissionsExt;
    let mut found = BTreeMap::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(current) = pending.pop() {
        for entry in std::fs::read_dir(&current).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "nk") {
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                let mode = entry.metadata().map(|m| m.permissions().mode() & 0o777);
                found.insert(path, (text, mode.unwrap_or(0)));
            }
        }
    }
    found
}

/// A host's configuration file as this machine can use it, written into `run`: `/etc/mgpu/`
/// is the host's directory in the output, and the agent's state directory `state`.
fn localized(out: &Path, host: &str, file: &str, run: &Path, state: &Path) -> PathBuf {
    let etc = out.join(host).join("etc/mgpu");
    let text = std::fs::read_to_string(etc.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
    let text = text
        .replace("/etc/mgpu/", &format!("{}/", etc.display()))
        .replace("/var/lib/mgpu/node", &state.display().to_string());
    std::fs::create_dir_all(run).unwrap_or_else(|e| panic!("{e}"));
    let path = run.join(format!("{host}-{file}"));
    std::fs::write(&path, text).unwrap_or_else(|e| panic!("{e}"));
    path
}

/// The head's server configuration listening on loopback only, its TLS files where they
/// are in the output, beside the generated one (nats-server finds `auth.conf` relative to it).
fn loopback_server_conf(out: &Path) -> PathBuf {
    let etc = out.join(HEAD).join("etc/mgpu");
    let conf =
        std::fs::read_to_string(etc.join("nats-server.conf")).unwrap_or_else(|e| panic!("{e}"));
    assert!(conf.contains("  sync_interval: always\n"), "{conf}");
    let path = etc.join("nats-server.loopback.conf");
    std::fs::write(
        &path,
        conf.replace("listen: \"0.0.0.0:", "listen: \"127.0.0.1:")
            .replace("\"/etc/mgpu/", &format!("\"{}/", etc.display())),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    path
}

/// `mgpu ARGS` as `user` would run it on a host of the site: HOME set up as their
/// `mgpu.env` says (their key in ~/.config/mgpu/), then that file sourced.
fn mgpu_as(out: &Path, home: &Path, user: &str, args: &[&str]) -> Command {
    let config = home.join(".config/mgpu");
    if !config.exists() {
        std::fs::create_dir_all(&config).unwrap_or_else(|e| panic!("{e}"));
        // Everything handed to the user: the key, and with TLS the CA.
        for file in ["mgpu.nk", "ca.pem"] {
            let given = out.join("users").join(user).join(file);
            if given.exists() {
                std::fs::copy(&given, config.join(file)).unwrap_or_else(|e| panic!("{e}"));
            }
        }
    }
    let env = out.join("users").join(user).join("mgpu.env");
    let mut command = Command::new("bash");
    command
        .arg("-c")
        .arg(format!(". {} && exec \"$0\" \"$@\"", env.display()))
        .arg(bin_dir().join("mgpu"))
        .args(args)
        .env("HOME", home)
        .env("USER", user)
        .env_remove("MGPU_SERVER")
        .env_remove("MGPU_CREDS")
        .env_remove("MGPU_CA")
        .current_dir(home);
    command
}

/// alice adds an e-mail destination and lists it; bob lists none of hers.
fn notify_destinations_are_private(out: &Path, homes: &Path) {
    let alice = homes.join("alice");
    let add = mgpu_as(
        out,
        &alice,
        "alice",
        &["notify", "add", "email", "alice@example.org"],
    )
    .output()
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        add.status.success(),
        "alice's notify add failed: {}",
        String::from_utf8_lossy(&add.stderr)
    );
    let list = |user: &str| {
        let listed = mgpu_as(out, &homes.join(user), user, &["notify", "list", "--json"])
            .output()
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(
            listed.status.success(),
            "{user}'s notify list failed: {}",
            String::from_utf8_lossy(&listed.stderr)
        );
        serde_json::from_slice::<serde_json::Value>(&listed.stdout)
            .unwrap_or_else(|e| panic!("{user}'s list: {e}"))
    };
    let hers = list("alice");
    assert_eq!(
        hers["destinations"][0]["target"], "alice@example.org",
        "{hers}"
    );
    let his = list("bob");
    assert_eq!(
        his["destinations"].as_array().map(Vec::len),
        Some(0),
        "{his}"
    );
}

/// Submits `echo hello-<user>` as `user` and waits until it succeeded.
fn run_job(out: &Path, home: &Path, user: &str) {
    let submit = mgpu_as(
        out,
        home,
        user,
        &["submit", "-q", "--", &format!("echo hello-{user}")],
    )
    .output()
    .unwrap_or_else(|e| panic!("{e}"));
    let id = String::from_utf8_lossy(&submit.stdout).trim().to_owned();
    assert!(
        submit.status.success() && !id.is_empty(),
        "{user}'s submit failed: {}",
        String::from_utf8_lossy(&submit.stderr)
    );
    wait_for(
        &format!("{user}'s job {id} to succeed"),
        Duration::from_secs(60),
        || {
            let show = mgpu_as(out, home, user, &["show", &id, "--json"])
                .output()
                .ok()?;
            let job: serde_json::Value = serde_json::from_slice(&show.stdout).ok()?;
            assert!(
                !matches!(job["state"].as_str(), Some("failed" | "cancelled")),
                "{job}"
            );
            (job["state"] == "succeeded").then(|| assert_eq!(job["user"], user, "{job}"))
        },
    );
    let logs = mgpu_as(out, home, user, &["logs", &id]).output().ok();
    let text = logs
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    assert!(text.contains(&format!("hello-{user}")), "{text}");
}

#[test]
fn a_generated_site_runs_a_job_per_user_and_grows_by_a_user() {
    site_story(false);
}

#[test]
fn a_generated_site_with_tls_runs_a_job_per_user_and_grows_by_a_user() {
    site_story(true);
}

/// The whole story, with TLS or without.
fn site_story(tls: bool) {
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("{e}"));
    let websocket = mgpu_tests::free_port();
    let description = tmp.path().join("site.toml");
    let jetstream = tmp.path().join("jetstream");
    std::fs::write(
        &description,
        site_toml(tls, port, websocket, &jetstream, &["alice", "bob"]),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let out = tmp.path().join("site");
    let written = write_site(&description, &out);
    assert!(written.len() >= 20, "{written:?}");
    let keys = seeds(&out);
    // The credentials directory's eight (scheduler, notify, two nodes, two users, an admin, a
    // viewer), the head's two and each GPU host's, and the four people's.
    assert_eq!(keys.len(), 16, "{keys:?}");
    let head_etc = out.join(HEAD).join("etc/mgpu");
    for file in ["keys/scheduler.nk", "keys/notify.nk", "notify.toml"] {
        assert!(head_etc.join(file).exists(), "{file} on the head");
    }
    let notify_key = std::fs::read_to_string(head_etc.join("keys/notify.nk")).ok();
    let notify_seed = std::fs::read_to_string(out.join("auth/keys/notify-notify.nk")).ok();
    assert!(notify_key.is_some() && notify_key == notify_seed);
    for gpu_host in ["gpu01", "gpu02.lab"] {
        assert!(!out.join(gpu_host).join("etc/mgpu/notify.toml").exists());
    }
    for (path, (text, mode)) in &keys {
        assert_eq!(*mode, 0o600, "{}", path.display());
        assert!(text.starts_with("SU"), "{}", path.display());
    }

    let mut services = Services::new(&tmp.path().join("logs"));
    let mut nats = Command::new(nats_server_bin());
    nats.arg("-c").arg(loopback_server_conf(&out));
    let nats_pid = services.spawn("nats-server", nats);
    wait_for("nats-server to listen", Duration::from_secs(10), || {
        std::net::TcpStream::connect(("127.0.0.1", port)).ok()
    });

    let scheduler_bin = bin_dir().join("mgpu-scheduler");
    let run = tmp.path().join("run");
    let scheduler_conf = localized(&out, HEAD, "scheduler.toml", &run, tmp.path());
    let mut scheduler = Command::new(&scheduler_bin);
    scheduler.args(config_args(&scheduler_bin, &scheduler_conf));
    services.spawn("scheduler", scheduler);
    // mgpu-notify from its own file: it connects with its key and makes its stream, buckets
    // and consumers under the permissions the site's auth.conf gives it.
    let notify_bin = bin_dir().join("mgpu-notify");
    let notify_conf = localized(&out, HEAD, "notify.toml", &run, tmp.path());
    let mut notify = Command::new(&notify_bin);
    notify.args(config_args(&notify_bin, &notify_conf));
    services.spawn("notify", notify);
    let node_bin = bin_dir().join("mgpu-node");
    for (node, host) in [("gpu01", "gpu01"), ("gpu02", "gpu02.lab")] {
        let state = tmp.path().join("state").join(node);
        let conf = localized(&out, host, "node.toml", &run, &state);
        let mut agent = Command::new(&node_bin);
        agent
            .args(config_args(&node_bin, &conf))
            .args(["--heartbeat-interval", "200ms", "--kill-grace", "2s"])
            // alice and bob have no Unix accounts here: jobs run as the agent's.
            .env("MGPU_JOBS_AS_AGENT_USER", "true")
            .env("MGPU_ALLOW_ROOT_JOBS", "true");
        services.spawn(node, agent);
    }
    let homes = tmp.path().join("home");
    let admin_home = homes.join("root-admin");
    wait_online(2, || mgpu_as(&out, &admin_home, "root-admin", &[]));
    for user in ["alice", "bob"] {
        run_job(&out, &homes.join(user), user);
    }
    wait_for("mgpu-notify to deliver", Duration::from_secs(30), || {
        services.assert_running("notify");
        services
            .log("notify")
            .contains("mgpu-notify delivering notices")
            .then_some(())
    });
    notify_destinations_are_private(&out, &homes);
    wall_screen_reads_the_queue(&out, &homes.join("wall"));

    // A third user: only that user's files and those naming every principal change.
    std::fs::write(
        &description,
        site_toml(tls, port, websocket, &jetstream, &["alice", "bob", "carol"]),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let before: Vec<PathBuf> = keys.keys().cloned().collect();
    let mut rewritten = write_site(&description, &out);
    rewritten.sort();
    let head = |file: &str| format!("{HEAD}/etc/mgpu/{file}");
    let mut expected = vec![
        "auth/auth.conf".to_owned(),
        "auth/principals.json".to_owned(),
        head("auth.conf"),
        head("principals.json"),
        "users/carol/mgpu.env".to_owned(),
        "users/carol/mgpu.nk".to_owned(),
    ];
    if tls {
        expected.push("users/carol/ca.pem".to_owned());
    }
    expected.sort();
    assert_eq!(rewritten, expected);
    let after = seeds(&out);
    for path in &before {
        assert_eq!(after.get(path), keys.get(path), "{}", path.display());
    }
    let added: Vec<&PathBuf> = after.keys().filter(|p| !keys.contains_key(*p)).collect();
    assert_eq!(added.len(), 2, "{added:?}");

    // The server reloads (its auth.conf is the one just written); the scheduler re-reads the
    // principals file by itself.
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(nats_pid as i32),
        nix::sys::signal::Signal::SIGHUP,
    );
    wait_for("carol to be known", Duration::from_secs(30), || {
        let out = mgpu_as(&out, &homes.join("carol"), "carol", &["queue"])
            .output()
            .ok()?;
        out.status.success().then_some(())
    });
    run_job(&out, &homes.join("carol"), "carol");
    services.assert_running("scheduler");
    services.assert_running("notify");
}

/// The site's viewer (a wall screen) signs in with the key written for it and reads the queue
/// the users' jobs went through; its settings name its role.
fn wall_screen_reads_the_queue(out: &Path, home: &Path) {
    let env = std::fs::read_to_string(out.join("users/wall/mgpu.env"))
        .unwrap_or_else(|e| panic!("users/wall/mgpu.env: {e}"));
    assert!(env.contains("(viewer)"), "{env}");
    let queue = mgpu_as(out, home, "wall", &["queue", "--json"])
        .output()
        .unwrap_or_else(|e| panic!("mgpu queue as wall: {e}"));
    assert!(
        queue.status.success(),
        "the viewer's mgpu queue: {}",
        String::from_utf8_lossy(&queue.stderr)
    );
}
