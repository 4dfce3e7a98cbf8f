//! Principals' nkeys and the nats-server configuration: the authorization that lets each role
//! publish and subscribe only to what it needs, and the server (or cluster) files that include it.
//! The principals file itself is `mgpu_protocol::principals` (the scheduler reads it too).
//!
//! `mgpu admin init` and the test harness use this to write a directory like:
//!
//! ```text
//! DIR/principals.json        who exists: name, role, public key (no secrets)
//! DIR/auth.conf              the `authorization` block nats-server includes
//! DIR/keys/<role>-<name>.nk  each principal's seed, mode 0600 (a secret: git-ignored)
//! DIR/server.conf            a nats-server configuration that includes auth.conf
//! DIR/server-2.conf, …       the other members of a cluster (`mgpu admin init --servers N`)
//! DIR/ca.pem, server-cert.pem, …  with `--tls`: the certificates (see [`super::tls`])
//! ```

use std::fs;
use std::path::{Path, PathBuf};

use serde_json::json;

use mgpu_protocol::error::InvalidInput;
pub use mgpu_protocol::principals::{
    KEYS_DIR, Principal, REGISTRY_FILE, Registry, Role, inbox_prefix, validate_principal_name,
};
use mgpu_protocol::subjects;

use super::files::{write_atomically, write_secret};
use super::tls::{TlsFiles, render_tls_block};

pub const AUTH_CONF_FILE: &str = "auth.conf";

/// Writing the principals file and its key files, and rendering the server's `authorization`
/// block from it: what `mgpu admin` does to a [`Registry`] (the scheduler only reads one).
pub trait RegistryFiles {
    /// Adds a principal with a fresh nkey, writes its seed (mode 0600) and returns the seed's
    /// path. Adding one that exists returns the existing key file and changes nothing.
    fn add(&mut self, dir: &Path, role: Role, name: &str) -> Result<PathBuf, AddError>;
    /// Writes `principals.json` and `auth.conf` (each atomically: write, then rename).
    fn save(&self, dir: &Path) -> std::io::Result<()>;
    /// The nats-server `authorization` block: one nkey user per principal with its role's
    /// permissions.
    fn render_auth_conf(&self) -> String;
}

impl RegistryFiles for Registry {
    fn add(&mut self, dir: &Path, role: Role, name: &str) -> Result<PathBuf, AddError> {
        validate_principal_name(name)?;
        let keys = dir.join(KEYS_DIR);
        if let Some(existing) = self.find(role, name) {
            return Ok(keys.join(existing.key_file_name()));
        }
        let pair = nkeys::KeyPair::new_user();
        let seed = pair.seed().map_err(|e| AddError::Key(e.to_string()))?;
        let principal = Principal {
            name: name.to_owned(),
            role,
            public_key: pair.public_key(),
            unix_user: None,
            group: None,
        };
        fs::create_dir_all(&keys)?;
        let path = keys.join(principal.key_file_name());
        write_secret(&path, &format!("{seed}\n"))?;
        self.principals.push(principal);
        Ok(path)
    }

    fn save(&self, dir: &Path) -> std::io::Result<()> {
        fs::create_dir_all(dir)?;
        let registry = serde_json::to_string_pretty(self).map_err(std::io::Error::other)?;
        write_atomically(&dir.join(REGISTRY_FILE), &registry)?;
        write_atomically(&dir.join(AUTH_CONF_FILE), &self.render_auth_conf())
    }

