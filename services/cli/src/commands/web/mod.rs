//! `mgpu web`: serves the web dashboard, the page built in `services/web` and embedded in
//! `mgpu` at build time (`assets`, from `build.rs`), over a tiny HTTP server (`site`), and
//! tells the page where the NATS server's WebSocket listener is (`/config.json`; the URL from
//! `--websocket` or derived from `--server` by `websocket`).
//!
//! It only serves files: it neither connects to NATS nor reads a key. The page is a NATS
//! client of its own: the browser connects to the WebSocket listener and signs in with the
//! user's nkey seed, and the server enforces that user's permissions as for any client.

mod assets;
pub mod site;
pub mod websocket;

use std::net::SocketAddr;
use std::path::Path;
use std::process::ExitCode;

use anyhow::{Result, anyhow, bail};
use clap::Args;
use mgpu_protocol::principals::KEYS_DIR;
use tokio::net::TcpListener;
use tokio::signal::unix::{Signal, SignalKind, signal};

use crate::client::session::{ConnectionArgs, current_user};
use crate::console;
use site::Site;

/// What `mgpu web` says when it was built without the page.
pub const NO_PAGE: &str = "this mgpu was built without its web page: build it with \
    `npm ci && npm run build` in services/web (scripts/setup.sh does this), then build mgpu again";

#[derive(Debug, Args)]
#[command(after_long_help = "\
The page is a NATS client in the browser: it connects to the NATS server's WebSocket listener
(what /config.json tells it) and signs in with your nkey seed file, which stays in the
browser; the server enforces your permissions there as for any client. `mgpu web` itself only
serves the page's files: it needs no credentials and no connection to NATS.

Examples:
  mgpu web                                   # http://127.0.0.1:8080/, ws:// from --server
  mgpu web --listen 127.0.0.1:9000
  mgpu web --websocket wss://gpu-head.example.org:4280
  ssh -L 8080:127.0.0.1:8080 -L 4280:127.0.0.1:4280 gpu-head   # then `mgpu web` there")]
pub struct WebArgs {
    /// Address to serve the page on (port 0: any free port, printed at start).
    #[arg(long, default_value = "127.0.0.1:8080", value_name = "ADDR")]
    pub listen: SocketAddr,

    /// WebSocket URL of the NATS server the page connects to. Default: derived from --server,
    /// whose port + 58 is the WebSocket port `mgpu admin init` configures: nats://HOST:4222
    /// gives ws://HOST:4280; tls:// or --ca give wss://.
    #[arg(long, env = "MGPU_WEBSOCKET", value_name = "URL", value_parser = websocket::parse_url)]
    pub websocket: Option<String>,
}

pub async fn run(connection: &ConnectionArgs, args: &WebArgs) -> Result<ExitCode> {
    if assets::FILES.is_empty() {
        bail!(NO_PAGE);
    }
    let websocket = match &args.websocket {
        Some(url) => url.clone(),
        None => websocket::derive(&connection.server, connection.ca.is_some())
            .map_err(|e| anyhow!(e))?,
    };
    let listener = TcpListener::bind(args.listen)
        .await
        .map_err(|err| bind_error(args.listen, &err))?;
    let address = listener.local_addr().unwrap_or(args.listen);
    console::stderr_line(&start_line(
        address,
        &websocket,
        connection.creds.as_deref(),
        &current_user(),
    ));
    tokio::select! {
        () = site::serve(listener, Site::new(assets::FILES, &websocket)) => {}
        () = stopped() => {}
    }
    Ok(ExitCode::SUCCESS)
}

/// Why `--listen` could not be listened on, saying what to do about it.
fn bind_error(address: SocketAddr, err: &std::io::Error) -> anyhow::Error {
    match err.kind() {
        std::io::ErrorKind::AddrInUse => anyhow!(
            "cannot listen on {address}: the address is taken (another mgpu web?); \
             choose another with --listen ADDR"
        ),
        _ => anyhow!("cannot listen on {address}: {err}"),
    }
}

/// The line printed at start: where the page is, where it connects, and what to sign in with.
pub fn start_line(
    address: SocketAddr,
    websocket: &str,
    creds: Option<&Path>,
    user: &str,
) -> String {
    let seed = match creds {
        Some(creds) => creds.display().to_string(),
        None => format!("e.g. .mgpu/auth/{KEYS_DIR}/user-{user}.nk"),
    };
    format!(
        "mgpu web: the dashboard is at http://{address}/ (it connects to {websocket}; \
         sign in with your nkey seed file, {seed})"
    )
}

/// Resolves at SIGINT or SIGTERM. A signal whose handler cannot be set keeps its default
/// action, which ends the process anyway.
async fn stopped() {
    async fn next(signal: Option<Signal>) {
        match signal {
            Some(mut signal) => {
                signal.recv().await;
            }
            None => std::future::pending().await,
        }
    }
    let interrupt = signal(SignalKind::interrupt()).ok();
    let terminate = signal(SignalKind::terminate()).ok();
    tokio::select! {
        () = next(interrupt) => {}
        () = next(terminate) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_start_line_says_where_the_page_is_and_what_to_sign_in_with() {
        let address: SocketAddr = ([127, 0, 0, 1], 8080).into();
        assert_eq!(
            start_line(address, "ws://127.0.0.1:4280", None, "alice"),
            "mgpu web: the dashboard is at http://127.0.0.1:8080/ (it connects to \
             ws://127.0.0.1:4280; sign in with your nkey seed file, e.g. \
             .mgpu/auth/keys/user-alice.nk)"
        );
        let line = start_line(
            address,
            "wss://h:4280",
            Some(Path::new("/home/a/a.nk")),
            "a",
        );
        assert!(
            line.ends_with(
                "(it connects to wss://h:4280; sign in with your nkey seed file, /home/a/a.nk)"
            ),
            "{line}"
        );
    }

    #[test]
    fn a_taken_address_says_to_choose_another() {
        let address: SocketAddr = ([127, 0, 0, 1], 8080).into();
        let taken = std::io::Error::from(std::io::ErrorKind::AddrInUse);
        let message = bind_error(address, &taken).to_string();
        assert!(message.contains("127.0.0.1:8080"), "{message}");
        assert!(message.contains("--listen"), "{message}");
    }

    #[test]
    fn the_websocket_option_takes_only_websocket_urls() {
        use clap::Parser as _;
        let parsed = crate::cli::Cli::try_parse_from(["mgpu", "web", "--websocket", "nats://h:1"]);
        assert!(parsed.is_err());
        let parsed = crate::cli::Cli::try_parse_from(["mgpu", "web", "--listen", "127.0.0.1:0"]);
        assert!(parsed.is_ok());
    }
}
