//! The command line of `mgpu-node`, the value parsers behind it, and the host facts used as
//! defaults (host name, Unix user).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use serde::Serialize;

use crate::gpu::GpuProbe;
use crate::gpu_spec::{DeclaredSpec, parse_gpu_spec};
use crate::gpu_type::{TypeOverrides, parse_feature, parse_gpu_type, parse_gpu_type_of};

/// What `mgpu-node`'s config file holds beside its flags' keys: nothing; and the flags that
/// are actions, not settings, and so have no key.
pub const SERVICE: mgpu_config::Service = mgpu_config::Service {
    command_line_only: &["print_config", "print_gpus"],
    sections: &[],
    legacy: None,
};

/// The mgpu node agent: reports this host's GPUs and runs the jobs the scheduler assigns to it.
#[derive(Debug, Parser)]
#[command(name = "mgpu-node", version)]
pub struct Args {
    /// Config file (TOML): a key for every flag, its long name with `_` for `-`
    /// (`heartbeat_interval = "2s"`, `label = ["rack=r1"]`). Flags and environment override
    /// it; the default file may be absent.
    #[arg(
        long,
        env = "MGPU_NODE_CONFIG",
        value_name = "FILE",
        default_value = "/etc/mgpu/node.toml"
    )]
    pub config: PathBuf,

    /// Print the settings in effect (file, environment and flags merged) as TOML, each with
    /// where it came from, and exit.
    #[arg(long)]
    pub print_config: bool,

    /// How log lines are written: `text`, or `json` (one object per line; `node` and `job`
    /// are fields).
    #[arg(long, env = "MGPU_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: mgpu_config::LogFormat,

    /// Name of this node in mgpu (letters, digits, `-`, `_`). Defaults to the short host name.
    #[arg(long, env = "MGPU_NODE", value_name = "NAME")]
    pub node: Option<String>,

    /// NATS server URL; several, comma-separated, for a cluster.
    #[arg(
        long,
        env = "MGPU_SERVER",
        value_name = "URL[,URL…]",
        default_value = "nats://127.0.0.1:4222"
    )]
    pub server: String,

    /// File holding this node's nkey seed (from `mgpu admin`).
    #[arg(
        long,
        env = "MGPU_CREDS",
        value_name = "FILE",
        required_unless_present = "print_gpus"
    )]
    pub creds: Option<PathBuf>,

    /// CA certificate (PEM) the server's certificate must be signed by: connect with TLS only.
    #[arg(long, env = "MGPU_CA", value_name = "FILE")]
    pub ca: Option<PathBuf>,

    /// Declare the GPUs instead of reading them through NVML: comma-separated COUNTxSIZE
    /// groups, e.g. `2x24GiB` or `4x80GiB,2x16GiB` (sizes in MiB, GiB or TiB), each with its
    /// GPUs' type if wanted: `2x24GiB:rtx-4090,1x80GiB:a100-80gb`.
    #[arg(long, value_name = "SPEC", value_parser = parse_gpu_spec)]
    pub gpus: Option<DeclaredSpec>,

    /// Declared GPUs to use only when NVML cannot be loaded (no NVIDIA driver); same form as
    /// --gpus. Heartbeats then say why.
    #[arg(long, value_name = "SPEC", value_parser = parse_gpu_spec)]
    pub fallback_gpus: Option<DeclaredSpec>,

    /// A JSON file saying what the declared GPUs are doing, read at every heartbeat instead of
    /// NVML: `{"gpus": [{"index": 0, "utilization_pct": 37, "memory_used_mib": 1200,
    /// "processes": [{"pid": 1234, "used_mib": 1000}]}]}`, every field but `index` optional.
    /// GPUs it does not list (and all of them while it is missing) are idle and empty.
    #[arg(long, value_name = "FILE")]
    pub gpu_samples: Option<PathBuf>,

    /// The type of every GPU here as jobs ask for it (`--gpu-type a100-80gb`), instead of the
    /// one derived from the model name or declared in --gpus: lower-case letters, digits, `-`.
    #[arg(long, env = "MGPU_NODE_GPU_TYPE", value_name = "TYPE", value_parser = parse_gpu_type)]
    pub gpu_type: Option<String>,

    /// The type of one GPU, by index (repeatable): `--gpu-type-of 0=h100`. Wins over
    /// --gpu-type.
    #[arg(long = "gpu-type-of", value_name = "INDEX=TYPE", value_parser = parse_gpu_type_of)]
    pub gpu_types_of: Vec<(u32, String)>,

    /// How often to send a heartbeat (`2s`, `500ms`, `1m`).
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = parse_interval)]
    pub heartbeat_interval: Duration,

    /// How long a stopped job gets between SIGTERM and SIGKILL (`10s`, `500ms`).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_interval)]
    pub kill_grace: Duration,

    /// Address other nodes reach this one at, as shown in heartbeats. Defaults to the local IP
    /// address of a connection to the first NATS server, or the host name when that is a
    /// loopback address (the server runs on this host).
    #[arg(long, value_name = "ADDR")]
    pub address: Option<String>,

    /// Directory of the state file (`DIR/<node>.json`) in which the agent remembers the job
    /// attempts it runs, so that after a crash it stops the ones left behind. Defaults to
    /// `$XDG_STATE_HOME/mgpu`, else `~/.local/state/mgpu`.
    #[arg(long, env = "MGPU_STATE_DIR", value_name = "DIR")]
    pub state_dir: Option<PathBuf>,

    /// Do not offer a GPU when processes mgpu did not start use more than this share of its
    /// memory (0.0 to 1.0).
    #[arg(
        long,
        value_name = "SHARE",
        default_value_t = mgpu_protocol::node::DEFAULT_THRESHOLD,
        value_parser = parse_threshold
    )]
    pub mem_threshold: f64,

    /// Do not offer a GPU that runs no mgpu job when its utilisation exceeds this share
    /// (0.0 to 1.0).
    #[arg(
        long,
        value_name = "SHARE",
        default_value_t = mgpu_protocol::node::DEFAULT_THRESHOLD,
        value_parser = parse_threshold
    )]
    pub load_threshold: f64,

    /// Stop every job when no heartbeat could be stored for this long (`10s`), since the
    /// scheduler may then count the node as offline and run the jobs elsewhere; `off` never
    /// does. Default: 3 heartbeat intervals (the scheduler's default offline detection), at
    /// least 10s so that a NATS cluster electing a new leader (about 5s) stops nothing. The
    /// scheduler holds a lost node's jobs until the fence and --kill-grace have passed.
    #[arg(long, env = "MGPU_FENCE_AFTER", value_name = "DURATION|off", default_value = "default",
          value_parser = parse_fence, hide_default_value = true)]
    pub fence_after: Fence,

    /// Run every job as the agent's own account, whoever submitted it (single-user machines).
    /// By default an agent running as root runs each job as its owner's Unix account.
    #[arg(long, env = "MGPU_JOBS_AS_AGENT_USER")]
    pub jobs_as_agent_user: bool,

    /// Allow jobs to run as root (a user mapped to root, or --jobs-as-agent-user on an agent
    /// running as root). Refused by default.
    #[arg(long, env = "MGPU_ALLOW_ROOT_JOBS")]
    pub allow_root_jobs: bool,

    /// The program every job starts under, which stops the job if this agent dies or loses
    /// contact: the path of `mgpu-job-guard`, or `builtin` for this binary's own guard (the
    /// same, but slower to start: about a millisecond of CPU per job). Default:
    /// `mgpu-job-guard` beside this binary, else the built-in guard.
    #[arg(long, env = "MGPU_JOB_GUARD", value_name = "PATH|builtin")]
    pub job_guard: Option<String>,

    /// How jobs are contained: `auto` puts each job in its own cgroup (v2 where the unified
    /// hierarchy has the controllers, else the v1 freezer) when this agent may make cgroups,
    /// so everything a job starts is killed when it ends; `v1` or `v2` insists on one version
    /// (and says so where it is missing); `off` keeps jobs in their process group only.
    #[arg(
        long,
        env = "MGPU_CGROUP",
        value_name = "auto|v1|v2|off",
        default_value = "auto"
    )]
    pub cgroup: crate::cgroup::CgroupChoice,

    /// Guards kept waiting, each in a cgroup of its own, for the next jobs: a contained job
    /// that takes one starts without waiting for its move into a cgroup (which can take
    /// about 10 ms). 0 turns the pool off. Only `mgpu-job-guard` is pooled.
    #[arg(long, env = "MGPU_GUARD_POOL", value_name = "N", default_value_t = crate::guard_pool::DEFAULT_SIZE,
          value_parser = clap::value_parser!(u16).range(0..=64))]
    pub guard_pool: u16,

    /// CPU cores the scheduler may hand out here (jobs' `--cpus` count against them). Default:
    /// the cores this agent may run on. Jobs are pinned to cores this agent may run on.
    #[arg(long, env = "MGPU_NODE_CPUS", value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=i64::from(mgpu_protocol::host::MAX_CPUS)))]
    pub cpus: Option<u32>,

    /// Host memory the scheduler may hand out here (jobs' `--mem-host` count against it):
    /// MiB or with a unit (`256GiB`). Default: the host's total memory.
    #[arg(long, env = "MGPU_NODE_MEM_HOST", value_name = "SIZE",
          value_parser = mgpu_protocol::host::parse_mib)]
    pub mem_host: Option<u64>,

    /// A label for this node, `KEY=VALUE` (repeatable): `--label rack=r1`. Multi-node jobs
    /// prefer nodes that share the value of the scheduler's topology label (`rack`).
    #[arg(long = "label", value_name = "KEY=VALUE", value_parser = parse_label)]
    pub labels: Vec<(String, String)>,

    /// A feature of this node (repeatable): `--feature ib --feature nvlink`. Jobs select
    /// nodes by their features (`mgpu submit --constraint 'ib&nvlink'`).
    #[arg(long = "feature", value_name = "NAME", value_parser = parse_feature)]
    pub features: Vec<String>,

    /// Serve Prometheus metrics on this address (`GET /metrics`), e.g. `0.0.0.0:9451`: per
    /// GPU its readings and the job holding it, per job its CPU and memory. Off by default;
    /// the endpoint has no authentication.
    #[arg(long, env = "MGPU_METRICS_LISTEN", value_name = "ADDR")]
    pub metrics_listen: Option<std::net::SocketAddr>,

    /// Print the GPUs this agent would report, as JSON, and exit without connecting.
    #[arg(long)]
    pub print_gpus: bool,
}

