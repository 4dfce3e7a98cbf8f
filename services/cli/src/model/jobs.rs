//! Jobs as the commands find and list them: one job by id or unique prefix, and the queue's
//! order with each queued job's effective priority.
//!
//! Built to order 100 000 waiting jobs in well under a second: sorting compares keys computed
//! once per job and moves indices, never records.

use std::cmp::Reverse;
use std::collections::BTreeMap;

use anyhow::{Result, anyhow};
use async_nats::jetstream;
use mgpu_nats::records;
use mgpu_protocol::Timestamp;
use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::{JobRecord, JobState};
use mgpu_protocol::priority::{base_priority, effective_priority};

use super::cluster::Cluster;
use crate::client::session::Session;
use crate::errors::plain;

/// The job a typed id or unique prefix names; an unknown or ambiguous one is an error.
pub async fn resolve(js: &jetstream::Context, typed: &str) -> Result<JobId> {
    records::resolve_job(js, typed).await.map_err(plain)
}

/// The record of the job a typed id or unique prefix names.
pub async fn find(js: &jetstream::Context, typed: &str) -> Result<JobRecord> {
    let id = resolve(js, typed).await?;
    records::get_job(js, &id)
        .await
        .map_err(plain)?
        // Resolved a moment ago, so only a deletion in between gets here.
        .ok_or_else(|| anyhow!("job {} no longer exists", id.short()))
}

/// [`resolve`], and a full id of a job that moved to history.
pub async fn resolve_anywhere(session: &Session, typed: &str) -> Result<JobId> {
    match resolve(&session.js, typed).await {
        Ok(id) => Ok(id),
        Err(err) => match typed.trim().parse::<JobId>() {
            Ok(id) if archived(session, &id).await?.is_some() => Ok(id),
            _ => Err(err),
        },
    }
}

/// [`find`], and a job that moved to history, by its full id.
pub async fn find_anywhere(session: &Session, typed: &str) -> Result<JobRecord> {
    match find(&session.js, typed).await {
        Ok(record) => Ok(record),
        Err(err) => match typed.trim().parse::<JobId>() {
            Ok(id) => archived(session, &id).await?.ok_or(err),
            Err(_) => Err(err),
        },
    }
}

/// A job in history: among the user's own, else anyone's where the user may read them all
/// (admins); the server refuses others, which reads here as not found.
async fn archived(session: &Session, id: &JobId) -> Result<Option<JobRecord>> {
    let own = records::archived_job(&session.js, id, Some(&session.key.public_key())).await;
    if let Some(record) = own.map_err(plain)? {
        return Ok(Some(record));
    }
    let anyone =
        tokio::time::timeout(ANYONE_WAIT, records::archived_job(&session.js, id, None)).await;
    Ok(anyone.ok().and_then(Result::ok).flatten())
}

/// How long a read the server may refuse (another user's history) is waited for: a refused
/// request gets no answer at all.
pub const ANYONE_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// When a queued job (re-)entered the queue: a requeued job waits from its requeue.
pub fn queued_at(job: &JobRecord) -> Timestamp {
    match &job.state {
        JobState::Queued(waiting) => waiting.enqueued_at.unwrap_or(job.submitted_at),
        _ => job.submitted_at,
    }
}

/// The jobs `mgpu queue` lists, in its order: every record read, with the order kept as
/// indices so that sorting never moves a record.
pub struct Listing {
    pub records: Vec<JobRecord>,
    /// The effective priority of each record (queued ones only), by index.
    effective: Vec<Option<i64>>,
    /// Indices of the listed records, in listing order.
    order: Vec<u32>,
}

impl Listing {
    /// The jobs in the order `mgpu queue` lists them (finished ones only if `finished`), each
    /// queued one with its effective priority under the cluster's policy and usage.
    pub fn new(
        records: Vec<JobRecord>,
        cluster: &Cluster,
        finished: bool,
        now: Timestamp,
    ) -> Listing {
        // A user's usage is the same for each of their jobs: worked out once per user, not
        // once per job (a map lookup and a power each).
        let mut usage: BTreeMap<&str, f64> = BTreeMap::new();
        let mut effective = Vec::with_capacity(records.len());
        // Records are large: sorting (key, index) pairs moves 24 bytes per swap, not a record.
        let mut keyed: Vec<(SortKey, u32)> = Vec::with_capacity(records.len());
        for (index, record) in records.iter().enumerate() {
            let priority = matches!(record.state, JobState::Queued(_)).then(|| {
                let used = *usage.entry(record.user.as_str()).or_insert_with(|| {
                    cluster
                        .usage
                        .gpu_hours(&record.user, now, cluster.policy.half_life_secs)
                });
                effective_priority(
                    base_priority(&record.spec, &cluster.policy),
                    queued_at(record),
                    used,
                    &cluster.policy,
                    now,
                )
            });
            effective.push(priority);
            if finished || !record.state.is_finished() {
                // Records are never near 4 billion: the index fits.
                let index = u32::try_from(index).unwrap_or(u32::MAX);
                keyed.push((sort_key(record, priority), index));
            }
        }
        let id = |index: u32| records.get(index as usize).map(|r| r.id.as_str());
        // The id settles ties, so the order is total and an unstable sort gives the same.
        keyed.sort_unstable_by(|a, b| a.0.cmp(&b.0).then_with(|| id(a.1).cmp(&id(b.1))));
        Listing {
            order: keyed.into_iter().map(|(_, index)| index).collect(),
            records,
            effective,
        }
    }

