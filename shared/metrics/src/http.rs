//! A tiny HTTP/1.1 endpoint for Prometheus to scrape: `GET /metrics` (or `HEAD`) answers with
//! the exposition the service renders at that moment; any other path is 404, any other
//! method 405. One request per connection (`Connection: close`), which Prometheus is fine
//! with: it scrapes every few seconds at most, so a full HTTP library would only add weight.
//!
//! The endpoint is read-only and says nothing a NATS client of the cluster could not read,
//! but it is not authenticated: bind it to an address only the monitoring network reaches.
//!
//! The connection handling underneath is public for other tiny read-only servers (`mgpu
//! web` serves the dashboard with it): [`serve_with`] accepts, bounds and times out the
//! connections, [`request_line`] reads what a request asks for, and [`response_with`] writes
//! the answer.

use std::future::Future;
use std::io::{Error, ErrorKind};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

/// The content type of the text exposition format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
/// The path that is served.
pub const PATH: &str = "/metrics";

/// The largest request head read: a scrape's is a few hundred bytes.
const MAX_HEAD: usize = 8 * 1024;
/// How long a client may take to send its request: a stuck one is dropped.
const READ_WITHIN: Duration = Duration::from_secs(10);
/// Connections answered at once; more are closed at once rather than queued, so a flood of
/// clients cannot make the service render (or hold memory) without bound.
const CONNECTIONS: usize = 16;

/// What a request asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// The metrics; `head_only` for HEAD (headers, no body).
    Metrics {
        head_only: bool,
    },
    NotFound,
    MethodNotAllowed,
    BadRequest,
}

/// Listens on `address`: done before anything else at start, so that a taken address stops
/// the service at once rather than leaving it unscrapeable.
pub async fn bind(address: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(address).await
}

/// Answers scrapes on `listener` until the task is dropped, each with the text `render` gives.
pub async fn serve<F, Fut>(listener: TcpListener, render: F)
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = String> + Send + 'static,
{
    let render = Arc::new(render);
    serve_with(listener, "metrics endpoint", move |head| {
        let render = Arc::clone(&render);
        async move {
            match route(&head) {
                Route::Metrics { head_only } => {
                    response(200, CONTENT_TYPE, &render().await, head_only)
                }
                Route::NotFound => response(404, "text/plain", "not found: try /metrics\n", false),
                Route::MethodNotAllowed => {
                    response(405, "text/plain", "only GET and HEAD\n", false)
                }
                Route::BadRequest => response(400, "text/plain", "bad request\n", false),
            }
        }
    })
    .await;
}

