//! What a story does through the real `mgpu` CLI: run a command as a user, submit, and read
//! or wait for a job's state and the nodes' (`show --json`, `queue --json`, `nodes --json`).

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::{Cluster, bin_dir, wait_for};

impl Cluster {
    /// Runs `mgpu ARGS` as user `alice`.
    pub fn mgpu(&self, args: &[&str]) -> Output {
        self.mgpu_with(&self.user_creds("alice"), args, None)
    }

    /// Adds `name=value` to the environment of every later `mgpu` run.
    pub fn set_cli_env(&mut self, name: &str, value: &str) {
        self.cli_env.push((name.to_owned(), value.to_owned()));
    }

    /// `mgpu ARGS` with the given credentials, ready to spawn (for commands that keep running,
    /// such as `submit --file F --watch`).
    pub fn mgpu_command(&self, creds: &Path, args: &[&str]) -> Command {
        let mut command = Command::new(bin_dir().join("mgpu"));
        self.set_ca_env(&mut command);
        command
            .args(args)
            .env("MGPU_SERVER", self.server_url())
            .env("MGPU_CREDS", creds)
            .env("USER", "alice")
            .current_dir(self.dir.path());
        for (name, value) in &self.cli_env {
            command.env(name, value);
        }
        command
    }

    /// Runs `mgpu ARGS` with the given credentials, optionally feeding `stdin`.
    pub fn mgpu_with(&self, creds: &Path, args: &[&str], stdin: Option<&[u8]>) -> Output {
        let mut command = self.mgpu_command(creds, args);
        command
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = command
            .spawn()
            .unwrap_or_else(|e| panic!("running mgpu: {e}"));
        if let (Some(bytes), Some(mut pipe)) = (stdin, child.stdin.take()) {
            use std::io::Write;
            let _ = pipe.write_all(bytes);
        }
        child
            .wait_with_output()
            .unwrap_or_else(|e| panic!("running mgpu: {e}"))
    }

    /// Runs `mgpu ARGS`, asserts success and returns stdout.
    pub fn mgpu_ok(&self, args: &[&str]) -> String {
        self.mgpu_ok_with(&self.user_creds("alice"), args)
    }

