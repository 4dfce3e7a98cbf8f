//! The environment a job attempt runs with: the submitter's captured variables, filtered,
//! then the agent's own (GPUs, mgpu ids, the restart count and stop file of preemption's
//! handshake, array index, and for multi-node jobs the rendezvous variables torchrun and MPI
//! launchers read), which always win.
//!
//! Pure, so the exact environment a job gets is unit-tested without spawning it.

use std::collections::BTreeMap;
use std::path::Path;

use mgpu_protocol::job::{JobSpec, Placement};

use crate::running::AttemptKey;
use crate::script::gpu_list;

/// Whether a variable from the submitter's captured environment is passed on. The agent sets
/// the GPU and mgpu variables itself, and `LD_PRELOAD` would inject code into every process
/// the job starts.
fn passes_user_variable(name: &str) -> bool {
    !(name.is_empty()
        || name.contains(['=', '\0'])
        || name == "LD_PRELOAD"
        || name == "CUDA_VISIBLE_DEVICES"
        || name == "CUDA_DEVICE_ORDER"
        || name.starts_with("MGPU_"))
}

/// Where one process of a multi-node job stands among the others.
pub struct RankInfo<'a> {
    pub placement: &'a Placement,
    pub rank: u32,
    pub hostfile: &'a Path,
}

/// The job's whole environment: the submitter's captured one (filtered), then the agent's
/// variables, which always win. `stop_file`: where the agent says why it stops the job
/// (`MGPU_STOP_FILE`, see `stop_notice.rs`).
pub fn job_environment(
    spec: &JobSpec,
    key: &AttemptKey,
    node: &str,
    gpus: &[u32],
    stop_file: &Path,
    ranks: Option<&RankInfo<'_>>,
) -> BTreeMap<String, String> {
    let mut env: BTreeMap<String, String> = spec
        .env
        .iter()
        .filter(|(name, value)| passes_user_variable(name) && !value.contains('\0'))
        .map(|(name, value)| (name.clone(), value.clone()))
        .collect();
    let gpu_list = gpu_list(gpus);
    env.insert("CUDA_VISIBLE_DEVICES".into(), gpu_list.clone());
    // CUDA's default numbering is fastest-first; PCI bus order matches NVML's indices.
    env.insert("CUDA_DEVICE_ORDER".into(), "PCI_BUS_ID".into());
    env.insert("MGPU_JOB_ID".into(), key.job_id.to_string());
    env.insert("MGPU_NODE".into(), node.to_owned());
    env.insert("MGPU_ATTEMPT".into(), key.attempt.to_string());
    // Attempts count from 1; a job checks this to resume from its checkpoint after a requeue.
    env.insert(
        "MGPU_RESTART_COUNT".into(),
        key.attempt.saturating_sub(1).to_string(),
    );
    // Always set, though the file exists only once a stop is announced: a job's signal handler
    // reads it without checking whether the variable is there.
    env.insert("MGPU_STOP_FILE".into(), stop_file.display().to_string());
    env.insert("MGPU_GPUS".into(), gpu_list);
    if let Some(member) = &spec.array {
        env.insert("MGPU_ARRAY_INDEX".into(), member.index.to_string());
        env.insert("MGPU_ARRAY_ID".into(), member.array_id.to_string());
    }
    if let Some(info) = ranks {
        rank_environment(&mut env, info);
    }
    env
}