/// Serves connections on `listener` until the task is dropped: one request each, whose head
/// (at most 8 KiB, sent within 10 s) `answer` turns into the complete response; the
/// connection closes after it. At most 16 are answered at once; more are closed at once.
/// `name` says whose connections they are in the log.
pub async fn serve_with<F, Fut>(listener: TcpListener, name: &'static str, answer: F)
where
    F: Fn(Vec<u8>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Vec<u8>> + Send + 'static,
{
    let answer = Arc::new(answer);
    let slots = Arc::new(Semaphore::new(CONNECTIONS));
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(err) => {
                // Out of file descriptors, say: wait rather than spin.
                tracing::warn!(%err, "{name}: accepting a connection");
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            tracing::debug!(%peer, "{name}: too many connections, closing one");
            continue;
        };
        let answer = Arc::clone(&answer);
        tokio::spawn(async move {
            let _slot = slot;
            if let Err(err) = reply(stream, answer.as_ref()).await {
                tracing::debug!(%peer, %err, "{name}: a request failed");
            }
        });
    }
}

/// Reads one request and answers it with what `answer` makes of its head.
async fn reply<F, Fut>(mut stream: TcpStream, answer: &F) -> std::io::Result<()>
where
    F: Fn(Vec<u8>) -> Fut,
    Fut: Future<Output = Vec<u8>>,
{
    let head = tokio::time::timeout(READ_WITHIN, read_head(&mut stream))
        .await
        .map_err(|_| Error::new(ErrorKind::TimedOut, "no request within 10 s"))??;
    let response = answer(head).await;
    stream.write_all(&response).await?;
    stream.shutdown().await
}

/// The request head: bytes up to the blank line that ends it (or all there were, at most
/// [`MAX_HEAD`]).
async fn read_head(stream: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut head = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    while head.len() < MAX_HEAD && !ends_head(&head) {
        let read = stream.read(&mut chunk).await?;
        if read == 0 {
            break;
        }
        head.extend_from_slice(&chunk[..read]);
    }
    Ok(head)
}

fn ends_head(head: &[u8]) -> bool {
    head.windows(4).any(|w| w == b"\r\n\r\n") || head.windows(2).any(|w| w == b"\n\n")
}

/// What the request line asks for: `GET /metrics HTTP/1.1` (a query string is ignored).
pub fn route(head: &[u8]) -> Route {
    let Some((method, path)) = request_line(head) else {
        return Route::BadRequest;
    };
    match (method, path == PATH) {
        ("GET", true) => Route::Metrics { head_only: false },
        ("HEAD", true) => Route::Metrics { head_only: true },
        ("GET" | "HEAD", false) => Route::NotFound,
        _ => Route::MethodNotAllowed,
    }
}

/// The method and the path (its query string dropped) of a complete HTTP/1.x request head:
/// `GET /metrics?x=1 HTTP/1.1` is `("GET", "/metrics")`. None for anything else (a head cut
/// short, not text, another protocol): a bad request.
pub fn request_line(head: &[u8]) -> Option<(&str, &str)> {
    if !ends_head(head) {
        return None;
    }
    let line = head.split(|b| *b == b'\n').next()?;
    let line = std::str::from_utf8(line).ok()?;
    let mut parts = line.trim_end_matches('\r').split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return None;
    };
    if !version.starts_with("HTTP/1.") || method.is_empty() {
        return None;
    }
    let path = target.split('?').next().unwrap_or_default();
    Some((method, path))
}

/// A complete response; the connection closes after it.
pub fn response(status: u16, content_type: &str, body: &str, head_only: bool) -> Vec<u8> {
    response_with(status, content_type, &[], body.as_bytes(), head_only)
}

