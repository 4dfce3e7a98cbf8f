//! Config files, told as stories: the services read a TOML file (`--config FILE`) with a key
//! for every flag, the flags and environment override it, `--print-config` shows the settings
//! in effect and where each came from, an unknown key stops a service naming the key and the
//! file, and `--log-format json` makes every log line a JSON object carrying the job and node.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use mgpu_tests::{Cluster, NodeSpec, bin_dir, wait_for};
use serde_json::Value;

const T: Duration = Duration::from_secs(30);

/// A config file named `name` holding `text`, in `dir`.
fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    path
}

/// Runs a service binary with exactly `env` for its environment (none of this process's
/// `MGPU_*`), so that only what the story sets reaches it.
fn run(binary: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(bin_dir().join(binary))
        .args(args)
        .env_clear()
        .envs(env.iter().copied())
        .output()
        .unwrap_or_else(|e| panic!("running {binary}: {e}"))
}

/// `--print-config`'s output, which must succeed.
fn printed(binary: &str, args: &[&str], env: &[(&str, &str)]) -> String {
    let out = run(binary, args, env);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{binary} {args:?} failed: {}{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The value (as written) and the source comment of `key` in `printed` (or in the part of
/// it given: one section).
fn setting(printed: &str, key: &str) -> (String, String) {
    let line = printed
        .lines()
        .find(|line| line.starts_with(&format!("{key} = ")))
        .unwrap_or_else(|| panic!("no `{key}` in\n{printed}"));
    let (value, source) = line.split_once("  # ").unwrap_or((line, ""));
    let value = value.trim_start_matches(&format!("{key} = ")).trim_end();
    (value.to_owned(), source.to_owned())
}

/// Asserts that `key` is `value` from `source` in `printed`.
fn assert_setting(printed: &str, key: &str, value: &str, source: &str) {
    assert_eq!(
        setting(printed, key),
        (value.to_owned(), source.to_owned()),
        "{key} in\n{printed}"
    );
}

/// The refusal of a service to start: it fails, and says why on standard error.
fn refusal(binary: &str, args: &[&str]) -> String {
    let out = run(binary, args, &[]);
    assert!(!out.status.success(), "{binary} {args:?} started");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn the_agent_takes_a_key_per_flag_with_the_environment_and_flags_over_the_file() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let config = write(
        dir.path(),
        "node.toml",
        "creds = \"/etc/mgpu/node-node007.nk\"\nnode = \"node007\"\ngpus = \"2x24GiB\"\n\
         heartbeat_interval = \"5s\"\nkill_grace = \"3s\"\nfence_after = \"30s\"\n\
         label = [\"rack=r1\", \"row=2\"]\nmem_threshold = 0.5\ncgroup = \"off\"\n\
         log_format = \"json\"\n",
    );
    let config = config.display().to_string();
    let shown = printed(
        "mgpu-node",
        &["--config", &config, "--kill-grace", "1s", "--print-config"],
        &[("MGPU_FENCE_AFTER", "4s")],
    );
    assert!(
        shown.contains(&format!("# Config file: {config}.")),
        "{shown}"
    );
    for (key, value, source) in [
        ("heartbeat_interval", "\"5s\"", "file"),
        ("kill_grace", "\"1s\"", "flag"),
        ("fence_after", "\"4s\"", "env MGPU_FENCE_AFTER"),
        ("label", "[\"rack=r1\", \"row=2\"]", "file"),
        ("mem_threshold", "0.5", "file"),
        ("node", "\"node007\"", "file"),
        ("log_format", "\"json\"", "file"),
        ("server", "\"nats://127.0.0.1:4222\"", "default"),
        ("jobs_as_agent_user", "false", "default"),
    ] {
        assert_setting(&shown, key, value, source);
    }
    assert!(shown.contains("# address: not set"), "{shown}");
    assert!(
        !shown.contains("print_gpus") && !shown.contains("config ="),
        "{shown}"
    );

    // What it prints is a config file of its own: read back alone, it gives the same values.
    let again = write(dir.path(), "again.toml", &shown);
    let reread = printed(
        "mgpu-node",
        &["--config", &again.display().to_string(), "--print-config"],
        &[],
    );
    let values = |text: &str| -> Vec<String> {
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| l.split(" # ").next().unwrap_or("").trim().to_owned())
            .collect()
    };
    assert_eq!(values(&reread), values(&shown));
}

#[test]
fn the_scheduler_reads_its_policy_section_and_still_the_old_policy_file() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let config = write(
        dir.path(),
        "scheduler.toml",
        "creds = \"/etc/mgpu/scheduler.nk\"\nprincipals = \"/etc/mgpu/principals.json\"\n\
         missed_heartbeats = 5\n\n[policy]\nplacement = \"spread\"\nhalf_life = \"2h\"\n",
    );
    let config = config.display().to_string();
    let shown = printed(
        "mgpu-scheduler",
        &[
            "--config",
            &config,
            "--max-attempts",
            "4",
            "--placement",
            "fill_first",
            "--print-config",
        ],
        &[("MGPU_SERVER", "nats://a:4222,nats://b:4222")],
    );
    let (flags, policy) = shown
        .split_once("\n[policy]\n")
        .unwrap_or_else(|| panic!("no [policy] in\n{shown}"));
    assert_setting(flags, "missed_heartbeats", "5", "file");
    assert_setting(flags, "max_attempts", "4", "flag");
    assert_setting(
        flags,
        "server",
        "\"nats://a:4222,nats://b:4222\"",
        "env MGPU_SERVER",
    );
    assert_setting(flags, "creds", "\"/etc/mgpu/scheduler.nk\"", "file");
    assert_setting(policy, "half_life", "\"2h\"", "file");
    assert_setting(policy, "age_weight", "100.0", "default");
    // The flag over the section's key of the same name.
    assert_setting(
        policy,
        "placement",
        "\"fill_first\"",
        "from `placement` above",
    );

    // The policy file of before: policy keys alone, at the top level.
    let old = write(
        dir.path(),
        "policy.toml",
        "placement = \"spread\"\nhalf_life = \"2h\"\n",
    );
    let shown = printed(
        "mgpu-scheduler",
        &[
            "--config",
            &old.display().to_string(),
            "--creds",
            "/c.nk",
            "--principals",
            "/p.json",
            "--print-config",
        ],
        &[],
    );
    let (_, policy) = shown.split_once("\n[policy]\n").unwrap_or_default();
    assert_setting(policy, "placement", "\"spread\"", "file");
}

#[test]
fn an_unknown_key_or_a_bad_value_stops_a_service_naming_the_key_and_the_file() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let creds = ["--creds", "/c.nk", "--principals", "/p.json"];
    let cases: [(&str, &str, &[&str]); 6] = [
        (
            "mgpu-node",
            "heartbeat_intervall = \"1s\"\n",
            &[
                "unknown key `heartbeat_intervall`",
                "did you mean `heartbeat_interval`",
            ],
        ),
        (
            "mgpu-node",
            "heartbeat_interval = \"fast\"\n",
            &["heartbeat_interval", "`fast`"],
        ),
        (
            "mgpu-node",
            "print_gpus = true\n",
            &["`print_gpus` cannot be set in a config file"],
        ),
        (
            "mgpu-scheduler",
            "[polcy]\nplacement = \"spread\"\n",
            &["unknown section [polcy]"],
        ),
        (
            "mgpu-scheduler",
            "[policy]\nplacment = \"spread\"\n",
            &["[policy]", "placment"],
        ),
        (
            "mgpu-scheduler",
            "server = \"nats://a:4222\"\nhalf_life = \"1h\"\n",
            &["`half_life` is a policy key: put it under [policy]"],
        ),
    ];
    for (i, (binary, text, expected)) in cases.into_iter().enumerate() {
        let config = write(dir.path(), &format!("{i}.toml"), text);
        let config = config.display().to_string();
        let args: Vec<&str> = ["--config", config.as_str()]
            .into_iter()
            .chain(creds)
            .collect();
        let args = if binary == "mgpu-node" {
            &args[..4]
        } else {
            &args[..]
        };
        let said = refusal(binary, args);
        assert!(said.contains(&config), "{binary} {text}: {said}");
        for words in expected {
            assert!(said.contains(words), "{binary} {text}: {said}");
        }
    }
    // A file named on purpose must be there; the default one need not.
    let missing = dir.path().join("missing.toml").display().to_string();
    let said = refusal("mgpu-node", &["--config", &missing, "--creds", "/c.nk"]);
    assert!(
        said.contains("cannot read the config file") && said.contains(&missing),
        "{said}"
    );
    if !Path::new("/etc/mgpu/node.toml").exists() {
        let shown = printed("mgpu-node", &["--creds", "/c.nk", "--print-config"], &[]);
        assert!(shown.contains("/etc/mgpu/node.toml (absent)"), "{shown}");
    }
}

