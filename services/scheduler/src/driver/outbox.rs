//! The machine's commands carried out: assignments and control messages to agents (stored,
//! retried while NATS elects a leader; many assignments at once), job events and audit
//! records for anyone watching (awaited off the hot path), acknowledgements, record writes
//! (`store.rs`), stores and questions whose answers go back to the machine. What to send is
//! the machine's ([`crate::machine::assignment`], [`crate::machine::announce`]); this only
//! sends, after fetching an environment kept apart for the assignment that needs it.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use anyhow::{Result, anyhow};
use async_nats::HeaderMap;
use async_nats::jetstream;
use bytes::Bytes;
use futures::StreamExt;

use mgpu_nats::background_publish::BackgroundPublisher;
use mgpu_nats::job_env;
use mgpu_nats::retry::Retry;
use mgpu_protocol::assign::NodeControl;
use mgpu_protocol::audit::AuditRecord;
use mgpu_protocol::event::JobEvent;
use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::JobState;
use mgpu_protocol::{now, subjects};

use super::replica::LeaseGate;
use super::store::{WRITE_RETRY_FOR, Write};
use super::{Driver, intake};
use crate::machine::Command;
use crate::machine::messages::{Count, Input, LogLevel, LogLine, RankAssignment};

/// An assignment to send: the job, whose environment it carries (if any), its ranks.
type Assign = (JobId, Option<String>, Vec<RankAssignment>);

/// Assignments awaiting JetStream's acknowledgement at once when a pass starts many jobs.
const ASSIGNMENTS_IN_FLIGHT: usize = 256;

impl Driver {
    /// Carries `commands` out in order, and those the results of their operations lead to.
    /// Each write, assignment and acknowledgement waits for the lease to be confirmed; once
    /// it is known lost, the rest is dropped (the replica that took over keeps the book).
    /// A required send that fails (an assignment, a kill that must get through) skips the
    /// later commands about the same job: its request is delivered again, the repair timer
    /// sends it again.
    pub(super) async fn carry_out(&mut self, mut commands: Vec<Command>) {
        loop {
            let deferred = self.carry_out_rounds(commands).await;
            if deferred.is_empty() {
                break;
            }
            // The bookkeeping stores a round put off, now that its jobs are on their way.
            let mut results = Vec::new();
            for command in deferred {
                if !self.lease_confirmed().await {
                    return;
                }
                results.extend(self.carry_out_one(command, &mut HashSet::new()).await);
            }
            commands = results
                .into_iter()
                .flat_map(|result| self.machine.handle(now(), result))
                .collect();
        }
        self.outbox.forget_prefetched();
    }

    /// [`Driver::carry_out`] but for the bookkeeping stores (the usage book, the plan), which
    /// are handed back: a start must not wait for them (each is a write flushed to disk).
    async fn carry_out_rounds(&mut self, mut commands: Vec<Command>) -> Vec<Command> {
        let mut failed: HashSet<JobId> = HashSet::new();
        let mut deferred = Vec::new();
        while !commands.is_empty() {
            let mut results = Vec::new();
            let mut writes = Vec::new();
            let mut assigns = Vec::new();
            for command in commands {
                let skipped = command.job().is_some_and(|job| failed.contains(job))
                    && !matches!(command, Command::Write { .. } | Command::Log(_));
                if skipped {
                    continue;
                }
                match command {
                    Command::Write {
                        op,
                        record,
                        expected,
                    } => {
                        self.outbox.prefetch_environment(&record);
                        writes.push(Write {
                            op,
                            record,
                            expected,
                        });
                    }
                    Command::Assign {
                        job,
                        env_owner,
                        ranks,
                    } => assigns.push((job, env_owner, ranks)),
                    bookkeeping @ (Command::SaveUsage(_) | Command::SavePlan(_)) => {
                        deferred.push(bookkeeping);
                    }
                    other => {
                        // Writes and assignments gathered so far go first, in order.
                        let (writes, assigns) =
                            (std::mem::take(&mut writes), std::mem::take(&mut assigns));
                        if !self.flush(writes, assigns, &mut results, &mut failed).await
                            || !self.lease_confirmed().await
                        {
                            return Vec::new();
                        }
                        results.extend(self.carry_out_one(other, &mut failed).await);
                    }
                }
            }
            if !self.flush(writes, assigns, &mut results, &mut failed).await {
                return Vec::new();
            }
            commands = Vec::new();
            for result in results {
                commands.extend(self.machine.handle(now(), result));
            }
        }
        deferred
    }