    pub fn len(&self) -> usize {
        self.order.len()
    }

    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// The listed jobs in order, each with its effective priority.
    pub fn iter(&self) -> impl Iterator<Item = (&JobRecord, Option<i64>)> {
        self.order.iter().filter_map(|&index| {
            let index = index as usize;
            let record = self.records.get(index)?;
            Some((record, self.effective.get(index).copied().flatten()))
        })
    }
}

/// Group (running, queued, finished), then within the group: running jobs by start (longest
/// running first), queued ones in the order the scheduler considers them (higher effective
/// priority, then earlier queue time), finished ones by end time.
type SortKey = (u8, Reverse<i64>, Option<Timestamp>);

fn sort_key(record: &JobRecord, effective: Option<i64>) -> SortKey {
    match &record.state {
        JobState::Running(run) => (
            0,
            Reverse(0),
            Some(run.started_at.unwrap_or(run.assigned_at)),
        ),
        JobState::Queued(_) => (
            1,
            Reverse(effective.unwrap_or_default()),
            Some(queued_at(record)),
        ),
        finished => (2, Reverse(0), finished.ending().map(|e| e.ended_at)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{finished, job, queued, running};
    use chrono::Duration;
    use mgpu_protocol::gpu_amount::GpuAmount;

    fn names(listing: &Listing) -> Vec<String> {
        listing
            .iter()
            .map(|(record, _)| record.spec.display_name())
            .collect()
    }

    #[test]
    fn running_then_queued_by_priority_and_age_then_finished_by_end() {
        let jobs = vec![
            job("done-late", finished(10), 0, 100),
            job("low-old", queued(), 0, 50),
            job("high-new", queued(), 5, 1),
            job("done-early", finished(60), 0, 100),
            job("low-new", queued(), 0, 5),
            job("run", running("n1", &[(0, GpuAmount::ONE)]), -3, 200),
        ];
        let now = mgpu_protocol::now();
        let listing = Listing::new(jobs.clone(), &Cluster::default(), true, now);
        assert_eq!(
            names(&listing),
            [
                "run",
                "high-new",
                "low-old",
                "low-new",
                "done-early",
                "done-late"
            ]
        );
        // Without finished jobs: the same order, less the finished ones.
        let unfinished = Listing::new(jobs, &Cluster::default(), false, now);
        assert_eq!(
            names(&unfinished),
            ["run", "high-new", "low-old", "low-new"]
        );
        assert_eq!(unfinished.len(), 4);
    }

    #[test]
    fn fair_share_and_requeues_reorder_equal_priorities() {
        let now = mgpu_protocol::now();
        let mut heavy = job("heavy", queued(), 0, 3_600);
        heavy.user = "bob".into();
        let light = job("light", queued(), 0, 60);
        // Requeued a minute ago after waiting two hours: its wait counts from the requeue.
        let mut requeued = job("requeued", queued(), 0, 7_200);
        if let JobState::Queued(waiting) = &mut requeued.state {
            waiting.enqueued_at = Some(now - Duration::seconds(30));
        }
        let mut cluster = Cluster::default();
        let half_life = cluster.policy.half_life_secs;
        cluster.usage.add("bob", 36_000.0, now, half_life);
        let listing = Listing::new(vec![heavy, requeued, light], &cluster, false, now);
        assert_eq!(names(&listing), ["light", "requeued", "heavy"]);
        let heavy_priority = listing
            .iter()
            .nth(2)
            .and_then(|(_, e)| e)
            .unwrap_or_default();
        // 10 GPU-hours × 100 points taken, one hour × 100 points given.
        assert_eq!(heavy_priority, -900);
    }
}
