//! Unit tests of the config file under the flags, on a small command line of the services'
//! shape: a required flag, an environment variable, a switch, a repeatable flag, a bounded
//! number, and `[policy]` as a section with the legacy format.

use std::path::{Path, PathBuf};

use clap::Parser;

use super::*;
use crate::{LogFormat, Source};

#[derive(Debug, Parser)]
#[command(name = "mgpu-test")]
struct Args {
    #[arg(long, default_value = "/nonexistent/mgpu/test.toml")]
    config: PathBuf,
    #[arg(long)]
    print_config: bool,
    #[arg(long, default_value = "nats://127.0.0.1:4222")]
    server: String,
    #[arg(long)]
    creds: PathBuf,
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=10))]
    missed_heartbeats: u32,
    #[arg(long, default_value = "2s", value_parser = parse_seconds)]
    heartbeat_interval: u64,
    #[arg(long)]
    jobs_as_agent_user: bool,
    #[arg(long = "label")]
    labels: Vec<String>,
    #[arg(long, value_enum, default_value = "text")]
    log_format: LogFormat,
    /// PATH is set wherever tests run: it stands for a flag's environment variable.
    #[arg(long, env = "PATH")]
    search_path: Option<String>,
}

fn parse_seconds(text: &str) -> Result<u64, String> {
    text.strip_suffix('s')
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| format!("`{text}` is not a number of seconds"))
}

const SERVICE: Service = Service {
    command_line_only: &["print_config"],
    sections: &["policy"],
    legacy: Some(Legacy {
        section: "policy",
        keys: &["placement", "half_life"],
    }),
};

/// A config file with `text` in a fresh directory (kept alive by the returned guard).
fn file(text: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let path = dir.path().join("test.toml");
    std::fs::write(&path, text).unwrap_or_else(|e| panic!("{e}"));
    (dir, path)
}

fn load(path: &Path, flags: &[&str]) -> Result<Loaded<Args>, Error> {
    let argv = ["mgpu-test", "--config", &path.display().to_string()]
        .into_iter()
        .map(str::to_owned)
        .chain(flags.iter().map(|f| (*f).to_owned()))
        .collect::<Vec<_>>();
    load_from(&SERVICE, argv)
}

fn loaded(path: &Path, flags: &[&str]) -> Loaded<Args> {
    load(path, flags).unwrap_or_else(|e| panic!("{e}"))
}

fn file_error(path: &Path, flags: &[&str]) -> String {
    match load(path, flags) {
        Err(Error::File(message)) => message,
        Err(Error::Clap(err)) => panic!("a command-line error, not the file's: {err}"),
        Ok(loaded) => panic!("accepted: {:?}", loaded.args),
    }
}

#[test]
fn every_flag_has_a_key_and_each_is_honoured() {
    let (_dir, path) = file(
        "server = \"nats://a:4222,nats://b:4222\"\ncreds = \"/etc/mgpu/n.nk\"\n\
         missed_heartbeats = 7\nheartbeat_interval = \"5s\"\njobs_as_agent_user = true\n\
         label = [\"rack=r1\", \"row=2\"]\nlog_format = \"json\"\n",
    );
    let loaded = loaded(&path, &[]);
    let args = &loaded.args;
    assert_eq!(args.server, "nats://a:4222,nats://b:4222");
    assert_eq!(args.creds, PathBuf::from("/etc/mgpu/n.nk"));
    assert_eq!(args.missed_heartbeats, 7);
    assert_eq!(args.heartbeat_interval, 5);
    assert!(args.jobs_as_agent_user);
    assert_eq!(args.labels, ["rack=r1", "row=2"]);
    assert_eq!(args.log_format, LogFormat::Json);
    for key in [
        "server",
        "creds",
        "missed_heartbeats",
        "label",
        "log_format",
    ] {
        let source = loaded.settings.get(key).map(|s| s.source.clone());
        assert_eq!(source, Some(Source::File), "{key}");
    }
    assert_eq!(
        loaded
            .settings
            .get("missed_heartbeats")
            .map(|s| s.source.clone()),
        Some(Source::File)
    );
    assert!(loaded.sections.is_empty());
}

