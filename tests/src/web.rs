//! `mgpu web` for the stories and the benchmark: started on a free port of 127.0.0.1, pointed
//! at a WebSocket URL, stopped when dropped.

use std::net::TcpStream;
use std::process::{Child, Stdio};
use std::time::Duration;

use crate::{Cluster, free_port, wait_for};

/// A running `mgpu web`.
pub struct WebServer {
    child: Child,
    /// Where the page is: `http://127.0.0.1:PORT/`.
    pub url: String,
}

impl WebServer {
    /// Serves the page, telling it to connect to `websocket` (run with alice's credentials, as
    /// a user runs it: it needs none, but a user has them).
    pub fn start(cluster: &Cluster, websocket: &str) -> WebServer {
        let port = free_port();
        let listen = format!("127.0.0.1:{port}");
        let child = cluster
            .mgpu_command(
                &cluster.user_creds("alice"),
                &["web", "--listen", &listen, "--websocket", websocket],
            )
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("starting mgpu web: {e}"));
        wait_for("mgpu web to listen", Duration::from_secs(10), || {
            TcpStream::connect(("127.0.0.1", port)).ok()
        });
        WebServer {
            child,
            url: format!("http://{listen}/"),
        }
    }
}

impl Drop for WebServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
