//! Making a change to the credentials directory known: running nats-servers reload their
//! authorization, and the audit trail records who made the change.

use std::path::Path;

use crate::setup::auth::Registry;
use anyhow::Result;
use mgpu_protocol::audit::AuditRecord;

use crate::client::session::{ConnectionArgs, Session};
use crate::console::println;

/// After `detail` (`added user alice`) was done to `target` in `dir`: the servers reload, the
/// audit trail records it.
pub async fn credentials_changed(
    connection: &ConnectionArgs,
    dir: &Path,
    target: &str,
    detail: String,
) -> Result<()> {
    reload_servers(dir)?;
    record_in_audit(connection, dir, target, detail).await;
    Ok(())
}

/// Adds a credentials change to the audit trail when a server is reachable with these
/// credentials (the change itself needs none: it is made in files). Says so when it is not.
async fn record_in_audit(connection: &ConnectionArgs, dir: &Path, target: &str, detail: String) {
    if connection.creds.is_none() {
        let _ = println("(not in the audit trail: no credentials to reach an mgpu server)");
        return;
    }
    // A fresh connection can miss a server busy reloading its configuration: a few tries.
    for attempt in 0..3 {
        let recorded = async {
            let session = Session::connect(connection).await?;
            let key = session.key.public_key();
            // The signer's name as the credentials directory knows it.
            let by = Registry::load(dir)
                .ok()
                .and_then(|registry| registry.by_key(&key).map(|p| p.name.clone()));
            let record = AuditRecord {
                at: mgpu_protocol::now(),
                action: "admin".into(),
                by,
                key: Some(key),
                target: Some(target.to_owned()),
                accepted: true,
                detail: detail.clone(),
            };
            let payload = serde_json::to_vec(&record)?;
            session
                .js
                .publish(mgpu_protocol::subjects::audit("admin"), payload.into())
                .await?
                .await?;
            Ok::<(), anyhow::Error>(())
        };
        let timeout = std::time::Duration::from_secs(5);
        if let Ok(Ok(())) = tokio::time::timeout(timeout, recorded).await {
            return;
        }
        if attempt < 2 {
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        }
    }
    let _ = println("(not in the audit trail: no mgpu server reachable with these credentials)");
}

/// Makes running nats-servers re-read `auth.conf` (SIGHUP: a configuration reload keeps every
/// connection open). The servers found are those whose pid files `scripts/dev-up.sh` keeps
/// next to the credentials directory; others are named in a hint.
fn reload_servers(dir: &Path) -> Result<()> {
    let run_dir = dir
        .canonicalize()
        .ok()
        .and_then(|d| d.parent().map(|p| p.join("run")));
    let mut reloaded = 0;
    if let Some(run_dir) = run_dir
        && let Ok(entries) = std::fs::read_dir(&run_dir)
    {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !(name.starts_with("nats-server") && name.ends_with(".pid")) {
                continue;
            }
            let pid = std::fs::read_to_string(entry.path())
                .ok()
                .and_then(|text| text.trim().parse::<i32>().ok());
            // A stale pid file may name some other process by now: signal only nats-server.
            let is_nats_server = |pid: i32| {
                std::fs::read_to_string(format!("/proc/{pid}/comm"))
                    .is_ok_and(|comm| comm.trim() == "nats-server")
            };
            if let Some(pid) = pid
                && is_nats_server(pid)
                && nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGHUP,
                )
                .is_ok()
            {
                reloaded += 1;
            }
        }
    }
    if reloaded > 0 {
        println(&format!(
            "Reloaded the configuration of {reloaded} running nats-server(s); connections stay open"
        ))?;
    } else {
        println(
            "Make running nats-servers pick this up: `nats-server --signal reload` (or SIGHUP).",
        )?;
    }
    Ok(())
}
