//! TLS: with the certificates `mgpu admin init --tls` makes, the server accepts only TLS; the
//! scheduler, an agent and the CLI work through it, and a client speaking plaintext, or one
//! that was not given the CA, is turned away.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use mgpu_tests::{Cluster, NodeSpec};

#[test]
fn over_tls_a_submitted_job_runs_and_plaintext_clients_are_refused() {
    let cluster = Cluster::start_tls(&[NodeSpec::new("node001", "1x24GiB")]);
    let Some(ca) = cluster.ca().map(|ca| ca.display().to_string()) else {
        panic!("a TLS cluster has a CA");
    };

    // The scheduler and the agent came up over TLS (start_tls waited for the node to be
    // online); a job submitted with the CLI runs and its output comes back.
    let id = cluster.submit(&[], "echo hello over tls");
    cluster.finished_as(&id, "succeeded", Duration::from_secs(30));
    let logs = cluster.mgpu_ok(&["logs", &id]);
    assert!(logs.contains("hello over tls"), "{logs}");

    // A `tls://` URL works as well as `nats://` with the CA.
    let tls_url = format!("tls://127.0.0.1:{}", cluster.port);
    let out = cluster.mgpu_ok(&["--server", &tls_url, "show", &id]);
    assert!(out.contains("succeeded"), "{out}");

    // A plaintext client: the server announces that TLS is required, and a CONNECT sent in
    // the clear never gets an answer, only a closed connection.
    let mut stream = TcpStream::connect(("127.0.0.1", cluster.port))
        .unwrap_or_else(|e| panic!("connecting: {e}"));
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let mut info = String::new();
    BufReader::new(&stream)
        .read_line(&mut info)
        .unwrap_or_else(|e| panic!("reading INFO: {e}"));
    assert!(info.contains("\"tls_required\":true"), "{info}");
    let _ = stream.write_all(b"CONNECT {\"verbose\":false}\r\nPING\r\nSUB > 1\r\n");
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        !answer.contains("PONG"),
        "plaintext client was answered: {answer}"
    );

    // The mgpu CLI without the CA is refused too, and told what to set.
    let out = cluster
        .mgpu_command(&cluster.user_creds("alice"), &["queue"])
        .env_remove("MGPU_CA")
        .output()
        .unwrap_or_else(|e| panic!("running mgpu: {e}"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("requires TLS"), "{stderr}");
    assert!(stderr.contains("MGPU_CA"), "{stderr}");

    // A CA file that is not there: one sentence naming it and the fix.
    let missing = format!("{ca}.missing");
    let out = cluster
        .mgpu_command(&cluster.user_creds("alice"), &["queue"])
        .env("MGPU_CA", &missing)
        .output()
        .unwrap_or_else(|e| panic!("running mgpu: {e}"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("CA certificate {missing} does not exist")),
        "{stderr}"
    );
    assert!(stderr.contains("mgpu admin init --tls"), "{stderr}");
}
