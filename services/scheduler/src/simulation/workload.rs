//! What the simulated users do: submit jobs of every shape the scheduler knows (whole GPUs,
//! shares, none; `--no-requeue`; time slices that requeue; dependencies; priorities; `--dedup`),
//! cancel, hold and release them, and (as the admin) drain and resume nodes. Job ids are
//! drawn from the seed, so a run replays exactly.

use mgpu_protocol::cancel::CancelRequest;
use mgpu_protocol::gpu_amount::GpuAmount;
use mgpu_protocol::hold::HoldRequest;
use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::{JobSpec, OnTimeout};
use mgpu_protocol::node_admin::AdminRequest;
use mgpu_protocol::request::Request;
use mgpu_protocol::submit::SubmitRequest;

use super::world::{Event, Stored, World};
use crate::limits::Limits;
use crate::machine::messages::Identity;

/// The per-user limits the simulated cluster runs under: bob runs two GPUs at most.
pub fn limits() -> Limits {
    let section: Result<toml::Value, _> = toml::from_str("[user.bob]\nmax_gpus_running = 2\n");
    section
        .ok()
        .and_then(|section| Limits::parse(Some(&section)).ok())
        .unwrap_or_default()
}

/// A job id drawn from the seed.
fn job_id(world: &mut World) -> Option<JobId> {
    let high = world.rng.next_u64();
    let low = world.rng.next_u64();
    format!("{high:016x}{low:016x}").parse().ok()
}

/// One thing a user does.
pub fn user_action(world: &mut World) {
    let roll = world.rng.below(100);
    match roll {
        0..=69 => submit(world),
        70..=79 => on_some_job(world, |job, user| Request::Cancel {
            job,
            request: CancelRequest { user, reason: None },
        }),
        80..=86 => {
            let before = world.held_jobs.len();
            on_some_job(world, |job, user| Request::Hold {
                job,
                request: HoldRequest { user },
            });
            let _ = before;
        }
        87..=93 => release_one(world),
        _ => administer(world),
    }
}

fn submit(world: &mut World) {
    let Some(id) = job_id(world) else {
        return;
    };
    let user_index = world.rng.below(2) as usize;
    let identity = world.users[user_index].clone();
    let mut spec = JobSpec::new(vec!["train".into()], "/tmp");
    spec.gpus = match world.rng.below(10) {
        0..=5 => GpuAmount::whole(1),
        6..=7 => GpuAmount::from_units(5_000),
        8 => GpuAmount::whole(2),
        _ => GpuAmount::ZERO,
    };
    spec.priority = world.rng.below(3) as i32;
    spec.no_requeue = world.rng.chance(200);
    if world.rng.chance(100) {
        spec.on_timeout = OnTimeout::Requeue;
        spec.time_limit_secs = Some(world.rng.between(2, 8));
    }
    if world.rng.chance(100) {
        let known: Vec<JobId> = world.submitted.keys().cloned().collect();
        if let Some(dependency) = world.rng.pick(&known) {
            spec.after.push(dependency.clone());
        }
    }
    spec.dedup = world.rng.chance(30);
    world.submitted.insert(id.clone(), spec.no_requeue);
    world.note(format!("{} submits {}", identity.name, id.short()));
    let request = Request::Submit(Box::new(SubmitRequest {
        id,
        user: identity.name.clone(),
        spec,
    }));
    send(world, identity, request);
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
    send(world, identity, request);
}

/// Releases a job held before (by the admin, who may).
pub fn release_one(world: &mut World) {
    let held: Vec<JobId> = world.held_jobs.iter().cloned().collect();
    let Some(job) = world.rng.pick(&held).cloned() else {
        return;
    };
    world.held_jobs.remove(&job);
    let admin = world.users[2].clone();
    let request = Request::Release {
        job,
        request: HoldRequest {
            user: admin.name.clone(),
        },
    };
    send(world, admin, request);
}

/// The admin drains a node, or resumes one drained.
fn administer(world: &mut World) {
    let admin = world.users[2].clone();
    let node_index = world.rng.below(world.agents.len() as u64) as usize;
    let node = world.agents[node_index].name.clone();
    let request = if world.drained.remove(&node) {
        Request::Admin(AdminRequest::ResumeNode {
            node,
            by: admin.name.clone(),
        })
    } else {
        world.drained.insert(node.clone());
        Request::Admin(AdminRequest::DrainNode {
            node,
            by: admin.name.clone(),
            reason: None,
        })
    };
    send(world, admin, request);
}

/// Resumes every drained node and releases every held job (the quiet period begins).
pub fn settle(world: &mut World) {
    let admin = world.users[2].clone();
    let drained: Vec<String> = std::mem::take(&mut world.drained).into_iter().collect();
    for node in drained {
        let request = Request::Admin(AdminRequest::ResumeNode {
            node,
            by: admin.name.clone(),
        });
        send(world, admin.clone(), request);
    }
    while !world.held_jobs.is_empty() {
        release_one(world);
    }
}

/// Publishes a request: JetStream stores it, the scheduler's consumer delivers it.
fn send(world: &mut World, identity: Identity, request: Request) {
    let delay = world.rng.between(1, 50);
    world.requests.push(Stored {
        message: (identity, request),
        available_at: world.now + delay,
        acked: false,
    });
    world.at(delay, Event::Pump);
}
