//! Strict decoding of inbound messages, and the checks every handler shares.
//!
//! Anything on a subject may come from a buggy or hostile publisher, so a handler first
//! refuses a payload larger than its subject's limit (before spending memory on parsing it),
//! then decodes it with [`decode`] into a type that denies unknown fields, then runs the
//! type's `validate`. Each step gives an [`InvalidInput`] that says what was wrong; the
//! handler logs it and changes nothing.
//!
//! The limits are far above what mgpu itself sends and far below what would hurt: NATS
//! already caps a message at its `max_payload` (1 MiB by default).

use serde::de::DeserializeOwned;

use crate::Timestamp;
pub use crate::error::InvalidInput;

/// Largest `jobs.<id>.cancel`, `jobs.<id>.hold`/`release` or `admin.requests` payload.
pub const MAX_REQUEST_BYTES: usize = 16 * 1024;
/// Largest `nodes.heartbeat.<node>` payload: room for 1 024 GPUs and their processes.
pub const MAX_HEARTBEAT_BYTES: usize = 512 * 1024;
/// Largest `jobs.<id>.events` payload (an `assigned` event carries a 1 024-node placement).
pub const MAX_EVENT_BYTES: usize = 1024 * 1024;
/// Largest `nodes.assign.<node>` payload: a submission plus its placement.
pub const MAX_ASSIGNMENT_BYTES: usize = 1024 * 1024;
/// Largest `nodes.control.<node>` payload.
pub const MAX_CONTROL_BYTES: usize = 64 * 1024;

/// Longest one-line text (a cancel reason, an admin's note, a GPU name).
pub const MAX_LINE_BYTES: usize = 4096;
/// Longest free text (an agent's start error, a reason the scheduler wrote).
pub const MAX_TEXT_BYTES: usize = 64 * 1024;
/// Longest user name.
pub const MAX_USER_BYTES: usize = 256;

/// How far ahead of the receiver's clock a timestamp may be (clock skew between hosts).
const MAX_FUTURE: chrono::TimeDelta = chrono::TimeDelta::days(1);
/// How old a timestamp may be: streams keep a week, so a year is surely garbage.
const MAX_PAST: chrono::TimeDelta = chrono::TimeDelta::days(366);

/// Decodes a `what` payload of at most `max` bytes as JSON into `T`.
pub fn decode<T: DeserializeOwned>(
    what: &str,
    payload: &[u8],
    max: usize,
) -> Result<T, InvalidInput> {
    if payload.len() > max {
        return Err(InvalidInput::new(format!(
            "{what} of {} bytes is larger than the {max} allowed",
            payload.len()
        )));
    }
    serde_json::from_slice(payload)
        .map_err(|err| InvalidInput::new(format!("{what} is not valid: {err}")))
}

/// One line of text: at most `max` bytes, no control characters (a newline in a log line or
/// a listing would let a sender forge the next line).
pub fn check_line(what: &str, text: &str, max: usize) -> Result<(), InvalidInput> {
    if text.len() > max {
        return Err(InvalidInput::new(format!(
            "{what} is {} bytes long; at most {max} are allowed",
            text.len()
        )));
    }
    if text.chars().any(char::is_control) {
        return Err(InvalidInput::new(format!(
            "{what} contains control characters"
        )));
    }
    Ok(())
}

/// Free text (an error message): at most `max` bytes; newlines and tabs are fine, other
/// control characters (NUL, escape sequences that repaint a terminal) are not.
pub fn check_text(what: &str, text: &str, max: usize) -> Result<(), InvalidInput> {
    if text.len() > max {
        return Err(InvalidInput::new(format!(
            "{what} is {} bytes long; at most {max} are allowed",
            text.len()
        )));
    }
    if text
        .chars()
        .any(|c| c.is_control() && c != '\n' && c != '\t')
    {
        return Err(InvalidInput::new(format!(
            "{what} contains control characters"
        )));
    }
    Ok(())
}