/// Every line of a component's log, as JSON objects; fails on a line that is not one.
fn json_lines(cluster: &Cluster, component: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(cluster.log_path(component)).unwrap_or_default();
    text.lines()
        .map(|line| {
            serde_json::from_str(line).unwrap_or_else(|e| {
                cluster.dump_logs();
                panic!("{component}: not a JSON line ({e}): {line}")
            })
        })
        .collect()
}

#[test]
fn a_cluster_runs_from_config_files_and_logs_json_lines_with_the_job_and_node() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let scheduler = write(
        dir.path(),
        "scheduler.toml",
        "log_format = \"json\"\n\n[policy]\nplacement = \"spread\"\n",
    );
    let node = write(
        dir.path(),
        "node.toml",
        "label = [\"rack=r1\"]\nmem_threshold = 0.5\nload_threshold = 0.6\nlog_format = \"json\"\n",
    );
    let node = node.display().to_string();
    let cluster = Cluster::start_with(
        &[
            NodeSpec::new("node001", "2x24GiB").agent_args(&["--config", &node]),
            NodeSpec::new("node002", "2x24GiB").agent_args(&[
                "--config",
                &node,
                "--load-threshold",
                "0.7",
            ]),
        ],
        &["--config", &scheduler.display().to_string()],
    );
    // The agents' keys, and a flag over one of them.
    let nodes: Value = serde_json::from_str(&cluster.mgpu_ok(&["nodes", "--json"]))
        .unwrap_or_else(|e| panic!("{e}"));
    let of = |name: &str| -> Value {
        nodes
            .as_array()
            .and_then(|all| all.iter().find(|n| n["node"] == name).cloned())
            .unwrap_or_else(|| panic!("{name} not in {nodes}"))
    };
    assert_eq!(of("node001")["labels"]["rack"], "r1", "{nodes}");
    assert_eq!(
        of("node001")["mem_threshold"].as_f64(),
        Some(0.5),
        "{nodes}"
    );
    assert_eq!(
        of("node001")["load_threshold"].as_f64(),
        Some(0.6),
        "{nodes}"
    );
    assert_eq!(
        of("node002")["load_threshold"].as_f64(),
        Some(0.7),
        "{nodes}"
    );

    // The scheduler's [policy]: spread puts the second job on the idle node.
    let first = cluster.submit(&[], "sleep 2");
    let first_on = cluster.wait_state(&first, "running", T)["node"].clone();
    let second = cluster.submit(&[], "sleep 2");
    let second_on = cluster.wait_state(&second, "running", T)["node"].clone();
    assert_ne!(first_on, second_on, "spread from [policy]");
    cluster.finished_as(&first, "succeeded", T);

    // Each agent line is a JSON object naming its node; the job's lines name the job.
    let agent = first_on.as_str().unwrap_or_default().to_owned();
    let lines = wait_for("the agent to log the job's exit", T, || {
        let lines = json_lines(&cluster, &agent);
        lines
            .iter()
            .any(|l| l["message"] == "job exited" && l["job"] == first.as_str())
            .then_some(lines)
    });
    assert!(
        lines.iter().all(|l| l["node"] == agent.as_str()),
        "{lines:?}"
    );
    let started = lines
        .iter()
        .find(|l| l["message"] == "job started")
        .unwrap_or_else(|| panic!("no start logged: {lines:?}"));
    assert_eq!(started["job"], first.as_str(), "{started}");
    assert_eq!(started["attempt"], 1, "{started}");
    assert_eq!(started["level"], "INFO", "{started}");
    assert!(started["timestamp"].is_string(), "{started}");

    // The scheduler's too, with the job as a field where a line is about one.
    let lines = json_lines(&cluster, "scheduler");
    assert!(
        lines.iter().any(|l| l["job"] == first.as_str()),
        "no scheduler line names {first}: {lines:?}"
    );
}
