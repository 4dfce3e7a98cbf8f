//! An mgpu cluster on several nats-servers forming one NATS cluster, for the stories about
//! losing a server.
//!
//! [`Cluster::start_on_nats_cluster`] writes each server's configuration with the generator
//! `mgpu admin init --servers N` uses (`render_cluster_server_conf`), on free ports, each
//! server with its own JetStream directory (capped at [`MEMBER_STORAGE`]) and the same
//! `auth.conf`; it waits until the servers have formed the cluster and elected a JetStream
//! meta leader, then starts the scheduler and the agents, every component given all the
//! servers' URLs.
//! [`Cluster::kill_nats_server`] SIGKILLs one of them ([`Cluster::restart_nats_server`] starts
//! it again); [`Cluster::stream_leaders`] says which
//! server leads which stream, so a story can kill the one whose loss hurts most.

use std::collections::BTreeMap;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

use mgpu_cli::setup::auth::{CLUSTER_NAME, ClusterMember, render_cluster_server_conf};
use mgpu_protocol::subjects;

use crate::auth::with_storage_limit;
use crate::{Cluster, NodeSpec, free_port, host_faults, nats_server_bin, wait_for};

/// Every stream mgpu keeps (buckets by their stream's name).
pub const MGPU_STREAMS: [&str; 9] = [
    subjects::REQUESTS_STREAM,
    subjects::EVENTS_STREAM,
    subjects::AUDIT_STREAM,
    subjects::OUTPUT_STREAM,
    subjects::NODES_STREAM,
    subjects::ASSIGN_STREAM,
    subjects::JOBS_BUCKET_STREAM,
    subjects::CLUSTER_BUCKET_STREAM,
    "KV_mgpu-leader",
];

/// The JetStream storage each member grants. Capped, so that the stories do not depend on
/// the free disk of the machine they run on (a server grants 75% of it, and each member must
/// have room for every stream's whole `max_bytes`), and so that the scheduler's way of
/// keeping less on a small server is exercised on a cluster every time.
const MEMBER_STORAGE: &str = "2G";

/// The nats-servers of one NATS cluster; the ones still running are killed on drop.
pub struct NatsCluster {
    members: Vec<ClusterMember>,
    /// One per member, in the same order; None once killed.
    servers: Vec<Option<Child>>,
    /// The address each member listens on, in the same order: 127.0.0.1, or its network
    /// namespace's.
    hosts: Vec<String>,
    /// Whether each member's JetStream directory is a small disk of its own, unmounted once
    /// the servers are gone.
    small_disks: bool,
}

impl NatsCluster {
    /// Every member's client URL, comma-separated, dead ones included: a component is
    /// configured once with the whole cluster and must itself skip a server that is down.
    pub fn urls(&self) -> String {
        self.members
            .iter()
            .zip(&self.hosts)
            .map(|(m, host)| format!("nats://{host}:{}", m.client_port))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The members' server names (`mgpu-test-1`, …).
    pub fn names(&self) -> Vec<String> {
        self.members.iter().map(|m| m.name.clone()).collect()
    }

    /// The client URL of one member, by server name.
    pub fn url_of(&self, name: &str) -> Option<String> {
        self.members
            .iter()
            .zip(&self.hosts)
            .find(|(m, _)| m.name == name)
            .map(|(m, host)| format!("nats://{host}:{}", m.client_port))
    }
}

impl Drop for NatsCluster {
    fn drop(&mut self) {
        for mut child in self.servers.iter_mut().filter_map(Option::take) {
            let _ = child.kill();
            let _ = child.wait();
        }
        if self.small_disks {
            for member in &self.members {
                host_faults::unmount_small_disk(&member.store_dir);
            }
        }
    }
}

impl Cluster {
    /// `servers` nats-servers in one NATS cluster, a scheduler started with `scheduler_args`,
    /// and the agents of `nodes`; every component is given all the servers' URLs.
    pub fn start_on_nats_cluster(
        servers: usize,
        nodes: &[NodeSpec],
        scheduler_args: &[&str],
    ) -> Cluster {
        Cluster::start_nats_cluster(Cluster::prepare(nodes, false), servers, scheduler_args)
    }

    /// Like [`Cluster::start_on_nats_cluster`], for the fault campaign: every server,
    /// scheduler and agent in a network namespace of its own ([`crate::netns`]), so that
    /// links can be cut; each server's JetStream directory on a small disk of its own, so
    /// that it can be filled; each agent's wall clock steppable where libfaketime is
    /// installed ([`crate::host_faults`]).
    pub fn start_in_namespaces(
        servers: usize,
        nodes: &[NodeSpec],
        scheduler_args: &[&str],
    ) -> Cluster {
        let mut cluster = Cluster::prepare(nodes, false);
        cluster.net = Some(std::sync::Arc::new(crate::netns::Net::create()));
        host_faults::unmount_leftovers();
        if host_faults::clocks_available() {
            let clocks = cluster.dir.path().join("clocks");
            std::fs::create_dir_all(&clocks).unwrap_or_else(|e| panic!("{e}"));
            cluster.clocks = Some(clocks);
        }
        Cluster::start_nats_cluster(cluster, servers, scheduler_args)
    }

