//! `mgpu-scheduler`: the service that decides which queued job runs where. The library
//! (`lib.rs`) holds the machine and the driver; this file reads the settings, makes sure the
//! streams exist, and acts while this replica holds the lease.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use tokio::sync::watch;

use mgpu_nats::connect::{ConnectTarget, connect};
use mgpu_nats::streams::{MAX_AUTO_REPLICAS, Replicas, StreamSettings, WhenTooLarge};
use mgpu_scheduler::driver::replica::{self, SchedulerMetrics};
use mgpu_scheduler::{
    config, driver, identity, idle_config, limits_file, qos_config, reservations_config,
};

/// The mgpu scheduler: takes submissions from `jobs.submit`, places jobs on node agents,
/// and keeps every job's record in JetStream. Stop it and start it again at any time:
/// nothing is lost.
#[derive(Parser, Debug)]
#[command(name = "mgpu-scheduler", version)]
struct Args {
    /// NATS server URL(s), comma-separated for a cluster.
    #[arg(long, env = "MGPU_SERVER", default_value = "nats://127.0.0.1:4222")]
    server: String,
    /// File holding the scheduler's nkey seed.
    #[arg(long, env = "MGPU_CREDS")]
    creds: PathBuf,
    /// The principals file `mgpu admin` keeps (`principals.json`: names, roles, public keys;
    /// no secrets): request signatures are checked against it, and it is re-read when it
    /// changes.
    #[arg(long, env = "MGPU_PRINCIPALS", value_name = "FILE")]
    principals: PathBuf,
    /// CA certificate (PEM) the server's certificate must be signed by: connect with TLS only.
    #[arg(long, env = "MGPU_CA", value_name = "FILE")]
    ca: Option<PathBuf>,
    /// Copies of each stream and bucket: `auto` = min(3, distinct servers in --server), or
    /// 1 to 5. Existing streams are updated to this count.
    #[arg(long, default_value = "auto")]
    replicas: Replicas,
    /// Total job output kept, in MiB, across all jobs (oldest output goes first).
    #[arg(long, default_value_t = 4096)]
    output_max_mib: i64,
    /// Finished jobs' records kept in history, in GiB (the oldest go first; also a year at
    /// most).
    #[arg(long, default_value_t = 10)]
    history_max_gib: i64,
    /// Config file (TOML): a key for every flag (`missed_heartbeats = 5`) and the scheduling
    /// policy under `[policy]` (an older file of policy keys alone still loads). Flags and
    /// environment override it; the default file may be absent.
    #[arg(
        long,
        env = "MGPU_SCHEDULER_CONFIG",
        value_name = "FILE",
        default_value = "/etc/mgpu/scheduler.toml"
    )]
    config: PathBuf,
    /// Print the settings in effect (file, environment and flags merged) as TOML, each with
    /// where it came from, and exit.
    #[arg(long)]
    print_config: bool,
    /// How log lines are written: `text`, or `json` (one object per line; `job` and `node`
    /// are fields).
    #[arg(long, env = "MGPU_LOG_FORMAT", value_enum, default_value = "text")]
    log_format: mgpu_config::LogFormat,
    /// Where jobs go when several nodes fit: fill_first (pack) or spread.
    #[arg(long, value_parser = parse_placement)]
    placement: Option<mgpu_protocol::priority::PlacementPolicy>,
    /// Cluster-wide time limit (`12h`, `90`, `1-00:00:00`); a time slice for jobs that requeue.
    #[arg(long, value_parser = parse_seconds)]
    max_job_time: Option<u64>,
    /// Heartbeats a node may miss before it is offline and its running jobs are lost.
    #[arg(long, default_value_t = mgpu_protocol::node::MISSED_HEARTBEATS_OFFLINE,
          value_parser = clap::value_parser!(u32).range(1..=1000))]
    missed_heartbeats: u32,
    /// Attempts a job gets when its nodes keep getting lost; then it ends `node_failed`.
    #[arg(long, default_value_t = mgpu_protocol::priority::Policy::default().max_attempts,
          value_parser = clap::value_parser!(u32).range(1..=1000))]
    max_attempts: u32,
    /// Serve Prometheus metrics on this address (`GET /metrics`), e.g. `0.0.0.0:9450`.
    /// Off by default; the endpoint has no authentication.
    #[arg(long, env = "MGPU_METRICS_LISTEN", value_name = "ADDR")]
    metrics_listen: Option<std::net::SocketAddr>,
}

