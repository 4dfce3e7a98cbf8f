//! Network namespaces for the fault campaign, so that a partition is a real cut link: each
//! component (a nats-server, a scheduler, an agent) runs in a namespace of its own, joined to
//! the others by a veth pair whose outer end is on a bridge in the machine's own namespace,
//! where the tests and the CLI run (10.213.0.254). [`Net::cut`] takes a component's link down
//! and [`Net::heal`] brings it up; [`Net::split`] moves some components' links to a second
//! bridge, so the cluster is in two halves that each still talk among themselves, and
//! [`Net::join`] puts every link back. [`Net::cut_one_way`] drops only what a component sends,
//! or only what it receives, with an iptables rule inside its namespace (where the `iptables`
//! command exists: `scripts/setup.sh` installs it); [`Net::heal`] removes it. Private
//! addresses inside 10.213.0.0/24 only: nothing leaves the machine.
//!
//! Made with `ip` (iproute2) as root. One campaign at a time per machine: the names are
//! fixed, and what a killed campaign left is removed when the next one starts. Everything is
//! removed on drop.

use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;
use std::process::Command;
use std::sync::Mutex;

/// What every name this module makes starts with.
const PREFIX: &str = "mgc";
/// The bridge every link is on, and the one the links of a split's other half move to.
const BRIDGE: &str = "mgcbr0";
const OTHER_BRIDGE: &str = "mgcbr1";
/// The machine's own address on the bridge.
pub const HOST_IP: Ipv4Addr = Ipv4Addr::new(10, 213, 0, 254);

/// Which half of a component's traffic a one-way cut drops.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OneWay {
    /// What it sends: the others stop hearing it, it still hears them.
    Outgoing,
    /// What it receives: it stops hearing the others, what it sends still arrives.
    Incoming,
}

/// One component's namespace.
#[derive(Clone, Debug)]
struct Member {
    name: String,
    ip: Ipv4Addr,
    /// The outer end of its veth pair, on a bridge.
    link: String,
}

/// The namespaces of one campaign.
pub struct Net {
    members: Mutex<Vec<Member>>,
}

impl Net {
    /// The bridges, after removing whatever an earlier campaign left.
    pub fn create() -> Net {
        remove_leftovers();
        for bridge in [BRIDGE, OTHER_BRIDGE] {
            ip(&["link", "add", bridge, "type", "bridge"]);
            ip(&["link", "set", bridge, "up"]);
        }
        ip(&["addr", "add", &format!("{HOST_IP}/24"), "dev", BRIDGE]);
        Net {
            members: Mutex::new(Vec::new()),
        }
    }

    fn members(&self) -> std::sync::MutexGuard<'_, Vec<Member>> {
        self.members
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The address of component `name`, its namespace made the first time it is asked for.
    pub fn ip_of(&self, name: &str) -> Ipv4Addr {
        let mut members = self.members();
        if let Some(member) = members.iter().find(|m| m.name == name) {
            return member.ip;
        }
        let number = members.len() + 1;
        assert!(number < 250, "more components than addresses");
        let address = Ipv4Addr::new(10, 213, 0, number as u8);
        let (ns, link, inner) = (
            namespace(number),
            format!("{PREFIX}{number}"),
            format!("{PREFIX}{number}i"),
        );
        ip(&["netns", "add", &ns]);
        ip(&["link", "add", &link, "type", "veth", "peer", "name", &inner]);
        ip(&["link", "set", &inner, "netns", &ns]);
        ip(&[
            "-n",
            &ns,
            "addr",
            "add",
            &format!("{address}/24"),
            "dev",
            &inner,
        ]);
        ip(&["-n", &ns, "link", "set", &inner, "up"]);
        ip(&["-n", &ns, "link", "set", "lo", "up"]);
        ip(&["link", "set", &link, "master", BRIDGE, "up"]);
        members.push(Member {
            name: name.to_owned(),
            ip: address,
            link,
        });
        address
    }