/// A user name as requests carry it: 1 to [`MAX_USER_BYTES`] bytes, no spaces or control
/// characters. Accounts are not checked here; the server's permissions decide who may publish.
pub fn check_user(what: &str, name: &str) -> Result<(), InvalidInput> {
    if name.is_empty() || name.chars().any(char::is_whitespace) {
        return Err(InvalidInput::new(format!(
            "{what} `{}` is not a user name (1-{MAX_USER_BYTES} characters, no spaces)",
            name.escape_debug()
        )));
    }
    check_line(what, name, MAX_USER_BYTES)
}

/// A timestamp another host wrote: at most a day ahead of `now`, at most a year behind. Far
/// off values would keep a node online forever, or overflow time arithmetic.
pub fn check_time(what: &str, at: Timestamp, now: Timestamp) -> Result<(), InvalidInput> {
    let ahead = at.signed_duration_since(now);
    if ahead > MAX_FUTURE || ahead < -MAX_PAST {
        return Err(InvalidInput::new(format!(
            "{what} {at} is too far from this host's clock ({now})"
        )));
    }
    Ok(())
}

/// Checks that `count` items of `what` are at most `max`.
pub fn check_count(what: &str, count: usize, max: usize) -> Result<(), InvalidInput> {
    if count > max {
        return Err(InvalidInput::new(format!(
            "{count} {what} is more than the {max} allowed"
        )));
    }
    Ok(())
}

/// A host address (name or IP) that other nodes connect to: no spaces or control characters.
pub fn check_address(address: &str) -> Result<(), InvalidInput> {
    if address.chars().any(char::is_whitespace) {
        return Err(InvalidInput::new(format!(
            "address `{}` contains spaces",
            address.escape_debug()
        )));
    }
    check_line("address", address, 256)
}

/// Fuzz targets for the messages the scheduler and the agents read (the heartbeat's use in
/// the scheduler's node table is fuzzed there, the job input in the agent). Each feeds
/// random bytes, random JSON and mutated valid samples to the decoder and the validation,
/// and asserts: no panic, and either a clean error or a value that passes validation and
/// survives a round trip. `scripts/fuzz.sh` runs them with many more cases.
#[cfg(test)]
mod fuzz {
    use std::collections::BTreeMap;
    use std::fmt::Debug;

    use proptest::prelude::*;
    use serde::Serialize;

    use super::*;
    use crate::assign::{Assignment, NodeControl};
    use crate::cancel::CancelRequest;
    use crate::event::{EventSource, JobEvent, JobEventKind};
    use crate::fuzzing::payloads;
    use crate::gpu_amount::GpuAmount;
    use crate::hold::HoldRequest;
    use crate::ids::JobId;
    use crate::job::{ArrayMember, GpuShare, JobSpec, Launch, NodeShare, Placement, WaitReason};
    use crate::node_admin::AdminRequest;
    use crate::submit::{MAX_SUBMIT_BYTES, SubmitRequest};

    fn json(value: &impl Serialize) -> serde_json::Value {
        serde_json::to_value(value).unwrap_or_default()
    }

    /// A spec using every field, so mutations reach every field.
    fn full_spec() -> JobSpec {
        let mut spec = JobSpec::new(vec!["python".into(), "train.py".into()], "/home/alice");
        spec.name = Some("train".into());
        spec.gpus = GpuAmount::whole(2);
        spec.mem_mib = Some(40_960);
        spec.priority = 3;
        spec.time_limit_secs = Some(7200);
        spec.env_setup_cmd = Some("source venv/bin/activate".into());
        spec.env = BTreeMap::from([("PATH".into(), "/usr/bin".into())]);
        spec.conda_env = Some("torch".into());
        spec.after = vec![JobId::random()];
        spec.array = Some(ArrayMember {
            array_id: JobId::random(),
            index: 3,
            max_running: Some(2),
        });
        spec.nodes = 2;
        spec.nodelist = vec!["node001".into(), "node002".into()];
        spec.exclude = vec!["node003".into()];
        spec.allowed_gpus = Some(vec![0, 1, 2]);
        spec
    }