    /// The writes, then the assignments, each batch only while the lease is confirmed (the
    /// writes' acknowledgements take milliseconds, in which the process may be stopped);
    /// false once the lease is known lost.
    async fn flush(
        &mut self,
        writes: Vec<Write>,
        assigns: Vec<Assign>,
        results: &mut Vec<Input>,
        failed: &mut HashSet<JobId>,
    ) -> bool {
        if !writes.is_empty() {
            if !self.lease_confirmed().await {
                return false;
            }
            results.extend(self.store.write_all(writes).await);
        }
        if !assigns.is_empty() {
            if !self.lease_confirmed().await {
                return false;
            }
            failed.extend(self.send_assignments(assigns).await);
        }
        true
    }

    /// Sends assignments, many at once; the jobs whose sending failed.
    async fn send_assignments(&self, assigns: Vec<Assign>) -> Vec<JobId> {
        if assigns.is_empty() {
            return Vec::new();
        }
        let outbox = &self.outbox;
        let sent: Vec<(JobId, Result<()>)> = futures::stream::iter(assigns)
            .map(|(job, env_owner, ranks)| async move {
                let outcome = outbox
                    .send_assignment(&job, env_owner.as_deref(), ranks)
                    .await;
                (job, outcome)
            })
            .buffered(ASSIGNMENTS_IN_FLIGHT)
            .collect()
            .await;
        sent.into_iter()
            .filter_map(|(job, outcome)| match outcome {
                Ok(()) => None,
                // Recorded as running: the repair timer sends it again.
                Err(err) => {
                    tracing::error!(job = %job, "{err:#}");
                    Some(job)
                }
            })
            .collect()
    }

    /// Carries out one command (not a write or an assignment); the machine's input for its
    /// result, if it asked for one.
    async fn carry_out_one(
        &mut self,
        command: Command,
        failed: &mut HashSet<JobId>,
    ) -> Option<Input> {
        match command {
            Command::Control {
                job,
                node,
                control,
                required,
            } => {
                if let Err(err) = self.outbox.send_control(&node, &control).await {
                    tracing::error!(job = %job, "sending a kill: {err:#}");
                    if required {
                        failed.insert(job);
                    }
                }
                None
            }
            Command::Event(event) => {
                self.outbox.publish_event(&event);
                None
            }
            Command::Audit(record) => {
                self.outbox.audit(&record);
                None
            }
            Command::Notice { subject, notice } => {
                self.outbox.notify(subject, &notice).await;
                None
            }
            Command::Verdict { to, verdict } => {
                self.outbox.tell_submitter(to, &verdict).await;
                None
            }
            Command::Ack { token, .. } => {
                if let Some(message) = self.held.acknowledged(token) {
                    intake::acknowledge(&message).await;
                }
                None
            }
            Command::StoreAdmin { op, node, admin } => {
                let stored = match self.store.put_admin(&node, &admin).await {
                    Ok(()) => true,
                    Err(err) => {
                        tracing::error!("{err:#}");
                        false
                    }
                };
                Some(Input::AdminStored { op, stored })
            }
            Command::StoreReservation { op, reservation } => {
                let stored = match self.store.put_reservation(&reservation).await {
                    Ok(()) => true,
                    Err(err) => {
                        tracing::error!("{err:#}");
                        false
                    }
                };
                op.map(|op| Input::ReservationStored { op, stored })
            }
            Command::DropReservation { name } => {
                if let Err(err) = self.store.drop_reservation(&name).await {
                    tracing::warn!("{err:#}");
                }
                None
            }
            Command::ReservationVerdict { to, verdict } => {
                self.outbox.answer(to, &verdict).await;
                None
            }
            Command::PurgeAssignments { node } => {
                let purged = match self.store.purge_assignments(&node).await {
                    Ok(()) => true,
                    Err(err) => {
                        tracing::error!("{err:#}");
                        false
                    }
                };
                Some(Input::AssignmentsPurged { node, purged })
            }
            Command::Archive {
                record,
                last_of_array,
            } => {
                let moved = match self.store.archive(&record, last_of_array).await {
                    Ok(()) => true,
                    Err(err) => {
                        tracing::warn!(job = %record.id, "moving a finished job to history: {err:#}");
                        false
                    }
                };
                Some(Input::Archived {
                    id: record.id,
                    moved,
                })
            }
            Command::SaveUsage(book) => match self.store.save_usage(&book).await {
                Ok(()) => None,
                Err(err) => {
                    tracing::warn!("{err:#}");
                    Some(Input::UsageNotSaved)
                }
            },
            Command::SavePlan(plan) => match self.store.save_plan(&plan).await {
                Ok(()) => None,
                Err(err) => {
                    tracing::warn!("{err:#}");
                    Some(Input::PlanNotSaved)
                }
            },
            Command::AskReportsCaughtUp { op } => {
                let caught_up = self.reports_caught_up().await;
                Some(Input::ReportsCaughtUp { op, caught_up })
            }
            Command::Count(count) => {
                let mut tally = self.metrics.tally();
                match count {
                    Count::Submitted { user, outcome } => tally.submitted(&user, outcome),
                    Count::Refused { action, why } => tally.refused(action, why),
                    Count::StartedAfter(waited) => tally.started_after(waited),
                }
                None
            }
            Command::Log(line) => {
                write_log(&line);
                None
            }
            Command::Write { .. } | Command::Assign { .. } => None,
        }
    }
}

