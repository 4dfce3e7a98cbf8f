//! What users ask of the scheduler: submissions (`jobs.submit`), cancellations
//! (`jobs.<id>.cancel`), holds and releases, and node administration. Each comes here with
//! the identity that signed it (see `identity.rs`): a job belongs to its signer, and only
//! its owner or an admin may cancel, hold or release it. A bad request is recorded or logged,
//! audited and acknowledged; it never stops the scheduler.

use anyhow::{Result, anyhow};
use bytes::Bytes;

use mgpu_protocol::assign::NodeControl;
use mgpu_protocol::error::InvalidInput;
use mgpu_protocol::event::JobEventKind;
use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::{
    CancelRequest, Ending, HoldRequest, JobRecord, JobState, MAX_SUBMIT_BYTES, SubmitRequest,
    WaitReason, Waiting,
};
use mgpu_protocol::node::{AdminMark, AdminRequest};
use mgpu_protocol::wire::{self, MAX_REQUEST_BYTES};
use mgpu_protocol::{now, subjects};

use crate::identity::Identity;
use crate::service::Scheduler;

impl Scheduler {
    /// Records one submission (a job with `--dedup` must see every job recorded before it).
    pub(crate) async fn on_submit(&mut self, payload: &Bytes, identity: &Identity) -> Result<()> {
        let Some(record) = self.submitted_record(payload, identity) else {
            return Ok(());
        };
        let created = self.store.create(record.clone()).await?;
        self.after_submit(&record, identity, created);
        Ok(())
    }

    /// Records many submissions at once, their writes pipelined; one result per payload.
    pub(crate) async fn on_submits(
        &mut self,
        submissions: &[(Bytes, Identity)],
    ) -> Vec<Result<()>> {
        let mut records = Vec::with_capacity(submissions.len());
        let mut positions = Vec::with_capacity(submissions.len());
        for (index, (payload, identity)) in submissions.iter().enumerate() {
            if let Some(record) = self.submitted_record(payload, identity) {
                records.push(record);
                positions.push(index);
            }
        }
        let mut results: Vec<Result<()>> = submissions.iter().map(|_| Ok(())).collect();
        let created = self.store.create_many(records.clone()).await;
        for ((record, index), created) in records.iter().zip(positions).zip(created) {
            match created {
                Ok(created) => self.after_submit(record, &submissions[index].1, created),
                Err(err) => results[index] = Err(err),
            }
        }
        results
    }

    /// The record a submission makes: queued, or failed when its spec is invalid or `--dedup`
    /// finds its twin. None when it is refused outright (unreadable, forged sender).
    fn submitted_record(&mut self, payload: &Bytes, identity: &Identity) -> Option<JobRecord> {
        if payload.len() > MAX_SUBMIT_BYTES {
            tracing::warn!(bytes = payload.len(), "refusing an oversized submission");
            return None;
        }
        let request: SubmitRequest = match serde_json::from_slice(payload) {
            Ok(request) => request,
            Err(err) => {
                tracing::warn!(%err, "refusing a malformed submission");
                return None;
            }
        };
        if let Err(invalid) = request.validate_sender() {
            if let Err(err) = self.refuse_submission(&request.id, &invalid) {
                tracing::warn!("{err:#}");
            }
            return None;
        }
        let at = now();
        let duplicate_of = if request.spec.dedup {
            let key = request.spec.dedup_key();
            self.store
                .queued()
                .chain(self.store.running())
                .find(|r| {
                    r.id != request.id
                        && r.user == identity.name
                        && matches!(r.state, JobState::Queued(_) | JobState::Running(_))
                        && r.spec.dedup_key() == key
                })
                .map(|r| r.id.clone())
        } else {
            None
        };
        let state = match (request.spec.validate(), duplicate_of) {
            (Err(invalid), _) => JobState::Failed(Ending {
                placement: None,
                started_at: None,
                ended_at: at,
                exit_code: None,
                signal: None,
                reason: Some(format!("invalid submission: {invalid}")),
            }),
            (Ok(()), Some(original)) => JobState::Failed(Ending {
                placement: None,
                started_at: None,
                ended_at: at,
                exit_code: None,
                signal: None,
                reason: Some(format!(
                    "not added: identical to job {} (--dedup)",
                    original.short()
                )),
            }),
            (Ok(()), None) => JobState::Queued(Waiting::new(WaitReason::Submitted)),
        };
        if request.user != identity.name {
            // The payload's name is only what the CLI believed; the signature decides.
            tracing::debug!(job = %request.id, claimed = request.user, signer = identity.name, "submission recorded under its signer");
        }
        Some(JobRecord {
            id: request.id.clone(),
            user: identity.name.clone(),
            user_key: Some(identity.key.clone()),
            spec: request.spec,
            submitted_at: at,
            attempt: 1,
            state,
        })
    }