fn parse_placement(text: &str) -> Result<mgpu_protocol::priority::PlacementPolicy, String> {
    match text {
        "fill_first" | "fill-first" | "pack" => {
            Ok(mgpu_protocol::priority::PlacementPolicy::FillFirst)
        }
        "spread" => Ok(mgpu_protocol::priority::PlacementPolicy::Spread),
        other => Err(format!(
            "`{other}` is not a placement policy: fill_first or spread"
        )),
    }
}

fn parse_seconds(text: &str) -> Result<u64, String> {
    mgpu_protocol::duration::parse_duration(text)
        .map(|d| d.as_secs())
        .map_err(|e| e.to_string())
}

#[tokio::main]
async fn main() -> ExitCode {
    let loaded = mgpu_config::load_or_exit::<Args>(&config::SERVICE);
    // Before anything connects: a bad policy stops the scheduler at once.
    let policy = match policy_of(&loaded) {
        Ok(policy) => policy,
        Err(err) => {
            eprintln!("error: {err:#}");
            return ExitCode::FAILURE;
        }
    };
    // Like the policy, bad limits stop the scheduler before it connects.
    let limits = match limits_file::LimitsFile::new(loaded.file.as_deref(), &loaded.sections) {
        Ok(limits) => limits,
        Err(err) => {
            eprintln!("error: {err:#}");
            return ExitCode::FAILURE;
        }
    };
    let sizes_chosen = SizesChosen {
        output: was_chosen(&loaded.settings, "output_max_mib"),
        history: was_chosen(&loaded.settings, "history_max_gib"),
    };
    let args = loaded.args;
    if args.print_config {
        let mut settings = loaded.settings;
        let section = config::policy_section(&loaded.sections);
        settings.add_section(
            "policy",
            config::policy_settings(&policy, section, &settings),
        );
        for (name, table) in limits.limits.printable() {
            settings.add_section(&name, table);
        }
        for (name, mut table) in qos_config::printable(&policy.qos, loaded.sections.get("qos")) {
            let class = name.trim_start_matches("qos.");
            table.extend(limits.limits.class_settings(class));
            settings.add_section(&name, table);
        }
        if let Some(idle) = &policy.idle {
            let written = loaded.sections.get("idle");
            settings.add_section("idle", idle_config::printable(idle, written));
        }
        let written = loaded.sections.get("reservations");
        let reservations = reservations_config::printable(&policy.reservations, written);
        settings.add_section("reservations", reservations);
        // Written, not `print!`ed: `--print-config | head` closes the pipe early, which is
        // the reader's choice and no reason to panic.
        let _ = std::io::Write::write_all(&mut std::io::stdout(), settings.render().as_bytes());
        return ExitCode::SUCCESS;
    }
    let log_format = args.log_format;
    mgpu_config::logging::init(log_format, "info", &[]);
    match run(args, (policy, limits), sizes_chosen).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            mgpu_config::logging::fatal(log_format, &format_args!("{err:#}"));
            ExitCode::FAILURE
        }
    }
}

/// Which stream sizes someone set (file, environment or flag) rather than left at the
/// default: those are kept or refused, never shrunk to fit the server's storage.
struct SizesChosen {
    output: bool,
    history: bool,
}

fn was_chosen(settings: &mgpu_config::print::Settings, key: &str) -> bool {
    settings
        .get(key)
        .is_some_and(|setting| setting.source != mgpu_config::print::Source::Default)
}

fn when_too_large(chosen: bool) -> WhenTooLarge {
    if chosen {
        WhenTooLarge::Refuse
    } else {
        WhenTooLarge::Shrink
    }
}

