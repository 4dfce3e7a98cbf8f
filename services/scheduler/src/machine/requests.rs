//! What people ask: submissions (each checked against its owner's `[limits]`, a `--dedup`
//! one against its twins; the record is the job lifecycle's), cancels, holds and releases
//! (the lifecycle's, for the job's owner or an admin), and node administration (admins
//! drain and resume nodes, pause and resume GPUs; the marks are stored in the cluster bucket
//! before the node table takes them).

use std::collections::HashMap;

use mgpu_protocol::Timestamp;
use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::{JobRecord, JobState};
use mgpu_protocol::node::AdminMark;
use mgpu_protocol::node_admin::AdminRequest;
use mgpu_protocol::qos::class_name;
use mgpu_protocol::request::{Action, Request};
use mgpu_protocol::submit::SubmitRequest;

use super::announce::Sender;
use super::jobs::JobTable;
use super::messages::{Admitted, Command, Count, Identity, LogLevel, Token};
use super::pending::{NewJob, Origin, Pending};
use super::{OpId, SchedulerState};
use crate::lifecycle::{self, Effect, Input, NotAdded, StreamOrder, Transition};
use crate::metrics::{RefusalReason, SubmitOutcome};

/// How long a request about a job that is not recorded yet waits for its submission (left
/// unacknowledged, delivered again) before it is dropped as about an unknown job.
const UNKNOWN_JOB_PATIENCE: chrono::Duration = chrono::Duration::minutes(3);

impl SchedulerState {
    /// Plain submissions that came together: each checked and its record written, the
    /// writes together. Each gets its own instant, a microsecond apart, so the jobs of a
    /// batch keep their order in the queue.
    pub(crate) fn on_submissions(&mut self, now: Timestamp, batch: Vec<Admitted>) {
        let mut memo = BatchMemo::default();
        for (offset, admitted) in (0i64..).zip(batch) {
            let at = now + chrono::Duration::microseconds(offset);
            self.submit(at, admitted, &mut memo);
        }
    }

    /// Any other request, alone.
    pub(crate) fn on_request(&mut self, now: Timestamp, admitted: Admitted) {
        let Admitted {
            token,
            identity,
            request,
            order,
            verdict_to,
        } = admitted;
        match request {
            Request::Submit(_) => {
                let admitted = Admitted {
                    token,
                    identity,
                    request,
                    order,
                    verdict_to,
                };
                self.submit(now, admitted, &mut BatchMemo::default());
            }
            Request::Cancel { job, request } => {
                let input = Input::Cancel {
                    by: identity.requester(),
                    reason: request.reason,
                };
                self.on_job_request(now, &job, input, identity, (token, order));
            }
            Request::Hold { job, .. } => {
                let input = Input::Hold {
                    by: identity.requester(),
                    order,
                };
                self.on_job_request(now, &job, input, identity, (token, order));
            }
            Request::Release { job, .. } => {
                let input = Input::Release {
                    by: identity.requester(),
                    order,
                };
                self.on_job_request(now, &job, input, identity, (token, order));
            }
            Request::Admin(request) => {
                self.on_node_admin(now, request, identity, (token, order));
            }
            Request::Reserve(request) => {
                let redelivered = order.is_some_and(|o| o.redelivered);
                let delivery = (token, verdict_to, redelivered);
                self.on_reservation_request(now, request, identity, delivery);
            }
        }
    }

    /// A cancel, hold or release of `job`. One about a job not recorded yet may come before
    /// its submission is (that one's write failed: JetStream delivers it again); it is left
    /// unacknowledged to come again after it, while young, and dropped once old.
    fn on_job_request(
        &mut self,
        now: Timestamp,
        job: &JobId,
        input: Input,
        identity: Identity,
        (token, order): (Token, Option<StreamOrder>),
    ) {
        if self.jobs.get(job).is_none() {
            let young = order.is_some_and(|o| now - o.stored_at < UNKNOWN_JOB_PATIENCE);
            if young {
                let said = "request about a job not recorded yet: handled when delivered again";
                self.out
                    .push(Command::log(LogLevel::Debug, Some(job), said));
                return;
            }
            self.out.push(Command::log(
                LogLevel::Warn,
                Some(job),
                "request about an unknown job",
            ));
            self.ack(Some(token), None);
            return;
        }
        self.apply(now, job, input, Origin::Request(identity), Some(token));
    }

