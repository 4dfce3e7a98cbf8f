//! What `mgpu web` serves, over the tiny HTTP/1.1 server `mgpu-metrics` also scrapes with
//! (one request per connection, bounded, timed out: [`mgpu_metrics::http::serve_with`]).
//!
//! - `GET /` and `/index.html`: the page; `/NAME`: any other embedded file (`/app.js`,
//!   `/style.css`, `/img/logo.svg` for a file in a folder), with its content type by
//!   extension ([`content_type`]);
//! - `GET /config.json`: the page's settings, `{"websocket": "ws://…"}` ([`page_config`]):
//!   where the page finds the NATS server's WebSocket listener;
//! - `HEAD` for the same, without the body; a query string is ignored (`/?wall`);
//! - anything else: 404, another method 405, a malformed request 400.
//!
//! Routing is pure ([`route`]: method and path in, what to answer out), so it is tested
//! without a socket. Every answer forbids caching stale pages, sniffing and framing, and
//! restricts what the page may load and connect to ([`SECURITY_HEADERS`]).

use mgpu_metrics::http::{request_line, response_with, serve_with};
use tokio::net::TcpListener;

/// An embedded file table: (name under `dist/`, bytes), as `build.rs` generates it.
pub type Files = &'static [(&'static str, &'static [u8])];

/// The file the page is: answered for `/`.
pub const INDEX: &str = "index.html";

/// The path of the page's settings, which no embedded file shadows.
pub const CONFIG_PATH: &str = "/config.json";

/// Headers on every answer: always revalidate (a rebuilt `mgpu` serves a new page), no MIME
/// sniffing, no referrer, and a content security policy that lets the page load only its own
/// files and connect only to itself and WebSocket servers (NATS), and no one frame it.
pub const SECURITY_HEADERS: &[(&str, &str)] = &[
    ("Cache-Control", "no-cache"),
    ("X-Content-Type-Options", "nosniff"),
    (
        "Content-Security-Policy",
        "default-src 'self'; connect-src 'self' ws: wss:; img-src 'self' data:; \
         style-src 'self' 'unsafe-inline'; frame-ancestors 'none'",
    ),
    ("Referrer-Policy", "no-referrer"),
];

/// Everything served: the embedded files and the page's settings.
#[derive(Debug)]
pub struct Site {
    files: Files,
    config: String,
}

impl Site {
    /// The site of `files`, whose page connects to `websocket`.
    pub fn new(files: Files, websocket: &str) -> Site {
        Site {
            files,
            config: page_config(websocket),
        }
    }
}

/// The body of `/config.json`: `{"websocket":"ws://127.0.0.1:4280"}`.
pub fn page_config(websocket: &str) -> String {
    serde_json::json!({ "websocket": websocket }).to_string()
}

/// What a well-formed request is answered with (a malformed one is a 400 before routing).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// An embedded file: its name and bytes.
    File {
        name: &'static str,
        bytes: &'static [u8],
    },
    /// The page's settings ([`page_config`]).
    Config,
    NotFound,
    MethodNotAllowed,
}

/// A routed request: what to answer, and whether with headers only (HEAD).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Routed {
    pub route: Route,
    pub head_only: bool,
}

/// What `method` on `path` (its query string already dropped, or not: it is ignored) gets
/// from `files`.
pub fn route(files: Files, method: &str, path: &str) -> Routed {
    let head_only = match method {
        "GET" => false,
        "HEAD" => true,
        _ => {
            return Routed {
                route: Route::MethodNotAllowed,
                head_only: false,
            };
        }
    };
    let path = path.split('?').next().unwrap_or_default();
    let route = if path == CONFIG_PATH {
        Route::Config
    } else {
        let wanted = match path {
            "/" => Some(INDEX),
            _ => path.strip_prefix('/'),
        };
        wanted
            .and_then(|wanted| files.iter().find(|(name, _)| *name == wanted))
            .map_or(Route::NotFound, |&(name, bytes)| Route::File {
                name,
                bytes,
            })
    };
    Routed { route, head_only }
}

