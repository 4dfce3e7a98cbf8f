//! Where a user's notices go: a chat webhook (Slack, Mattermost, Discord), a generic webhook,
//! or an e-mail address, and what makes one acceptable. `mgpu notify add` refuses what fails
//! [`Destination::validate`], and `mgpu-notify` checks again before it sends (a user could
//! write their bucket entry with another tool): no plain-HTTP URL outside loopback, so a
//! notice never crosses a network unencrypted, and no address that does not parse.

use serde::{Deserialize, Serialize};

use crate::error::InvalidInput;

/// Longest URL or address taken.
pub const MAX_TARGET_BYTES: usize = 2048;

/// One destination, as stored under `<user key>.dest.<id>` in the destinations bucket.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Destination {
    /// A Slack incoming webhook: `{"text": …}`.
    Slack { url: String },
    /// A Mattermost incoming webhook: `{"text": …}`, as Slack's.
    Mattermost { url: String },
    /// A Discord webhook: `{"content": …}`.
    Discord { url: String },
    /// Any HTTP receiver: the notice itself as JSON.
    Webhook { url: String },
    /// Mail through the site's SMTP relay.
    Email { address: String },
}

impl Destination {
    /// Builds one from `mgpu notify add KIND TARGET`, validated.
    pub fn parse(kind: &str, target: &str) -> Result<Destination, InvalidInput> {
        let url = target.trim().to_owned();
        let destination = match kind.trim().to_ascii_lowercase().as_str() {
            "slack" => Destination::Slack { url },
            "mattermost" => Destination::Mattermost { url },
            "discord" => Destination::Discord { url },
            "webhook" => Destination::Webhook { url },
            "email" => Destination::Email { address: url },
            other => {
                return Err(InvalidInput::new(format!(
                    "`{other}` is not a destination: use slack, mattermost, discord, webhook \
                     or email"
                )));
            }
        };
        destination.validate()?;
        Ok(destination)
    }

    pub fn kind(&self) -> &'static str {
        match self {
            Destination::Slack { .. } => "slack",
            Destination::Mattermost { .. } => "mattermost",
            Destination::Discord { .. } => "discord",
            Destination::Webhook { .. } => "webhook",
            Destination::Email { .. } => "email",
        }
    }

    /// The URL or the address.
    pub fn target(&self) -> &str {
        match self {
            Destination::Slack { url }
            | Destination::Mattermost { url }
            | Destination::Discord { url }
            | Destination::Webhook { url } => url,
            Destination::Email { address } => address,
        }
    }

    /// An `https` URL (or `http` to this host), or an address that parses.
    pub fn validate(&self) -> Result<(), InvalidInput> {
        let target = self.target();
        if target.is_empty()
            || target.len() > MAX_TARGET_BYTES
            || target.chars().any(|c| c.is_control() || c.is_whitespace())
        {
            return Err(InvalidInput::new(format!(
                "`{target}` must be 1-{MAX_TARGET_BYTES} characters without spaces"
            )));
        }
        match self {
            Destination::Email { address } => validate_address(address),
            _ => parse_url(target).map(|_| ()),
        }
    }

    /// A short id, the same for the same kind and target: adding one twice keeps one.
    pub fn id(&self) -> String {
        // FNV-1a: stable across versions and platforms, and an id, not a secret.
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in self.kind().bytes().chain([0]).chain(self.target().bytes()) {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
        format!("{hash:016x}")
    }

    /// Its key in the destinations bucket.
    pub fn key(&self, user_key: &str) -> String {
        format!("{user_key}.dest.{}", self.id())
    }
}

/// A URL split as the service connects to it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Url {
    pub tls: bool,
    pub host: String,
    pub port: u16,
    /// The path and query, `/` at least.
    pub path: String,
}

/// Parses `https://host[:port]/path` or `http://` to a loopback host (`127.x`, `::1`,
/// `localhost`); anything else is refused, saying why.
pub fn parse_url(text: &str) -> Result<Url, InvalidInput> {
    let (tls, rest) = if let Some(rest) = text.strip_prefix("https://") {
        (true, rest)
    } else if let Some(rest) = text.strip_prefix("http://") {
        (false, rest)
    } else {
        return Err(InvalidInput::new(format!(
            "`{text}` is not an https:// URL"
        )));
    };
    let (authority, path) = match rest.find(['/', '?']) {
        Some(at) => (&rest[..at], rest[at..].to_owned()),
        None => (rest, "/".to_owned()),
    };
    let path = if path.starts_with('?') {
        format!("/{path}")
    } else {
        path
    };
    if authority.contains('@') {
        return Err(InvalidInput::new(format!(
            "`{text}`: credentials in a URL are not taken"
        )));
    }
    let (host, port) = split_host_port(authority, if tls { 443 } else { 80 })
        .ok_or_else(|| InvalidInput::new(format!("`{text}` has no valid host and port")))?;
    if !tls && !is_loopback(&host) {
        return Err(InvalidInput::new(format!(
            "`{text}` is plain http: use https (http only to this host, 127.0.0.1 or localhost)"
        )));
    }
    Ok(Url {
        tls,
        host,
        port,
        path,
    })
}