    /// Records one submission, looking for its twin first when it asks for `--dedup`.
    fn submit(&mut self, now: Timestamp, admitted: Admitted, memo: &mut BatchMemo) {
        let Admitted {
            token,
            identity,
            request,
            verdict_to,
            ..
        } = admitted;
        let Request::Submit(request) = request else {
            return;
        };
        let mut request = *request;
        request.spec.private_output |= self.policy.private_output;
        let twin = request
            .spec
            .dedup
            .then(|| twin_of(&self.jobs, &request, &identity))
            .flatten();
        let unselectable = self
            .qos_refusal(&request.spec, &identity.name)
            .or_else(|| self.reservation_refusal(&request.spec, &identity.name, now))
            .or_else(|| self.unselectable(&request.spec));
        let impossible = match unselectable {
            Some(_) => None,
            None => self.impossible(&request, &identity.name, &mut memo.nodes, now),
        };
        let over_limit = self.over_limit(&mut request, &identity, &mut memo.queued);
        let not_added = match (&twin, unselectable, impossible, over_limit) {
            (Some(twin), ..) => Some(NotAdded::Duplicate(twin)),
            (None, Some(why), ..) => Some(NotAdded::Unselectable(why)),
            // A limit names what the admins set: said before what no node could do.
            (None, None, _, Some(why)) => Some(NotAdded::OverLimit(why)),
            (None, None, Some(why), None) => Some(NotAdded::Impossible(why)),
            (None, None, None, None) => None,
        };
        let id = request.id.clone();
        let Transition { record, effects } =
            lifecycle::submit(request, &identity.signer(), not_added, now);
        let outcome = SubmitOutcome::of(record.as_ref(), twin.is_some());
        let Some(record) = record else {
            // No record (its sender field is not a user name): its submitter hears why.
            self.after_submit(now, &id, effects, &identity, outcome);
            self.ack(Some(token), Some(&id));
            return;
        };
        if matches!(record.state, JobState::Queued(_)) {
            let class = class_name(record.spec.qos.as_deref());
            memo.queued.add(&identity.name, class);
        }
        if self.staged_again(&id, token) {
            // Delivered again before its first write: acknowledged with it.
            return;
        }
        if self.jobs.get(&id).is_some() {
            // A redelivered submission: recorded before, its effects went out then.
            let said = "submission already recorded";
            self.out
                .push(Command::log(LogLevel::Debug, Some(&id), said));
            self.ack(Some(token), Some(&id));
            return;
        }
        let verdict = verdict_to.map(|to| (to, super::transitions::verdict_of(&record)));
        let job = NewJob {
            effects,
            identity,
            outcome,
            token: Some(token),
            verdict,
            later: Vec::new(),
            redelivered: Vec::new(),
        };
        if matches!(record.state, JobState::Queued(_)) {
            // Created once the next pass decided for it (see `staging`).
            self.stage(record, job);
            return;
        }
        let op = self.op();
        let record = std::sync::Arc::new(record);
        self.out.push(Command::Write {
            op,
            record: std::sync::Arc::clone(&record),
            expected: None,
        });
        self.pending.insert(op, Pending::Create { record, job });
    }

    /// A submission's effects, once its record is stored, and its count.
    pub(crate) fn after_submit(
        &mut self,
        at: Timestamp,
        id: &JobId,
        effects: Vec<Effect>,
        identity: &Identity,
        outcome: SubmitOutcome,
    ) {
        self.out.push(Command::Count(Count::Submitted {
            user: identity.name.clone(),
            outcome,
        }));
        self.carry_out(at, id, effects, Some(identity));
    }

    /// Why `spec` asks for what no known node has: a GPU type or a node feature, naming those
    /// the cluster has. None while no node is known (nothing to compare with).
    /// Why the submitter may not use the class its job names (`--qos`), if they may not.
    /// Also refused: `--idle-ok` where the class does not allow it.
    fn qos_refusal(&self, spec: &mgpu_protocol::job::JobSpec, user: &str) -> Option<String> {
        let group = self.group_of(user);
        if let Some(why) = self.policy.qos.refusal(spec.qos.as_deref(), user, group) {
            return Some(why);
        }
        let class = class_name(spec.qos.as_deref());
        (spec.idle_ok && !self.policy.qos.of_job(spec.qos.as_deref()).allow_idle_ok).then(|| {
            format!(
                "--idle-ok is not allowed in the quality-of-service class {class:?} (its \
                 allow_idle_ok is false)"
            )
        })
    }