    /// Fills server `name`'s JetStream disk (a cluster started in namespaces); false when
    /// its directory is not a disk of its own.
    pub fn fill_jetstream_disk(&self, name: &str) -> bool {
        let Some(dir) = self.small_disk_of(name) else {
            return false;
        };
        host_faults::fill(&dir);
        true
    }

    /// Loses server `name`'s JetStream data (stopped first; started again by
    /// [`Cluster::restart_nats_server`], it comes back with an empty directory, as on a new
    /// disk); false when its directory is not a disk of its own.
    pub fn lose_jetstream_disk(&mut self, name: &str) -> bool {
        let Some(dir) = self.small_disk_of(name) else {
            return false;
        };
        self.kill_nats_server(name);
        host_faults::wipe(&dir);
        true
    }

    /// Empties server `name`'s JetStream disk again.
    pub fn empty_jetstream_disk(&self, name: &str) {
        if let Some(dir) = self.small_disk_of(name) {
            host_faults::empty(&dir);
        }
    }

    fn small_disk_of(&self, name: &str) -> Option<PathBuf> {
        let servers = self.nats_cluster.as_ref()?;
        if !servers.small_disks {
            return None;
        }
        let member = servers.members.iter().find(|m| m.name == name)?;
        Some(member.store_dir.clone())
    }

    fn start_nats_cluster(
        mut cluster: Cluster,
        servers: usize,
        scheduler_args: &[&str],
    ) -> Cluster {
        let members: Vec<ClusterMember> = (1..=servers)
            .map(|i| {
                let name = format!("mgpu-test-{i}");
                ClusterMember {
                    store_dir: cluster.dir.path().join("jetstream").join(&name),
                    name,
                    client_port: free_port(),
                    cluster_port: free_port(),
                }
            })
            .collect();
        let hosts: Vec<String> = members
            .iter()
            .map(|m| match &cluster.net {
                Some(net) => net.ip_of(&m.name).to_string(),
                None => "127.0.0.1".to_owned(),
            })
            .collect();
        let small_disks = cluster.net.is_some();
        let mut children = Vec::new();
        for (index, member) in members.iter().enumerate() {
            if small_disks {
                host_faults::mount_small_disk(&member.store_dir);
            }
            let conf = render_cluster_server_conf(CLUSTER_NAME, &members, index, None)
                .unwrap_or_else(|| panic!("no member {index}"));
            let conf = on_hosts(&with_storage_limit(&conf, MEMBER_STORAGE), &members, &hosts);
            // Beside auth.conf, which every member includes by a relative path.
            let path = cluster.auth_dir.join(format!("{}.conf", member.name));
            std::fs::write(&path, conf).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            children.push(Some(spawn_server(&cluster, &member.name, &path)));
        }
        cluster.port = members[0].client_port;
        cluster.nats_cluster = Some(NatsCluster {
            members: members.clone(),
            servers: children,
            hosts: hosts.clone(),
            small_disks,
        });
        for (member, host) in members.iter().zip(&hosts) {
            wait_for(
                &format!("{} to listen", member.name),
                Duration::from_secs(10),
                || TcpStream::connect((host.as_str(), member.client_port)).ok(),
            );
        }
        cluster.wait_for_jetstream_cluster(servers);
        cluster.scheduler_args = scheduler_args.iter().map(|a| (*a).to_owned()).collect();
        cluster.start_scheduler();
        let with_agents: Vec<String> = cluster
            .nodes
            .iter()
            .filter(|n| n.agent)
            .map(|n| n.name.clone())
            .collect();
        for node in &with_agents {
            cluster.start_agent(node);
        }
        cluster.wait_nodes_online(with_agents.len());
        cluster
    }

    /// The server names of the NATS cluster's members.
    pub fn nats_server_names(&self) -> Vec<String> {
        self.nats_cluster
            .as_ref()
            .map(NatsCluster::names)
            .unwrap_or_default()
    }

    /// The client URL of one server of the NATS cluster, by server name.
    pub fn nats_url_of(&self, name: &str) -> String {
        self.nats_cluster
            .as_ref()
            .and_then(|servers| servers.url_of(name))
            .unwrap_or_else(|| panic!("no server {name}"))
    }

