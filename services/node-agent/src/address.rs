//! The address other nodes reach this one at (seed 003), shown in heartbeats, when `--address`
//! does not give it.
//!
//! The default is the local IP address of a TCP connection to the first NATS server: the
//! interface the host routes towards the cluster, which is the one its peers share. The probe
//! opens a short connection to that server and nothing else (no packets to public addresses),
//! then closes it. When that address is a loopback one (the server runs on this host) it says
//! nothing to other hosts, and the host name is used instead, as it is when the probe fails.

use std::net::{IpAddr, SocketAddr, TcpStream, ToSocketAddrs};
use std::time::Duration;

use tracing::{debug, info, warn};

/// How long the probe may take per resolved server address.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// NATS's port when a URL names none.
const DEFAULT_PORT: u16 = 4222;

/// Works out the address (blocking: name resolution and a TCP connect). `hostname` is the
/// fallback, asked for only when needed.
pub fn detect(
    servers: &str,
    hostname: impl FnOnce() -> anyhow::Result<String>,
) -> anyhow::Result<String> {
    let local = match first_server(servers) {
        Some((host, port)) => match local_ip_towards(&host, port) {
            Ok(ip) => Some(ip),
            Err(err) => {
                warn!(
                    server = %format!("{host}:{port}"),
                    "cannot tell which address this host uses towards the NATS server ({err}); using the host name"
                );
                None
            }
        },
        None => {
            warn!(
                servers,
                "no server address to probe; using the host name as this node's address"
            );
            None
        }
    };
    match choose(local) {
        Some(address) => {
            info!(
                address,
                "address detected from the connection to the NATS server"
            );
            Ok(address)
        }
        None => {
            if local.is_some() {
                debug!("the NATS server is reached over loopback; using the host name");
            }
            hostname()
        }
    }
}

/// The detected IP unless it is a loopback one (or unspecified), which other hosts cannot use.
fn choose(local: Option<IpAddr>) -> Option<String> {
    let ip = local?;
    if ip.is_loopback() || ip.is_unspecified() {
        return None;
    }
    Some(ip.to_string())
}

/// The local end of a short TCP connection to `host:port`.
fn local_ip_towards(host: &str, port: u16) -> std::io::Result<IpAddr> {
    let targets: Vec<SocketAddr> = (host, port).to_socket_addrs()?.collect();
    let mut last_error = std::io::Error::new(
        std::io::ErrorKind::NotFound,
        format!("{host} resolves to no address"),
    );
    for target in targets {
        match TcpStream::connect_timeout(&target, CONNECT_TIMEOUT) {
            Ok(stream) => {
                let local = stream.local_addr()?;
                // Closed at once: the agent's real connection is the NATS client's.
                drop(stream);
                return Ok(local.ip());
            }
            Err(err) => last_error = err,
        }
    }
    Err(last_error)
}

