//! What the simulated users do: submit jobs of every shape the scheduler knows (whole GPUs,
//! shares, none; `--no-requeue`; time slices that requeue and hard time limits; dependencies;
//! priorities; `--dedup`; arrays with and without `%N`; multi-node jobs, distributed or not),
//! cancel, hold and release them; and what the admin does (`admin.rs`). Job ids are drawn
//! from the seed, so a run replays exactly.
//!
//! Every job asks only for what the cluster can run once the quiet period restores the
//! limits (bob's jobs hold two GPUs at most), or for what it can never run at all (then it
//! is rejected), so that each one ends.

use mgpu_protocol::cancel::CancelRequest;
use mgpu_protocol::gpu_amount::GpuAmount;
use mgpu_protocol::hold::HoldRequest;
use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::{ArrayMember, JobSpec, OnTimeout};
use mgpu_protocol::request::Request;
use mgpu_protocol::submit::SubmitRequest;

use super::admin;
use super::world::World;

/// A job id drawn from the seed.
fn job_id(world: &mut World) -> Option<JobId> {
    let high = world.rng.next_u64();
    let low = world.rng.next_u64();
    format!("{high:016x}{low:016x}").parse().ok()
}

/// One thing a user (or the admin) does.
pub fn user_action(world: &mut World) {
    match world.rng.below(100) {
        0..=54 => submit(world),
        55..=59 => submit_array(world),
        60..=65 => submit_gang(world),
        66..=73 => on_some_job(world, |job, user| Request::Cancel {
            job,
            request: CancelRequest { user, reason: None },
        }),
        74..=79 => on_some_job(world, |job, user| Request::Hold {
            job,
            request: HoldRequest { user },
        }),
        80..=83 => admin::release_one(world),
        84 => super::bookings::book_or_cancel(world),
        85..=86 => {
            let (user, spec) = super::bookings::member_job(world);
            send_job(world, user, spec);
        }
        _ => admin::administer(world),
    }
}

/// A spec with the draws every kind of job shares: priority, `--no-requeue`, a time limit.
fn common_spec(world: &mut World, gpus: GpuAmount) -> JobSpec {
    let mut spec = JobSpec::new(vec!["train".into()], "/tmp");
    spec.gpus = gpus;
    spec.priority = world.rng.below(3) as i32;
    spec.no_requeue = world.rng.chance(200);
    if world.rng.chance(250) {
        spec.qos = Some("scavenger".into());
        if world.rng.chance(300) {
            spec.signal = mgpu_protocol::stop::StopSignal::parse("USR2@1").ok();
        }
    }
    // Refused at submit in `normal`, which does not allow it; left alone in `scavenger`.
    spec.idle_ok = world.rng.chance(50);
    if world.rng.chance(100) {
        spec.on_timeout = OnTimeout::Requeue;
        spec.time_limit_secs = Some(world.rng.between(2, 8));
    } else if world.rng.chance(50) {
        spec.on_timeout = OnTimeout::Fail;
        spec.time_limit_secs = Some(world.rng.between(2, 30));
    }
    spec
}

fn submit(world: &mut World) {
    let user = world.rng.below(2) as usize;
    let gpus = match world.rng.below(10) {
        0..=5 => GpuAmount::whole(1),
        6..=7 => GpuAmount::from_units(5_000),
        8 => GpuAmount::whole(2),
        _ => GpuAmount::ZERO,
    };
    let mut spec = common_spec(world, gpus);
    if world.rng.chance(100) {
        let known: Vec<JobId> = world.submitted.keys().cloned().collect();
        if let Some(dependency) = world.rng.pick(&known) {
            spec.after.push(dependency.clone());
        }
    }
    spec.dedup = world.rng.chance(30);
    if world.rng.chance(200) {
        // One type, or both in either order of preference.
        spec.gpu_types = match world.rng.below(3) {
            0 => vec!["h100".into()],
            1 => vec!["a100".into(), "h100".into()],
            _ => vec!["h100".into(), "a100".into()],
        };
    }
    if world.rng.chance(100) {
        spec.constraint = Some("ib".into());
    }
    send_job(world, user, spec);
}