/// The content type of a file, by its extension; bytes of no known kind are
/// `application/octet-stream` (and, with `nosniff`, never run as a script).
pub fn content_type(name: &str) -> &'static str {
    let extension = name
        .rsplit_once('.')
        .map(|(_, extension)| extension.to_ascii_lowercase())
        .unwrap_or_default();
    match extension.as_str() {
        "html" | "htm" => "text/html; charset=utf-8",
        "js" | "mjs" => "text/javascript; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "json" | "map" => "application/json",
        "svg" => "image/svg+xml",
        "png" => "image/png",
        "ico" => "image/x-icon",
        "woff2" => "font/woff2",
        "txt" => "text/plain; charset=utf-8",
        _ => "application/octet-stream",
    }
}

/// The complete response to a request whose head is `head`.
pub fn answer(site: &Site, head: &[u8]) -> Vec<u8> {
    let Some((method, path)) = request_line(head) else {
        return plain(400, "bad request\n", false);
    };
    let Routed { route, head_only } = route(site.files, method, path);
    match route {
        Route::File { name, bytes } => {
            response_with(200, content_type(name), SECURITY_HEADERS, bytes, head_only)
        }
        Route::Config => response_with(
            200,
            "application/json",
            SECURITY_HEADERS,
            site.config.as_bytes(),
            head_only,
        ),
        Route::NotFound => plain(404, "not found\n", head_only),
        Route::MethodNotAllowed => plain(405, "only GET and HEAD\n", false),
    }
}

fn plain(status: u16, body: &str, head_only: bool) -> Vec<u8> {
    let content_type = "text/plain; charset=utf-8";
    response_with(
        status,
        content_type,
        SECURITY_HEADERS,
        body.as_bytes(),
        head_only,
    )
}

