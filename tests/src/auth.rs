//! Who may connect, and clients that connect as one of them: the principals' keys and the
//! registry naming them, the server's configuration (with the TLS authority when it requires
//! TLS), all written with the code `mgpu admin init` uses; the credentials and CA a component
//! or a story is given; and NATS clients connected as a principal, for the stories that speak
//! NATS directly (as a node, as an admin).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use mgpu_cli::setup::auth::{
    Registry, RegistryFiles, Role, SYNC_INTERVAL_LINE, render_server_conf, render_websocket_block,
};
use mgpu_cli::setup::tls::{ensure_certificates, server_hosts};
use mgpu_nats::connect::read_seed;
use mgpu_nats::records;
use mgpu_protocol::node::{NodeAdmin, NodeHeartbeat};
use mgpu_protocol::subjects;

use crate::{Cluster, NodeSpec, free_port};

/// Keys for the scheduler, `admin`, users `alice` and `bob`, the viewer `wall`, and each node
/// in `nodes`, and the registry naming them, in `auth_dir`.
pub(crate) fn write_principals(auth_dir: &Path, nodes: &[NodeSpec]) {
    let mut registry = Registry::default();
    let add = |registry: &mut Registry, role, name: &str| {
        registry
            .add(auth_dir, role, name)
            .unwrap_or_else(|e| panic!("adding {name}: {e}"));
    };
    add(&mut registry, Role::Scheduler, "scheduler");
    add(&mut registry, Role::Notify, "notify");
    add(&mut registry, Role::Admin, "admin");
    add(&mut registry, Role::User, "alice");
    add(&mut registry, Role::User, "bob");
    add(&mut registry, Role::Viewer, "wall");
    for node in nodes {
        add(&mut registry, Role::Node, &node.name);
    }
    registry
        .save(auth_dir)
        .unwrap_or_else(|e| panic!("saving auth: {e}"));
}

/// A single-server configuration (`<auth_dir>/server.conf`) on a free port (and its
/// WebSocket listener on another, as `mgpu admin init` writes it), keeping JetStream
/// in `jetstream`; with `tls`, certificates made as `mgpu admin init --tls` makes them and a
/// server that requires TLS. Returns the port and the CA certificate clients must trust.
pub(crate) fn write_server_conf(
    auth_dir: &Path,
    jetstream: &Path,
    tls: bool,
) -> ((u16, u16), Option<PathBuf>) {
    let certificates = tls.then(|| {
        ensure_certificates(auth_dir, &server_hosts(&[]))
            .unwrap_or_else(|e| panic!("making certificates: {e}"))
    });
    let tls_files = certificates.as_ref().map(|c| &c.files);
    let (port, websocket_port) = (free_port(), free_port());
    let mut conf = render_server_conf(port, jetstream, "mgpu-test", tls_files);
    conf.push_str(&render_websocket_block(
        "127.0.0.1",
        websocket_port,
        tls_files,
    ));
    std::fs::write(auth_dir.join("server.conf"), conf).unwrap_or_else(|e| panic!("{e}"));
    (
        (port, websocket_port),
        tls_files.map(|files| files.ca_file.clone()),
    )
}

/// Takes `sync_interval: always` out of `<auth_dir>/server.conf`, leaving nats-server's
/// default (a flush every two minutes).
pub(crate) fn use_default_sync(auth_dir: &Path) {
    let path = auth_dir.join("server.conf");
    let conf = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{e}"));
    assert!(conf.contains(SYNC_INTERVAL_LINE), "{conf}");
    std::fs::write(&path, conf.replace(SYNC_INTERVAL_LINE, "")).unwrap_or_else(|e| panic!("{e}"));
}

/// Caps the JetStream storage of `<auth_dir>/server.conf` at `limit` (`1G`): what
/// nats-server grants by itself on a machine with little free disk (75% of it).
pub(crate) fn limit_jetstream_storage(auth_dir: &Path, limit: &str) {
    let path = auth_dir.join("server.conf");
    let conf = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(&path, with_storage_limit(&conf, limit)).unwrap_or_else(|e| panic!("{e}"));
}

/// A server configuration written by mgpu's generators with its JetStream storage capped at
/// `limit`.
pub(crate) fn with_storage_limit(conf: &str, limit: &str) -> String {
    assert!(conf.contains(SYNC_INTERVAL_LINE), "{conf}");
    let limited = format!("{SYNC_INTERVAL_LINE}  max_file_store: {limit}\n");
    conf.replace(SYNC_INTERVAL_LINE, &limited)
}

impl Cluster {
    /// The CA certificate clients must trust, when the server requires TLS.
    pub fn ca(&self) -> Option<&Path> {
        self.ca.as_deref()
    }

    /// Gives a component the CA when the server requires TLS, and otherwise makes sure an
    /// `MGPU_CA` from the developer's shell (`source .mgpu/env`) does not leak into it.
    pub(crate) fn set_ca_env(&self, command: &mut Command) {
        match &self.ca {
            Some(ca) => command.env("MGPU_CA", ca),
            None => command.env_remove("MGPU_CA"),
        };
    }

    /// The seed file of a principal.
    pub fn creds(&self, role: Role, name: &str) -> PathBuf {
        self.auth_dir
            .join("keys")
            .join(format!("{}-{name}.nk", role.as_str()))
    }

    pub fn user_creds(&self, name: &str) -> PathBuf {
        self.creds(Role::User, name)
    }

    pub fn admin_creds(&self) -> PathBuf {
        self.creds(Role::Admin, "admin")
    }

