//! `jobs.submit`: a new job recorded. Plain submissions that arrive together are recorded
//! together, their writes pipelined; a `--dedup` submission alone, after every job before it
//! (it must see them to find its twin). The record and what follows from it are the job
//! lifecycle's ([`lifecycle::submit`]).

use std::collections::HashMap;

use anyhow::Result;

use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::{JobRecord, JobSpec, JobState};
use mgpu_protocol::now;
use mgpu_protocol::submit::SubmitRequest;

use crate::identity::Identity;
use crate::lifecycle::{self, NotAdded, Transition};
use crate::metrics::SubmitOutcome;
use crate::service::Scheduler;

impl Scheduler {
    /// Records one submission, looking for its twin first when it asks for `--dedup`.
    pub(crate) async fn on_submit(
        &mut self,
        mut request: SubmitRequest,
        identity: &Identity,
    ) -> Result<()> {
        self.keep_env_apart(&mut request, identity).await?;
        request.spec.private_output |= self.policy.private_output;
        self.learn_archived(std::iter::once(&request.spec)).await;
        let twin = request
            .spec
            .dedup
            .then(|| self.twin_of(&request, identity))
            .flatten();
        let over_limit = self.over_limit(&mut request, identity, &mut QueuedByUser::default());
        let not_added = match (&twin, over_limit) {
            (Some(twin), _) => Some(NotAdded::Duplicate(twin)),
            (None, Some(why)) => Some(NotAdded::OverLimit(why)),
            (None, None) => None,
        };
        let id = request.id.clone();
        let transition = lifecycle::submit(request, &identity.signer(), not_added, now());
        let Transition { record, effects } = transition;
        let outcome = SubmitOutcome::of(record.as_ref(), twin.is_some());
        let created = match record {
            Some(record) => self.store.create(record).await?,
            None => true,
        };
        self.after_submit(&id, created, (effects, outcome), identity)
            .await;
        Ok(())
    }

    /// Records many submissions at once, their writes pipelined; one result per submission.
    pub(crate) async fn on_submits(
        &mut self,
        submissions: Vec<(SubmitRequest, &Identity)>,
    ) -> Vec<Result<()>> {
        let depending: Vec<JobSpec> = submissions
            .iter()
            .filter(|(request, _)| {
                !request.spec.after.is_empty() || !request.spec.after_any.is_empty()
            })
            .map(|(request, _)| request.spec.clone())
            .collect();
        self.learn_archived(depending.iter()).await;
        let mut records = Vec::with_capacity(submissions.len());
        let mut followups = Vec::with_capacity(submissions.len());
        let mut queued = QueuedByUser::default();
        for (mut request, identity) in submissions {
            // Not recorded without its environment put apart: left for JetStream to redeliver.
            if let Err(err) = self.keep_env_apart(&mut request, identity).await {
                followups.push(Err(err));
                continue;
            }
            request.spec.private_output |= self.policy.private_output;
            let not_added = self
                .over_limit(&mut request, identity, &mut queued)
                .map(NotAdded::OverLimit);
            let id = request.id.clone();
            // Each its own time, so jobs of a batch keep their order in the queue.
            let transition = lifecycle::submit(request, &identity.signer(), not_added, now());
            let stored = transition.record.is_some();
            if transition
                .record
                .as_ref()
                .is_some_and(|r| matches!(r.state, JobState::Queued(_)))
            {
                queued.add(&identity.name);
            }
            let outcome = SubmitOutcome::of(transition.record.as_ref(), false);
            records.extend(transition.record);
            followups.push(Ok((id, stored, (transition.effects, outcome), identity)));
        }
        let mut created = self.store.create_many(records).await.into_iter();
        let mut results = Vec::with_capacity(followups.len());
        for followup in followups {
            let (id, stored, effects, identity) = match followup {
                Ok(followup) => followup,
                Err(err) => {
                    results.push(Err(err));
                    continue;
                }
            };
            let outcome = if stored {
                created
                    .next()
                    .unwrap_or_else(|| Err(anyhow::anyhow!("internal: {id} was not stored")))
            } else {
                Ok(true)
            };
            results.push(match outcome {
                Ok(created) => {
                    self.after_submit(&id, created, effects, identity).await;
                    Ok(())
                }
                Err(err) => Err(err),
            });
        }
        results
    }

    /// Carries out a submission's effects once its record is stored (`created`) and counts
    /// it with its outcome; a redelivered submission, already recorded, only gets a log line.
    async fn after_submit(
        &self,
        id: &JobId,
        created: bool,
        (effects, outcome): (Vec<lifecycle::Effect>, SubmitOutcome),
        identity: &Identity,
    ) {
        if !created {
            tracing::debug!(job = %id, "submission already recorded");
            return;
        }
        self.metrics.tally().submitted(&identity.name, outcome);
        if let Err(err) = self.carry_out_effects(id, effects, Some(identity)).await {
            tracing::error!(job = %id, "after a submission: {err:#}");
        }
    }

    /// Why `request`, signed by `identity`, is over its owner's limits (`[limits]`), counting
    /// the jobs `queued` knows of; within them, a job without a time limit gets
    /// `max_time_limit`.
    fn over_limit(
        &self,
        request: &mut SubmitRequest,
        identity: &Identity,
        queued: &mut QueuedByUser,
    ) -> Option<String> {
        if self.limits.limits.is_empty() {
            return None;
        }
        // The signer owns the job, whatever name the payload gives.
        let user = identity.name.as_str();
        let limits = self
            .limits
            .limits
            .for_user(user, self.gate.principals.group_of(user));
        let count = match &limits.max_jobs_queued {
            Some(_) => queued.of(user, &self.store),
            None => 0,
        };
        if let Some(why) = limits.refusal(user, &request.spec, count) {
            return Some(why);
        }
        limits.cap_time_limit(&mut request.spec);
        None
    }

    /// The queued or running job of the same user that `--dedup` finds identical.
    fn twin_of(&self, request: &SubmitRequest, identity: &Identity) -> Option<JobId> {
        let key = request.spec.dedup_key();
        self.store
            .queued()
            .chain(self.store.running())
            .find(|r: &&JobRecord| {
                r.id != request.id
                    && r.user == identity.name
                    && matches!(r.state, JobState::Queued(_) | JobState::Running(_))
                    && r.spec.dedup_key() == key
            })
            .map(|r| r.id.clone())
    }
}

/// Users' queued jobs, counted once per batch of submissions (only for users with a
/// `max_jobs_queued`), plus those the batch queued.
#[derive(Default)]
struct QueuedByUser(HashMap<String, usize>);

impl QueuedByUser {
    fn of(&mut self, user: &str, store: &crate::state::JobStore) -> usize {
        if let Some(count) = self.0.get(user) {
            return *count;
        }
        let count = store.queued().filter(|record| record.user == user).count();
        self.0.insert(user.to_owned(), count);
        count
    }

    fn add(&mut self, user: &str) {
        if let Some(count) = self.0.get_mut(user) {
            *count += 1;
        }
    }
}
