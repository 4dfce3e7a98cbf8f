//! Decoding job records for listings (`mgpu queue`, `mgpu nodes`), which read every record in
//! the bucket and show only a few fields of each spec.
//!
//! Most of a record's bytes are the submitter's captured environment: decoding it builds a map
//! of a few dozen strings per job that no listing shows, and with 100 000 records that is most
//! of `mgpu queue`'s time. [`JobRecord::from_listing_json`] reads the record with a spec type
//! that keeps only what listings use; serde skips the rest of the spec without building it.

use serde::Deserialize;

use super::{ArrayMember, JobRecord, JobSpec, JobState, one_gpu};
use crate::Timestamp;
use crate::gpu_amount::GpuAmount;
use crate::ids::JobId;

/// The spec fields listings show. Not `deny_unknown_fields`, unlike [`JobSpec`]: the fields
/// left out here are exactly what it skips. Names and defaults must match [`JobSpec`]'s (a test
/// below checks them against a serialised spec).
#[derive(Deserialize)]
struct ListedSpec {
    command: Vec<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default = "one_gpu")]
    gpus: GpuAmount,
    #[serde(default)]
    priority: i32,
    workdir: String,
    #[serde(default)]
    array: Option<ArrayMember>,
    #[serde(default)]
    qos: Option<String>,
    #[serde(default)]
    reservation: Option<String>,
}

/// [`JobRecord`] with a [`ListedSpec`].
#[derive(Deserialize)]
struct ListedRecord {
    id: JobId,
    user: String,
    #[serde(default)]
    user_key: Option<String>,
    spec: ListedSpec,
    submitted_at: Timestamp,
    attempt: u32,
    #[serde(flatten)]
    state: JobState,
}

impl JobRecord {
    /// Decodes a stored record for a listing. The spec keeps its command, name, GPUs, priority,
    /// class (`qos`), directory, array membership and reservation; everything else (environment, setup, placement
    /// constraints, dependencies, limits) is left at [`JobSpec::new`]'s defaults. Such a record
    /// is for showing only: never write it back, and never compare specs with it (`--dedup`
    /// needs the whole record).
    pub fn from_listing_json(bytes: &[u8]) -> serde_json::Result<JobRecord> {
        let listed: ListedRecord = serde_json::from_slice(bytes)?;
        let ListedSpec {
            command,
            name,
            gpus,
            priority,
            workdir,
            array,
            qos,
            reservation,
        } = listed.spec;
        let mut spec = JobSpec::new(command, workdir);
        spec.name = name;
        spec.gpus = gpus;
        spec.priority = priority;
        spec.array = array;
        spec.qos = qos;
        spec.reservation = reservation;
        Ok(JobRecord {
            id: listed.id,
            user: listed.user,
            user_key: listed.user_key,
            spec,
            submitted_at: listed.submitted_at,
            attempt: listed.attempt,
            state: listed.state,
            last_request: None,
            preemptions: Vec::new(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::{WaitReason, Waiting};

    #[test]
    fn a_listing_keeps_what_listings_show_and_drops_the_environment() {
        let mut spec = JobSpec::new(vec!["python".into(), "train.py".into()], "/work");
        spec.name = Some("train".into());
        spec.gpus = GpuAmount::whole(2);
        spec.priority = -3;
        spec.array = Some(ArrayMember {
            array_id: JobId::random(),
            index: 4,
            max_running: Some(2),
        });
        spec.env.insert("PATH".into(), "/usr/bin".into());
        spec.env_setup_cmd = Some("source venv/bin/activate".into());
        spec.time_limit_secs = Some(60);
        spec.after = vec![JobId::random()];
        spec.nodelist = vec!["node001".into()];
        let mut waiting = Waiting::new(WaitReason::Held);
        waiting.held_by = Some("bob".into());
        let record = JobRecord {
            id: JobId::random(),
            user: "alice".into(),
            user_key: Some("UALICE".into()),
            spec: spec.clone(),
            submitted_at: crate::now(),
            attempt: 2,
            state: JobState::Queued(waiting),
            last_request: None,
            preemptions: Vec::new(),
        };
        let bytes = serde_json::to_vec(&record).unwrap_or_default();
        let listed = JobRecord::from_listing_json(&bytes);
        assert!(listed.is_ok(), "{listed:?}");
        let Ok(listed) = listed else { return };
        assert_eq!(listed.summary(), record.summary());
        assert_eq!(listed.spec.display_name(), "train[4]");
        assert_eq!(
            (listed.spec.gpus, listed.spec.priority),
            (spec.gpus, spec.priority)
        );
        assert_eq!(listed.spec.workdir, "/work");
        assert_eq!(
            (&listed.user_key, listed.attempt, &listed.state),
            (&record.user_key, 2, &record.state)
        );
        assert!(listed.spec.env.is_empty() && listed.spec.after.is_empty());
    }

    #[test]
    fn defaults_match_the_specs() {
        // A spec serialised with its defaults left out reads back the same way.
        let record = JobRecord {
            id: JobId::random(),
            user: "alice".into(),
            user_key: None,
            spec: JobSpec::new(vec!["true".into()], "/"),
            submitted_at: crate::now(),
            attempt: 1,
            state: JobState::Queued(Waiting::new(WaitReason::Resources)),
            last_request: None,
            preemptions: Vec::new(),
        };
        let mut json = serde_json::to_value(&record).unwrap_or_default();
        if let Some(spec) = json["spec"].as_object_mut() {
            spec.remove("gpus");
            spec.remove("priority");
        }
        let bytes = serde_json::to_vec(&json).unwrap_or_default();
        let listed = JobRecord::from_listing_json(&bytes).ok();
        assert_eq!(listed, Some(record));
    }
}
