//! The service's settings: its flags (each also a key of its config file, by default
//! `/etc/mgpu/notify.toml`, read with `mgpu-config`) and the file's `[notify]` section:
//!
//! ```toml
//! server = "nats://head:4222"      # any flag, by its long name with `_` for `-`
//!
//! [notify]
//! smtp = "smtp://mail.lab.example:25"   # the site's relay; without it e-mail is not sent
//! from = "mgpu@lab.example"             # the sender of the mails
//! max_per_minute = 10                   # notices per destination per minute; the rest summarised
//! ```

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use clap::Parser;
use serde::Deserialize;

use mgpu_protocol::notify::destination::validate_address;

/// What the config file holds beside the flags' keys.
pub const SERVICE: mgpu_config::Service = mgpu_config::Service {
    command_line_only: &["print_config"],
    sections: &["notify"],
    legacy: None,
};

/// Tells job owners what they asked to hear (`mgpu submit --notify`), through the
/// destinations they set (`mgpu notify add`): chat and generic webhooks, and e-mail.
#[derive(Debug, Parser)]
#[command(name = "mgpu-notify", version)]
pub struct Args {
    /// NATS server URL; several, comma-separated, for a cluster.
    #[arg(long, env = "MGPU_SERVER", default_value = "nats://127.0.0.1:4222")]
    pub server: String,
    /// The service's nkey seed file (`keys/notify-notify.nk` of `mgpu admin init`).
    #[arg(long, env = "MGPU_CREDS", value_name = "FILE")]
    pub creds: PathBuf,
    /// CA certificate (PEM) the server's must be signed by: connect with TLS only.
    #[arg(long, env = "MGPU_CA", value_name = "FILE")]
    pub ca: Option<PathBuf>,
    /// Copies of the notices stream and the buckets in a NATS cluster (1 to 5); as the
    /// scheduler's `--replicas` (auto: the number of servers given, up to 3).
    #[arg(long, default_value = "auto")]
    pub replicas: mgpu_nats::streams::Replicas,
    /// Config file (TOML): a key for every flag and the `[notify]` section (smtp, from,
    /// max_per_minute). Flags and environment override it; the default file may be absent.
    #[arg(
        long,
        env = "MGPU_NOTIFY_CONFIG",
        value_name = "FILE",
        default_value = "/etc/mgpu/notify.toml"
    )]
    pub config: PathBuf,
    /// Print the settings in effect as TOML, each with where it came from, and exit.
    #[arg(long)]
    pub print_config: bool,
    /// How log lines are written: `text`, or `json` (one object per line).
    #[arg(long, env = "MGPU_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: mgpu_config::LogFormat,
    /// How often running jobs are looked at for 80 % of their time limit (`--notify time80`).
    #[arg(long, default_value = "15s", value_parser = parse_interval)]
    pub time80_interval: Duration,
}

fn parse_interval(text: &str) -> Result<Duration, String> {
    mgpu_protocol::duration::parse_duration(text).map_err(|e| e.to_string())
}

/// The `[notify]` section as written.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Section {
    smtp: Option<String>,
    from: Option<String>,
    max_per_minute: Option<u32>,
    /// The throttle's window; a minute unless a test wants a shorter one.
    throttle_window: Option<String>,
}

/// What the `[notify]` section sets, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NotifySettings {
    /// The relay, `host:port` (None: e-mail destinations are skipped, with a warning).
    pub smtp: Option<(String, u16)>,
    pub from: String,
    pub max_per_minute: u32,
    pub window: Duration,
}

/// Notices each destination gets per minute before the rest are summarised.
pub const DEFAULT_MAX_PER_MINUTE: u32 = 10;

impl NotifySettings {
    /// The `[notify]` table of the config file (absent: the defaults).
    pub fn from_table(table: Option<&toml::Value>) -> Result<NotifySettings> {
        let section: Section = match table {
            Some(value) => value.clone().try_into().context("in [notify]")?,
            None => Section::default(),
        };
        let smtp = section.smtp.as_deref().map(parse_smtp).transpose()?;
        let from = section.from.unwrap_or_else(|| "mgpu@localhost".to_owned());
        validate_address(&from).context("[notify] from")?;
        let max_per_minute = section.max_per_minute.unwrap_or(DEFAULT_MAX_PER_MINUTE);
        if max_per_minute == 0 {
            bail!("[notify] max_per_minute must be at least 1");
        }
        let window = match section.throttle_window.as_deref() {
            Some(text) => parse_interval(text)
                .map_err(anyhow::Error::msg)
                .context("[notify] throttle_window")?,
            None => Duration::from_secs(60),
        };
        if window.is_zero() {
            bail!("[notify] throttle_window must be longer than 0s");
        }
        Ok(NotifySettings {
            smtp,
            from,
            max_per_minute,
            window,
        })
    }
}

/// `smtp://host:port` (port 25 when left out), or `host:port`.
fn parse_smtp(text: &str) -> Result<(String, u16)> {
    let rest = text.strip_prefix("smtp://").unwrap_or(text);
    let rest = rest.trim_end_matches('/');
    let (host, port) = match rest.rsplit_once(':') {
        Some((host, port)) => (host, port.parse::<u16>().ok()),
        None => (rest, Some(25)),
    };
    match port {
        Some(port) if !host.is_empty() && port != 0 => Ok((host.to_owned(), port)),
        _ => bail!("[notify] smtp = \"{text}\" is not smtp://HOST[:PORT]"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(text: &str) -> Result<NotifySettings> {
        let table: toml::Table = toml::from_str(text)?;
        NotifySettings::from_table(table.get("notify"))
    }

    #[test]
    fn the_section_reads_with_defaults() {
        let read = settings("[notify]\nsmtp = \"smtp://mail.lab:2525\"\nmax_per_minute = 3\n");
        let read = read.ok();
        assert_eq!(
            read.as_ref().and_then(|s| s.smtp.clone()),
            Some(("mail.lab".to_owned(), 2525))
        );
        assert_eq!(read.as_ref().map(|s| s.max_per_minute), Some(3));
        assert_eq!(read.map(|s| s.window), Some(Duration::from_secs(60)));
        let empty = settings("").ok();
        assert_eq!(empty.map(|s| (s.smtp, s.max_per_minute)), Some((None, 10)));
        assert_eq!(
            settings("[notify]\nsmtp = \"mail\"\n")
                .ok()
                .and_then(|s| s.smtp),
            Some(("mail".to_owned(), 25))
        );
    }

    #[test]
    fn bad_values_are_refused_naming_the_key() {
        for (text, key) in [
            ("[notify]\nmax_per_minute = 0\n", "max_per_minute"),
            ("[notify]\nsmtp = \"smtp://:25\"\n", "smtp"),
            ("[notify]\nfrom = \"nobody\"\n", "from"),
            ("[notify]\nsmpt = \"x\"\n", "smpt"),
        ] {
            let err = settings(text)
                .err()
                .map(|e| format!("{e:#}"))
                .unwrap_or_default();
            assert!(err.contains(key), "{text}: {err}");
        }
    }
}