/// An array of 2 to 6 tasks, with `%1`, `%2` or no limit: one request per task, as
/// `mgpu submit --array` sends them.
fn submit_array(world: &mut World) {
    let Some(array_id) = job_id(world) else {
        return;
    };
    let user = world.rng.below(2) as usize;
    let tasks = world.rng.between(2, 6) as u32;
    let max_running = match world.rng.below(3) {
        0 => Some(1),
        1 => Some(2),
        _ => None,
    };
    let gpus = if world.rng.chance(700) {
        GpuAmount::whole(1)
    } else {
        GpuAmount::from_units(5_000)
    };
    let mut spec = common_spec(world, gpus);
    // Its environment stored once, under the array's id, as the CLI does.
    spec.private_env = true;
    world.store_array_environment(&array_id);
    world.note(format!(
        "array {} of {tasks} tasks, %{max_running:?}",
        array_id.short()
    ));
    // Mostly in one message, as `mgpu submit --array` sends an array's tasks; else one
    // message each, as a program of its own may.
    let together = world.rng.chance(700);
    let mut requests = Vec::new();
    for index in 0..tasks {
        let mut task = spec.clone();
        task.array = Some(ArrayMember {
            array_id: array_id.clone(),
            index,
            max_running,
        });
        if together {
            requests.extend(prepare_job(world, user, task));
        } else {
            send_job(world, user, task);
        }
    }
    let mut requests = requests.into_iter();
    if let Some(first) = requests.next() {
        let identity = world.users[user].clone();
        world.publish_batch(identity, first, requests.collect());
    }
}

/// A job over 2 or 3 nodes, whole GPUs on each, distributed (a process per node) or not.
fn submit_gang(world: &mut World) {
    let user = world.rng.below(2) as usize;
    let most = world.agents.len().min(3) as u64;
    // bob's cap of two GPUs must let it run once the quiet period restores it.
    let (nodes, per_node) = if user == 1 {
        (2, 1)
    } else {
        (world.rng.between(2, most), world.rng.between(1, 2) as u32)
    };
    let mut spec = common_spec(world, GpuAmount::whole(per_node));
    spec.nodes = nodes as u32;
    spec.distributed = world.rng.chance(600);
    send_job(world, user, spec);
}

/// Submits `spec` as user `user` (0: alice, 1: bob).
fn send_job(world: &mut World, user: usize, spec: JobSpec) {
    if let Some(request) = prepare_job(world, user, spec) {
        let identity = world.users[user].clone();
        world.publish_request(identity, request);
    }
}

/// A submission of `spec` by `user`, its job remembered as submitted; not yet sent.
fn prepare_job(world: &mut World, user: usize, spec: JobSpec) -> Option<Request> {
    let id = job_id(world)?;
    let identity = world.users[user].clone();
    world.submitted.insert(id.clone(), spec.no_requeue);
    world.open.insert(id.clone());
    let shape = if spec.nodes > 1 {
        format!(" on {} nodes", spec.nodes)
    } else {
        String::new()
    };
    world.note(format!("{} submits {}{shape}", identity.name, id.short()));
    Some(Request::Submit(Box::new(SubmitRequest {
        id,
        user: identity.name.clone(),
        spec,
    })))
}

/// A request about a job drawn from those submitted, by its owner or the admin.
fn on_some_job(world: &mut World, make: impl Fn(JobId, String) -> Request) {
    let known: Vec<JobId> = world.submitted.keys().cloned().collect();
    let Some(job) = world.rng.pick(&known).cloned() else {
        return;
    };
    let user_index = world.rng.below(world.users.len() as u64) as usize;
    let identity = world.users[user_index].clone();
    let request = make(job.clone(), identity.name.clone());
    if matches!(request, Request::Hold { .. }) {
        world.held_jobs.insert(job);
    }
    world.note(
        format!("{} asks {request:?}", identity.name)
            .chars()
            .take(120)
            .collect(),
    );
    world.publish_request(identity, request);
}