#[test]
fn flags_override_the_file_and_a_repeated_flag_replaces_its_list() {
    let (_dir, path) = file(
        "creds = \"/f.nk\"\nmissed_heartbeats = 7\nlabel = [\"rack=r1\"]\njobs_as_agent_user = false\n",
    );
    let loaded = loaded(
        &path,
        &[
            "--missed-heartbeats",
            "2",
            "--label",
            "rack=r9",
            "--jobs-as-agent-user",
        ],
    );
    assert_eq!(loaded.args.missed_heartbeats, 2);
    assert_eq!(loaded.args.labels, ["rack=r9"]);
    assert!(loaded.args.jobs_as_agent_user);
    assert_eq!(loaded.args.creds, PathBuf::from("/f.nk"));
    let source = |key: &str| loaded.settings.get(key).map(|s| s.source.clone());
    assert_eq!(source("missed_heartbeats"), Some(Source::Flag));
    assert_eq!(source("creds"), Some(Source::File));
    assert_eq!(source("server"), Some(Source::Default));
}

#[test]
fn the_environment_overrides_the_file() {
    let Ok(path_variable) = std::env::var("PATH") else {
        return;
    };
    let (_dir, path) = file("creds = \"/f.nk\"\nsearch_path = \"/from/the/file\"\n");
    let loaded = loaded(&path, &[]);
    assert_eq!(
        loaded.args.search_path.as_deref(),
        Some(path_variable.as_str())
    );
    assert_eq!(
        loaded.settings.get("search_path").map(|s| s.source.clone()),
        Some(Source::Env("PATH".into()))
    );
}

#[test]
fn an_unknown_key_is_an_error_naming_it_and_the_file() {
    let (_dir, path) = file("creds = \"/f.nk\"\nmissed_heartbeat = 4\n");
    let message = file_error(&path, &[]);
    assert!(message.contains("`missed_heartbeat`"), "{message}");
    assert!(message.contains(&path.display().to_string()), "{message}");
    assert!(
        message.contains("did you mean `missed_heartbeats`"),
        "{message}"
    );

    let (_dir, path) = file("creds = \"/f.nk\"\nprint_config = true\n");
    let message = file_error(&path, &[]);
    assert!(message.contains("only as --print-config"), "{message}");
    let (_dir, path) = file("config = \"/other.toml\"\n");
    assert!(file_error(&path, &[]).contains("`config` cannot be set"));
}

#[test]
fn sections_the_service_reads_are_handed_over_and_others_are_errors() {
    let (_dir, path) = file("creds = \"/f.nk\"\n[policy]\nhalf_life = \"1h\"\n");
    let loaded = loaded(&path, &[]);
    let half_life = loaded
        .sections
        .get("policy")
        .and_then(|p| p.get("half_life"))
        .and_then(toml::Value::as_str);
    assert_eq!(half_life, Some("1h"));

    let (_dir, path) = file("creds = \"/f.nk\"\n[limits.default]\ngpus = 4\n");
    let message = file_error(&path, &[]);
    assert!(
        message.contains("unknown section [limits]") && message.contains("[policy]"),
        "{message}"
    );
    let (_dir, path) = file("creds = \"/f.nk\"\npolicy = 3\n");
    assert!(file_error(&path, &[]).contains("write it as [policy]"));
}

#[test]
fn the_legacy_format_is_read_as_its_section_but_not_mixed_with_flags() {
    let (_dir, path) = file("placement = \"spread\"\nhalf_life = \"1h\"\n");
    let loaded = loaded(&path, &["--creds", "/c.nk"]);
    let placement = loaded
        .sections
        .get("policy")
        .and_then(|p| p.get("placement"))
        .and_then(toml::Value::as_str);
    assert_eq!(placement, Some("spread"));

    let (_dir, path) = file("creds = \"/f.nk\"\nhalf_life = \"1h\"\n");
    let message = file_error(&path, &[]);
    assert!(
        message.contains("`half_life` is a policy key: put it under [policy]"),
        "{message}"
    );
}