    fn placement() -> Placement {
        let gpu = |index| GpuShare {
            index,
            amount: GpuAmount::ONE,
            mem_mib: 1024,
        };
        Placement {
            node: "node001".into(),
            gpus: vec![gpu(0), gpu(1)],
            peers: vec![NodeShare {
                node: "node002".into(),
                gpus: vec![gpu(3)],
            }],
            launch: Some(Launch {
                distributed: true,
                addresses: vec!["10.0.0.1".into(), "gpu-02".into()],
                master_port: 29_500,
            }),
            cpus: 4,
            mem_host_mib: 8192,
        }
    }

    /// Decodes and validates; a value that passes must survive a round trip unchanged.
    fn check<T>(payload: &[u8], max: usize, validate: impl Fn(&T) -> Result<(), InvalidInput>)
    where
        T: serde::de::DeserializeOwned + Serialize + PartialEq + Debug,
    {
        let Ok(value) = decode::<T>("payload", payload, max) else {
            return;
        };
        if validate(&value).is_ok() {
            let again = serde_json::to_vec(&value).unwrap_or_default();
            let back = decode::<T>("payload", &again, usize::MAX).ok();
            assert_eq!(back.as_ref(), Some(&value), "round trip");
        }
    }

    proptest! {
        #[test]
        fn fuzz_submit_request(payload in payloads(json(&SubmitRequest {
            id: JobId::random(),
            user: "alice".into(),
            spec: full_spec(),
        }))) {
            check::<SubmitRequest>(&payload, MAX_SUBMIT_BYTES, |r| {
                r.validate_sender()?;
                r.spec.validate()?;
                // What passes can be shown and scheduled without surprises.
                let _ = (r.spec.display_name(), r.spec.command_line(), r.spec.dedup_key());
                let _ = r.spec.time_limit();
                Ok(())
            });
        }

        #[test]
        fn fuzz_cancel_request(payload in payloads(json(&CancelRequest {
            user: "alice".into(),
            reason: Some("wrong learning rate".into()),
        }))) {
            check::<CancelRequest>(&payload, MAX_REQUEST_BYTES, CancelRequest::validate);
        }

        #[test]
        fn fuzz_hold_request(payload in payloads(json(&HoldRequest { user: "alice".into() }))) {
            check::<HoldRequest>(&payload, MAX_REQUEST_BYTES, HoldRequest::validate);
        }

        #[test]
        fn fuzz_admin_request(payload in payloads(json(&AdminRequest::PauseGpu {
            node: "node001".into(),
            index: 3,
            by: "admin".into(),
            reason: Some("fan failure".into()),
        }))) {
            check::<AdminRequest>(&payload, MAX_REQUEST_BYTES, AdminRequest::validate);
        }

        #[test]
        fn fuzz_job_event(
            payload in payloads(json(&JobEvent {
                job_id: JobId::random(),
                attempt: 1,
                at: crate::now(),
                source: EventSource::Node("node001".into()),
                kind: JobEventKind::Exited {
                    exit_code: 0,
                    signal: Some(9),
                    cancelled: false,
                    timed_out: false,
                    preempted: false,
                    lost: false,
                    out_of_memory: true,
                    usage: Some(crate::host::JobUsage { peak_mem_host_bytes: Some(1 << 30), cpu_time_ms: Some(1500), gpu_peak_mem: vec![crate::host::GpuPeak { index: 0, peak_mib: 2048 }], idle_gpu_secs: Some(60) }),
                },
            })),
            other in payloads(json(&JobEvent {
                job_id: JobId::random(),
                attempt: 2,
                at: crate::now(),
                source: EventSource::Scheduler,
                kind: JobEventKind::Assigned { placement: placement() },
            })),
        ) {
            let now = crate::now();
            check::<JobEvent>(&payload, MAX_EVENT_BYTES, |e| e.validate(now));
            check::<JobEvent>(&other, MAX_EVENT_BYTES, |e| e.validate(now));
        }

        #[test]
        fn fuzz_assignment(payload in payloads(json(&Assignment {
            job_id: JobId::random(),
            attempt: 1,
            user: "alice".into(),
            spec: full_spec(),
            placement: placement(),
            rank: 1,
            input_keys: vec![nkeys::KeyPair::new_user().public_key()],
            unix_user: Some("alice".into()),
            output_subject: None,
            previous_stop: Some("preempted by 4f2a (bob)".into()),
            idle_below_pct: Some(5),
        }))) {
            check::<Assignment>(&payload, MAX_ASSIGNMENT_BYTES, |a| {
                a.validate()?;
                let _ = (a.placement.launched_ranks(), a.placement.total_gpus());
                Ok(())
            });
        }

        #[test]
        fn fuzz_node_control(payload in payloads(json(&NodeControl::Kill {
            job_id: JobId::random(),
            attempt: 1,
            reason: "cancelled by alice".into(),
            requeue: true,
            warning: Some(crate::stop::StopWarning {
                signal: crate::stop::DEFAULT_SIGNAL,
                grace_secs: 300,
                cause: crate::stop::StopCause::Preempted,
            }),
        }))) {
            check::<NodeControl>(&payload, MAX_CONTROL_BYTES, NodeControl::validate);
        }
    }

