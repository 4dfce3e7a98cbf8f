//! Posting one webhook: HTTP/1.1 over TCP, with TLS for `https` (rustls with the system's
//! roots), one request per connection. Written small on purpose: a POST with a JSON body and
//! a status line back is all a webhook needs, and a full HTTP client would double the
//! service's build.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::rustls::{self, pki_types::ServerName};

use mgpu_protocol::notify::destination::Url;

use crate::deliver_error::DeliveryError;

/// POSTs `body` to `url` with `headers`; Ok once the receiver answered 2xx.
pub async fn post(
    url: &Url,
    body: &[u8],
    headers: &[(&str, String)],
    timeout: Duration,
) -> Result<(), DeliveryError> {
    let request = request_bytes(url, body, headers);
    let exchange = async {
        let tcp = TcpStream::connect((url.host.as_str(), url.port))
            .await
            .map_err(|e| DeliveryError::retry(format!("connecting to {}: {e}", url.host)))?;
        if url.tls {
            let name = ServerName::try_from(url.host.clone())
                .map_err(|e| DeliveryError::permanent(format!("{}: {e}", url.host)))?;
            let tls = connector()
                .connect(name, tcp)
                .await
                .map_err(|e| DeliveryError::retry(format!("TLS with {}: {e}", url.host)))?;
            status_of(tls, &request).await
        } else {
            status_of(tcp, &request).await
        }
    };
    let status = tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| DeliveryError::retry(format!("{} did not answer in time", url.host)))??;
    match status {
        200..=299 => Ok(()),
        // Too many requests, and the receiver's own trouble: worth trying again later.
        408 | 429 | 500..=599 => Err(DeliveryError::retry(format!(
            "{} answered {status}",
            url.host
        ))),
        _ => Err(DeliveryError::permanent(format!(
            "{} answered {status}",
            url.host
        ))),
    }
}

/// The request: headers, then the body.
fn request_bytes(url: &Url, body: &[u8], headers: &[(&str, String)]) -> Vec<u8> {
    let default_port = if url.tls { 443 } else { 80 };
    let host = if url.host.contains(':') {
        format!("[{}]", url.host)
    } else {
        url.host.clone()
    };
    let host = if url.port == default_port {
        host
    } else {
        format!("{host}:{}", url.port)
    };
    let mut head = format!(
        "POST {} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: mgpu-notify/{}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n",
        url.path,
        env!("CARGO_PKG_VERSION"),
        body.len()
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    let mut bytes = head.into_bytes();
    bytes.extend_from_slice(body);
    bytes
}

/// Sends `request` and reads the status code off the response's first line.
async fn status_of<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    request: &[u8],
) -> Result<u16, DeliveryError> {
    let io = |e: std::io::Error| DeliveryError::retry(format!("sending the request: {e}"));
    stream.write_all(request).await.map_err(io)?;
    stream.flush().await.map_err(io)?;
    let mut head = Vec::with_capacity(256);
    let mut buffer = [0u8; 512];
    while !head.windows(2).any(|w| w == b"\r\n") && head.len() < 8192 {
        let read = stream.read(&mut buffer).await.map_err(io)?;
        if read == 0 {
            break;
        }
        head.extend_from_slice(&buffer[..read]);
    }
    parse_status(&head)
        .ok_or_else(|| DeliveryError::retry("the receiver's answer is not HTTP".to_owned()))
}

/// The code of `HTTP/1.x NNN …`.
fn parse_status(head: &[u8]) -> Option<u16> {
    let line = head.split(|b| *b == b'\n').next()?;
    let text = std::str::from_utf8(line).ok()?;
    let mut words = text.split_whitespace();
    words.next().filter(|w| w.starts_with("HTTP/"))?;
    words.next()?.parse().ok()
}

/// One TLS set-up for every request: the system's roots, read once.
fn connector() -> TlsConnector {
    static CONFIG: OnceLock<Arc<rustls::ClientConfig>> = OnceLock::new();
    let config = CONFIG.get_or_init(|| {
        let mut roots = rustls::RootCertStore::empty();
        let found = rustls_native_certs::load_native_certs();
        for error in &found.errors {
            tracing::warn!("reading the system's CA certificates: {error}");
        }
        for cert in found.certs {
            // A root the system lists but rustls cannot parse is left out, not fatal.
            let _ = roots.add(cert);
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map(|builder| {
                builder
                    .with_root_certificates(roots.clone())
                    .with_no_client_auth()
            })
            .unwrap_or_else(|_| {
                rustls::ClientConfig::builder()
                    .with_root_certificates(roots)
                    .with_no_client_auth()
            });
        Arc::new(config)
    });
    TlsConnector::from(config.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_request_names_host_length_and_headers() {
        let url = mgpu_protocol::notify::destination::parse_url("http://127.0.0.1:8080/hook?a=1");
        let Ok(url) = url else {
            panic!("url");
        };
        let bytes = request_bytes(&url, b"{}", &[("X-Mgpu-Signature", "sha256=ab".into())]);
        let text = String::from_utf8_lossy(&bytes);
        assert!(text.starts_with("POST /hook?a=1 HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n"));
        assert!(text.contains("Content-Length: 2\r\n"));
        assert!(text.ends_with("X-Mgpu-Signature: sha256=ab\r\n\r\n{}"));
    }

    #[test]
    fn status_lines_parse() {
        assert_eq!(parse_status(b"HTTP/1.1 204 No Content\r\n"), Some(204));
        assert_eq!(parse_status(b"HTTP/1.0 503\r\n"), Some(503));
        assert_eq!(parse_status(b"SSH-2.0\r\n"), None);
    }
}
