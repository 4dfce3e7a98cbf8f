//! Checking a [`JobSpec`]: what no scheduler could fix later (a missing command, a relative
//! workdir, impossible GPU pins, absurd values a hostile submission could send). Node-
//! dependent checks (does GPU 7 exist?) happen at placement.

use super::*;
use crate::gpu_amount::MAX_GPU_MEMORY_MIB;

impl JobSpec {
    /// Checks what no scheduler could fix later. Node-dependent checks (does GPU 7 exist?)
    /// happen at placement.
    pub fn validate(&self) -> Result<(), InvalidInput> {
        self.validate_command()?;
        self.validate_gpus()?;
        self.validate_extras()?;
        self.validate_selection()?;
        self.validate_nodes()?;
        self.validate_hostile()?;
        if let Some(script) = &self.script {
            script.validate()?;
        }
        if let Some(limit) = self.time_limit_secs
            && (limit == 0 || limit > MAX_TIME_LIMIT.as_secs())
        {
            return Err(InvalidInput::new(format!(
                "time limit of {limit}s is outside 1s..366 days"
            )));
        }
        Ok(())
    }

    /// The command, where it runs and what it is called.
    fn validate_command(&self) -> Result<(), InvalidInput> {
        if self.command.is_empty() || self.command.iter().all(|a| a.trim().is_empty()) {
            return Err(InvalidInput::new("the job has no command"));
        }
        if self.command.iter().any(|a| a.contains('\0')) {
            return Err(InvalidInput::new("the command contains a NUL byte"));
        }
        crate::wire::check_line("workdir", &self.workdir, MAX_PATH_BYTES)?;
        if !self.workdir.starts_with('/') {
            return Err(InvalidInput::new(format!(
                "workdir `{}` must be an absolute path",
                self.workdir
            )));
        }
        if let Some(name) = &self.name
            && (name.is_empty() || name.len() > 128 || name.chars().any(char::is_control))
        {
            return Err(InvalidInput::new(
                "job name must be 1-128 printable characters",
            ));
        }
        Ok(())
    }

    /// The GPUs asked for: pinned ids that agree with the count, memory with a GPU.
    fn validate_gpus(&self) -> Result<(), InvalidInput> {
        if let Some(ids) = &self.gpu_ids {
            if ids.is_empty() {
                return Err(InvalidInput::new("--gpu-ids names no GPU"));
            }
            let mut sorted = ids.clone();
            sorted.sort_unstable();
            sorted.dedup();
            if sorted.len() != ids.len() {
                return Err(InvalidInput::new("--gpu-ids names a GPU twice"));
            }
            if self.gpus.is_whole() && self.gpus.gpu_count() as usize != ids.len() {
                return Err(InvalidInput::new(format!(
                    "--gpus {} does not match the {} GPU id(s) given in --gpu-ids",
                    self.gpus,
                    ids.len()
                )));
            }
            if !self.gpus.is_whole() && ids.len() != 1 {
                return Err(InvalidInput::new(
                    "a share of a GPU can be pinned to exactly one GPU id",
                ));
            }
        }
        if self.allowed_gpus.as_ref().is_some_and(Vec::is_empty) {
            return Err(InvalidInput::new("the allowed GPU list is empty"));
        }
        if let Some(mem) = self.mem_mib
            && (mem == 0 || mem > MAX_GPU_MEMORY_MIB)
        {
            return Err(InvalidInput::new(format!(
                "--mem {mem} MiB is not a plausible GPU memory size"
            )));
        }
        if self.mem_mib.is_some() && self.gpus.is_zero() {
            return Err(InvalidInput::new("--mem needs at least a share of a GPU"));
        }
        crate::host::check_request(self.cpus, self.mem_host_mib)
    }

    /// The GPU types and node constraint it selects by.
    fn validate_selection(&self) -> Result<(), InvalidInput> {
        if self.gpu_types.len() > crate::gpu_type::MAX_TYPES {
            return Err(InvalidInput::new(format!(
                "at most {} GPU types may be listed",
                crate::gpu_type::MAX_TYPES
            )));
        }
        for name in &self.gpu_types {
            crate::gpu_type::check_name(name, "GPU type")?;
        }
        if let Some(text) = &self.constraint {
            crate::gpu_type::Constraint::parse(text)?;
        }
        Ok(())
    }

