//! The `mgpu-notify` binary: settings, logging, the connection, the stream and buckets, then
//! the two consumers and the time-limit sweep until SIGTERM or Ctrl+C.

use std::process::ExitCode;

use anyhow::{Context as _, Result};
use async_nats::jetstream;

use mgpu_nats::connect::{ConnectTarget, connect_with};
use mgpu_notify::config::{Args, NotifySettings, SERVICE};
use mgpu_notify::deliver::{self, Deliverer};
use mgpu_notify::destinations::Destinations;
use mgpu_notify::events;
use mgpu_protocol::notify::{DESTINATIONS_BUCKET, SENT_BUCKET};

#[tokio::main]
async fn main() -> ExitCode {
    let loaded = mgpu_config::load_or_exit::<Args>(&SERVICE);
    let settings = match NotifySettings::from_table(loaded.sections.get("notify")) {
        Ok(settings) => settings,
        Err(err) => {
            eprintln!("error: {err:#}");
            return ExitCode::from(2);
        }
    };
    let mut printable = loaded.settings;
    if loaded.args.print_config {
        if let Some(table) = loaded.sections.get("notify").and_then(|t| t.as_table()) {
            let written = table
                .iter()
                .map(|(key, value)| mgpu_config::Setting {
                    key: key.clone(),
                    value: Some(value.clone()),
                    source: mgpu_config::Source::File,
                })
                .collect();
            printable.add_section("notify", written);
        }
        let _ = std::io::Write::write_all(&mut std::io::stdout(), printable.render().as_bytes());
        return ExitCode::SUCCESS;
    }
    let args = loaded.args;
    let log_format = args.log_format;
    mgpu_config::logging::init(log_format, "info", &[]);
    match run(args, settings).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            mgpu_config::logging::fatal(log_format, &format_args!("{err:#}"));
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args, settings: NotifySettings) -> Result<()> {
    let target = ConnectTarget {
        server: args.server.clone(),
        creds: args.creds.clone(),
        ca: args.ca.clone(),
    };
    let client = connect_with(&target, "mgpu-notify", async_nats::ConnectOptions::new()).await?;
    let js = jetstream::new(client);
    mgpu_nats::notify_streams::ensure(&js, args.replicas.resolve(&args.server)).await?;
    let destinations = Destinations::follow(js.get_key_value(DESTINATIONS_BUCKET).await?).await?;
    let sent = js
        .get_key_value(SENT_BUCKET)
        .await
        .context("the sent bucket")?;
    if settings.smtp.is_none() {
        tracing::warn!(
            "no [notify] smtp relay in the config file: e-mail destinations get nothing"
        );
    }
    // The notices consumer first: a notice published from an event is never before it.
    let notices = deliver::consumer(&js).await?;
    let event_consumer = events::consumer(&js).await?;
    tracing::info!(
        max_per_minute = settings.max_per_minute,
        "mgpu-notify delivering notices"
    );
    let deliverer = Deliverer::new(js.clone(), sent, destinations, settings);
    tokio::select! {
        result = deliverer.run(notices) => result,
        result = events::run(js.clone(), event_consumer) => result,
        () = events::time80_sweep(js.clone(), args.time80_interval) => Ok(()),
        () = shutdown() => {
            tracing::info!("stopping");
            Ok(())
        }
    }
}

/// SIGTERM (systemd) or Ctrl+C.
async fn shutdown() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = term => {}
    }
}