/// `--fence-after`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fence {
    /// 3 heartbeat intervals, at least [`MIN_DEFAULT_FENCE`].
    Default,
    Off,
    After(Duration),
}

/// The shortest default fence: longer than a NATS cluster's leader election.
pub const MIN_DEFAULT_FENCE: Duration = Duration::from_secs(10);

impl Fence {
    /// How long without a stored heartbeat before the agent stops its jobs (None: never). By
    /// default when the scheduler's default offline detection (3 missed heartbeats) would
    /// give up on this node, but not before a NATS leader election is over.
    pub fn resolve(self, heartbeat_interval: Duration) -> Option<Duration> {
        match self {
            Fence::Off => None,
            Fence::After(after) => Some(after),
            Fence::Default => Some(
                heartbeat_interval
                    .saturating_mul(mgpu_protocol::node::MISSED_HEARTBEATS_OFFLINE)
                    .max(MIN_DEFAULT_FENCE),
            ),
        }
    }
}

fn parse_fence(text: &str) -> Result<Fence, String> {
    match text.trim() {
        "default" => Ok(Fence::Default),
        "off" | "never" => Ok(Fence::Off),
        other => match parse_interval(other)? {
            zero if zero.is_zero() => Err("--fence-after must be more than 0 (or `off`)".into()),
            after => Ok(Fence::After(after)),
        },
    }
}

