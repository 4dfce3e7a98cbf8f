//! What the simulated admin does: drain and resume nodes, pause and resume GPUs (requests the
//! scheduler stores), release held jobs, and edit the files the scheduler reads again on its
//! tick: the limits (bob's `max_gpus_running` raised, lowered or lifted; the `students`
//! group's) and the principals (alice or bob moved in or out of `students`). The quiet period
//! undoes it all ([`settle`]).

use std::collections::BTreeMap;

use mgpu_protocol::hold::HoldRequest;
use mgpu_protocol::ids::JobId;
use mgpu_protocol::node_admin::AdminRequest;
use mgpu_protocol::request::Request;

use super::world::World;
use crate::limits::Limits;

/// The group whose limits apply to the users in it.
const GROUP: &str = "students";

/// The limits the cluster starts and ends with: bob runs two GPUs at most, a student one.
pub fn base_limits() -> Limits {
    limits_of(Some(2), Some(1))
}

/// Limits with these caps on running GPUs (None: none); everyone runs one H100 at most, and
/// two GPUs of `scavenger` jobs at most.
pub fn limits_of(bob: Option<u64>, students: Option<u64>) -> Limits {
    let mut text = String::from("[default.max_gpus_running]\nh100 = 1\n");
    if let Some(cap) = bob {
        text.push_str(&format!("[user.bob]\nmax_gpus_running = {cap}\n"));
    }
    if let Some(cap) = students {
        text.push_str(&format!("[group.{GROUP}]\nmax_gpus_running = {cap}\n"));
    }
    let section: Result<toml::Value, _> = toml::from_str(&text);
    let classes: Result<toml::Value, _> = toml::from_str("[scavenger]\nmax_gpus_running = 2\n");
    section
        .ok()
        .and_then(|section| Limits::parse(Some(&section)).ok())
        .and_then(|limits| limits.with_classes(classes.ok().as_ref()).ok())
        .unwrap_or_default()
}

/// One thing the admin does.
pub fn administer(world: &mut World) {
    match world.rng.below(10) {
        0..=4 => drain_or_resume(world),
        5..=7 => pause_or_resume_gpu(world),
        8 => change_limits(world),
        _ => regroup(world),
    }
}

fn admin_request(world: &mut World, request: AdminRequest) {
    let admin = world.users[2].clone();
    world.note(format!("root asks {request:?}").chars().take(120).collect());
    world.publish_request(admin, Request::Admin(request));
}

/// Drains a node, or resumes one drained.
fn drain_or_resume(world: &mut World) {
    let index = world.rng.below(world.agents.len() as u64) as usize;
    let node = world.agents[index].name.clone();
    let by = world.users[2].name.clone();
    let request = if world.drained.remove(&node) {
        AdminRequest::ResumeNode { node, by }
    } else {
        world.drained.insert(node.clone());
        AdminRequest::DrainNode {
            node,
            by,
            reason: None,
        }
    };
    admin_request(world, request);
}

/// Pauses a GPU, or resumes one paused.
fn pause_or_resume_gpu(world: &mut World) {
    let index = world.rng.below(world.agents.len() as u64) as usize;
    let gpu = world.rng.below(u64::from(world.agents[index].gpus)) as u32;
    let node = world.agents[index].name.clone();
    let by = world.users[2].name.clone();
    let request = if world.paused.remove(&(node.clone(), gpu)) {
        AdminRequest::ResumeGpu {
            node,
            index: gpu,
            by,
        }
    } else {
        world.paused.insert((node.clone(), gpu));
        AdminRequest::PauseGpu {
            node,
            index: gpu,
            by,
            reason: None,
        }
    };
    admin_request(world, request);
}

/// Edits the limits file: bob's cap and the students' drawn anew.
fn change_limits(world: &mut World) {
    let bob = match world.rng.below(4) {
        0 => Some(1),
        1 => Some(2),
        2 => Some(3),
        _ => None,
    };
    let students = world.rng.between(1, 2);
    world.note(format!(
        "the limits file now caps bob at {bob:?} GPUs, students at {students}"
    ));
    world.limits = limits_of(bob, Some(students));
    world.limits_changed = true;
}

/// Edits the principals file: alice or bob moves in or out of the students.
fn regroup(world: &mut World) {
    let mut groups: BTreeMap<String, String> = BTreeMap::new();
    for user in ["alice", "bob"] {
        if let Some(group) = world.group_of(user) {
            groups.insert(user.to_owned(), group.to_owned());
        }
    }
    let user = if world.rng.chance(500) {
        "alice"
    } else {
        "bob"
    };
    if groups.remove(user).is_none() {
        groups.insert(user.to_owned(), GROUP.to_owned());
    }
    world.note(format!("the principals file now groups {groups:?}"));
    world.set_groups(&groups);
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
    world.publish_request(admin, request);
}

/// The quiet period begins: every drained node and paused GPU resumed, every held job
/// released, the limits and principals as they were at the start.
pub fn settle(world: &mut World) {
    let by = world.users[2].name.clone();
    let drained: Vec<String> = std::mem::take(&mut world.drained).into_iter().collect();
    for node in drained {
        let by = by.clone();
        admin_request(world, AdminRequest::ResumeNode { node, by });
    }
    let paused: Vec<(String, u32)> = std::mem::take(&mut world.paused).into_iter().collect();
    for (node, index) in paused {
        let by = by.clone();
        admin_request(world, AdminRequest::ResumeGpu { node, index, by });
    }
    while !world.held_jobs.is_empty() {
        release_one(world);
    }
    world.limits = base_limits();
    world.limits_changed = true;
    world.set_groups(&BTreeMap::new());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limits_cap_bob_and_the_students_as_written() {
        let limits = base_limits();
        let caps = limits.running_caps([("bob", None), ("alice", Some(GROUP)), ("root", None)]);
        assert_eq!(caps.get("bob"), Some(&20_000));
        assert_eq!(caps.get("alice"), Some(&10_000));
        assert_eq!(caps.get("root"), None);
        let lifted = limits_of(None, Some(2)).running_caps([("bob", None)]);
        assert!(lifted.is_empty());
    }
}