#[test]
fn a_value_the_flag_refuses_is_an_error_naming_the_key_and_the_file() {
    let cases = [
        ("missed_heartbeats = 0", "missed_heartbeats: `0`"),
        (
            "heartbeat_interval = \"soon\"",
            "`soon` is not a number of seconds",
        ),
        ("log_format = \"xml\"", "`xml` is not one of text, json"),
        (
            "jobs_as_agent_user = \"yes\"",
            "is a switch: write true or false",
        ),
        (
            "server = [\"a\", \"b\"]",
            "server: takes one value, not a list",
        ),
        (
            "creds = { path = \"/x\" }",
            "creds: takes a value, not a table",
        ),
    ];
    for (line, expected) in cases {
        let (_dir, path) = file(&format!("{line}\n"));
        let message = file_error(&path, &["--creds", "/c.nk"]);
        assert!(message.contains(expected), "{line}: {message}");
        assert!(message.contains(&path.display().to_string()), "{message}");
    }
    let (_dir, path) = file("server = \n");
    assert!(file_error(&path, &[]).contains("TOML parse error"));
}

#[test]
fn the_file_satisfies_a_required_flag() {
    let (_dir, path) = file("server = \"nats://a:4222\"\n");
    assert!(matches!(load(&path, &[]), Err(Error::Clap(_))));
    let (_dir, path) = file("creds = \"/f.nk\"\n");
    assert_eq!(loaded(&path, &[]).args.creds, PathBuf::from("/f.nk"));
}

#[test]
fn a_missing_default_file_is_no_file_but_a_named_one_is_an_error() {
    let loaded = load_from::<Args, _, _>(&SERVICE, ["mgpu-test", "--creds", "/c.nk"])
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(loaded.args.missed_heartbeats, 3);
    assert!(loaded.settings.render().contains("(absent)"));

    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let missing = dir.path().join("missing.toml");
    let message = file_error(&missing, &["--creds", "/c.nk"]);
    assert!(message.contains("cannot read the config file"), "{message}");
    assert!(
        message.contains(&missing.display().to_string()),
        "{message}"
    );
}

#[test]
fn help_is_left_to_clap() {
    let result = load_from::<Args, _, _>(&SERVICE, ["mgpu-test", "--help"]);
    assert!(
        matches!(&result, Err(Error::Clap(e)) if e.kind() == clap::error::ErrorKind::DisplayHelp),
        "{result:?}"
    );
}

#[test]
fn the_printed_settings_are_a_config_file_that_gives_the_same_settings() {
    let (_dir, path) = file(
        "creds = \"/f.nk\"\nmissed_heartbeats = 7\nlabel = [\"rack=r1\"]\n\
         [policy]\nhalf_life = \"1h\"\n",
    );
    let first = loaded(
        &path,
        &["--heartbeat-interval", "9s", "--log-format", "json"],
    );
    let printed = first.settings.render();
    assert!(printed.contains("missed_heartbeats = 7"), "{printed}");
    assert!(printed.contains("heartbeat_interval = \"9s\""), "{printed}");
    assert!(printed.contains("# search_path: not set") || printed.contains("# env PATH"));
    // The environment's value is printed too, which the file would then repeat; without it
    // the printed file reads back as the same settings.
    let without_env: String = printed
        .lines()
        .filter(|line| !line.contains("# env "))
        .map(|line| format!("{line}\n"))
        .collect();
    let (_dir, again) = file(&without_env);
    let second = loaded(&again, &[]);
    assert_eq!(
        format!("{:?}", second.args).replace(&*again.display().to_string(), ""),
        format!("{:?}", first.args).replace(&*path.display().to_string(), "")
    );
}

#[test]
fn near_keys_are_suggested_and_far_ones_are_not() {
    let known = ["heartbeat_interval", "kill_grace", "server"];
    assert_eq!(
        closest("heartbeat_intervall", known.into_iter()),
        Some("heartbeat_interval")
    );
    assert_eq!(closest("severs", known.into_iter()), Some("server"));
    assert_eq!(closest("colour", known.into_iter()), None);
    assert_eq!(edit_distance("kitten", "sitting"), 3);
}