    /// SIGKILLs one nats-server of the cluster, by server name, and returns once it is dead.
    pub fn kill_nats_server(&mut self, name: &str) {
        let (servers, index) = self.member_mut(name);
        let mut child = servers.servers[index]
            .take()
            .unwrap_or_else(|| panic!("{name} was already killed"));
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Starts a killed nats-server of the cluster again, with its configuration and JetStream
    /// directory.
    pub fn restart_nats_server(&mut self, name: &str) {
        let conf = self.auth_dir.join(format!("{name}.conf"));
        let child = spawn_server(self, name, &conf);
        let (servers, index) = self.member_mut(name);
        assert!(servers.servers[index].is_none(), "{name} is running");
        servers.servers[index] = Some(child);
    }

    /// The NATS cluster and the position of its member `name`.
    fn member_mut(&mut self, name: &str) -> (&mut NatsCluster, usize) {
        let servers = self
            .nats_cluster
            .as_mut()
            .unwrap_or_else(|| panic!("not a NATS cluster"));
        let index = servers
            .members
            .iter()
            .position(|m| m.name == name)
            .unwrap_or_else(|| panic!("no server {name}"));
        (servers, index)
    }

    /// The process id of a running nats-server of the cluster.
    pub fn nats_server_pid(&self, name: &str) -> Option<u32> {
        let servers = self.nats_cluster.as_ref()?;
        let index = servers.members.iter().position(|m| m.name == name)?;
        servers.servers.get(index)?.as_ref().map(Child::id)
    }

    /// The server leading each of mgpu's streams and buckets (by stream name), as far as the
    /// cluster knows one.
    pub fn stream_leaders(&self) -> BTreeMap<String, String> {
        self.with_nats(&self.admin_creds(), |client| async move {
            let js = async_nats::jetstream::new(client);
            let mut leaders = BTreeMap::new();
            for stream in MGPU_STREAMS {
                let Ok(mut handle) = js.get_stream(stream).await else {
                    continue;
                };
                let leader = handle
                    .info()
                    .await
                    .ok()
                    .and_then(|info| info.cluster.clone())
                    .and_then(|cluster| cluster.leader);
                if let Some(leader) = leader {
                    leaders.insert(stream.to_owned(), leader);
                }
            }
            leaders
        })
    }

    /// Moves the leadership of every mgpu stream `server` leads to another server (a JetStream
    /// leader step-down), and waits until none is led by it.
    pub fn move_leaders_off(&self, server: &str) {
        // Asked again each round: a step-down can be lost, or land back on `server` when a
        // stream's other replicas are still catching up.
        wait_for(
            &format!("no stream led by {server}"),
            Duration::from_secs(30),
            || {
                let leaders = self.stream_leaders();
                if leaders.len() == MGPU_STREAMS.len() && leaders.values().all(|l| l != server) {
                    return Some(());
                }
                for (stream, leader) in leaders {
                    if leader == server {
                        self.with_nats(&self.admin_creds(), |client| async move {
                            let subject = format!("$JS.API.STREAM.LEADER.STEPDOWN.{stream}");
                            let _ = client.request(subject, "".into()).await;
                        });
                    }
                }
                std::thread::sleep(Duration::from_millis(500));
                None
            },
        );
    }

    /// Moves the leadership of `stream` onto `server` by step-downs (each elects one of the
    /// replicas, so a few may be needed), and waits until it is there.
    pub fn move_leader_onto(&self, stream: &str, server: &str) {
        wait_for(
            &format!("{stream} led by {server}"),
            Duration::from_secs(60),
            || {
                if self.stream_leaders().get(stream).map(String::as_str) == Some(server) {
                    return Some(());
                }
                self.with_nats(&self.admin_creds(), |client| async move {
                    let subject = format!("$JS.API.STREAM.LEADER.STEPDOWN.{stream}");
                    let _ = client.request(subject, "".into()).await;
                });
                std::thread::sleep(Duration::from_millis(500));
                None
            },
        );
    }

    /// Waits until the servers route to each other and JetStream answers, which needs an
    /// elected meta leader: before that, creating a replicated stream fails.
    fn wait_for_jetstream_cluster(&self, servers: usize) {
        wait_for("the NATS cluster to form", Duration::from_secs(20), || {
            self.with_nats(&self.admin_creds(), |client| async move {
                // INFO lists every member's client URL once the routes are up.
                let routed = client.server_info().connect_urls.len() >= servers;
                let js = async_nats::jetstream::new(client);
                let answers = tokio::time::timeout(Duration::from_secs(2), js.query_account())
                    .await
                    .is_ok_and(|r| r.is_ok());
                (routed && answers).then_some(())
            })
        });
    }
}

/// A member's configuration with each member's address where the generator wrote the
/// loopback one (its ports are the member's own, so each replacement is unambiguous).
fn on_hosts(conf: &str, members: &[ClusterMember], hosts: &[String]) -> String {
    let mut conf = conf.to_owned();
    for (member, host) in members.iter().zip(hosts) {
        for port in [member.client_port, member.cluster_port] {
            conf = conf.replace(&format!("127.0.0.1:{port}"), &format!("{host}:{port}"));
        }
    }
    conf
}

fn spawn_server(cluster: &Cluster, name: &str, conf: &Path) -> Child {
    let mut command = Command::new(nats_server_bin());
    cluster.place(name, &mut command);
    command
        .arg("-c")
        .arg(conf)
        .stdout(cluster.log(name))
        .stderr(cluster.log(name))
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "cannot start {}: {e} (run scripts/setup.sh)",
                nats_server_bin().display()
            )
        })
}