fn write_log(line: &LogLine) {
    let job = line.job.as_ref().map(|id| id.as_str());
    let node = line.node.as_deref();
    let message = &line.message;
    match line.level {
        LogLevel::Debug => tracing::debug!(job, node, "{message}"),
        LogLevel::Info => tracing::info!(job, node, "{message}"),
        LogLevel::Warn => tracing::warn!(job, node, "{message}"),
        LogLevel::Error => tracing::error!(job, node, "{message}"),
    }
}

/// The scheduler's way out to agents and watchers.
pub(crate) struct Outbox {
    js: jetstream::Context,
    /// Where job events and audit records go out, off the hot path.
    background: BackgroundPublisher,
    /// Environments kept apart, fetched while the records of the jobs about to start them
    /// are written (see [`Outbox::prefetch_environment`]).
    prefetched: Mutex<HashMap<JobId, Prefetch>>,
    /// Asked before each message to a node is sent, and before each retry.
    lease: LeaseGate,
}

/// An environment being fetched.
type Prefetch = tokio::task::JoinHandle<Result<Option<job_env::Environment>, String>>;

impl Outbox {
    pub(crate) fn new(js: jetstream::Context, lease: LeaseGate) -> Self {
        Outbox {
            lease,
            background: BackgroundPublisher::start(js.clone(), WRITE_RETRY_FOR),
            js,
            prefetched: Mutex::new(HashMap::new()),
        }
    }

    /// Starts fetching the environment kept apart of a job whose record is written as
    /// starting (running, not started yet), so its assignment need not wait for the fetch
    /// after the write.
    fn prefetch_environment(&self, record: &mgpu_protocol::job::JobRecord) {
        let JobState::Running(run) = &record.state else {
            return;
        };
        if !record.spec.private_env || run.started_at.is_some() || run.pid.is_some() {
            return;
        }
        let Ok(mut prefetched) = self.prefetched.lock() else {
            return;
        };
        let (client, owner, job) = (
            self.js.client(),
            subjects::history_owner(record).to_owned(),
            record.id.clone(),
        );
        let array = record.spec.array.as_ref().map(|a| a.array_id.clone());
        prefetched.entry(record.id.clone()).or_insert_with(|| {
            tokio::spawn(async move {
                job_env::get_for(&client, &owner, &job, array.as_ref())
                    .await
                    .map_err(|err| err.to_string())
            })
        });
    }

    /// Drops what was fetched for assignments that were not sent.
    fn forget_prefetched(&self) {
        if let Ok(mut prefetched) = self.prefetched.lock() {
            for (_, fetch) in prefetched.drain() {
                fetch.abort();
            }
        }
    }

    /// The environment `owner` kept apart for `job` (or for its `array`): fetched ahead, or
    /// now.
    async fn environment(
        &self,
        owner: &str,
        job: &JobId,
        array: Option<&JobId>,
    ) -> Result<Option<job_env::Environment>> {
        let ahead = self
            .prefetched
            .lock()
            .ok()
            .and_then(|mut prefetched| prefetched.remove(job));
        if let Some(Ok(Ok(found))) = match ahead {
            Some(fetch) => Some(fetch.await),
            None => None,
        } {
            return Ok(found);
        }
        // None fetched ahead, or that fetch failed: asked again.
        Ok(job_env::get_for(&self.js.client(), owner, job, array).await?)
    }

    /// Sends a control message to `node`.
    pub(crate) async fn send_control(&self, node: &str, control: &NodeControl) -> Result<()> {
        let payload = Bytes::from(serde_json::to_vec(control)?);
        self.publish_stored(subjects::control(node), HeaderMap::new(), payload)
            .await
            .map_err(|e| anyhow!("sending a control message to {node}: {e:#}"))
    }