/// Answers requests on `listener` with `site` until the task is dropped.
pub async fn serve(listener: TcpListener, site: Site) {
    serve_with(listener, "mgpu web", move |head| {
        std::future::ready(answer(&site, &head))
    })
    .await;
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    use tokio::net::TcpStream;

    use super::*;

    const FILES: Files = &[
        ("index.html", b"<!doctype html><p>mgpu</p>"),
        ("app.js", b"console.log(1)"),
        ("img/logo.svg", b"<svg/>"),
        ("config.json", b"{\"websocket\":\"ws://stale\"}"),
    ];

    fn routed(method: &str, path: &str) -> Route {
        route(FILES, method, path).route
    }

    #[test]
    fn the_page_is_served_at_the_root_and_by_its_name() {
        let index = Route::File {
            name: "index.html",
            bytes: FILES[0].1,
        };
        assert_eq!(routed("GET", "/"), index);
        assert_eq!(routed("GET", "/index.html"), index);
        assert_eq!(routed("GET", "/?wall"), index);
        assert_eq!(
            route(FILES, "HEAD", "/"),
            Routed {
                route: index,
                head_only: true
            }
        );
    }

    #[test]
    fn each_embedded_file_is_served_by_its_name() {
        assert!(matches!(
            routed("GET", "/app.js"),
            Route::File { name: "app.js", .. }
        ));
        assert!(matches!(
            routed("GET", "/img/logo.svg?v=2"),
            Route::File {
                name: "img/logo.svg",
                ..
            }
        ));
    }

    #[test]
    fn the_settings_are_ours_whatever_the_build_holds() {
        assert_eq!(routed("GET", "/config.json"), Route::Config);
        assert_eq!(routed("GET", "/config.json?x"), Route::Config);
        assert_eq!(
            page_config("ws://127.0.0.1:4280"),
            r#"{"websocket":"ws://127.0.0.1:4280"}"#
        );
        assert_eq!(page_config("ws://a\"b"), r#"{"websocket":"ws://a\"b"}"#);
    }

    #[test]
    fn anything_else_is_not_found_or_not_allowed() {
        for path in [
            "/nope",
            "/img",
            "/img/",
            "//app.js",
            "/../app.js",
            "app.js",
            "",
        ] {
            assert_eq!(routed("GET", path), Route::NotFound, "{path}");
        }
        assert_eq!(routed("POST", "/"), Route::MethodNotAllowed);
        assert_eq!(routed("DELETE", "/config.json"), Route::MethodNotAllowed);
        assert_eq!(route(&[], "GET", "/").route, Route::NotFound);
    }

    #[test]
    fn content_types_follow_the_extension() {
        assert_eq!(content_type("index.html"), "text/html; charset=utf-8");
        assert_eq!(content_type("app.js"), "text/javascript; charset=utf-8");
        assert_eq!(content_type("style.css"), "text/css; charset=utf-8");
        assert_eq!(content_type("x.json"), "application/json");
        assert_eq!(content_type("app.js.map"), "application/json");
        assert_eq!(content_type("img/logo.SVG"), "image/svg+xml");
        assert_eq!(content_type("icon.png"), "image/png");
        assert_eq!(content_type("LICENSE.txt"), "text/plain; charset=utf-8");
        assert_eq!(content_type("blob"), "application/octet-stream");
        assert_eq!(content_type("a.exe"), "application/octet-stream");
    }

    #[test]
    fn malformed_requests_are_bad_and_head_answers_have_no_body() {
        let site = Site::new(FILES, "ws://h:4280");
        let text = |head: &[u8]| String::from_utf8_lossy(&answer(&site, head)).into_owned();
        assert!(text(b"GET /\r\n\r\n").starts_with("HTTP/1.1 400 "));
        assert!(text(b"GET / HTTP/1.1\r\n").starts_with("HTTP/1.1 400 "));
        let head = text(b"HEAD /app.js HTTP/1.1\r\n\r\n");
        assert!(head.contains("Content-Length: 14\r\n"), "{head}");
        assert!(head.ends_with("\r\n\r\n"), "{head}");
        let refused = text(b"POST / HTTP/1.1\r\n\r\n");
        assert!(refused.starts_with("HTTP/1.1 405 "), "{refused}");
        assert!(refused.contains("Allow: GET, HEAD\r\n"), "{refused}");
    }

    /// Sends a GET of `path` to `port`; the whole reply.
    async fn get(port: u16, path: &str) -> String {
        let mut stream = TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap_or_else(|e| panic!("connecting: {e}"));
        let request = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
        stream
            .write_all(request.as_bytes())
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
    async fn the_server_answers_the_page_its_settings_and_not_found() {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|e| panic!("binding: {e}"));
        let port = listener
            .local_addr()
            .unwrap_or_else(|e| panic!("address: {e}"))
            .port();
        let server = tokio::spawn(serve(listener, Site::new(FILES, "ws://127.0.0.1:4280")));

        let page = get(port, "/").await;
        assert!(page.starts_with("HTTP/1.1 200 OK\r\n"), "{page}");
        assert!(
            page.contains("Content-Type: text/html; charset=utf-8\r\n"),
            "{page}"
        );
        assert!(page.contains("Cache-Control: no-cache\r\n"), "{page}");
        assert!(
            page.contains("X-Content-Type-Options: nosniff\r\n"),
            "{page}"
        );
        assert!(page.contains("Referrer-Policy: no-referrer\r\n"), "{page}");
        assert!(
            page.contains(
                "Content-Security-Policy: default-src 'self'; connect-src 'self' ws: wss:;"
            ),
            "{page}"
        );
        assert!(page.contains("Connection: close\r\n"), "{page}");
        assert!(
            page.ends_with("\r\n\r\n<!doctype html><p>mgpu</p>"),
            "{page}"
        );

        let config = get(port, "/config.json").await;
        assert!(config.starts_with("HTTP/1.1 200 OK\r\n"), "{config}");
        assert!(
            config.contains("Content-Type: application/json\r\n"),
            "{config}"
        );
        assert!(
            config.ends_with("\r\n\r\n{\"websocket\":\"ws://127.0.0.1:4280\"}"),
            "{config}"
        );

        let missing = get(port, "/nope").await;
        assert!(
            missing.starts_with("HTTP/1.1 404 Not Found\r\n"),
            "{missing}"
        );
        assert!(
            missing.contains("X-Content-Type-Options: nosniff\r\n"),
            "{missing}"
        );
        server.abort();
    }
}