    /// Makes `command` run in component `name`'s namespace (and only that: the mounts, the
    /// cgroups and the rest are the machine's).
    pub fn place(&self, name: &str, command: &mut Command) {
        let number = {
            self.ip_of(name);
            let members = self.members();
            members.iter().position(|m| m.name == name).unwrap_or(0) + 1
        };
        let path = format!("/run/netns/{}", namespace(number));
        let file = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        use std::os::unix::process::CommandExt;
        // SAFETY: between fork and exec the closure makes one system call on a descriptor
        // opened before the fork (and kept open by the closure); it allocates nothing.
        unsafe {
            command.pre_exec(move || {
                match nix::libc::setns(file.as_raw_fd(), nix::libc::CLONE_NEWNET) {
                    0 => Ok(()),
                    _ => Err(std::io::Error::last_os_error()),
                }
            });
        }
    }

    /// Cuts component `name` off from every other.
    pub fn cut(&self, name: &str) {
        if let Some(link) = self.link_of(name) {
            ip(&["link", "set", &link, "down"]);
        }
    }

    /// Brings component `name`'s link up again, and lifts a one-way cut.
    pub fn heal(&self, name: &str) {
        if let Some(link) = self.link_of(name) {
            ip(&["link", "set", &link, "up"]);
        }
        if let Some(number) = self.number_of(name) {
            for chain in ["INPUT", "OUTPUT"] {
                // Nothing to flush where iptables is missing: no one-way cut was made.
                let _ = iptables(number, &["-F", chain]);
            }
        }
    }

    /// Cuts component `name` off one way only (a rule on its namespace's side of its link;
    /// TCP then stalls both ways, as it does when a firewall drops one direction); false
    /// where iptables cannot make the rule.
    pub fn cut_one_way(&self, name: &str, way: OneWay) -> bool {
        let Some(number) = self.number_of(name) else {
            return false;
        };
        let inner = format!("{PREFIX}{number}i");
        let rule: [&str; 6] = match way {
            OneWay::Outgoing => ["-A", "OUTPUT", "-o", &inner, "-j", "DROP"],
            OneWay::Incoming => ["-A", "INPUT", "-i", &inner, "-j", "DROP"],
        };
        iptables(number, &rule)
    }

    /// Splits the cluster: the components in `half` talk among themselves only, the others
    /// (and the machine, where the CLI runs) among themselves.
    pub fn split(&self, half: &[String]) {
        for name in half {
            if let Some(link) = self.link_of(name) {
                ip(&["link", "set", &link, "master", OTHER_BRIDGE]);
            }
        }
    }

    /// Every link on the one bridge again (one cut off stays down until healed).
    pub fn join(&self) {
        let links: Vec<String> = self.members().iter().map(|m| m.link.clone()).collect();
        for link in links {
            ip(&["link", "set", &link, "master", BRIDGE]);
        }
    }

    /// Every component with a namespace.
    pub fn names(&self) -> Vec<String> {
        self.members().iter().map(|m| m.name.clone()).collect()
    }

    /// The number of component `name`'s namespace and links.
    fn number_of(&self, name: &str) -> Option<usize> {
        self.members()
            .iter()
            .position(|m| m.name == name)
            .map(|index| index + 1)
    }

    fn link_of(&self, name: &str) -> Option<String> {
        self.members()
            .iter()
            .find(|m| m.name == name)
            .map(|m| m.link.clone())
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        remove_leftovers();
    }
}

fn namespace(number: usize) -> String {
    format!("{PREFIX}-ns{number}")
}

/// Removes every namespace, link and bridge this module makes (a veth pair goes with its
/// namespace).
fn remove_leftovers() {
    let listed = Command::new("ip").args(["netns", "list"]).output();
    let text = listed
        .map(|out| String::from_utf8_lossy(&out.stdout).into_owned())
        .unwrap_or_default();
    for ns in text
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .filter(|ns| ns.starts_with(&format!("{PREFIX}-ns")))
    {
        let _ = Command::new("ip").args(["netns", "del", ns]).status();
    }
    for bridge in [BRIDGE, OTHER_BRIDGE] {
        let _ = Command::new("ip")
            .args(["link", "del", bridge])
            .stderr(std::process::Stdio::null())
            .status();
    }
}

/// Runs `iptables ARGS` in namespace `number`; whether it succeeded (false where iptables
/// is not installed, or the kernel has no filter table).
fn iptables(number: usize, args: &[&str]) -> bool {
    Command::new("ip")
        .args(["netns", "exec", &namespace(number), "iptables"])
        .args(args)
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

/// Runs `ip ARGS`, which must succeed.
fn ip(args: &[&str]) {
    let out = Command::new("ip")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("ip {args:?}: {e}"));
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