/// A complete response with `headers` besides the content type, length and `Connection:
/// close` (and `Allow: GET, HEAD` on a 405: these servers answer nothing else). With
/// `head_only` (a HEAD request) the body is left out but its length still said.
pub fn response_with(
    status: u16,
    content_type: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    head_only: bool,
) -> Vec<u8> {
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        _ => "Error",
    };
    let mut head = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n",
        body.len()
    );
    if status == 405 {
        head.push_str("Allow: GET, HEAD\r\n");
    }
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("Connection: close\r\n\r\n");
    let mut reply = head.into_bytes();
    if !head_only {
        reply.extend_from_slice(body);
    }
    reply
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scrape_is_routed_to_the_metrics_and_anything_else_is_not() {
        let scrape = b"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: text/plain\r\n\r\n";
        assert_eq!(route(scrape), Route::Metrics { head_only: false });
        assert_eq!(
            route(b"GET /metrics?x=1 HTTP/1.0\n\n"),
            Route::Metrics { head_only: false }
        );
        assert_eq!(
            route(b"HEAD /metrics HTTP/1.1\r\n\r\n"),
            Route::Metrics { head_only: true }
        );
        assert_eq!(route(b"GET / HTTP/1.1\r\n\r\n"), Route::NotFound);
        assert_eq!(
            route(b"POST /metrics HTTP/1.1\r\n\r\n"),
            Route::MethodNotAllowed
        );
        assert_eq!(route(b"GET /metrics HTTP/1.1\r\n"), Route::BadRequest);
        assert_eq!(route(b"GET /metrics\r\n\r\n"), Route::BadRequest);
        assert_eq!(route(b"\xff\xfe\r\n\r\n"), Route::BadRequest);
    }

    #[test]
    fn responses_say_their_length_and_close() {
        let reply =
            String::from_utf8(response(200, CONTENT_TYPE, "a 1\n", false)).unwrap_or_default();
        assert!(reply.starts_with("HTTP/1.1 200 OK\r\n"), "{reply}");
        assert!(reply.contains("Content-Length: 4\r\n"), "{reply}");
        assert!(reply.contains("Connection: close\r\n\r\na 1\n"), "{reply}");
        let head =
            String::from_utf8(response(200, CONTENT_TYPE, "a 1\n", true)).unwrap_or_default();
        assert!(head.ends_with("\r\n\r\n"), "{head}");
        let refused =
            String::from_utf8(response(405, "text/plain", "no\n", false)).unwrap_or_default();
        assert!(refused.contains("Allow: GET, HEAD\r\n"), "{refused}");
    }

    #[test]
    fn the_request_line_gives_the_method_and_the_path_without_its_query() {
        assert_eq!(
            request_line(b"GET /?wall HTTP/1.1\r\nHost: x\r\n\r\n"),
            Some(("GET", "/"))
        );
        assert_eq!(
            request_line(b"HEAD /app.js HTTP/1.0\n\n"),
            Some(("HEAD", "/app.js"))
        );
        assert_eq!(request_line(b" / HTTP/1.1\r\n\r\n"), None);
        assert_eq!(request_line(b"GET / HTTP/2\r\n\r\n"), None);
        assert_eq!(request_line(b"GET / HTTP/1.1\r\n"), None);
    }

    #[test]
    fn extra_headers_come_before_the_blank_line_and_a_head_answer_has_no_body() {
        let headers = [
            ("Cache-Control", "no-cache"),
            ("X-Content-Type-Options", "nosniff"),
        ];
        let reply = response_with(200, "image/png", &headers, &[0, 1, 2], false);
        let text = String::from_utf8_lossy(&reply);
        assert!(text.contains("Content-Length: 3\r\n"), "{text}");
        assert!(
            text.contains("Cache-Control: no-cache\r\nX-Content-Type-Options: nosniff\r\n"),
            "{text}"
        );
        assert!(
            reply.ends_with(b"Connection: close\r\n\r\n\x00\x01\x02"),
            "{text}"
        );
        let head = response_with(200, "image/png", &headers, &[0, 1, 2], true);
        assert!(head.ends_with(b"\r\n\r\n"));
        assert!(String::from_utf8_lossy(&head).contains("Content-Length: 3\r\n"));
    }

    /// Sends `request` to `port` and returns the whole reply.
    async fn ask(port: u16, request: &[u8]) -> String {
        let mut stream = TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap_or_else(|e| panic!("connecting: {e}"));
        stream
            .write_all(request)
            .await
            .unwrap_or_else(|e| panic!("writing: {e}"));
        let mut reply = String::new();
        stream
            .read_to_string(&mut reply)
            .await
            .unwrap_or_else(|e| panic!("reading: {e}"));
        reply
    }

    #[tokio::test]
    async fn the_endpoint_serves_what_is_rendered_at_each_scrape() {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|e| panic!("binding: {e}"));
        let port = listener
            .local_addr()
            .unwrap_or_else(|e| panic!("address: {e}"))
            .port();
        let scrapes = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let counted = Arc::clone(&scrapes);
        let server = tokio::spawn(serve(listener, move || {
            let n = counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
            async move { format!("scrapes {n}\n") }
        }));
        let first = ask(port, b"GET /metrics HTTP/1.1\r\nHost: a\r\n\r\n").await;
        assert!(first.ends_with("\r\n\r\nscrapes 1\n"), "{first}");
        assert!(first.contains(CONTENT_TYPE), "{first}");
        let second = ask(port, b"GET /metrics HTTP/1.1\r\n\r\n").await;
        assert!(second.ends_with("scrapes 2\n"), "{second}");
        let elsewhere = ask(port, b"GET /other HTTP/1.1\r\n\r\n").await;
        assert!(elsewhere.starts_with("HTTP/1.1 404"), "{elsewhere}");
        assert_eq!(scrapes.load(std::sync::atomic::Ordering::SeqCst), 2);
        server.abort();
    }
}