    /// Audits and announces a submission once its record is stored (`created`), or notes a
    /// redelivered one.
    fn after_submit(&mut self, record: &JobRecord, identity: &Identity, created: bool) {
        if !created {
            tracing::debug!(job = %record.id, "submission already recorded");
            return;
        }
        let rejected = record.state.is_finished();
        tracing::info!(job = %record.id, user = record.user, "job submitted");
        self.audit(
            "submit",
            Some(identity),
            None,
            Some(record.id.to_string()),
            !rejected,
            if rejected {
                "rejected".into()
            } else {
                "queued".into()
            },
        );
        if rejected {
            let reason = record
                .state
                .ending()
                .and_then(|e| e.reason.clone())
                .unwrap_or_default();
            self.publish_event(&record.id, JobEventKind::Rejected { reason });
        } else {
            self.publish_event(
                &record.id,
                JobEventKind::Queued {
                    reason: WaitReason::Submitted,
                },
            );
        }
    }

    pub(crate) async fn on_cancel(
        &mut self,
        id: &str,
        payload: &Bytes,
        identity: &Identity,
    ) -> Result<()> {
        let request: CancelRequest =
            match wire::decode("cancel request", payload, MAX_REQUEST_BYTES)
                .and_then(|r: CancelRequest| r.validate().map(|()| r))
            {
                Ok(request) => request,
                Err(err) => {
                    tracing::warn!(job = id, %err, "refusing a malformed cancel request");
                    return Ok(());
                }
            };
        let Ok(job) = id.parse::<JobId>() else {
            tracing::warn!(job = id, "cancel for something that is not a job id");
            return Ok(());
        };
        let Some(record) = self.store.get(&job).cloned() else {
            tracing::warn!(job = %job, "cancel for an unknown job");
            return Ok(());
        };
        if !identity.may_act_on(&record.user) {
            self.refuse(
                "cancel",
                Some(&job),
                Some(identity),
                None,
                format!("job {} belongs to {}", job.short(), record.user),
            );
            return Ok(());
        }
        self.audit(
            "cancel",
            Some(identity),
            None,
            Some(job.to_string()),
            true,
            format!("was {}", record.state.name()),
        );
        let by = identity.name.clone();
        let reason = match &request.reason {
            Some(why) => format!("cancelled by {by}: {why}"),
            None => format!("cancelled by {by}"),
        };
        match &record.state {
            JobState::Queued(_) => {
                let at = now();
                self.finish(&job, |_| {
                    JobState::Cancelled(Ending {
                        placement: None,
                        started_at: None,
                        ended_at: at,
                        exit_code: None,
                        signal: None,
                        reason: Some(reason.clone()),
                    })
                })
                .await?;
            }
            JobState::Running(run) if run.cancel_requested_by.is_none() => {
                let control = NodeControl::Kill {
                    job_id: job.clone(),
                    attempt: record.attempt,
                    reason: reason.clone(),
                    requeue: false,
                };
                self.store
                    .update(&job, |r| {
                        if let JobState::Running(run) = &mut r.state {
                            run.cancel_requested_by = Some(by.clone());
                        }
                    })
                    .await?;
                self.send_control_to_job(&run.placement, &control, None)
                    .await
                    .map_err(|e| anyhow!("sending kill for {job}: {e:#}"))?;
                tracing::info!(job = %job, nodes = %run.placement.nodes_label(), "kill sent");
            }
            _ => tracing::debug!(job = %job, state = record.state.name(), "cancel: nothing to do"),
        }
        Ok(())
    }