/// `host`, `host:port`, `[v6]` or `[v6]:port`.
fn split_host_port(authority: &str, default_port: u16) -> Option<(String, u16)> {
    let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        let port = match after.strip_prefix(':') {
            Some(port) => port.parse().ok()?,
            None if after.is_empty() => default_port,
            None => return None,
        };
        (host, port)
    } else {
        match authority.rsplit_once(':') {
            Some((host, port)) => (host, port.parse().ok()?),
            None => (authority, default_port),
        }
    };
    let valid = !host.is_empty()
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '_'));
    (valid && port != 0).then(|| (host.to_ascii_lowercase(), port))
}

fn is_loopback(host: &str) -> bool {
    host == "localhost"
        || host == "::1"
        || host
            .parse::<std::net::Ipv4Addr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// `local@domain`: one `@`, a local part of printable characters other than `<>()[],;:"\`,
/// and a domain of letters, digits and hyphens in dot-separated labels.
pub fn validate_address(address: &str) -> Result<(), InvalidInput> {
    let refuse = || InvalidInput::new(format!("`{address}` is not an e-mail address"));
    let (local, domain) = address.split_once('@').ok_or_else(refuse)?;
    let local_ok = !local.is_empty()
        && local.len() <= 64
        && local
            .chars()
            .all(|c| c.is_ascii_graphic() && !"<>()[],;:\"\\@".contains(c));
    let domain_ok = !domain.is_empty()
        && domain.len() <= 253
        && domain.split('.').all(|label| {
            !label.is_empty()
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        });
    if local_ok && domain_ok {
        Ok(())
    } else {
        Err(refuse())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn https_anywhere_http_only_to_this_host() {
        let url = parse_url("https://hooks.slack.com/services/T0/B0/x").ok();
        assert_eq!(
            url,
            Some(Url {
                tls: true,
                host: "hooks.slack.com".into(),
                port: 443,
                path: "/services/T0/B0/x".into()
            })
        );
        assert_eq!(
            parse_url("http://127.0.0.1:8080")
                .ok()
                .map(|u| (u.port, u.path)),
            Some((8080, "/".to_owned()))
        );
        assert!(parse_url("http://localhost/x").is_ok());
        assert!(parse_url("http://[::1]:9/x").is_ok());
        let err = parse_url("http://example.com/x").err().map(|e| e.0);
        assert!(err.unwrap_or_default().contains("plain http"));
        assert!(parse_url("ftp://example.com").is_err());
        assert!(parse_url("https://user:pw@example.com").is_err());
        assert!(parse_url("https://:443/").is_err());
        assert!(parse_url("https://example.com:99999/").is_err());
    }

    #[test]
    fn addresses_must_parse() {
        assert!(validate_address("alice@example.com").is_ok());
        assert!(validate_address("a.b+tag@lab-1.example.org").is_ok());
        for bad in [
            "alice",
            "@example.com",
            "alice@",
            "a b@x.org",
            "a@x..org",
            "a@-x.org",
        ] {
            assert!(validate_address(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn parse_names_the_kinds_and_ids_are_stable() {
        let slack = Destination::parse("slack", "https://hooks.slack.com/x");
        assert_eq!(slack.as_ref().map(Destination::kind).ok(), Some("slack"));
        assert!(Destination::parse("pager", "https://x").is_err());
        assert!(Destination::parse("email", "not-an-address").is_err());
        let a = Destination::parse("webhook", "https://a.example/x").ok();
        let b = Destination::parse("webhook", "https://a.example/x").ok();
        assert_eq!(a.map(|d| d.id()), b.map(|d| d.id()));
        let text = serde_json::to_string(&Destination::Email {
            address: "a@b.c".into(),
        })
        .unwrap_or_default();
        assert_eq!(text, r#"{"kind":"email","address":"a@b.c"}"#);
    }
}