/// A node label: `KEY=VALUE`, both made of letters, digits, `-`, `_`, `.` or `/`.
pub fn parse_label(text: &str) -> Result<(String, String), String> {
    let (key, value) = text
        .split_once('=')
        .ok_or_else(|| format!("`{text}` is not KEY=VALUE (e.g. rack=r1)"))?;
    let plain = |s: &str| {
        !s.is_empty()
            && s.len() <= 64
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c))
    };
    if !plain(key) || !plain(value) {
        return Err(format!(
            "`{text}`: key and value must be 1-64 letters, digits, `-`, `_`, `.` or `/`"
        ));
    }
    Ok((key.to_owned(), value.to_owned()))
}

/// A duration as `mgpu_protocol::duration::parse_duration` reads it (`2s`, `10m`, `1h30m`, `90`),
/// or in milliseconds (`200ms`), which agent timings need and job time limits do not.
pub fn parse_interval(text: &str) -> Result<Duration, String> {
    let trimmed = text.trim();
    if let Some(millis) = trimmed.strip_suffix("ms") {
        return match millis.trim().parse::<u64>() {
            Ok(0) => Err(format!("`{text}`: a duration must be longer than 0")),
            Ok(millis) => Ok(Duration::from_millis(millis)),
            Err(_) => Err(format!("`{text}` is not a number of milliseconds")),
        };
    }
    mgpu_protocol::duration::parse_duration(trimmed).map_err(|err| err.to_string())
}