async fn run(
    args: Args,
    (policy, limits): (mgpu_protocol::priority::Policy, limits_file::LimitsFile),
    sizes_chosen: SizesChosen,
) -> anyhow::Result<()> {
    let target = ConnectTarget {
        server: args.server.clone(),
        creds: args.creds.clone(),
        ca: args.ca.clone(),
    };
    let metrics = std::sync::Arc::new(SchedulerMetrics::default());
    replica::serve_metrics(args.metrics_listen, &metrics).await?;
    let client = connect(&target, "mgpu-scheduler").await?;
    tracing::info!(server = %args.server, "connected");
    let replicas = args.replicas.resolve(&args.server);
    tracing::info!(replicas, rule = %args.replicas, "stream replicas");
    warn_if_cluster_is_larger(&client, replicas, args.replicas);
    let settings = StreamSettings {
        replicas,
        output_max_bytes: args.output_max_mib.saturating_mul(1024 * 1024),
        history_max_bytes: args.history_max_gib.saturating_mul(1024 * 1024 * 1024),
        output_when_too_large: when_too_large(sizes_chosen.output),
        history_when_too_large: when_too_large(sizes_chosen.history),
        ..StreamSettings::default()
    };
    let (shutdown_tx, mut shutdown_rx) = watch::channel(false);
    tokio::spawn(async move {
        wait_for_signal().await;
        let _ = shutdown_tx.send(true);
    });
    let js = async_nats::jetstream::new(client.clone());
    if !ensure_streams(&js, &settings, &mut shutdown_rx).await? {
        return Ok(());
    }
    // Read once here, so a missing or broken file stops the scheduler at once.
    let principals = identity::Principals::load(&args.principals)?;
    // Stand by until this replica holds the lease; act while it does; stand by again if it
    // is lost (another replica took over while this one was stalled), or if acting failed
    // for a reason that may pass (NATS electing a leader while the state was loaded).
    let holder = lease_holder_name();
    while let Some(lease) = replica::acquire(&js, &holder, &mut shutdown_rx).await? {
        let acted = driver::run(
            client.clone(),
            policy.clone(),
            (principals.clone(), limits.clone()),
            (shutdown_rx.clone(), lease.gate()),
            metrics.clone(),
        )
        .await;
        if *shutdown_rx.borrow() {
            break;
        }
        if let Err(err) = acted {
            tracing::error!("{err:#}; standing by and trying again");
            drop(lease);
            tokio::select! {
                _ = shutdown_rx.changed() => break,
                () = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
            }
        }
    }
    // Flush what is still buffered (acks, last events) before leaving.
    let _ = client.drain().await;
    Ok(())
}

/// The config file's `[policy]` (if any) with the flags over it.
fn policy_of(
    loaded: &mgpu_config::Loaded<Args>,
) -> anyhow::Result<mgpu_protocol::priority::Policy> {
    let section = config::policy_section(&loaded.sections);
    let mut policy = config::load_policy(section, loaded.file.as_deref())?;
    policy.qos = qos_config::load(loaded.sections.get("qos"))?;
    policy.idle = idle_config::load(loaded.sections.get("idle"))?;
    policy.reservations = reservations_config::load(loaded.sections.get("reservations"))?;
    let args = &loaded.args;
    if let Some(placement) = args.placement {
        policy.placement = placement;
    }
    if let Some(max) = args.max_job_time {
        policy.max_job_time_secs = Some(max);
    }
    policy.missed_heartbeats = args.missed_heartbeats;
    policy.max_attempts = args.max_attempts;
    Ok(policy)
}

/// Creates or updates the streams and buckets. A NATS cluster that just started elects its
/// JetStream leader first (a few seconds): until then creating streams times out, and until
/// every server has reported to that leader, replicated streams find "no suitable peers for
/// placement" (JetStream error 10005). Both are worth waiting for, not dying of. False when
/// asked to stop while waiting.
async fn ensure_streams(
    js: &async_nats::jetstream::Context,
    settings: &StreamSettings,
    shutdown: &mut watch::Receiver<bool>,
) -> anyhow::Result<bool> {
    let mut tries = 0u32;
    loop {
        match mgpu_nats::streams::ensure(js, settings).await {
            Ok(()) => return Ok(true),
            Err(err) if tries < retries_for(&err.to_string()) => {
                tries += 1;
                if tries == 1 || tries.is_multiple_of(10) {
                    tracing::warn!(
                        "creating streams: {err}; JetStream is not ready (the NATS cluster forming, electing a leader, or a server out of disk): retrying"
                    );
                }
                tokio::select! {
                    _ = shutdown.changed() => return Ok(false),
                    () = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
                }
            }
            Err(err) => return Err(err.into()),
        }
    }
}