/// Host and port of the first URL of `--server` (`nats://user:pw@host:4222,…`, `tls://host`,
/// `host:4222`, `[::1]:4222`).
fn first_server(servers: &str) -> Option<(String, u16)> {
    let url = servers.split(',').map(str::trim).find(|u| !u.is_empty())?;
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split(['/', '?']).next().unwrap_or(rest);
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, hp)| hp);
    if let Some(bracketed) = host_port.strip_prefix('[') {
        let (host, after) = bracketed.split_once(']')?;
        let port = match after.strip_prefix(':') {
            Some(port) => port.parse().ok()?,
            None if after.is_empty() => DEFAULT_PORT,
            None => return None,
        };
        return (!host.is_empty()).then(|| (host.to_owned(), port));
    }
    let (host, port) = match host_port.rsplit_once(':') {
        Some((host, port)) => (host, port.parse().ok()?),
        None => (host_port, DEFAULT_PORT),
    };
    (!host.is_empty()).then(|| (host.to_owned(), port))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr, TcpListener};

    #[test]
    fn the_first_server_url_gives_host_and_port() {
        let cases = [
            ("nats://10.0.0.5:4223", Some(("10.0.0.5", 4223))),
            (
                "nats://a:b@gpu-head.lab:4222,nats://other:4222",
                Some(("gpu-head.lab", 4222)),
            ),
            ("tls://nats.example", Some(("nats.example", 4222))),
            ("127.0.0.1:5000", Some(("127.0.0.1", 5000))),
            (" , nats://x:1", Some(("x", 1))),
            ("nats://[fd00::1]:4300", Some(("fd00::1", 4300))),
            ("nats://[fd00::1]", Some(("fd00::1", 4222))),
            ("ws://host:8080/path", Some(("host", 8080))),
            ("nats://host:notaport", None),
            ("nats://", None),
            ("", None),
        ];
        for (servers, expected) in cases {
            let expected = expected.map(|(h, p)| (h.to_owned(), p));
            assert_eq!(first_server(servers), expected, "{servers}");
        }
    }

    #[test]
    fn loopback_addresses_fall_back_to_the_host_name() {
        let v4 = IpAddr::V4(Ipv4Addr::new(10, 1, 2, 3));
        assert_eq!(choose(Some(v4)).as_deref(), Some("10.1.2.3"));
        let v6 = IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 7));
        assert_eq!(choose(Some(v6)).as_deref(), Some("fd00::7"));
        assert_eq!(choose(Some(IpAddr::V4(Ipv4Addr::LOCALHOST))), None);
        assert_eq!(choose(Some(IpAddr::V6(Ipv6Addr::LOCALHOST))), None);
        assert_eq!(choose(Some(IpAddr::V4(Ipv4Addr::UNSPECIFIED))), None);
        assert_eq!(choose(None), None);
    }

    #[test]
    fn a_server_on_this_host_gives_the_host_name_and_a_dead_one_too() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
        let port = listener.local_addr().map(|a| a.port()).unwrap_or_default();
        // The probe reaches the server over loopback: its local address is 127.0.0.1.
        let local = local_ip_towards("127.0.0.1", port).unwrap_or_else(|e| panic!("{e}"));
        assert!(local.is_loopback());
        let url = format!("nats://127.0.0.1:{port}");
        let address = detect(&url, || Ok("gpu07".to_owned())).unwrap_or_default();
        assert_eq!(address, "gpu07");
        drop(listener);
        // Nothing listens any more: the probe fails and the host name is used.
        let address = detect(&url, || Ok("gpu07".to_owned())).unwrap_or_default();
        assert_eq!(address, "gpu07");
    }

    #[test]
    fn a_server_on_a_real_interface_gives_that_interfaces_address() {
        // A listener on every interface, reached at this host's non-loopback address (when it
        // has one): the probe's local address is that address.
        let listener = TcpListener::bind("0.0.0.0:0").unwrap_or_else(|e| panic!("{e}"));
        let port = listener.local_addr().map(|a| a.port()).unwrap_or_default();
        let Some(own) = non_loopback_ipv4() else {
            eprintln!("no non-loopback IPv4 address on this host; skipping");
            return;
        };
        let url = format!("nats://{own}:{port}");
        let address = detect(&url, || Ok("fallback".to_owned())).unwrap_or_default();
        assert_eq!(address, own.to_string());
    }

    /// An IPv4 address of this host other than loopback, found without sending anything
    /// anywhere: the addresses the host name resolves to, or those of /proc/net/fib_trie.
    fn non_loopback_ipv4() -> Option<Ipv4Addr> {
        let name = crate::cli::hostname().ok()?;
        let from_name = (name.as_str(), 0u16)
            .to_socket_addrs()
            .ok()
            .into_iter()
            .flatten()
            .filter_map(|a| match a.ip() {
                IpAddr::V4(v4) if !v4.is_loopback() => Some(v4),
                _ => None,
            })
            .next();
        from_name.or_else(|| {
            let trie = std::fs::read_to_string("/proc/net/fib_trie").ok()?;
            let lines: Vec<&str> = trie.lines().collect();
            lines.windows(2).find_map(|pair| {
                let ip: Ipv4Addr = pair[0].trim().trim_start_matches("|-- ").parse().ok()?;
                (pair[1].contains("/32 host LOCAL") && !ip.is_loopback()).then_some(ip)
            })
        })
    }
}