    fn unselectable(&self, spec: &mgpu_protocol::job::JobSpec) -> Option<String> {
        if self.nodes.is_empty() || (spec.gpu_types.is_empty() && spec.constraint.is_none()) {
            return None;
        }
        let (types, features) = self.nodes.types_and_features();
        let listed = |names: &std::collections::BTreeSet<&str>| match names.is_empty() {
            true => "none".to_owned(),
            false => names.iter().copied().collect::<Vec<_>>().join(", "),
        };
        let missing_types: Vec<&str> = spec
            .gpu_types
            .iter()
            .map(String::as_str)
            .filter(|t| !types.contains(t))
            .collect();
        if !missing_types.is_empty() && !spec.gpus.is_zero() {
            return Some(format!(
                "no node has GPU type {} (the cluster has: {})",
                missing_types.join(", "),
                listed(&types)
            ));
        }
        let constraint = spec.constraint.as_deref()?;
        let parsed = mgpu_protocol::gpu_type::Constraint::parse(constraint).ok()?;
        let missing: Vec<&str> = parsed
            .features()
            .into_iter()
            .filter(|f| !features.contains(f))
            .collect();
        (!missing.is_empty()).then(|| {
            format!(
                "no node has the feature {} (the cluster has: {})",
                missing.join(", "),
                listed(&features)
            )
        })
    }

    /// Why no node known could ever run `request` of `user`, even idle (more GPUs than any
    /// node has, more memory per GPU, a pin on a GPU that does not exist…), as the pass would
    /// find: said at submit, so `mgpu submit` can say it. The nodes' views are built once per
    /// batch of submissions (`nodes`), and only for a submission that asks for GPUs.
    fn impossible(
        &self,
        request: &SubmitRequest,
        user: &str,
        nodes: &mut Option<Vec<crate::core::NodeView>>,
        now: Timestamp,
    ) -> Option<String> {
        if self.nodes.is_empty() {
            return None;
        }
        let view =
            crate::queue_view::request_view(&self.policy, &request.id, user, &request.spec, now);
        let nodes = nodes.get_or_insert_with(|| self.nodes.views(now));
        crate::core::impossible_reason(nodes, &view)
            .or_else(|| crate::core::type_caps_impossible_reason(nodes, &view, &self.gpu_type_caps))
    }

    /// Why `request`, signed by `identity`, is over its owner's limits (`[limits]`) or its
    /// class's (the limits keys of `[qos.<name>]`, counting the owner's jobs of that class),
    /// counting the jobs `queued` knows of; within them, a job without a time limit gets the
    /// shorter `max_time_limit` of the two.
    fn over_limit(
        &self,
        request: &mut SubmitRequest,
        identity: &Identity,
        queued: &mut QueuedByUser,
    ) -> Option<String> {
        if self.limits.is_empty() {
            return None;
        }
        // The signer owns the job, whatever name the payload gives.
        let user = identity.name.as_str();
        let limits = self.limits.for_user(user, self.group_of(user));
        let count = match &limits.max_jobs_queued {
            Some(_) => queued.of(user, None, &self.jobs),
            None => 0,
        };
        if let Some(why) = limits.refusal(user, &request.spec, count) {
            return Some(why);
        }
        let class = request.spec.qos.as_deref();
        let class_limits = self.limits.for_class(class);
        if let Some(class_limits) = &class_limits {
            let count = match &class_limits.max_jobs_queued {
                Some(_) => queued.of(user, Some(class_name(class)), &self.jobs),
                None => 0,
            };
            if let Some(why) = class_limits.refusal(user, &request.spec, count) {
                return Some(why);
            }
        }
        // A job without a time limit gets the shorter of its user's and its class's.
        if request.spec.time_limit_secs.is_none() {
            let caps = [&limits, class_limits.as_ref().unwrap_or(&limits)];
            request.spec.time_limit_secs = caps
                .iter()
                .filter_map(|l| l.max_time_limit_secs.as_ref().map(|limit| limit.value))
                .min();
        }
        None
    }