    /// Lets `mgpu admin add-user`/`add-node`/`remove` reload this cluster's nats-server, as
    /// they reload `scripts/dev-up.sh`'s: its pid file in `run/`, beside the credentials
    /// directory.
    pub fn let_admin_reload_server(&self) {
        let run_dir = self
            .auth_dir
            .parent()
            .map(|p| p.join("run"))
            .unwrap_or_default();
        std::fs::create_dir_all(&run_dir).unwrap_or_else(|e| panic!("{e}"));
        let pid = self.nats_pid().unwrap_or_else(|| panic!("no nats-server"));
        std::fs::write(run_dir.join("nats-server.pid"), pid.to_string())
            .unwrap_or_else(|e| panic!("{e}"));
    }

    /// The credentials directory (`principals.json`, `keys/`), for `mgpu admin --dir`.
    pub fn auth_dir(&self) -> PathBuf {
        self.auth_dir.clone()
    }

    /// Runs `work` with a NATS client connected with `creds`, on a runtime of its own: the
    /// stories are synchronous, and a few speak NATS directly (as a node, as an admin).
    pub fn with_nats<T, Fut>(&self, creds: &Path, work: impl FnOnce(async_nats::Client) -> Fut) -> T
    where
        Fut: std::future::Future<Output = T>,
    {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("tokio runtime: {e}"));
        runtime.block_on(async {
            let client = self.connect(&self.server_url(), creds).await;
            let result = work(client.clone()).await;
            let _ = client.flush().await;
            result
        })
    }

    /// A NATS client connected with `creds` to `urls` (comma-separated), as mgpu's own
    /// clients connect: for stories that keep one client across several steps.
    pub async fn connect(&self, urls: &str, creds: &Path) -> async_nats::Client {
        let seed = read_seed(creds).unwrap_or_else(|e| panic!("{e}"));
        // The inbox every mgpu client uses (users may subscribe to theirs only).
        let public_key = public_key_of(creds);
        let mut options = async_nats::ConnectOptions::with_nkey(seed)
            .custom_inbox_prefix(mgpu_protocol::principals::inbox_prefix(&public_key));
        if let Some(ca) = &self.ca {
            options = options.require_tls(true).add_root_certificates(ca.clone());
        }
        options
            .connect(mgpu_nats::connect::server_list(urls))
            .await
            .unwrap_or_else(|e| panic!("connecting with {}: {e}", creds.display()))
    }

    /// Publishes a heartbeat as its node would (with that node's credentials), so a test can
    /// describe GPUs declared inventories never have: busy with processes mgpu did not start.
    pub fn publish_heartbeat(&self, beat: &NodeHeartbeat) {
        let payload = serde_json::to_vec(beat).unwrap_or_else(|e| panic!("{e}"));
        let subject = subjects::heartbeat(&beat.node);
        self.with_nats(&self.creds(Role::Node, &beat.node), |client| async move {
            let js = async_nats::jetstream::new(client);
            js.publish(subject, payload.into())
                .await
                .unwrap_or_else(|e| panic!("publishing a heartbeat: {e}"))
                .await
                .unwrap_or_else(|e| panic!("heartbeat not stored: {e}"));
        });
    }

    /// Publishes a job event as `signer` (a node's or an admin's seed file) would: signed,
    /// with the protocol header, stored by JetStream.
    pub fn publish_report(&self, signer: &Path, event: &mgpu_protocol::event::JobEvent) {
        let payload = serde_json::to_vec(event).unwrap_or_else(|e| panic!("{e}"));
        let protocol = mgpu_protocol::version::BASELINE.to_string();
        self.publish_signed(
            signer,
            &subjects::events(&event.job_id),
            payload,
            &[(mgpu_protocol::version::HEADER, &protocol)],
        );
    }

    /// Publishes `payload` on `subject` as the holder of `creds` would, by hand (a program of
    /// its own, an older release): signed with its key, with the `extra` headers, stored by
    /// JetStream.
    pub fn publish_signed(
        &self,
        creds: &Path,
        subject: &str,
        payload: Vec<u8>,
        extra: &[(&str, &str)],
    ) {
        let seed = mgpu_nats::connect::read_seed(creds).unwrap_or_else(|e| panic!("{e}"));
        let key = nkeys::KeyPair::from_seed(&seed).unwrap_or_else(|e| panic!("{e}"));
        let mut headers = async_nats::HeaderMap::new();
        mgpu_nats::signing::sign(&key, subject, &payload, mgpu_protocol::now(), &mut headers)
            .unwrap_or_else(|e| panic!("{e}"));
        for (name, value) in extra {
            headers.insert(*name, *value);
        }
        let subject = subject.to_owned();
        self.with_nats(creds, |client| async move {
            async_nats::jetstream::new(client)
                .publish_with_headers(subject, headers, payload.into())
                .await
                .unwrap_or_else(|e| panic!("publishing: {e}"))
                .await
                .unwrap_or_else(|e| panic!("not stored: {e}"));
        });
    }

    /// Drained nodes and paused GPUs as the scheduler recorded them (empty until it did).
    pub fn node_admin(&self) -> BTreeMap<String, NodeAdmin> {
        self.with_nats(&self.admin_creds(), |client| async move {
            let js = async_nats::jetstream::new(client);
            records::node_admin(&js).await.unwrap_or_default()
        })
    }
}

/// The public key of a principal's seed file (`users.<key>.notices`, its inbox, its history).
pub fn public_key_of(creds: &Path) -> String {
    let seed = read_seed(creds).unwrap_or_else(|e| panic!("{e}"));
    nkeys::KeyPair::from_seed(&seed)
        .map(|pair| pair.public_key())
        .unwrap_or_else(|e| panic!("{e}"))
}
