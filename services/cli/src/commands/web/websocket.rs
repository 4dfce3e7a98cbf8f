//! Where the page's browser connects: the NATS server's WebSocket listener, given with
//! `--websocket`, or derived from the server the CLI itself would use (`--server`,
//! `MGPU_SERVER`). `mgpu admin init` puts that listener [`WEBSOCKET_PORT_OFFSET`] ports
//! above the client port (4222 → 4280), with TLS (`wss://`) exactly when the client port has
//! it.

use mgpu_nats::connect::server_list;

use crate::setup::auth::WEBSOCKET_PORT_OFFSET;

/// The client port of a server URL that names none (`nats://host`).
const DEFAULT_CLIENT_PORT: u16 = 4222;

/// The WebSocket URL of the first server of `server` (a comma-separated list, as `--server`
/// takes it): `nats://HOST:PORT` gives `ws://HOST:PORT+58`; `tls://` or `tls` (a CA file,
/// `--ca`, is set) gives `wss://`. A URL that already is a WebSocket one (`ws://`, `wss://`)
/// is kept. The error is a sentence saying what to pass instead.
pub fn derive(server: &str, tls: bool) -> Result<String, String> {
    let servers = server_list(server);
    let Some(first) = servers.first() else {
        return Err("no server URL to derive the WebSocket URL from: pass --websocket URL".into());
    };
    let cannot = |why: &str| {
        format!(
            "cannot derive the WebSocket URL from the server URL `{first}`: {why}; \
             pass --websocket ws://HOST:PORT"
        )
    };
    let (scheme, rest) = match first.split_once("://") {
        Some((scheme, rest)) => (scheme.to_ascii_lowercase(), rest),
        None => ("nats".to_owned(), first.as_str()),
    };
    let secure = match scheme.as_str() {
        "nats" => tls,
        "tls" => true,
        "ws" | "wss" => return Ok(first.trim_end_matches('/').to_owned()),
        _ => return Err(cannot(&format!("unknown scheme `{scheme}://`"))),
    };
    let authority = rest.split(['/', '?']).next().unwrap_or_default();
    // `user:password@host:port`: the page signs in with its own key.
    let authority = authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host);
    let (host, port) = host_and_port(authority).ok_or_else(|| cannot("no host and port"))?;
    let port = port.checked_add(WEBSOCKET_PORT_OFFSET).ok_or_else(|| {
        cannot(&format!(
            "port {port} + {WEBSOCKET_PORT_OFFSET} is beyond 65535"
        ))
    })?;
    let scheme = if secure { "wss" } else { "ws" };
    Ok(format!("{scheme}://{host}:{port}"))
}

/// `host:port`, `[v6]:port`, or a host alone (the default client port).
fn host_and_port(authority: &str) -> Option<(&str, u16)> {
    let (host, port) = if authority.starts_with('[') {
        let end = authority.find(']')?;
        let (host, after) = authority.split_at(end + 1);
        match after {
            "" => (host, None),
            _ => (host, Some(after.strip_prefix(':')?)),
        }
    } else {
        match authority.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        }
    };
    if host.is_empty() || host == "[]" {
        return None;
    }
    let port = match port {
        Some(port) => port.parse().ok()?,
        None => DEFAULT_CLIENT_PORT,
    };
    Some((host, port))
}

/// Checks a `--websocket` value: a `ws://` or `wss://` URL with a host (clap's value parser).
pub fn parse_url(value: &str) -> Result<String, String> {
    let value = value.trim();
    let rest = value
        .strip_prefix("ws://")
        .or_else(|| value.strip_prefix("wss://"))
        .ok_or_else(|| {
            format!("`{value}` is not a WebSocket URL: ws://HOST:PORT or wss://HOST:PORT")
        })?;
    if rest.is_empty() || rest.starts_with(['/', ':', '?']) {
        return Err(format!(
            "`{value}` names no host: ws://HOST:PORT or wss://HOST:PORT"
        ));
    }
    Ok(value.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_websocket_port_is_58_above_the_client_port() {
        assert_eq!(
            derive("nats://127.0.0.1:4222", false).as_deref(),
            Ok("ws://127.0.0.1:4280")
        );
        assert_eq!(
            derive("nats://gpu-head:5000", false).as_deref(),
            Ok("ws://gpu-head:5058")
        );
        assert_eq!(
            derive("127.0.0.1:4222", false).as_deref(),
            Ok("ws://127.0.0.1:4280")
        );
        assert_eq!(
            derive("nats://head", false).as_deref(),
            Ok("ws://head:4280")
        );
        assert_eq!(
            derive("nats://[::1]:4222", false).as_deref(),
            Ok("ws://[::1]:4280")
        );
        assert_eq!(
            derive("nats://[::1]", false).as_deref(),
            Ok("ws://[::1]:4280")
        );
        assert_eq!(
            derive("nats://alice:secret@head:4222/", false).as_deref(),
            Ok("ws://head:4280")
        );
    }

    #[test]
    fn the_first_server_of_a_cluster_is_taken() {
        assert_eq!(
            derive(" nats://a:4222, nats://b:4223", false).as_deref(),
            Ok("ws://a:4280")
        );
    }

    #[test]
    fn tls_gives_wss() {
        assert_eq!(
            derive("tls://head:4222", false).as_deref(),
            Ok("wss://head:4280")
        );
        assert_eq!(
            derive("TLS://head:4222", false).as_deref(),
            Ok("wss://head:4280")
        );
        assert_eq!(
            derive("nats://head:4222", true).as_deref(),
            Ok("wss://head:4280")
        );
        assert_eq!(derive("head:4222", true).as_deref(), Ok("wss://head:4280"));
    }

    #[test]
    fn a_websocket_server_url_is_kept() {
        assert_eq!(
            derive("wss://head:443/", false).as_deref(),
            Ok("wss://head:443")
        );
    }

    #[test]
    fn what_cannot_be_derived_says_to_pass_the_url() {
        for server in [
            "",
            " , ",
            "http://head:80",
            "nats://:4222",
            "nats://head:x",
            "nats://[::1",
        ] {
            let err = derive(server, false).err().unwrap_or_default();
            assert!(err.contains("--websocket"), "{server}: {err}");
        }
        let err = derive("nats://head:65500", false).err().unwrap_or_default();
        assert!(err.contains("beyond 65535"), "{err}");
    }

    #[test]
    fn only_websocket_urls_are_accepted_as_the_option() {
        assert_eq!(
            parse_url("ws://127.0.0.1:4280").as_deref(),
            Ok("ws://127.0.0.1:4280")
        );
        assert_eq!(
            parse_url(" wss://head/nats ").as_deref(),
            Ok("wss://head/nats")
        );
        assert!(parse_url("nats://head:4222").is_err());
        assert!(parse_url("http://head").is_err());
        assert!(parse_url("ws://").is_err());
        assert!(parse_url("ws://:4280").is_err());
    }
}