    /// `jobs.<id>.hold` (hold = true) and `jobs.<id>.release`: only queued jobs.
    pub(crate) async fn on_hold(
        &mut self,
        id: &str,
        payload: &Bytes,
        hold: bool,
        identity: &Identity,
    ) -> Result<()> {
        // Decoded strictly, though the signer (not the payload's `user`) is who asks.
        if let Err(err) = wire::decode("hold request", payload, MAX_REQUEST_BYTES)
            .and_then(|r: HoldRequest| r.validate())
        {
            tracing::warn!(job = id, %err, "refusing a malformed hold/release request");
            return Ok(());
        }
        let Ok(job) = id.parse::<JobId>() else {
            tracing::warn!(job = id, "hold/release for something that is not a job id");
            return Ok(());
        };
        let action = if hold { "hold" } else { "release" };
        let Some(owner) = self.store.get(&job).map(|r| r.user.clone()) else {
            tracing::warn!(job = %job, "hold/release of an unknown job");
            return Ok(());
        };
        if !identity.may_act_on(&owner) {
            let reason = format!("job {} belongs to {owner}", job.short());
            self.refuse(action, Some(&job), Some(identity), None, reason);
            return Ok(());
        }
        let queued = matches!(
            self.store.get(&job).map(|r| &r.state),
            Some(JobState::Queued(_))
        );
        let detail = if queued {
            "done"
        } else {
            "not queued: nothing to do"
        };
        self.audit(
            action,
            Some(identity),
            None,
            Some(job.to_string()),
            true,
            detail.into(),
        );
        if !queued {
            tracing::info!(job = %job, "hold/release of a job that is not queued: nothing to do");
            return Ok(());
        }
        let by = identity.name.clone();
        self.store
            .update(&job, |r| {
                if let JobState::Queued(waiting) = &mut r.state {
                    waiting.held_by = hold.then(|| by.clone());
                    if hold {
                        waiting.reason = WaitReason::Held;
                    }
                }
            })
            .await?;
        tracing::info!(job = %job, hold, "hold state changed");
        Ok(())
    }

    /// `admin.requests`: drain/resume nodes, pause/resume GPUs. The server lets only admins
    /// publish it; the state is kept in the cluster bucket so it survives restarts.
    pub(crate) async fn on_admin(&mut self, payload: &Bytes, identity: &Identity) -> Result<()> {
        let request: AdminRequest = match wire::decode("admin request", payload, MAX_REQUEST_BYTES)
            .and_then(|r: AdminRequest| r.validate().map(|()| r))
        {
            Ok(request) => request,
            Err(err) => {
                tracing::warn!(%err, "refusing a malformed admin request");
                return Ok(());
            }
        };
        if !identity.admin {
            let reason = format!("{} is not an admin", identity.name);
            self.refuse("admin", None, Some(identity), None, reason);
            return Ok(());
        }
        // Marks carry the signer, whatever name the payload gives.
        let signer = identity.name.clone();
        let mark = |_: &str, reason: &Option<String>| AdminMark {
            by: signer.clone(),
            at: now(),
            reason: reason.clone(),
        };
        let node = match &request {
            AdminRequest::DrainNode { node, .. }
            | AdminRequest::ResumeNode { node, .. }
            | AdminRequest::PauseGpu { node, .. }
            | AdminRequest::ResumeGpu { node, .. } => node.clone(),
        };
        if mgpu_protocol::ids::validate_node_name(&node).is_err() {
            tracing::warn!(node, "admin request for an invalid node name");
            return Ok(());
        }
        let mut admin = self.nodes.admin.get(&node).cloned().unwrap_or_default();
        match &request {
            AdminRequest::DrainNode { by, reason, .. } => admin.drained = Some(mark(by, reason)),
            AdminRequest::ResumeNode { .. } => admin.drained = None,
            AdminRequest::PauseGpu {
                index, by, reason, ..
            } => {
                admin.paused_gpus.insert(*index, mark(by, reason));
            }
            AdminRequest::ResumeGpu { index, .. } => {
                admin.paused_gpus.remove(index);
            }
        }
        self.cluster
            .put(
                subjects::node_admin_key(&node),
                Bytes::from(serde_json::to_vec(&admin)?),
            )
            .await
            .map_err(|e| anyhow!("storing node {node} administration: {e}"))?;
        tracing::info!(node, by = identity.name, request = ?request, "node administration changed");
        self.audit(
            "admin",
            Some(identity),
            None,
            Some(node.clone()),
            true,
            format!("{request:?}"),
        );
        self.nodes.admin.insert(node, admin);
        Ok(())
    }

    /// A submission refused before it is recorded (its sender is not a user name): the
    /// submitter learns why from the `rejected` event; nothing is stored.
    fn refuse_submission(&self, id: &JobId, invalid: &InvalidInput) -> Result<()> {
        tracing::warn!(job = %id, %invalid, "refusing a submission");
        self.publish_event(
            id,
            JobEventKind::Rejected {
                reason: format!("invalid submission: {invalid}"),
            },
        );
        Ok(())
    }
}