    /// Publishes to a stream until JetStream stored it, retrying while NATS cannot answer (a
    /// server lost, a stream electing its leader) for up to
    /// [`WRITE_RETRY_FOR`]. Callers whose message may be stored twice give it
    /// a `Nats-Msg-Id`.
    async fn publish_stored(
        &self,
        subject: String,
        headers: HeaderMap,
        payload: Bytes,
    ) -> Result<()> {
        let mut retry = Retry::new(WRITE_RETRY_FOR);
        loop {
            if !self.lease.clone().confirmed().await {
                return Err(anyhow!("this replica no longer holds the scheduler lease"));
            }
            let stored = async {
                self.js
                    .publish_with_headers(subject.clone(), headers.clone(), payload.clone())
                    .await?
                    .await
            };
            match stored.await {
                Ok(_) => return Ok(()),
                Err(err) => {
                    retry
                        .wait(&format!("publishing on {subject}: {err}"))
                        .await?
                }
            }
        }
    }

    /// Sends a job's assignments, each rank's to its node. An environment kept apart
    /// (`env_owner`'s) is fetched first and put in each; one that is gone (its owner deleted
    /// it) is an empty one, and said so.
    pub(crate) async fn send_assignment(
        &self,
        job: &JobId,
        env_owner: Option<&str>,
        mut ranks: Vec<RankAssignment>,
    ) -> Result<()> {
        if let Some(owner) = env_owner {
            let array = ranks
                .first()
                .and_then(|rank| rank.assignment.spec.array.as_ref())
                .map(|member| &member.array_id);
            let env = self.environment(owner, job, array).await?;
            if env.is_none() {
                tracing::warn!(job = %job, "its environment is gone; it runs without");
            }
            let env = env.unwrap_or_default();
            for rank in &mut ranks {
                rank.assignment.spec.env = env.clone();
                rank.assignment.spec.private_env = false;
            }
        }
        for rank in ranks {
            let mut headers = HeaderMap::new();
            headers.insert("Nats-Msg-Id", rank.msg_id.as_str());
            self.publish_stored(
                subjects::assign(&rank.node),
                headers,
                Bytes::from(serde_json::to_vec(&rank.assignment)?),
            )
            .await
            .map_err(|e| anyhow!("sending job {job} to {}: {e:#}", rank.node))?;
        }
        Ok(())
    }

    /// Publishes a job event. The acknowledgement is awaited off the hot path: events are
    /// for watchers, the record in KV is the truth.
    pub(crate) fn publish_event(&self, event: &JobEvent) {
        let Ok(payload) = serde_json::to_vec(event) else {
            return;
        };
        self.background
            .publish(subjects::events(&event.job_id), payload, "a job event");
    }

    /// Tells a user about one of their jobs: a plain publish (no stream keeps notices; the
    /// job's record says the same), so a failure is only logged.
    pub(crate) async fn notify(&self, subject: String, notice: &mgpu_protocol::idle::Notice) {
        let Ok(payload) = serde_json::to_vec(notice) else {
            return;
        };
        if let Err(err) = self.js.client().publish(subject, payload.into()).await {
            tracing::warn!(about = %notice.about(), "telling an owner: {err}");
        }
    }

    /// Tells a submitter the verdict on their job (core NATS: they wait for it now or never).
    pub(crate) async fn tell_submitter(
        &self,
        to: String,
        verdict: &mgpu_protocol::submit::SubmitVerdict,
    ) {
        let Ok(payload) = serde_json::to_vec(verdict) else {
            return;
        };
        if let Err(err) = self.js.client().publish(to, payload.into()).await {
            tracing::debug!(job = %verdict.job, "telling the submitter: {err}");
        }
    }

    /// Tells whoever booked or cancelled a reservation what came of it (core NATS).
    pub(crate) async fn answer(
        &self,
        to: String,
        verdict: &mgpu_protocol::reservation::ReservationVerdict,
    ) {
        let Ok(payload) = serde_json::to_vec(verdict) else {
            return;
        };
        if let Err(err) = self.js.client().publish(to, payload.into()).await {
            tracing::debug!(reservation = %verdict.name, "answering a booking: {err}");
        }
    }

    /// Records a request in the audit stream.
    pub(crate) fn audit(&self, record: &AuditRecord) {
        let Ok(payload) = serde_json::to_vec(record) else {
            return;
        };
        self.background
            .publish(subjects::audit(&record.action), payload, "an audit record");
    }
}