/// A share for `--mem-threshold` / `--load-threshold`: a number from 0.0 to 1.0 (`0.8`, `1`).
/// A percentage such as `80` is refused rather than read as "never", which it would mean.
pub fn parse_threshold(text: &str) -> Result<f64, String> {
    let value: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("`{text}` is not a number; give a share from 0.0 to 1.0"))?;
    if !(0.0..=1.0).contains(&value) {
        return Err(format!(
            "`{text}` is out of range: give a share from 0.0 to 1.0 (0.8 means 80%)"
        ));
    }
    Ok(value)
}

/// `--state-dir`'s default: `$XDG_STATE_HOME/mgpu`, else `$HOME/.local/state/mgpu`. The XDG
/// specification says a relative `XDG_STATE_HOME` is to be ignored.
pub fn default_state_dir() -> anyhow::Result<PathBuf> {
    state_dir_from(
        std::env::var_os("XDG_STATE_HOME").map(PathBuf::from),
        std::env::var_os("HOME").map(PathBuf::from),
    )
}

fn state_dir_from(xdg: Option<PathBuf>, home: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    if let Some(xdg) = xdg.filter(|p| p.is_absolute()) {
        return Ok(xdg.join("mgpu"));
    }
    match home.filter(|p| p.is_absolute()) {
        Some(home) => Ok(home.join(".local/state/mgpu")),
        None => Err(anyhow::anyhow!(
            "neither XDG_STATE_HOME nor HOME is set to a full path; pass --state-dir DIR"
        )),
    }
}

/// This node's name: `--node`, else the short host name; checked.
pub fn node_name(args: &Args) -> anyhow::Result<String> {
    let node = match args.node.clone() {
        Some(node) => node,
        None => short_hostname().context("cannot tell this host's name; pass --node NAME")?,
    };
    mgpu_protocol::ids::validate_node_name(&node)
        .map_err(|err| anyhow::anyhow!("--node: {err}"))?;
    Ok(node)
}

/// The GPU types `--gpu-type` and `--gpu-type-of` give (each name checked as it was parsed).
pub fn type_overrides(args: &Args) -> anyhow::Result<TypeOverrides> {
    TypeOverrides::new(args.gpu_type.clone(), &args.gpu_types_of).map_err(anyhow::Error::msg)
}

/// The host name as the kernel has it.
pub fn hostname() -> anyhow::Result<String> {
    let name = nix::unistd::gethostname().context("gethostname")?;
    name.into_string()
        .map_err(|raw| anyhow::anyhow!("the host name {raw:?} is not UTF-8"))
}

/// The host name up to its first dot (`gpu01.lab.example` → `gpu01`): a valid node name on
/// most hosts.
pub fn short_hostname() -> anyhow::Result<String> {
    Ok(short_name(&hostname()?).to_owned())
}

fn short_name(hostname: &str) -> &str {
    hostname.split('.').next().unwrap_or(hostname)
}

/// The Unix account the agent (and so every job) runs as; the uid when it has no name.
pub fn current_user() -> String {
    let uid = nix::unistd::getuid();
    match nix::unistd::User::from_uid(uid) {
        Ok(Some(user)) => user.name,
        _ => uid.to_string(),
    }
}

