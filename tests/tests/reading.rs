//! Reading the live state while the scheduler changes it: `mgpu queue` reads the jobs bucket
//! until its consumer has nothing left, so records rewritten meanwhile come twice.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use mgpu_nats::records;
use mgpu_nats::streams::{self, StreamSettings};
use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::{JobRecord, JobSpec, JobState, Placement, Run, WaitReason, Waiting};
use mgpu_protocol::principals::Role;
use mgpu_protocol::subjects;
use mgpu_tests::Cluster;

/// Records in the bucket: several pulls' worth, so the read takes a while.
const RECORDS: usize = 3000;
/// The first records written (the first the read delivers), rewritten again and again.
const REWRITTEN: usize = 300;

fn record(id: &JobId, state: JobState) -> JobRecord {
    JobRecord {
        id: id.clone(),
        user: "alice".into(),
        user_key: None,
        spec: JobSpec::new(vec!["true".into()], "/"),
        submitted_at: mgpu_protocol::now(),
        attempt: 1,
        state,
        last_request: None,
        preemptions: Vec::new(),
    }
}

/// A job the scheduler starts while `mgpu queue` reads is listed once, not once queued and
/// once running; and its id is found once where a prefix is resolved.
#[test]
fn records_rewritten_during_a_listing_are_listed_once() {
    let cluster = Cluster::server_only(&[]);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("tokio runtime: {e}"));
    let creds = cluster.creds(Role::Scheduler, "scheduler");
    runtime.block_on(async {
        let client = cluster.connect(&cluster.server_url(), &creds).await;
        let js = async_nats::jetstream::new(client);
        streams::ensure(&js, &StreamSettings::default())
            .await
            .unwrap_or_else(|e| panic!("creating the streams: {e}"));
        let bucket = js
            .get_key_value(subjects::JOBS_BUCKET)
            .await
            .unwrap_or_else(|e| panic!("the jobs bucket: {e}"));
        let ids: Vec<JobId> = (0..RECORDS).map(|_| JobId::random()).collect();
        for id in &ids {
            let queued = record(id, JobState::Queued(Waiting::new(WaitReason::Resources)));
            let bytes = serde_json::to_vec(&queued).unwrap_or_default();
            bucket
                .put(id.as_str(), bytes.into())
                .await
                .unwrap_or_else(|e| panic!("writing a record: {e}"));
        }

        // As the scheduler starting jobs: the earliest records, rewritten while reads go on.
        let stop = Arc::new(AtomicBool::new(false));
        let rewriter = tokio::spawn({
            let (stop, bucket) = (stop.clone(), bucket.clone());
            let rewritten: Vec<JobId> = ids.iter().take(REWRITTEN).cloned().collect();
            async move {
                let mut writes = 0_usize;
                while !stop.load(Ordering::Relaxed) {
                    for id in &rewritten {
                        let run = Run::assigned(
                            Placement::single("node001", vec![]),
                            mgpu_protocol::now(),
                        );
                        let running = record(id, JobState::Running(run));
                        let bytes = serde_json::to_vec(&running).unwrap_or_default();
                        if bucket.put(id.as_str(), bytes.into()).await.is_ok() {
                            writes += 1;
                        }
                    }
                }
                writes
            }
        });
        for read in 0..5 {
            let jobs = records::list_jobs(&js)
                .await
                .unwrap_or_else(|e| panic!("listing the jobs: {e}"));
            let mut listed: Vec<&JobId> = jobs.iter().map(|job| &job.id).collect();
            listed.sort();
            listed.dedup();
            assert_eq!(
                (jobs.len(), listed.len()),
                (RECORDS, RECORDS),
                "read {read}: every job once"
            );
            // What `mgpu cancel 3f2a` matches a prefix against: a job started meanwhile is
            // one match, not an ambiguous two.
            let mut ids = records::list_job_ids(&js)
                .await
                .unwrap_or_else(|e| panic!("listing the ids: {e}"));
            let count = ids.len();
            ids.sort();
            ids.dedup();
            assert_eq!(
                (count, ids.len()),
                (RECORDS, RECORDS),
                "ids {read}: each once"
            );
        }
        stop.store(true, Ordering::Relaxed);
        let writes = rewriter
            .await
            .unwrap_or_else(|e| panic!("the rewriter: {e}"));
        assert!(
            writes > REWRITTEN,
            "the records were rewritten during the reads"
        );
    });
}
