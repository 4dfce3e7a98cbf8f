//! The WebSocket listener every generated server configuration carries (the web dashboard's
//! transport; `mgpu admin init`, `mgpu admin site`, the packaged examples): a browser's
//! upgrade is accepted and the server greets it as NATS does, asking for the same nkey
//! authentication as on the client port (`auth_required`, a nonce to sign).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use mgpu_tests::{Cluster, NodeSpec};

#[test]
fn a_browser_upgrade_is_greeted_by_nats_asking_for_an_nkey() {
    let cluster = Cluster::start(&[NodeSpec::new("node001", "1x24GiB")]);
    let port = cluster.websocket_port;
    let mut stream =
        TcpStream::connect(("127.0.0.1", port)).unwrap_or_else(|e| panic!("connecting: {e}"));
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    let upgrade = format!(
        "GET / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n\
         Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
         Sec-WebSocket-Version: 13\r\n\r\n"
    );
    stream
        .write_all(upgrade.as_bytes())
        .unwrap_or_else(|e| panic!("upgrading: {e}"));
    let mut read = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline && !String::from_utf8_lossy(&read).contains("\"nonce\"") {
        let mut chunk = [0u8; 4096];
        match stream.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => read.extend_from_slice(&chunk[..n]),
            Err(_) => {}
        }
    }
    let text = String::from_utf8_lossy(&read);
    assert!(text.starts_with("HTTP/1.1 101"), "{text}");
    assert!(text.contains("INFO {"), "{text}");
    assert!(text.contains("\"auth_required\":true"), "{text}");
    assert!(text.contains("\"nonce\""), "{text}");
}