/// The variables torchrun, `torch.distributed` and MPI launchers read, plus mgpu's own.
fn rank_environment(env: &mut BTreeMap<String, String>, info: &RankInfo<'_>) {
    let placement = info.placement;
    let nodes = placement.node_count();
    let gpus_per_node = placement.gpus.len().max(1);
    let nodelist = placement.nodes_label();
    env.insert("MGPU_NODELIST".into(), nodelist);
    env.insert("MGPU_NNODES".into(), nodes.to_string());
    env.insert("MGPU_NODE_RANK".into(), info.rank.to_string());
    env.insert("MGPU_HOSTFILE".into(), info.hostfile.display().to_string());
    if let Some(launch) = &placement.launch
        && launch.distributed
    {
        let master = launch
            .addresses
            .first()
            .cloned()
            .unwrap_or_else(|| placement.node.clone());
        env.insert("MASTER_ADDR".into(), master);
        env.insert("MASTER_PORT".into(), launch.master_port.to_string());
        env.insert("NNODES".into(), nodes.to_string());
        env.insert("NODE_RANK".into(), info.rank.to_string());
        env.insert("GPUS_PER_NODE".into(), gpus_per_node.to_string());
        // torchrun's WORLD_SIZE: one process per GPU on every node (at least one per node).
        let world: usize = placement
            .ranks()
            .map(|(_, _, gpus)| gpus.len().max(1))
            .sum();
        env.insert("WORLD_SIZE".into(), world.to_string());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mgpu_protocol::ids::JobId;
    use mgpu_protocol::job::ArrayMember;

    const STOP: &str = "/tmp/mgpu-stop-x/stop";

    fn spec(command: &[&str]) -> JobSpec {
        JobSpec::new(command.iter().map(|s| (*s).to_owned()).collect(), "/tmp")
    }

    fn key(attempt: u32) -> AttemptKey {
        AttemptKey {
            job_id: JobId::random(),
            attempt,
        }
    }

    #[test]
    fn user_variables_cannot_override_the_agents_or_inject_code() {
        let mut s = spec(&["true"]);
        s.env = [
            ("PATH", "/usr/bin"),
            ("HOME", "/home/alice"),
            ("LD_PRELOAD", "/tmp/evil.so"),
            ("LD_LIBRARY_PATH", "/opt/cuda/lib64"),
            ("CUDA_VISIBLE_DEVICES", "0,1,2,3"),
            ("CUDA_DEVICE_ORDER", "FASTEST_FIRST"),
            ("MGPU_JOB_ID", "forged"),
            ("MGPU_ANYTHING", "x"),
            ("MGPU_RESTART_COUNT", "9"),
            ("MGPU_STOP_FILE", "/home/alice/forged"),
            ("MGPU_ARRAY_INDEX", "9"),
            ("MGPU_ARRAY_ID", "forged"),
            ("BAD=NAME", "x"),
            ("NUL_VALUE", "a\0b"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        let key = key(3);
        let env = job_environment(&s, &key, "node001", &[2, 5], Path::new(STOP), None);
        let get = |name: &str| env.get(name).map(String::as_str);
        assert_eq!(get("PATH"), Some("/usr/bin"));
        assert_eq!(get("HOME"), Some("/home/alice"));
        assert_eq!(get("LD_LIBRARY_PATH"), Some("/opt/cuda/lib64"));
        assert_eq!(get("LD_PRELOAD"), None);
        assert_eq!(get("MGPU_ANYTHING"), None);
        assert_eq!(get("BAD=NAME"), None);
        assert_eq!(get("NUL_VALUE"), None);
        assert_eq!(get("CUDA_VISIBLE_DEVICES"), Some("2,5"));
        assert_eq!(get("MGPU_GPUS"), Some("2,5"));
        assert_eq!(get("CUDA_DEVICE_ORDER"), Some("PCI_BUS_ID"));
        assert_eq!(get("MGPU_JOB_ID"), Some(key.job_id.as_str()));
        assert_eq!(get("MGPU_NODE"), Some("node001"));
        assert_eq!(get("MGPU_ATTEMPT"), Some("3"));
        assert_eq!(get("MGPU_RESTART_COUNT"), Some("2"));
        assert_eq!(get("MGPU_STOP_FILE"), Some(STOP));
        // Not an array task: the forged array variables are dropped, none are set.
        assert_eq!(get("MGPU_ARRAY_INDEX"), None);
        assert_eq!(get("MGPU_ARRAY_ID"), None);
    }

    #[test]
    fn the_first_attempt_is_no_restart() {
        let env = job_environment(&spec(&["true"]), &key(1), "n", &[0], Path::new(STOP), None);
        assert_eq!(env.get("MGPU_RESTART_COUNT").map(String::as_str), Some("0"));
        assert_eq!(env.get("MGPU_STOP_FILE").map(String::as_str), Some(STOP));
    }

    #[test]
    fn array_tasks_see_their_index_and_array() {
        let mut s = spec(&["true"]);
        let array_id = JobId::random();
        s.array = Some(ArrayMember {
            array_id: array_id.clone(),
            index: 4,
            max_running: Some(2),
        });
        let env = job_environment(&s, &key(1), "n", &[0], Path::new(STOP), None);
        let get = |name: &str| env.get(name).map(String::as_str);
        assert_eq!(get("MGPU_ARRAY_INDEX"), Some("4"));
        assert_eq!(get("MGPU_ARRAY_ID"), Some(array_id.as_str()));
    }

    #[test]
    fn a_job_without_gpus_sees_none() {
        let env = job_environment(&spec(&["true"]), &key(1), "n", &[], Path::new(STOP), None);
        assert_eq!(
            env.get("CUDA_VISIBLE_DEVICES").map(String::as_str),
            Some("")
        );
        assert_eq!(env.get("MGPU_GPUS").map(String::as_str), Some(""));
    }

    #[test]
    fn a_distributed_rank_gets_the_torchrun_variables() {
        use mgpu_protocol::gpu_amount::GpuAmount;
        use mgpu_protocol::job::{GpuShare, Launch, NodeShare};
        let share = |index| GpuShare {
            index,
            amount: GpuAmount::ONE,
            mem_mib: 0,
        };
        let placement = Placement {
            node: "a".into(),
            gpus: vec![share(0), share(1)],
            peers: vec![NodeShare {
                node: "b".into(),
                gpus: vec![share(2), share(3)],
            }],
            launch: Some(Launch {
                distributed: true,
                addresses: vec!["10.0.0.1".into(), "10.0.0.2".into()],
                master_port: 29_877,
            }),
            cpus: 0,
            mem_host_mib: 0,
        };
        let info = RankInfo {
            placement: &placement,
            rank: 1,
            hostfile: Path::new("/tmp/h"),
        };
        let env = job_environment(
            &spec(&["true"]),
            &key(1),
            "b",
            &[2, 3],
            Path::new(STOP),
            Some(&info),
        );
        let get = |name: &str| env.get(name).map(String::as_str);
        assert_eq!(get("MASTER_ADDR"), Some("10.0.0.1"));
        assert_eq!(get("MASTER_PORT"), Some("29877"));
        assert_eq!(get("NNODES"), Some("2"));
        assert_eq!(get("NODE_RANK"), Some("1"));
        assert_eq!(get("GPUS_PER_NODE"), Some("2"));
        assert_eq!(get("WORLD_SIZE"), Some("4"));
        assert_eq!(get("MGPU_HOSTFILE"), Some("/tmp/h"));
        assert_eq!(get("MGPU_NODELIST"), Some("a,b"));
        assert_eq!(get("CUDA_VISIBLE_DEVICES"), Some("2,3"));
    }
}