    fn render_auth_conf(&self) -> String {
        let users: Vec<serde_json::Value> = self
            .principals
            .iter()
            .map(|p| {
                let perms = permissions(p.role, &p.name, &p.public_key);
                json!({
                    "nkey": p.public_key,
                    "permissions": {
                        "publish": { "allow": perms.publish, "deny": perms.deny_publish },
                        "subscribe": { "allow": perms.subscribe },
                    }
                })
            })
            .collect();
        let block = json!({ "users": users });
        format!(
            "# Written by mgpu; regenerate with `mgpu admin`, do not edit by hand.\nauthorization: {}\n",
            serde_json::to_string_pretty(&block).unwrap_or_else(|_| "{}".into())
        )
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AddError {
    #[error(transparent)]
    Invalid(#[from] InvalidInput),
    #[error("generating an nkey: {0}")]
    Key(String),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// What one principal may publish and subscribe to.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Permissions {
    pub publish: Vec<String>,
    pub subscribe: Vec<String>,
    /// Exceptions to `publish`.
    pub deny_publish: Vec<String>,
}

/// The server-side permissions of each role. Anything not listed is refused by the server.
pub fn permissions(role: Role, name: &str, public_key: &str) -> Permissions {
    match role {
        Role::Admin => admin_permissions(),
        Role::Scheduler => scheduler_permissions(),
        Role::Node => node_permissions(name, public_key),
        Role::User => user_permissions(public_key),
        Role::Notify => Permissions {
            publish: super::notify_access::service_publish(),
            subscribe: vec![format!("{}.>", inbox_prefix(public_key))],
            deny_publish: Vec::new(),
        },
        Role::Viewer => viewer_permissions(public_key),
    }
}

/// A viewer (a wall screen) reads the nodes, their heartbeats and administration, the job
/// records, job events, pending submissions, public output and the scheduler's status; it
/// publishes no request, reads no environment, no private output and no history.
fn viewer_permissions(public_key: &str) -> Permissions {
    let mut publish = strings(&[
        "$SRV.PING",
        "$SRV.PING.>",
        "$SRV.INFO",
        "$SRV.INFO.>",
        subjects::SCHEDULER_STATUS,
    ]);
    publish.extend(shared_reads());
    Permissions {
        publish,
        subscribe: vec![
            format!("{}.>", inbox_prefix(public_key)),
            subjects::ALL_OUTPUT.to_owned(),
            subjects::ALL_EVENTS.to_owned(),
            subjects::ALL_HEARTBEATS.to_owned(),
        ],
        deny_publish: schedulers_consumer(),
    }
}

/// What users and viewers both read: stream info, ephemeral consumers and direct gets on the
/// job records, the cluster bucket, job events and heartbeats; pending submissions (shown as
/// queued while the scheduler has not recorded them; `mgpu submit` keeps a job's environment
/// apart before it sends it); public output through consumers that name their filter in the
/// request's subject (no direct gets, whose requests do not); flow control.
fn shared_reads() -> Vec<String> {
    let mut publish = strings(&[
        "$JS.API.INFO",
        "$JS.FC.>",
        "$JS.API.STREAM.INFO.MGPU_REQUESTS",
        "$JS.API.DIRECT.GET.MGPU_REQUESTS",
        "$JS.API.DIRECT.GET.MGPU_REQUESTS.>",
    ]);
    for stream in [
        subjects::JOBS_BUCKET_STREAM,
        subjects::CLUSTER_BUCKET_STREAM,
        subjects::EVENTS_STREAM,
        subjects::NODES_STREAM,
    ] {
        publish.extend(stream_reader_subjects(stream));
    }
    let output = subjects::OUTPUT_STREAM;
    publish.extend([
        format!("$JS.API.STREAM.INFO.{output}"),
        format!(
            "$JS.API.CONSUMER.CREATE.{output}.*.{}",
            subjects::ALL_OUTPUT
        ),
        format!("$JS.API.CONSUMER.INFO.{output}.*"),
        format!("$JS.API.CONSUMER.MSG.NEXT.{output}.*"),
    ]);
    publish
}

/// The scheduler's durable consumer of reports, which no reader may create, change or drain.
fn schedulers_consumer() -> Vec<String> {
    let events = subjects::EVENTS_STREAM;
    let scheduler = subjects::SCHEDULER_EVENTS_CONSUMER;
    vec![
        format!("$JS.API.CONSUMER.CREATE.{events}.{scheduler}"),
        format!("$JS.API.CONSUMER.CREATE.{events}.{scheduler}.>"),
        format!("$JS.API.CONSUMER.MSG.NEXT.{events}.{scheduler}"),
    ]
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

/// Admins may do anything.
fn admin_permissions() -> Permissions {
    Permissions {
        publish: strings(&[">"]),
        subscribe: strings(&[">"]),
        deny_publish: Vec::new(),
    }
}

/// The scheduler keeps the job and cluster buckets, assigns and controls jobs, and records
/// events and the audit trail; it hears heartbeats and answers its service endpoints.
fn scheduler_permissions() -> Permissions {
    Permissions {
        publish: strings(&[
            "$JS.API.>",
            "$JS.ACK.>",
            "$JS.FC.>",
            "$KV.mgpu-jobs.>",
            "$KV.mgpu-job-env.>",
            "$KV.mgpu-nonces.>",
            "$KV.mgpu-cluster.>",
            "$KV.mgpu-leader.>",
            "$KV.mgpu-node-leases.>",
            subjects::ALL_HISTORY,
            subjects::ALL_ASSIGNMENTS,
            subjects::ALL_CONTROLS,
            subjects::ALL_EVENTS,
            subjects::ALL_AUDIT,
            subjects::ALL_NOTICES,
            "$SRV.>",
            "_INBOX.>",
        ]),
        subscribe: strings(&[
            "$SRV.>",
            subjects::SCHEDULER_ENDPOINTS,
            subjects::ALL_HEARTBEATS,
            "_INBOX.>",
        ]),
        deny_publish: Vec::new(),
    }
}

/// A node agent heartbeats under its own name, holds its own name's lease, writes jobs' output
/// and events, and reads its own assignments through its own durable consumer; it hears jobs'
/// input.
fn node_permissions(name: &str, public_key: &str) -> Permissions {
    let consumer = subjects::node_consumer(name);
    let assign = subjects::ASSIGN_STREAM;
    let leases = subjects::NODE_LEASE_BUCKET_STREAM;
    let lease = subjects::node_lease(name);
    let filter = subjects::node_assignment_filter(name);
    Permissions {
        publish: vec![
            subjects::heartbeat(name),
            lease.clone(),
            format!("$JS.API.STREAM.INFO.{leases}"),
            format!("$JS.API.STREAM.CREATE.{leases}"),
            // Asked by the client before it makes a bucket.
            "$JS.API.INFO".to_owned(),
            format!("$JS.API.DIRECT.GET.{leases}.{lease}"),
            subjects::ALL_OUTPUT.to_owned(),
            subjects::ALL_PRIVATE_OUTPUT.to_owned(),
            subjects::ALL_EVENTS.to_owned(),
            format!("$JS.API.STREAM.INFO.{assign}"),
            // Only the create request that names its filter, and only the node's own: a
            // request without the filter in its subject could name another node's.
            format!("$JS.API.CONSUMER.CREATE.{assign}.{consumer}.{filter}"),
            format!("$JS.API.CONSUMER.INFO.{assign}.{consumer}"),
            format!("$JS.API.CONSUMER.MSG.NEXT.{assign}.{consumer}"),
            format!("$JS.ACK.{assign}.{consumer}.>"),
        ],
        subscribe: vec![
            format!("{}.>", inbox_prefix(public_key)),
            "jobs.*.input".to_owned(),
        ],
        deny_publish: Vec::new(),
    }
}

/// Users read every mgpu stream (through ephemeral consumers and direct gets), of the history
/// their own jobs only, but write only requests; they cannot create, change or delete streams or consumers by name, nor publish
/// assignments, events, output or heartbeats.
fn user_permissions(public_key: &str) -> Permissions {
    let mut publish = strings(&[
        subjects::SUBMIT,
        subjects::ALL_CANCELS,
        subjects::ALL_HOLDS,
        subjects::ALL_RELEASES,
        subjects::RESERVATION_REQUESTS,
        "jobs.*.input",
        "$SRV.>",
        subjects::SCHEDULER_STATUS,
        subjects::SCHEDULER_WHY,
    ]);
    publish.extend(shared_reads());
    // Output: also the user's own private jobs', through a consumer that names its filter.
    let output = subjects::OUTPUT_STREAM;
    let own_output = subjects::private_outputs_of(public_key);
    publish.push(format!("$JS.API.CONSUMER.CREATE.{output}.*.{own_output}"));
    // History: the user's own subjects only (a consumer names its filter when it is created,
    // and no direct get is allowed, since its request does not).
    let history = subjects::HISTORY_STREAM;
    publish.extend([
        format!("$JS.API.STREAM.INFO.{history}"),
        format!("$JS.API.CONSUMER.CREATE.{history}.*.history.{public_key}.>"),
        format!("$JS.API.CONSUMER.INFO.{history}.*"),
        format!("$JS.API.CONSUMER.MSG.NEXT.{history}.*"),
    ]);
    // Environments: the user's own keys only, written and read by name (a direct get that
    // names its subject), never listed.
    let env_keys = format!("$KV.{}.{public_key}.>", subjects::JOB_ENV_BUCKET);
    publish.extend([
        format!(
            "$JS.API.DIRECT.GET.{}.{env_keys}",
            subjects::JOB_ENV_BUCKET_STREAM
        ),
        env_keys,
    ]);
    publish.extend(super::notify_access::user_publish(public_key));
    Permissions {
        publish,
        subscribe: vec![
            format!("{}.>", inbox_prefix(public_key)),
            subjects::ALL_OUTPUT.to_owned(),
            own_output,
            subjects::notices(public_key),
            subjects::ALL_EVENTS.to_owned(),
            subjects::ALL_HEARTBEATS.to_owned(),
        ],
        deny_publish: schedulers_consumer()
            .into_iter()
            .chain(super::notify_access::user_deny_publish())
            .collect(),
    }
}

/// The JetStream API subjects that read `stream`: its info, ephemeral consumers, direct gets.
fn stream_reader_subjects(stream: &str) -> [String; 8] {
    [
        format!("$JS.API.STREAM.INFO.{stream}"),
        format!("$JS.API.CONSUMER.CREATE.{stream}"),
        format!("$JS.API.CONSUMER.CREATE.{stream}.>"),
        format!("$JS.API.CONSUMER.INFO.{stream}.*"),
        format!("$JS.API.CONSUMER.MSG.NEXT.{stream}.*"),
        format!("$JS.API.DIRECT.GET.{stream}"),
        format!("$JS.API.DIRECT.GET.{stream}.>"),
        format!("$JS.API.STREAM.MSG.GET.{stream}"),
    ]
}

/// JetStream's `sync_interval` in every configuration mgpu writes: `always` makes the server
/// write each message to disk (fsync) before it acknowledges it. nats-server's default flushes
/// every two minutes, and Jepsen's analysis of NATS 2.12.1 (2025) showed that an OS crash or a
/// power failure then loses writes that were acknowledged: a submission `mgpu submit` reported
/// stored, a job's record. A single server (most labs) has no replica to recover them from.
/// What it costs, and how to relax it, is in docs/operations.md ("Durability"); the test
/// harness removes this line to measure the default.
pub const SYNC_INTERVAL_LINE: &str = "  sync_interval: always\n";

/// The `jetstream` block of a server configuration: its store directory, and
/// [`SYNC_INTERVAL_LINE`].
pub fn render_jetstream_block(store_dir: &Path) -> String {
    format!(
        "jetstream {{\n  store_dir: {store}\n{SYNC_INTERVAL_LINE}}}\n",
        store = json!(store_dir.display().to_string()),
    )
}

/// A complete single-server nats-server configuration that includes `auth.conf`; with `tls`,
/// clients must connect with TLS.
pub fn render_server_conf(
    port: u16,
    store_dir: &Path,
    server_name: &str,
    tls: Option<&TlsFiles>,
) -> String {
    format!(
        "# Written by mgpu.\nserver_name: {name}\nlisten: \"127.0.0.1:{port}\"\n{tls}\
         {jetstream}include \"{auth}\"\n",
        name = json!(server_name),
        tls = tls
            .map(|files| render_tls_block(files, "", false))
            .unwrap_or_default(),
        jetstream = render_jetstream_block(store_dir),
        auth = AUTH_CONF_FILE,
    )
}

/// How far above a server's client port its WebSocket port is by default (4222 → 4280).
pub const WEBSOCKET_PORT_OFFSET: u16 = 58;

/// The `websocket` block: browsers (the web dashboard) connect on `host:port` with the same
/// nkeys and permissions as every other client. With the cluster's TLS files they must use
/// TLS (`wss://`); without, plain `ws://` (meant for loopback).
pub fn render_websocket_block(host: &str, port: u16, tls: Option<&TlsFiles>) -> String {
    let security = match tls {
        Some(files) => render_tls_block(files, "  ", false),
        None => "  no_tls: true\n".to_owned(),
    };
    format!(
        "# The web dashboard's browsers: WebSocket, the same nkeys and permissions.\n\
         websocket {{\n  listen: {listen}\n{security}}}\n",
        listen = json!(format!("{host}:{port}")),
    )
}

/// One server of a NATS cluster, as the configuration of every member names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterMember {
    /// `server_name`: unique in the cluster; JetStream's Raft groups know peers by it.
    pub name: String,
    /// Port clients (the mgpu programs) connect to.
    pub client_port: u16,
    /// Port the other servers' routes connect to.
    pub cluster_port: u16,
    /// This server's JetStream directory: never shared, each server keeps its own replicas.
    pub store_dir: PathBuf,
}

/// Name of the NATS cluster `mgpu admin init --servers N` writes (the `cluster { name }`).
pub const CLUSTER_NAME: &str = "mgpu";

/// The members of a cluster of `count` servers on this machine: ports counted up from
/// `client_port` and `cluster_port`, names `<base_name>-1`…, JetStream in `<store_root>/<name>`.
///
/// One generator for `mgpu admin init --servers N`, `scripts/dev-up.sh --servers N` (which
/// calls it) and the test harness, so all three run the same cluster.
pub fn local_cluster(
    count: u16,
    client_port: u16,
    cluster_port: u16,
    store_root: &Path,
    base_name: &str,
) -> Vec<ClusterMember> {
    (0..count)
        .map(|i| {
            let name = format!("{base_name}-{}", i + 1);
            ClusterMember {
                store_dir: store_root.join(&name),
                name,
                client_port: client_port.saturating_add(i),
                cluster_port: cluster_port.saturating_add(i),
            }
        })
        .collect()
}

/// The file name of member `index` (0-based) in the credentials directory: `server.conf` for
/// the first, so single-server commands (`nats-server -c DIR/server.conf`) keep working, then
/// `server-2.conf`, `server-3.conf`, ….
pub fn cluster_conf_file_name(index: usize) -> String {
    if index == 0 {
        "server.conf".to_owned()
    } else {
        format!("server-{}.conf", index + 1)
    }
}

/// The configuration of member `index` of `members`: what [`render_server_conf`] writes, plus a
/// `cluster` block whose routes point at every other member. All members include the same
/// `auth.conf`, so a principal may log in at any server with the same permissions.
///
/// Routes listen on 127.0.0.1 only, like clients: the generated cluster runs on one machine.
/// Without `tls` its routes carry no credentials; with it, clients must use TLS and routes do
/// too, each server proving itself to its peers with the CA-signed server certificate
/// (`verify`), so only servers holding a key the CA signed can join. Servers on several hosts
/// need routes on reachable addresses, and without TLS cluster authorization (see
/// `nats/README.md`).
pub fn render_cluster_server_conf(
    cluster_name: &str,
    members: &[ClusterMember],
    index: usize,
    tls: Option<&TlsFiles>,
) -> Option<String> {
    let me = members.get(index)?;
    let routes: String = members
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != index)
        .map(|(_, peer)| {
            format!(
                "    {}\n",
                json!(format!("nats-route://127.0.0.1:{}", peer.cluster_port))
            )
        })
        .collect();
    Some(format!(
        "# Written by mgpu: server {n} of {total} of cluster {cluster}.\n\
         server_name: {name}\nlisten: \"127.0.0.1:{port}\"\n{client_tls}\
         {jetstream}\
         cluster {{\n  name: {cluster}\n  listen: \"127.0.0.1:{cluster_port}\"\n{route_tls}  routes: [\n{routes}  ]\n}}\n\
         include \"{auth}\"\n",
        n = index + 1,
        total = members.len(),
        cluster = json!(cluster_name),
        name = json!(me.name),
        port = me.client_port,
        jetstream = render_jetstream_block(&me.store_dir),
        cluster_port = me.cluster_port,
        client_tls = tls
            .map(|files| render_tls_block(files, "", false))
            .unwrap_or_default(),
        route_tls = tls
            .map(|files| render_tls_block(files, "  ", true))
            .unwrap_or_default(),
        auth = AUTH_CONF_FILE,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_are_private_and_the_registry_has_no_secret() {
        let dir = tempfile::tempdir().ok();
        let Some(dir) = dir else { return };
        let mut registry = Registry::default();
        let path = registry.add(dir.path(), Role::User, "alice").ok();
        assert!(path.is_some());
        let path = path.unwrap_or_default();
        let mode = fs::metadata(&path).map(|m| {
            use std::os::unix::fs::PermissionsExt;
            m.permissions().mode() & 0o777
        });
        assert_eq!(mode.ok(), Some(0o600));
        assert!(registry.save(dir.path()).is_ok());
        let registry_text = fs::read_to_string(dir.path().join(REGISTRY_FILE)).unwrap_or_default();
        let auth_text = fs::read_to_string(dir.path().join(AUTH_CONF_FILE)).unwrap_or_default();
        // The seed itself, not just anything starting with "SU" (a public key may contain it).
        let seed = fs::read_to_string(&path).unwrap_or_default();
        let seed = seed.trim();
        assert!(seed.starts_with("SU"));
        assert!(!registry_text.contains(seed));
        assert!(!auth_text.contains(seed));
        assert!(auth_text.contains(&registry.principals[0].public_key));
        // Adding the same principal again keeps its key.
        let again = registry.add(dir.path(), Role::User, "alice").ok();
        assert_eq!(again, Some(path));
        assert_eq!(registry.principals.len(), 1);
    }

    #[test]
    fn users_cannot_publish_assignments_and_nodes_cannot_submit() {
        let user = permissions(Role::User, "alice", "UALICE");
        assert!(!user.publish.iter().any(|s| s.starts_with("nodes.")));
        assert!(!user.publish.iter().any(|s| s == ">" || s == "$JS.API.>"));
        let node = permissions(Role::Node, "node001", "UNODE");
        assert!(!node.publish.iter().any(|s| s == subjects::SUBMIT));
        assert!(node.publish.contains(&"nodes.heartbeat.node001".to_owned()));
        assert!(!node.publish.contains(&"nodes.heartbeat.*".to_owned()));
        // Its own name's lease, and no other node's.
        assert!(
            node.publish
                .contains(&"$KV.mgpu-node-leases.node001".to_owned())
        );
        assert!(
            !node
                .publish
                .iter()
                .any(|s| s.starts_with("$KV.mgpu-node-leases.") && !s.ends_with(".node001"))
        );
    }

    #[test]
    fn bad_names_are_refused() {
        let mut registry = Registry::default();
        let dir = std::env::temp_dir();
        assert!(registry.add(&dir, Role::Node, "a.b").is_err());
        assert!(registry.add(&dir, Role::Node, "*").is_err());
    }

    #[test]
    fn a_three_server_cluster_routes_each_server_to_the_other_two() {
        let members = local_cluster(3, 4222, 6222, Path::new("/srv/js"), "mgpu");
        assert_eq!(members.len(), 3);
        assert_eq!(members[2].name, "mgpu-3");
        assert_eq!(members[2].client_port, 4224);
        assert_eq!(members[2].cluster_port, 6224);
        assert_eq!(members[2].store_dir, Path::new("/srv/js/mgpu-3"));
        let second =
            render_cluster_server_conf(CLUSTER_NAME, &members, 1, None).unwrap_or_default();
        assert!(second.contains("server_name: \"mgpu-2\""), "{second}");
        assert!(second.contains("listen: \"127.0.0.1:4223\""), "{second}");
        assert!(second.contains("store_dir: \"/srv/js/mgpu-2\""), "{second}");
        assert!(second.contains("listen: \"127.0.0.1:6223\""), "{second}");
        assert!(
            second.contains("\"nats-route://127.0.0.1:6222\""),
            "{second}"
        );
        assert!(
            second.contains("\"nats-route://127.0.0.1:6224\""),
            "{second}"
        );
        assert!(!second.contains("nats-route://127.0.0.1:6223"), "{second}");
        assert!(second.contains("name: \"mgpu\""), "{second}");
        assert!(second.ends_with("include \"auth.conf\"\n"), "{second}");
        assert!(!second.contains("tls"), "{second}");
        assert_eq!(
            render_cluster_server_conf(CLUSTER_NAME, &members, 3, None),
            None
        );
        assert_eq!(cluster_conf_file_name(0), "server.conf");
        assert_eq!(cluster_conf_file_name(2), "server-3.conf");
    }

    #[test]
    fn every_server_syncs_each_write_to_disk() {
        let single = render_server_conf(4222, Path::new("/srv/js"), "mgpu", None);
        assert!(
            single.contains("jetstream {\n  store_dir: \"/srv/js\"\n  sync_interval: always\n}\n"),
            "{single}"
        );
        let members = local_cluster(3, 4222, 6222, Path::new("/srv/js"), "mgpu");
        for index in 0..3 {
            let conf =
                render_cluster_server_conf(CLUSTER_NAME, &members, index, None).unwrap_or_default();
            assert_eq!(conf.matches(SYNC_INTERVAL_LINE).count(), 1, "{conf}");
        }
    }

    #[test]
    fn browsers_get_a_websocket_listener_with_tls_where_the_server_has_it() {
        let plain = render_websocket_block("127.0.0.1", 4280, None);
        assert!(plain.contains("websocket {\n  listen: \"127.0.0.1:4280\"\n  no_tls: true\n}"));
        let files = TlsFiles {
            ca_file: "/d/ca.pem".into(),
            cert_file: "/d/server-cert.pem".into(),
            key_file: "/d/server-key.pem".into(),
        };
        let secure = render_websocket_block("0.0.0.0", 443, Some(&files));
        assert!(
            secure.contains("listen: \"0.0.0.0:443\"\n  tls {"),
            "{secure}"
        );
        assert!(
            secure.contains("cert_file: \"/d/server-cert.pem\""),
            "{secure}"
        );
        assert!(!secure.contains("no_tls"), "{secure}");
    }

    #[test]
    fn a_tls_server_requires_tls_of_clients_and_a_tls_cluster_of_routes() {
        let files = TlsFiles::in_dir(Path::new("/etc/mgpu"));
        let single = render_server_conf(4222, Path::new("/srv/js"), "mgpu", Some(&files));
        assert!(
            single.contains(
                "listen: \"127.0.0.1:4222\"\ntls {\n  cert_file: \"/etc/mgpu/server-cert.pem\"\n"
            ),
            "{single}"
        );
        assert!(
            single.contains("  ca_file: \"/etc/mgpu/ca.pem\"\n"),
            "{single}"
        );
        // Clients prove themselves with nkeys, not certificates.
        assert!(!single.contains("verify"), "{single}");
        assert!(single.ends_with("include \"auth.conf\"\n"), "{single}");
        let plain = render_server_conf(4222, Path::new("/srv/js"), "mgpu", None);
        assert!(!plain.contains("tls"), "{plain}");

        let members = local_cluster(3, 4222, 6222, Path::new("/srv/js"), "mgpu");
        let first =
            render_cluster_server_conf(CLUSTER_NAME, &members, 0, Some(&files)).unwrap_or_default();
        assert_eq!(first.matches("tls {").count(), 2, "{first}");
        assert!(
            first.contains(
                "  listen: \"127.0.0.1:6222\"\n  tls {\n    cert_file: \"/etc/mgpu/server-cert.pem\"\n"
            ),
            "{first}"
        );
        // Routes have no other credentials: the peer's certificate must be the CA's.
        assert_eq!(first.matches("verify: true").count(), 1, "{first}");
        assert!(first.contains("    verify: true\n"), "{first}");
    }
}