/// This replica's name in the lease: host, process and a random suffix.
fn lease_holder_name() -> String {
    format!(
        "{}-{}-{}",
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_owned())
            .unwrap_or_else(|_| "host".into()),
        std::process::id(),
        &mgpu_protocol::ids::JobId::random().as_str()[..6]
    )
}

/// How many times (a second apart) creating the streams is tried again after `error`: 60 for
/// a cluster still forming; 20 for a shortage of storage, which a disk that filled up explains
/// for a while but a stream larger than the server's whole JetStream storage (a
/// `history_max_gib` too large) explains for ever, and the operator must hear about that one
/// (the scheduler stops, naming the setting) within half a minute; none for anything else.
fn retries_for(error: &str) -> u32 {
    match is_cluster_still_forming(error) {
        true if error.contains("insufficient storage resources") => 20,
        true => 60,
        false => 0,
    }
}

/// Whether creating the streams failed because JetStream is not ready yet: no meta leader
/// (the request times out, or the server answers 503 "JetStream system temporarily
/// unavailable", error code 10008, while the meta group elects one), not every server known
/// to it (no peers to place replicas on), or a server whose disk filled up and turned
/// JetStream off until it restarts ("insufficient storage resources available", 10047: a
/// replica cannot be placed; seen by the fault campaign, seed 103, where every scheduler
/// replica gave up on it and no job ended). A lasting shortage is reported after the
/// retries, as before.
fn is_cluster_still_forming(error: &str) -> bool {
    error.contains("timed out")
        || error.contains("temporarily unavailable")
        || error.contains("no suitable peers for placement")
        || error.contains("insufficient storage resources")
}

/// A scheduler given one URL of a cluster keeps one copy of everything (see
/// [`Replicas::resolve`] for why the URL list decides); the server's INFO, which lists the
/// cluster's client URLs, is good enough to notice that and say what to do.
fn warn_if_cluster_is_larger(client: &async_nats::Client, replicas: usize, rule: Replicas) {
    let announced = client.server_info().connect_urls.len();
    if rule == Replicas::Auto && replicas < MAX_AUTO_REPLICAS && announced > replicas {
        tracing::warn!(
            replicas,
            announced,
            "the server announces more cluster addresses than --server lists: pass every \
             server's URL (or --replicas N) so that streams survive the loss of a server"
        );
    }
}

async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::is_cluster_still_forming;

    #[test]
    fn a_shortage_of_storage_is_waited_for_less_long_than_a_forming_cluster() {
        use super::retries_for;
        let full = "creating stream MGPU_HISTORY: insufficient storage resources available (code 500, error code 10047)";
        assert_eq!(retries_for(full), 20);
        assert_eq!(retries_for("creating stream MGPU_EVENTS: timed out"), 60);
        assert_eq!(
            retries_for("stream name already in use with a different configuration"),
            0
        );
    }

    #[test]
    fn a_forming_cluster_is_waited_for_and_other_errors_are_not() {
        assert!(is_cluster_still_forming(
            "JetStream: creating stream MGPU_REQUESTS: jetstream error: no suitable peers for placement (code 400, error code 10005)"
        ));
        assert!(is_cluster_still_forming(
            "creating stream MGPU_EVENTS: timed out"
        ));
        // Seen by the fault campaign: both replicas gave up while the meta group elected.
        assert!(is_cluster_still_forming(
            "JetStream: creating stream MGPU_AUDIT: jetstream error: JetStream system temporarily unavailable (code 503, error code 10008)"
        ));
        assert!(is_cluster_still_forming(
            "JetStream: creating stream MGPU_REQUESTS: jetstream error: insufficient storage resources available (code 500, error code 10047)"
        ));
        assert!(!is_cluster_still_forming(
            "creating stream MGPU_EVENTS: stream name already in use with a different configuration"
        ));
    }
}