    /// An admin drains or resumes a node, pauses or resumes a GPU: the new marks are stored,
    /// then taken by the node table. The server lets only admins publish such a request, and
    /// the signature must be an admin's too; one delivered again after a later one about the
    /// same node was applied is not applied again.
    fn on_node_admin(
        &mut self,
        now: Timestamp,
        request: AdminRequest,
        identity: Identity,
        (token, order): (Token, Option<StreamOrder>),
    ) {
        if !identity.admin {
            let reason = format!("{} is not an admin", identity.name);
            let sender = Sender::Known(&identity);
            let why = RefusalReason::NotPermitted;
            self.refuse(now, Action::Admin, None, &sender, why, reason);
            self.ack(Some(token), None);
            return;
        }
        // Marks carry the signer, whatever name the payload gives.
        let mark = |reason: &Option<String>| AdminMark {
            by: identity.name.clone(),
            at: now,
            reason: reason.clone(),
        };
        let node = match &request {
            AdminRequest::DrainNode { node, .. }
            | AdminRequest::ResumeNode { node, .. }
            | AdminRequest::PauseGpu { node, .. }
            | AdminRequest::ResumeGpu { node, .. } => node.clone(),
        };
        let mut admin = self.nodes.admin.get(&node).cloned().unwrap_or_default();
        if StreamOrder::is_stale(order, admin.last_request) {
            let said = format!("{request:?} delivered again after a later request: not applied");
            self.out
                .push(Command::node_log(LogLevel::Info, &node, said));
            self.ack(Some(token), None);
            return;
        }
        if let Some(order) = order {
            admin.last_request = Some(order.sequence);
        }
        match &request {
            AdminRequest::DrainNode { reason, .. } => admin.drained = Some(mark(reason)),
            AdminRequest::ResumeNode { .. } => admin.drained = None,
            AdminRequest::PauseGpu { index, reason, .. } => {
                admin.paused_gpus.insert(*index, mark(reason));
            }
            AdminRequest::ResumeGpu { index, .. } => {
                admin.paused_gpus.remove(index);
            }
        }
        let op = self.op();
        self.out.push(Command::StoreAdmin {
            op,
            node: node.clone(),
            admin: admin.clone(),
        });
        let detail = format!("{request:?}");
        let pending = Pending::Admin {
            token,
            node,
            admin,
            identity,
            detail,
        };
        self.pending.insert(op, pending);
    }

    /// A node's administration was stored (or not: the request is delivered again).
    pub(crate) fn on_admin_stored(&mut self, now: Timestamp, op: OpId, stored: bool) {
        let Some(Pending::Admin {
            token,
            node,
            admin,
            identity,
            detail,
        }) = self.pending.remove(&op)
        else {
            return;
        };
        if !stored {
            let said = format!("storing node {node} administration failed");
            self.out
                .push(Command::node_log(LogLevel::Error, &node, said));
            return;
        }
        let said = format!("node administration changed by {}: {detail}", identity.name);
        self.out
            .push(Command::node_log(LogLevel::Info, &node, said));
        let sender = Sender::Known(&identity);
        self.audit(now, Action::Admin, &sender, Some(node.clone()), Ok(detail));
        self.nodes.admin.insert(node, admin);
        self.pass_due = true;
        self.ack(Some(token), None);
    }
}

/// The queued or running job of the same user that `--dedup` finds identical.
fn twin_of(jobs: &JobTable, request: &SubmitRequest, identity: &Identity) -> Option<JobId> {
    let key = request.spec.dedup_key();
    jobs.queued()
        .chain(jobs.running())
        .find(|r: &&JobRecord| {
            r.id != request.id
                && r.user == identity.name
                && matches!(r.state, JobState::Queued(_) | JobState::Running(_))
                && r.spec.dedup_key() == key
        })
        .map(|r| r.id.clone())
}

/// What the checks of one batch of submissions read once for all of it.
#[derive(Default)]
struct BatchMemo {
    queued: QueuedByUser,
    /// The nodes as the core sees them, built for the first submission that needs them.
    nodes: Option<Vec<crate::core::NodeView>>,
}

/// Users' queued jobs, counted once per batch of submissions (only for users with a
/// `max_jobs_queued`), plus those the batch queued.
#[derive(Default)]
struct QueuedByUser(HashMap<(String, Option<String>), usize>);

impl QueuedByUser {
    /// How many jobs `user` has queued: of class `class` only, when it is given.
    fn of(&mut self, user: &str, class: Option<&str>, jobs: &JobTable) -> usize {
        let key = (user.to_owned(), class.map(str::to_owned));
        if let Some(count) = self.0.get(&key) {
            return *count;
        }
        let of_class = |record: &JobRecord| {
            class.is_none_or(|class| class_name(record.spec.qos.as_deref()) == class)
        };
        let count = jobs
            .queued()
            .filter(|record| record.user == user && of_class(record))
            .count();
        self.0.insert(key, count);
        count
    }

    /// One more queued job of `user`, of class `class`.
    fn add(&mut self, user: &str, class: &str) {
        for key in [
            (user.to_owned(), None),
            (user.to_owned(), Some(class.to_owned())),
        ] {
            if let Some(count) = self.0.get_mut(&key) {
                *count += 1;
            }
        }
    }
}