/// `--print-gpus`: one sample of the inventory, as the heartbeat would carry it.
pub fn print_gpus(probe: &mut dyn GpuProbe) -> anyhow::Result<()> {
    #[derive(Serialize)]
    struct Inventory {
        gpu_source: mgpu_protocol::node::GpuSource,
        #[serde(skip_serializing_if = "Option::is_none")]
        gpu_note: Option<String>,
        gpus: Vec<mgpu_protocol::node::GpuStatus>,
    }
    let mut gpus = probe.sample(&[]).context("reading the GPUs")?;
    // As a heartbeat names them: every GPU process is foreign here (no job runs).
    crate::process_owner::name_foreign_owners(&mut gpus);
    let inventory = Inventory {
        gpu_source: probe.source(),
        gpu_note: probe.note(),
        gpus,
    };
    let text = serde_json::to_string_pretty(&inventory).context("encoding the GPU list")?;
    println!("{text}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn intervals_take_milliseconds_and_the_shared_forms() {
        assert_eq!(parse_interval("200ms"), Ok(Duration::from_millis(200)));
        assert_eq!(parse_interval("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_interval("1m"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_interval("10"), Ok(Duration::from_secs(10)));
        for bad in ["0ms", "ms", "-5ms", "1.5s", "", "0", "fast"] {
            assert!(parse_interval(bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn the_state_dir_follows_xdg_then_home() {
        let dir = |xdg: Option<&str>, home: Option<&str>| {
            state_dir_from(xdg.map(PathBuf::from), home.map(PathBuf::from))
                .ok()
                .map(|p| p.display().to_string())
        };
        assert_eq!(
            dir(Some("/var/state"), Some("/home/a")).as_deref(),
            Some("/var/state/mgpu")
        );
        assert_eq!(
            dir(None, Some("/home/a")).as_deref(),
            Some("/home/a/.local/state/mgpu")
        );
        assert_eq!(
            dir(Some("relative"), Some("/home/a")).as_deref(),
            Some("/home/a/.local/state/mgpu")
        );
        assert_eq!(dir(None, None), None);
        let args = Args::try_parse_from(["mgpu-node", "--creds", "c", "--state-dir", "/tmp/s"]);
        assert_eq!(
            args.ok().and_then(|a| a.state_dir),
            Some(PathBuf::from("/tmp/s"))
        );
    }

    #[test]
    fn the_default_fence_is_three_heartbeats_but_at_least_ten_seconds() {
        let second = Duration::from_secs(1);
        assert_eq!(Fence::Default.resolve(2 * second), Some(MIN_DEFAULT_FENCE));
        assert_eq!(Fence::Default.resolve(5 * second), Some(15 * second));
        assert_eq!(Fence::Off.resolve(5 * second), None);
        assert_eq!(Fence::After(second).resolve(5 * second), Some(second));
        assert_eq!(parse_fence("off"), Ok(Fence::Off));
        assert_eq!(parse_fence("default"), Ok(Fence::Default));
        assert!(parse_fence("0").is_err());
    }

    #[test]
    fn short_names_stop_at_the_first_dot() {
        assert_eq!(short_name("gpu01.lab.example"), "gpu01");
        assert_eq!(short_name("gpu01"), "gpu01");
    }

    #[test]
    fn the_command_line_is_consistent() {
        Args::command().debug_assert();
    }

    #[test]
    fn flags_parse_into_their_types() {
        let args = Args::try_parse_from([
            "mgpu-node",
            "--node",
            "n1",
            "--creds",
            "/tmp/n1.nk",
            "--gpus",
            "2x24GiB",
            "--heartbeat-interval",
            "250ms",
            "--kill-grace",
            "3s",
        ]);
        let Ok(args) = args else {
            panic!("flags did not parse: {args:?}");
        };
        assert_eq!(args.heartbeat_interval, Duration::from_millis(250));
        assert_eq!(args.kill_grace, Duration::from_secs(3));
        assert_eq!(args.gpus.map(|g| g.to_string()).as_deref(), Some("2x24GiB"));
        assert_eq!(args.gpu_samples, None);
        let samples = ["mgpu-node", "--creds", "c", "--gpu-samples", "/run/s.json"];
        assert_eq!(
            Args::try_parse_from(samples)
                .ok()
                .and_then(|a| a.gpu_samples),
            Some(PathBuf::from("/run/s.json"))
        );
        assert!(Args::try_parse_from(["mgpu-node", "--creds", "x", "--gpus", "4"]).is_err());
    }

    #[test]
    fn gpu_types_and_features_parse_and_name_their_flag_when_wrong() {
        let base = ["mgpu-node", "--creds", "/tmp/n1.nk"];
        let flags = base.into_iter().chain([
            "--gpus",
            "1x80GiB:A100-80GB,1x24GiB",
            "--gpu-type",
            "L40S",
            "--gpu-type-of",
            "1=h100",
            "--gpu-type-of",
            "0=t4",
            "--feature",
            "nvlink",
            "--feature",
            "IB",
        ]);
        let args = Args::try_parse_from(flags);
        let Ok(args) = args else {
            panic!("flags did not parse: {args:?}");
        };
        assert_eq!(
            args.gpus.map(|g| g.to_string()).as_deref(),
            Some("1x80GiB:a100-80gb,1x24GiB")
        );
        assert_eq!(args.gpu_type.as_deref(), Some("l40s"));
        assert_eq!(
            args.gpu_types_of,
            vec![(1, "h100".to_owned()), (0, "t4".to_owned())]
        );
        assert_eq!(args.features, vec!["nvlink", "ib"]);
        for (flag, value) in [
            ("--gpu-type", "rtx 4090"),
            ("--gpu-type-of", "h100"),
            ("--gpu-type-of", "0=a100_80gb"),
            ("--feature", "nv/link"),
            ("--gpus", "2x24GiB:rtx_4090"),
        ] {
            let err = Args::try_parse_from(base.into_iter().chain([flag, value]))
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(err.contains(flag), "{flag} {value}: {err}");
        }
        let twice = base
            .into_iter()
            .chain(["--gpu-type-of", "0=h100", "--gpu-type-of", "0=t4"]);
        let Ok(args) = Args::try_parse_from(twice) else {
            panic!("--gpu-type-of twice did not parse");
        };
        let err = type_overrides(&args).err().map(|e| e.to_string());
        assert!(
            err.as_deref().is_some_and(|e| e.contains("--gpu-type-of")),
            "{err:?}"
        );
    }

    #[test]
    fn thresholds_are_shares_from_zero_to_one() {
        assert_eq!(parse_threshold("0.8"), Ok(0.8));
        assert_eq!(parse_threshold("0"), Ok(0.0));
        assert_eq!(parse_threshold("1"), Ok(1.0));
        assert_eq!(parse_threshold(" 0.25 "), Ok(0.25));
        for bad in ["80", "1.01", "-0.1", "NaN", "inf", "", "high"] {
            assert!(parse_threshold(bad).is_err(), "{bad} accepted");
        }
        let message = parse_threshold("80").err().unwrap_or_default();
        assert!(message.contains("0.0 to 1.0"), "{message}");
    }

    #[test]
    fn thresholds_default_to_the_shared_value_and_parse_from_flags() {
        let base = ["mgpu-node", "--creds", "/tmp/n1.nk"];
        let Ok(args) = Args::try_parse_from(base) else {
            panic!("defaults did not parse");
        };
        assert_eq!(args.mem_threshold, mgpu_protocol::node::DEFAULT_THRESHOLD);
        assert_eq!(args.load_threshold, mgpu_protocol::node::DEFAULT_THRESHOLD);
        let flags = base
            .into_iter()
            .chain(["--mem-threshold", "0.5", "--load-threshold", "0.9"]);
        let Ok(args) = Args::try_parse_from(flags) else {
            panic!("threshold flags did not parse");
        };
        assert_eq!(args.mem_threshold, 0.5);
        assert_eq!(args.load_threshold, 0.9);
        let err = Args::try_parse_from(base.into_iter().chain(["--mem-threshold", "1.5"]))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            err.contains("--mem-threshold") && err.contains("0.0 to 1.0"),
            "{err}"
        );
    }
}