    /// The conda environment, dependencies and array limit.
    fn validate_extras(&self) -> Result<(), InvalidInput> {
        if let Some(env) = &self.conda_env
            && (env.is_empty()
                || !env
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c)))
        {
            return Err(InvalidInput::new(format!(
                "`{env}` is not a conda environment name (letters, digits, `-`, `_`, `.`, `/`)"
            )));
        }
        if self.after.len() + self.after_any.len() > 1000 {
            return Err(InvalidInput::new("a job may depend on at most 1000 jobs"));
        }
        if self.notify.len() > crate::notify::NotifyEvent::ALL.len() {
            return Err(InvalidInput::new("--notify names a notice more than once"));
        }
        if let Some(member) = &self.array
            && member.max_running == Some(0)
        {
            return Err(InvalidInput::new(
                "an array's `%N` limit must be at least 1",
            ));
        }
        if let Some(size) = &self.pty {
            size.validate()?;
            if self.distributed {
                return Err(InvalidInput::new(
                    "--pty gives one process a terminal; a --distributed job runs one per node",
                ));
            }
        }
        self.validate_stop()
    }

    /// `--qos` names a class (the scheduler checks it exists and who may use it); `--signal`
    /// is a real signal, warned no earlier than the job's time limit allows.
    fn validate_stop(&self) -> Result<(), InvalidInput> {
        if let Some(qos) = &self.qos
            && (qos.is_empty()
                || qos.len() > 64
                || !qos
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'))
        {
            return Err(InvalidInput::new(format!(
                "--qos {qos:?}: a class name is letters, digits, `-` and `_`"
            )));
        }
        if let Some(name) = &self.reservation {
            crate::reservation::check_name(name)
                .map_err(|err| InvalidInput::new(format!("--reservation: {err}")))?;
        }
        let Some(signal) = &self.signal else {
            return Ok(());
        };
        if crate::stop::signal_number(&signal.signal.to_string()) != Some(signal.signal)
            || signal.seconds > crate::stop::MAX_WARNING_SECS
        {
            return Err(InvalidInput::new(format!(
                "--signal {signal}: not a signal a job may be warned with"
            )));
        }
        if let Some(limit) = self.time_limit_secs
            && signal.seconds >= limit
        {
            return Err(InvalidInput::new(format!(
                "--signal {signal}: {} s of warning is not less than the job's time limit \
                 ({limit} s)",
                signal.seconds
            )));
        }
        Ok(())
    }

    /// The part of [`JobSpec::validate`] that guards against absurd values no CLI would send
    /// (a hand-written or hostile submission): priorities, environment, GPU indices, text.
    fn validate_hostile(&self) -> Result<(), InvalidInput> {
        if !(-MAX_PRIORITY..=MAX_PRIORITY).contains(&self.priority) {
            return Err(InvalidInput::new(format!(
                "priority {} is outside -{MAX_PRIORITY}..{MAX_PRIORITY}",
                self.priority
            )));
        }
        crate::wire::check_count("environment variables", self.env.len(), MAX_ENV_VARS)?;
        // Values may hold newlines (exported shell functions); only NUL cannot be passed on.
        for (key, value) in &self.env {
            if key.is_empty() || key.contains(['=', '\0']) || value.contains('\0') {
                return Err(InvalidInput::new(format!(
                    "environment variable `{}` cannot be set (empty name, `=` or NUL)",
                    key.escape_debug()
                )));
            }
        }
        if self
            .env_setup_cmd
            .as_ref()
            .is_some_and(|cmd| cmd.contains('\0'))
        {
            return Err(InvalidInput::new(
                "the environment setup contains a NUL byte",
            ));
        }
        if let Some(profile) = &self.profile {
            crate::wire::check_line("profile", profile, 128)?;
        }
        let pinned = self
            .gpu_ids
            .iter()
            .flatten()
            .chain(self.allowed_gpus.iter().flatten())
            .chain(self.node_gpu_ids.iter().flat_map(|n| &n.gpu_ids));
        for &index in pinned {
            check_gpu_index(index)?;
        }
        for list in [&self.gpu_ids, &self.allowed_gpus].into_iter().flatten() {
            crate::wire::check_count("GPU ids", list.len(), GpuAmount::MAX_GPUS as usize)?;
        }
        crate::wire::check_count("excluded nodes", self.exclude.len(), MAX_JOB_NODES as usize)?;
        Ok(())
    }

    /// The multi-node part of [`JobSpec::validate`].
    fn validate_nodes(&self) -> Result<(), InvalidInput> {
        if self.nodes == 0 || self.nodes > MAX_JOB_NODES {
            return Err(InvalidInput::new(format!(
                "--nodes {} is outside 1..{MAX_JOB_NODES}",
                self.nodes
            )));
        }
        for name in self.nodelist.iter().chain(&self.exclude) {
            crate::ids::validate_node_name(name)?;
        }
        let mut listed = self.nodelist.clone();
        listed.sort();
        listed.dedup();
        if listed.len() != self.nodelist.len() {
            return Err(InvalidInput::new("--nodelist names a node twice"));
        }
        if let Some(both) = self.nodelist.iter().find(|n| self.exclude.contains(n)) {
            return Err(InvalidInput::new(format!(
                "node {both} is both in --nodelist and in --exclude"
            )));
        }
        if self.nodelist.len() > self.nodes as usize {
            return Err(InvalidInput::new(format!(
                "--nodelist names {} nodes but the job asks for {} (--nodes)",
                self.nodelist.len(),
                self.nodes
            )));
        }
        if self.is_multi_node() && !self.gpus.is_zero() && !self.gpus.is_whole() {
            return Err(InvalidInput::new(
                "a multi-node job takes whole GPUs on each node (--gpus-per-node 1 or more)",
            ));
        }
        if !self.node_gpu_ids.is_empty() {
            self.validate_node_gpu_ids()?;
        }
        Ok(())
    }

    /// `--node-gpu-ids`: one entry per node asked for, distinct GPUs on each, agreeing with
    /// `--gpus`.
    fn validate_node_gpu_ids(&self) -> Result<(), InvalidInput> {
        if self.gpu_ids.is_some() || !self.nodelist.is_empty() {
            return Err(InvalidInput::new(
                "--node-gpu-ids already names nodes and GPUs: leave out --gpu-ids and --nodelist",
            ));
        }
        if self.node_gpu_ids.len() != self.nodes as usize {
            return Err(InvalidInput::new(format!(
                "--node-gpu-ids names {} node(s) but the job asks for {} (--nodes)",
                self.node_gpu_ids.len(),
                self.nodes
            )));
        }
        for entry in &self.node_gpu_ids {
            crate::ids::validate_node_name(&entry.node)?;
            if self.exclude.contains(&entry.node) {
                return Err(InvalidInput::new(format!(
                    "node {} is both in --node-gpu-ids and in --exclude",
                    entry.node
                )));
            }
            let mut ids = entry.gpu_ids.clone();
            ids.sort_unstable();
            ids.dedup();
            if ids.len() != entry.gpu_ids.len() || ids.is_empty() {
                return Err(InvalidInput::new(format!(
                    "--node-gpu-ids: node {} needs distinct GPU ids",
                    entry.node
                )));
            }
        }
        // Nodes may get different counts (`node001:0,1;node002:0`); `gpus` is then the
        // largest, and each node gets exactly its ids.
        let most = self
            .node_gpu_ids
            .iter()
            .map(|n| n.gpu_ids.len())
            .max()
            .unwrap_or(0);
        if !self.gpus.is_whole() || self.gpus.gpu_count() as usize != most {
            return Err(InvalidInput::new(format!(
                "--node-gpu-ids gives a node {most} GPU(s) but the job asks for {} per node",
                self.gpus
            )));
        }
        Ok(())
    }
}

/// A GPU index no node could have is an error, not a job waiting forever.
pub(super) fn check_gpu_index(index: u32) -> Result<(), InvalidInput> {
    if index >= GpuAmount::MAX_GPUS {
        return Err(InvalidInput::new(format!(
            "GPU index {index} is beyond any node (at most {})",
            GpuAmount::MAX_GPUS - 1
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::job::JobSpec;
    use crate::stop::StopSignal;

    #[test]
    fn a_warning_must_come_before_the_time_limit_and_a_class_name_be_plain() {
        let mut spec = JobSpec::new(vec!["train".into()], "/tmp");
        spec.signal = StopSignal::parse("USR1@300").ok();
        assert!(spec.validate().is_ok(), "no time limit");
        spec.time_limit_secs = Some(300);
        assert!(
            spec.validate()
                .is_err_and(|e| e.to_string().contains("time limit"))
        );
        spec.time_limit_secs = Some(301);
        assert!(spec.validate().is_ok());
        spec.qos = Some("scavenger".into());
        assert!(spec.validate().is_ok());
        spec.qos = Some("no spaces".into());
        assert!(spec.validate().is_err());
    }
}