    #[test]
    fn oversized_payloads_are_refused_before_parsing() {
        let big = vec![b' '; MAX_REQUEST_BYTES + 1];
        let err = decode::<HoldRequest>("hold request", &big, MAX_REQUEST_BYTES).err();
        assert!(err.is_some_and(|e| e.0.contains("larger than")));
    }

    #[test]
    fn absurd_values_are_refused_with_a_reason() {
        let now = crate::now();
        let spec = |edit: &dyn Fn(&mut serde_json::Value)| {
            let mut value = json(&full_spec());
            edit(&mut value);
            serde_json::from_value::<JobSpec>(value)
                .map_err(|e| e.to_string())
                .and_then(|s| s.validate().map_err(|e| e.0))
        };
        assert!(spec(&|_| {}).is_ok());
        assert!(spec(&|v| v["gpus"] = (-1).into()).is_err(), "negative GPUs");
        assert!(
            spec(&|v| v["time_limit_secs"] = 3_153_600_000u64.into()).is_err(),
            "100 years"
        );
        assert!(
            spec(&|v| v["priority"] = i32::MAX.into()).is_err(),
            "absurd priority"
        );
        assert!(
            spec(&|v| v["command"] = serde_json::json!([])).is_err(),
            "empty command"
        );
        assert!(
            spec(&|v| v["nodelist"] = serde_json::json!(["a.b", "c"])).is_err(),
            "dot"
        );
        assert!(
            spec(&|v| v["exclude"] = serde_json::json!(["*"])).is_err(),
            "wildcard"
        );
        assert!(
            spec(&|v| v["allowed_gpus"] = serde_json::json!([4000])).is_err(),
            "index"
        );
        assert!(
            spec(&|v| v["workdir"] = "/tmp/\u{1b}[2J".into()).is_err(),
            "control"
        );
        let huge: serde_json::Map<String, serde_json::Value> =
            (0..5000).map(|i| (format!("V{i}"), "x".into())).collect();
        assert!(
            spec(&|v| v["env"] = huge.clone().into()).is_err(),
            "huge env"
        );
        let id: Result<JobId, _> = serde_json::from_str("\"4c947fea346f4fc1bd487231ac28a.*>\"");
        assert!(id.is_err(), "wildcards in a job id");
        let event = |text: &str| {
            decode::<JobEvent>("event", text.as_bytes(), MAX_EVENT_BYTES)
                .and_then(|e| e.validate(now))
        };
        let ok = serde_json::to_string(&JobEvent {
            job_id: JobId::random(),
            attempt: 1,
            at: now,
            source: EventSource::Node("node001".into()),
            kind: JobEventKind::Queued {
                reason: WaitReason::Resources,
            },
        })
        .unwrap_or_default();
        assert!(event(&ok).is_ok(), "{ok}");
        assert!(
            event(&ok.replace("}", ",\"bogus\":1}")).is_err(),
            "unknown field"
        );
        assert!(
            event(&ok.replace("node001", "node.1")).is_err(),
            "dotted node"
        );
        let year = now.format("%Y").to_string();
        assert!(event(&ok.replacen(&year, "9999", 1)).is_err(), "far future");
    }
}
