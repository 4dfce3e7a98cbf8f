//! Faults a story inflicts on its cluster, and what it reads to see their effects: SIGKILL the
//! nats-server and start it again, SIGKILL or SIGSTOP an agent, SIGKILL one scheduler replica, start a standby replica, read the scheduler
//! lease, a job's events and an agent's state file. Every fault is a real signal to a real
//! process.

use std::time::Duration;

use mgpu_protocol::subjects;
use serde_json::Value;

use crate::{Cluster, process_alive};

/// True while a process with this pid exists and has not exited: unlike [`process_alive`], a
/// zombie counts as gone. A job orphaned by a killed agent is reparented to init, and an init
/// that does not reap (a bare container's) leaves it a zombie forever once it is killed.
pub fn process_running(pid: i32) -> bool {
    if !process_alive(pid) {
        return false;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name, which is in parentheses and may hold anything.
        Ok(stat) => stat
            .rfind(')')
            .and_then(|end| stat[end + 1..].split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        // No /proc: the signal's answer stands.
        Err(_) => true,
    }
}

impl Cluster {
    /// The single nats-server's pid, while it runs.
    pub fn nats_pid(&self) -> Option<u32> {
        self.nats.as_ref().map(std::process::Child::id)
    }

    /// SIGKILLs the nats-server: every component loses its connection at once.
    pub fn kill_nats(&mut self) {
        if let Some(mut server) = self.nats.take() {
            let _ = server.kill();
            let _ = server.wait();
        }
    }

    /// Starts the nats-server again on the same port and JetStream directory.
    pub fn restart_nats(&mut self) {
        assert!(self.nats.is_none(), "nats-server is running");
        self.start_nats();
    }

    /// Starts one more scheduler replica beside those running, named `scheduler-2`,
    /// `scheduler-3`, … (its log is `logs/<name>.log`), and returns its name. It stands by while
    /// another holds the lease.
    pub fn start_standby_scheduler(&mut self) -> String {
        let name = (2..)
            .map(|n| format!("scheduler-{n}"))
            .find(|name| !self.schedulers.iter().any(|(running, _)| running == name))
            .unwrap_or_else(|| "scheduler-x".to_owned());
        self.spawn_scheduler(&name);
        name
    }

    /// Names of the running scheduler replicas, oldest first.
    pub fn scheduler_names(&self) -> Vec<String> {
        self.schedulers
            .iter()
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// The process id of a running scheduler replica.
    pub fn scheduler_pid(&self, name: &str) -> u32 {
        self.schedulers
            .iter()
            .find(|(running, _)| running == name)
            .map(|(_, child)| child.id())
            .unwrap_or_else(|| panic!("no scheduler named {name} runs"))
    }

    /// SIGKILLs one scheduler replica and returns once it is dead.
    pub fn kill_scheduler_named(&mut self, name: &str) {
        let index = self
            .schedulers
            .iter()
            .position(|(running, _)| running == name)
            .unwrap_or_else(|| panic!("no scheduler named {name} runs"));
        let (_, mut child) = self.schedulers.remove(index);
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Who holds the scheduler lease (the value of `scheduler` in the `mgpu-leader` bucket,
    /// the active replica's id), read with admin credentials; None while nobody does.
    pub fn scheduler_lease(&self) -> Option<String> {
        self.with_nats(&self.admin_creds(), |client| async move {
            let js = async_nats::jetstream::new(client);
            let bucket = js.get_key_value(subjects::LEADER_BUCKET).await.ok()?;
            let value = bucket.get(subjects::LEADER_KEY).await.ok()??;
            Some(String::from_utf8_lossy(&value).into_owned())
        })
    }

    /// The process id of a running agent.
    pub fn agent_pid(&self, name: &str) -> u32 {
        self.agents
            .iter()
            .find(|(running, _)| running == name)
            .map(|(_, child)| child.id())
            .unwrap_or_else(|| panic!("no agent of {name} runs"))
    }

    /// SIGKILLs a node's agent and returns once it is dead (reaped). Its jobs keep running as
    /// orphans, as after a real crash; [`Cluster::start_agent`] starts it again.
    pub fn kill_agent(&mut self, name: &str) {
        let index = self
            .agents
            .iter()
            .position(|(running, _)| running == name)
            .unwrap_or_else(|| panic!("no agent of {name} runs"));
        let (_, mut child) = self.agents.remove(index);
        child
            .kill()
            .unwrap_or_else(|e| panic!("SIGKILL to agent {name}: {e}"));
        child
            .wait()
            .unwrap_or_else(|e| panic!("waiting for agent {name}: {e}"));
    }

    /// Sends a signal to a node's agent (SIGSTOP to freeze it, SIGCONT to thaw it).
    pub fn signal_agent(&self, name: &str, signal: nix::sys::signal::Signal) {
        let pid = i32::try_from(self.agent_pid(name)).unwrap_or_else(|e| panic!("{e}"));
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal)
            .unwrap_or_else(|e| panic!("{signal} to agent {name}: {e}"));
    }

    /// Every event of a job on `jobs.<id>.events`, oldest first, as JSON (`event` names it:
    /// `started`, `exited`, `queued`, `finished`…; `attempt` and `source` say whose).
    pub fn job_events(&self, id: &str) -> Vec<Value> {
        self.stream_json(subjects::EVENTS_STREAM, &format!("jobs.{id}.events"))
    }

    /// Every message `stream` holds on `subject`, oldest first, as JSON (null where a payload
    /// is not), read with admin credentials.
    pub fn stream_json(&self, stream: &str, subject: &str) -> Vec<Value> {
        use futures::StreamExt;
        let (stream, subject) = (stream.to_owned(), subject.to_owned());
        self.with_nats(&self.admin_creds(), |client| async move {
            let js = async_nats::jetstream::new(client);
            let stream = js
                .get_stream(&stream)
                .await
                .unwrap_or_else(|e| panic!("stream {stream}: {e}"));
            let consumer = stream
                .create_consumer(async_nats::jetstream::consumer::pull::OrderedConfig {
                    filter_subject: subject.clone(),
                    deliver_policy: async_nats::jetstream::consumer::DeliverPolicy::All,
                    ..Default::default()
                })
                .await
                .unwrap_or_else(|e| panic!("reading {subject}: {e}"));
            let mut pending = consumer.cached_info().num_pending;
            let mut messages = consumer
                .messages()
                .await
                .unwrap_or_else(|e| panic!("reading {subject}: {e}"));
            let mut read = Vec::new();
            while pending > 0 {
                let next = tokio::time::timeout(Duration::from_secs(5), messages.next()).await;
                let Ok(Some(Ok(message))) = next else {
                    panic!("a message on {subject} could not be read");
                };
                pending = message.info().map(|i| i.pending).unwrap_or(0);
                read.push(serde_json::from_slice(&message.payload).unwrap_or(Value::Null));
            }
            read
        })
    }

    /// The attempts a node's state file records (what its agent would reconcile at start).
    pub fn state_file_attempts(&self, node: &str) -> Vec<Value> {
        let path = self.state_dir().join(format!("{node}.json"));
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let state: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        state["attempts"].as_array().cloned().unwrap_or_default()
    }

    /// Job process groups still recorded in the agents' state files once every agent is gone:
    /// those a killed agent left running and no agent restarted to stop. Killed here so a test
    /// leaves no processes behind.
    pub(crate) fn kill_orphaned_jobs(&self) {
        let Ok(entries) = std::fs::read_dir(self.state_dir()) else {
            return;
        };
        for entry in entries.flatten() {
            let Ok(text) = std::fs::read_to_string(entry.path()) else {
                continue;
            };
            let Ok(state) = serde_json::from_str::<Value>(&text) else {
                continue;
            };
            let attempts = state["attempts"].as_array().cloned().unwrap_or_default();
            for pid in attempts.iter().filter_map(|a| a["pid"].as_i64()) {
                if let Ok(pid) = i32::try_from(pid)
                    && pid > 1
                {
                    let _ = nix::sys::signal::killpg(
                        nix::unistd::Pid::from_raw(pid),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
            }
        }
    }
}