    /// [`Cluster::mgpu_ok`] with other credentials.
    pub fn mgpu_ok_with(&self, creds: &Path, args: &[&str]) -> String {
        let out = self.mgpu_with(creds, args, None);
        assert!(
            out.status.success(),
            "mgpu {args:?} failed ({:?}): {}{}",
            out.status.code(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The audit records, as `mgpu admin audit --json` prints them.
    pub fn audit_records(&self) -> Vec<Value> {
        self.mgpu_ok_with(&self.admin_creds(), &["admin", "audit", "--json"])
            .lines()
            .filter_map(|line| serde_json::from_str(line).ok())
            .collect()
    }

    /// Submits a shell command line and returns the job id.
    pub fn submit(&self, extra: &[&str], command: &str) -> String {
        self.submit_as(&self.user_creds("alice"), extra, command).0
    }

    /// `mgpu submit --json FLAGS -- COMMAND` with `creds`: the job's id, and why the
    /// scheduler refused it at submit, if it did. A refusal must come with exit status 1
    /// and the reason in the JSON; an accepted job with status 0.
    pub fn submit_as(
        &self,
        creds: &Path,
        extra: &[&str],
        command: &str,
    ) -> (String, Option<String>) {
        let mut args = vec!["submit", "--json"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--", command]);
        let out = self.mgpu_with(creds, &args, None);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let json: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| {
            panic!(
                "mgpu {args:?} printed {stdout:?} ({e}): {}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
        let id = json["id"]
            .as_str()
            .unwrap_or_else(|| panic!("no id in {stdout}"))
            .to_owned();
        let refused = json["refused"].as_str().map(str::to_owned);
        let expected = if refused.is_some() { Some(1) } else { Some(0) };
        assert_eq!(out.status.code(), expected, "mgpu {args:?}: {stdout}");
        (id, refused)
    }

    /// `mgpu submit --json --array RANGE FLAGS -- COMMAND`: what it printed (`array_id`,
    /// `ids`…) and its tasks' ids, in index order.
    pub fn submit_array(&self, range: &str, extra: &[&str], command: &str) -> (Value, Vec<String>) {
        let mut args = vec!["--array", range];
        args.extend_from_slice(extra);
        let printed = self.submit_json(&args, command);
        let ids = printed["ids"]
            .as_array()
            .map(|ids| {
                ids.iter()
                    .filter_map(|id| id.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        (printed, ids)
    }

    /// `mgpu submit --json FLAGS -- COMMAND`, returning what it printed (`{"id": …}`, or for
    /// arrays and duplicates the other shapes).
    pub fn submit_json(&self, extra: &[&str], command: &str) -> Value {
        let mut args = vec!["submit", "--json"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--", command]);
        let out = self.mgpu_ok(&args);
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("submit --json printed {out:?}: {e}"))
    }

    /// `mgpu show --json` of a job.
    pub fn show(&self, id: &str) -> Value {
        let out = self.mgpu_ok(&["show", "--json", id]);
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("show --json printed {out:?}: {e}"))
    }

    /// Every job `mgpu queue --all --json` lists, finished ones included.
    pub fn all_jobs(&self) -> Vec<Value> {
        let out = self.mgpu_ok(&["queue", "--all", "--json"]);
        let queue: Value = serde_json::from_str(&out)
            .unwrap_or_else(|e| panic!("queue --all --json printed {out:?}: {e}"));
        queue["jobs"].as_array().cloned().unwrap_or_default()
    }

    pub fn state(&self, id: &str) -> String {
        self.show(id)["state"].as_str().unwrap_or("").to_owned()
    }

    /// Waits until the job is in `state`, returning its `show --json`.
    pub fn wait_state(&self, id: &str, state: &str, timeout: Duration) -> Value {
        wait_for(&format!("job {id} to be {state}"), timeout, || {
            let job = self.show(id);
            (job["state"] == state).then_some(job)
        })
    }

    /// Waits until the job is queued for `reason` (a `WaitReason::describe` text).
    pub fn wait_reason(&self, id: &str, reason: &str, timeout: Duration) -> Value {
        let deadline = Instant::now() + timeout;
        loop {
            let job = self.show(id);
            if job["state"] == "queued" && job["reason"] == reason {
                return job;
            }
            // The last state seen says more than a timeout: which reason, or that it ran.
            assert!(
                Instant::now() < deadline,
                "job {id} never waited with `{reason}`; last seen: {job}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits until the job has finished and asserts it ended in `state`.
    pub fn finished_as(&self, id: &str, state: &str, timeout: Duration) -> Value {
        let job = self.wait_finished(id, timeout);
        assert_eq!(job["state"], state, "{job}");
        job
    }

    /// Waits until the job has finished, returning its `show --json`.
    pub fn wait_finished(&self, id: &str, timeout: Duration) -> Value {
        wait_for(&format!("job {id} to finish"), timeout, || {
            let job = self.show(id);
            let done = matches!(
                job["state"].as_str(),
                Some("succeeded" | "failed" | "cancelled" | "timed_out" | "node_failed")
            );
            done.then_some(job)
        })
    }

    pub fn wait_nodes_online(&self, count: usize) {
        self.wait_nodes_online_within(count, Duration::from_secs(20));
    }

    /// [`Cluster::wait_nodes_online`] with its own patience (a degraded NATS cluster answers
    /// reads slowly).
    pub fn wait_nodes_online_within(&self, count: usize, timeout: Duration) {
        wait_for(&format!("{count} node(s) online"), timeout, || {
            let out = self.mgpu_with(&self.admin_creds(), &["nodes", "--json"], None);
            let nodes: Value = serde_json::from_slice(&out.stdout).ok()?;
            let online = nodes
                .as_array()?
                .iter()
                .filter(|n| n["state"] == "online")
                .count();
            (online >= count).then_some(())
        });
    }
}
