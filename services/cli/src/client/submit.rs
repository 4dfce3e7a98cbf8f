//! Storing submissions, one or thousands (arrays, job files) pipelined: each job's environment
//! first, in the `mgpu-job-env` bucket under the user's key, then the submission without it on
//! the request path ([`super::request`]), its job id as its message id. An array whose tasks
//! all carry the same environment stores it once, under the array's id, and an array's tasks
//! go a hundred to a message (a `SubmitBatch`, protocol 2: [`version::ARRAY_BATCHES`]):
//! 10 000 tasks are then about a hundred writes, not 20 000, each flushed to disk. A round
//! stores what it can and the failures that may pass are retried as any request's are, so a
//! job is never sent without its environment and never stored twice.

use std::collections::{BTreeMap, HashMap, HashSet};

use anyhow::{Context as _, Result, bail};
use async_nats::jetstream::context::{PublishAckFuture, PublishErrorKind};
use mgpu_protocol::ids::JobId;
use mgpu_protocol::submit::{
    BATCH_MSG_ID_PREFIX, MAX_BATCH_TASKS, MAX_SUBMIT_BYTES, SubmitRequest,
};
use mgpu_protocol::{subjects, version};

use super::request::{self, Failure, Outcomes, Request, RetryPolicy};
use super::session::Session;

/// Stores each submission and waits for JetStream's acknowledgements, so every id reported as
/// submitted belongs to a stored job. Those that fail for a passing reason are sent again (see
/// [`request::retried`]), as long as mgpu's streams exist at all. Returns one result per
/// request, in order. With `verdict_to`, each asks the scheduler for its verdict there. Where
/// the server's permissions refuse the environments or the submissions (a viewer's key),
/// every one fails at once with that refusal.
pub async fn submit_all(
    session: &Session,
    requests: &[SubmitRequest],
    verdict_to: Option<&str>,
) -> Vec<Result<()>> {
    let envs = format!("$KV.{}.", subjects::JOB_ENV_BUCKET);
    let refusable = [subjects::SUBMIT, envs.as_str()];
    tokio::select! {
        results = submit_all_stored(session, requests, verdict_to) => results,
        refusal = session.publish_refused(&refusable) => requests
            .iter()
            .map(|_| Err(request::refused_error("submit jobs", &refusal)))
            .collect(),
    }
}

async fn submit_all_stored(
    session: &Session,
    requests: &[SubmitRequest],
    verdict_to: Option<&str>,
) -> Vec<Result<()>> {
    let shared = shared_environments(requests);
    // Decided once, so that a message retried carries the same tasks under the same id
    // (JetStream then drops a second copy of one whose acknowledgement was lost).
    let all: Vec<usize> = (0..requests.len()).collect();
    let planned = match messages_of(requests, &all) {
        Ok(planned) => planned,
        Err(failure) => {
            return requests
                .iter()
                .map(|_| Err(failure.again().into_error()))
                .collect();
        }
    };
    let batch = Batch {
        session,
        requests,
        shared: &shared,
        planned: &planned,
        verdict_to,
    };
    request::retried(
        requests.len(),
        RetryPolicy::ELECTION,
        async |indices: &[usize]| batch.round(indices).await,
        async || request::streams_exist(session).await,
    )
    .await
}

/// The arrays whose tasks, among `requests`, all carry the same environment (not none): each
/// stores it once, under its array's id.
fn shared_environments(requests: &[SubmitRequest]) -> HashSet<JobId> {
    let mut first: HashMap<&JobId, &BTreeMap<String, String>> = HashMap::new();
    let mut mixed: HashSet<&JobId> = HashSet::new();
    for request in requests {
        let Some(array) = &request.spec.array else {
            continue;
        };
        let env = &request.spec.env;
        if env.is_empty() || *first.entry(&array.array_id).or_insert(env) != env {
            mixed.insert(&array.array_id);
        }
    }
    first
        .into_keys()
        .filter(|array| !mixed.contains(array))
        .cloned()
        .collect()
}

/// The submissions of one command and what is decided once for all of them.
struct Batch<'a> {
    session: &'a Session,
    requests: &'a [SubmitRequest],
    /// The arrays whose environment is stored once ([`shared_environments`]).
    shared: &'a HashSet<JobId>,
    /// The messages the submissions go in ([`messages_of`]).
    planned: &'a [Message],
    verdict_to: Option<&'a str>,
}

impl Batch<'_> {
    /// The array whose environment `submission` shares, if it does.
    fn shared_array_of<'r>(&self, submission: &'r SubmitRequest) -> Option<&'r JobId> {
        let array = &submission.spec.array.as_ref()?.array_id;
        self.shared.contains(array).then_some(array)
    }

    /// One pass over the submissions at `indices`, pipelined: first the jobs' environments,
    /// then the submissions of the jobs whose environment is stored.
    async fn round(&self, indices: &[usize]) -> Outcomes {
        let (ready, mut outcomes) = self.store_envs(indices).await;
        let messages = match self.messages_for(&ready) {
            Ok(messages) => messages,
            Err(failure) => {
                outcomes.extend(ready.iter().map(|&index| (index, Err(failure.again()))));
                return outcomes;
            }
        };
        let sent = request::pipelined(0..messages.len(), async |message: usize| {
            match messages.get(message) {
                Some(Message::Alone(index)) => match self.requests.get(*index) {
                    Some(submission) => self.send(submission).await.map(Some),
                    None => Ok(None),
                },
                Some(Message::Tasks { tasks, payload }) => {
                    self.send_tasks(tasks, payload).await.map(Some)
                }
                None => Ok(None),
            }
        })
        .await;
        for (message, outcome) in sent {
            match messages.get(message) {
                Some(Message::Alone(index)) => outcomes.push((*index, outcome)),
                Some(Message::Tasks { tasks, .. }) => outcomes.extend(tasks.iter().map(|&t| {
                    let each = outcome.as_ref().map_err(Failure::again).map(|_| ());
                    (t, each)
                })),
                None => {}
            }
        }
        outcomes
    }

    /// The planned messages of the jobs at `ready`: whole where all their tasks are ready;
    /// a batch some of whose tasks are not (their environment not stored) encoded again
    /// without them, under an id of its own.
    fn messages_for(&self, ready: &[usize]) -> std::result::Result<Vec<Message>, Failure> {
        let ready_set: HashSet<usize> = ready.iter().copied().collect();
        let mut messages = Vec::new();
        for message in self.planned {
            match message {
                Message::Alone(index) if ready_set.contains(index) => {
                    messages.push(Message::Alone(*index));
                }
                Message::Alone(_) => {}
                Message::Tasks { tasks, payload } => {
                    let here: Vec<usize> = tasks
                        .iter()
                        .copied()
                        .filter(|task| ready_set.contains(task))
                        .collect();
                    if here.len() == tasks.len() {
                        messages.push(Message::Tasks {
                            tasks: here,
                            payload: payload.clone(),
                        });
                    } else if !here.is_empty() {
                        messages.extend(messages_of(self.requests, &here)?);
                    }
                }
            }
        }
        Ok(messages)
    }

    /// Publishes one try of a batch of an array's tasks (protocol 2), under an id made of its
    /// tasks' ([`batch_msg_id`]).
    async fn send_tasks(
        &self,
        tasks: &[usize],
        payload: &[u8],
    ) -> std::result::Result<PublishAckFuture, Failure> {
        check_size(payload.len(), &BTreeMap::new())
            .map_err(Failure::local(PublishErrorKind::MaxPayloadExceeded))?;
        let msg_id = batch_msg_id(self.requests, tasks);
        let request = Request::encoded(subjects::SUBMIT, payload.to_vec(), msg_id)
            .with_verdict_to(self.verdict_to)
            .needing_protocol(version::ARRAY_BATCHES);
        request::send(self.session, &request).await
    }

    /// Stores the environments of the jobs at `indices` in the `mgpu-job-env` bucket under
    /// this user's key, where other users cannot read them (the submission, like the job
    /// record made of it, is readable by every user): a shared array's once, by its first
    /// task here, every other job's under its own id. Returns the jobs whose environment is
    /// stored (or who have none), in the order asked, and the failures.
    async fn store_envs(&self, indices: &[usize]) -> (Vec<usize>, Outcomes) {
        let mut carriers: HashMap<&JobId, usize> = HashMap::new();
        let mut puts = Vec::with_capacity(indices.len());
        for &index in indices {
            let array = self
                .requests
                .get(index)
                .and_then(|r| self.shared_array_of(r));
            match array {
                Some(array) if carriers.contains_key(array) => {}
                Some(array) => {
                    carriers.insert(array, index);
                    puts.push(index);
                }
                None => puts.push(index),
            }
        }
        let stored =
            request::pipelined(puts, async |index: usize| match self.requests.get(index) {
                Some(submission) => self.put_env(submission).await,
                None => Ok(None),
            })
            .await;
        let stored: HashMap<usize, request::Tried> = stored.into_iter().collect();
        let mut ready = Vec::with_capacity(indices.len());
        let mut failed = Vec::new();
        for &index in indices {
            let array = self
                .requests
                .get(index)
                .and_then(|r| self.shared_array_of(r));
            let carrier = array
                .and_then(|a| carriers.get(a))
                .copied()
                .unwrap_or(index);
            match stored.get(&carrier) {
                Some(Err(failure)) => failed.push((index, Err(failure.again()))),
                _ => ready.push(index),
            }
        }
        // In the order asked: the submissions keep their order in the queue.
        ready.sort_unstable();
        (ready, failed)
    }

    /// Publishes one try of the submission, without its environment, on the request path.
    async fn send(
        &self,
        submission: &SubmitRequest,
    ) -> std::result::Result<PublishAckFuture, Failure> {
        let sent = without_env(submission);
        let payload = serde_json::to_vec(&*sent)
            .context("encoding the submission")
            .map_err(Failure::local(PublishErrorKind::Other))?;
        check_size(payload.len(), &sent.spec.env)
            .map_err(Failure::local(PublishErrorKind::MaxPayloadExceeded))?;
        let request = Request::encoded(subjects::SUBMIT, payload, submission.id.as_str())
            .with_verdict_to(self.verdict_to);
        request::send(self.session, &request).await
    }

    /// Publishes the job's environment to its key in `mgpu-job-env` (its array's, when the
    /// array shares one); the acknowledgement to await, or None for a job without one.
    async fn put_env(
        &self,
        submission: &SubmitRequest,
    ) -> std::result::Result<Option<PublishAckFuture>, Failure> {
        if submission.spec.env.is_empty() {
            return Ok(None);
        }
        let env = serde_json::to_vec(&submission.spec.env)
            .context("encoding the environment")
            .map_err(Failure::local(PublishErrorKind::Other))?;
        check_size(env.len(), &submission.spec.env)
            .map_err(Failure::local(PublishErrorKind::MaxPayloadExceeded))?;
        let key = self.shared_array_of(submission).unwrap_or(&submission.id);
        let subject = subjects::job_env(&self.session.key.public_key(), key);
        self.session
            .js
            .publish(subject, env.into())
            .await
            .map(Some)
            .map_err(|err| Failure::new(err.kind(), &err))
    }
}

/// The messages the jobs at `ready` go in, in order: an array's tasks together, up to
/// [`MAX_BATCH_TASKS`] of them within [`MAX_SUBMIT_BYTES`] (10 000 tasks are then a
/// hundred messages, each flushed once, not 10 000); every other job alone.
fn messages_of(
    requests: &[SubmitRequest],
    ready: &[usize],
) -> std::result::Result<Vec<Message>, Failure> {
    let mut messages = Vec::new();
    let mut open: Option<(&JobId, Vec<usize>, Vec<u8>)> = None;
    for &index in ready {
        let Some(submission) = requests.get(index) else {
            continue;
        };
        let Some(array) = submission.spec.array.as_ref().map(|a| &a.array_id) else {
            messages.extend(open.take().map(Message::closed));
            messages.push(Message::Alone(index));
            continue;
        };
        let task = serde_json::to_vec(&*without_env(submission))
            .context("encoding the submission")
            .map_err(Failure::local(PublishErrorKind::Other))?;
        let fits = open.as_ref().is_some_and(|(same, tasks, payload)| {
            *same == array
                && tasks.len() < MAX_BATCH_TASKS
                && payload.len() + task.len() + BATCH_CLOSING.len() < MAX_SUBMIT_BYTES
        });
        if !fits {
            messages.extend(open.take().map(Message::closed));
            open = Some((array, Vec::new(), BATCH_OPENING.to_vec()));
        }
        if let Some((_, tasks, payload)) = open.as_mut() {
            if !tasks.is_empty() {
                payload.push(b',');
            }
            payload.extend_from_slice(&task);
            tasks.push(index);
        }
    }
    messages.extend(open.take().map(Message::closed));
    Ok(messages)
}

/// A batch's message id: its first task's id after [`BATCH_MSG_ID_PREFIX`], then a hash of
/// all its tasks' ids, so that the same tasks sent again are dropped as a copy and other
/// tasks never are.
fn batch_msg_id(requests: &[SubmitRequest], tasks: &[usize]) -> String {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::hash::DefaultHasher::new();
    let ids = tasks.iter().filter_map(|&index| requests.get(index));
    for task in ids {
        task.id.as_str().hash(&mut hasher);
    }
    let first = tasks.first().and_then(|&index| requests.get(index));
    let first = first.map_or("", |task| task.id.as_str());
    format!("{BATCH_MSG_ID_PREFIX}{first}-{:016x}", hasher.finish())
}

/// What one message on the request path carries.
#[derive(Clone, Debug)]
enum Message {
    /// One job's submission.
    Alone(usize),
    /// A batch of an array's tasks ([`SubmitBatch`](mgpu_protocol::submit::SubmitBatch)),
    /// encoded.
    Tasks { tasks: Vec<usize>, payload: Vec<u8> },
}

/// A batch's encoding around its tasks' (`{"tasks":[…]}`).
const BATCH_OPENING: &[u8] = b"{\"tasks\":[";
const BATCH_CLOSING: &[u8] = b"]}";

impl Message {
    /// A batch whose tasks are all in, its encoding closed.
    fn closed((_, tasks, mut payload): (&JobId, Vec<usize>, Vec<u8>)) -> Message {
        payload.extend_from_slice(BATCH_CLOSING);
        Message::Tasks { tasks, payload }
    }
}

/// The submission as sent: without its environment (stored apart), marked so.
fn without_env(submission: &SubmitRequest) -> std::borrow::Cow<'_, SubmitRequest> {
    if submission.spec.env.is_empty() {
        return std::borrow::Cow::Borrowed(submission);
    }
    let mut apart = submission.clone();
    apart.spec.env.clear();
    apart.spec.private_env = true;
    std::borrow::Cow::Owned(apart)
}

/// Refuses a submission over the limit, naming the usual culprit.
pub fn check_size(bytes: usize, env: &BTreeMap<String, String>) -> Result<()> {
    if bytes <= MAX_SUBMIT_BYTES {
        return Ok(());
    }
    let env_bytes: usize = env.iter().map(|(k, v)| k.len() + v.len()).sum();
    if env_bytes == 0 {
        bail!(
            "the submission is {} KiB, over the {} KiB limit: shorten the command or the script",
            bytes.div_ceil(1024),
            MAX_SUBMIT_BYTES / 1024
        );
    }
    bail!(
        "the submission is {} KiB, over the {} KiB limit; {} KiB of it is your environment, \
         which the job inherits: unset large environment variables and submit again",
        bytes.div_ceil(1024),
        MAX_SUBMIT_BYTES / 1024,
        env_bytes.div_ceil(1024)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use mgpu_protocol::job::{ArrayMember, JobSpec};

    #[test]
    fn oversized_submissions_blame_the_environment() {
        let mut env = BTreeMap::new();
        env.insert("BIG".to_owned(), "x".repeat(300 * 1024));
        let err = check_size(301 * 1024, &env)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("301 KiB of it is your environment"), "{err}");
        assert!(check_size(1024, &env).is_ok());
    }

    #[test]
    fn the_environment_is_sent_apart() {
        let mut spec = JobSpec::new(vec!["true".into()], "/");
        let plain = SubmitRequest {
            id: JobId::random(),
            user: "alice".into(),
            spec: spec.clone(),
        };
        assert!(matches!(without_env(&plain), std::borrow::Cow::Borrowed(_)));
        spec.env.insert("HOME".into(), "/home/alice".into());
        let with_env = SubmitRequest { spec, ..plain };
        let sent = without_env(&with_env);
        assert!(sent.spec.env.is_empty() && sent.spec.private_env);
        assert_eq!(sent.id, with_env.id);
    }

    fn task(array: &JobId, index: u32, home: &str) -> SubmitRequest {
        let mut spec = JobSpec::new(vec!["true".into()], "/");
        if !home.is_empty() {
            spec.env.insert("HOME".into(), home.into());
        }
        spec.array = Some(ArrayMember {
            array_id: array.clone(),
            index,
            max_running: None,
        });
        SubmitRequest {
            id: JobId::random(),
            user: "alice".into(),
            spec,
        }
    }

    #[test]
    fn only_an_array_whose_tasks_all_carry_one_environment_stores_it_once() {
        let (same, differs, none) = (JobId::random(), JobId::random(), JobId::random());
        let mut requests: Vec<SubmitRequest> = (0..3).map(|i| task(&same, i, "/a")).collect();
        requests.push(task(&differs, 0, "/a"));
        requests.push(task(&differs, 1, "/b"));
        requests.push(task(&none, 0, ""));
        requests.push(SubmitRequest {
            id: JobId::random(),
            user: "alice".into(),
            spec: JobSpec::new(vec!["true".into()], "/"),
        });
        let shared = shared_environments(&requests);
        assert_eq!(shared, HashSet::from([same]));
    }

    /// What each message carries: the ids it submits.
    fn ids_in(requests: &[SubmitRequest], messages: &[Message]) -> Vec<Vec<JobId>> {
        messages
            .iter()
            .map(|message| match message {
                Message::Alone(index) => vec![requests[*index].id.clone()],
                Message::Tasks { payload, .. } => mgpu_protocol::submit::submissions_in(payload)
                    .unwrap_or_else(|e| panic!("{e}"))
                    .into_iter()
                    .map(|task| task.id)
                    .collect(),
            })
            .collect()
    }

    #[test]
    fn an_array_s_tasks_go_a_hundred_to_a_message_in_order_and_other_jobs_alone() {
        let array = JobId::random();
        let mut requests: Vec<SubmitRequest> = (0..150).map(|i| task(&array, i, "/a")).collect();
        requests.push(SubmitRequest {
            id: JobId::random(),
            user: "alice".into(),
            spec: JobSpec::new(vec!["true".into()], "/"),
        });
        requests.extend((150..250).map(|i| task(&array, i, "/a")));
        let ready: Vec<usize> = (0..requests.len()).collect();
        let messages = messages_of(&requests, &ready).unwrap_or_else(|e| panic!("{e:?}"));
        let sizes: Vec<usize> = ids_in(&requests, &messages).iter().map(Vec::len).collect();
        assert_eq!(sizes, vec![100, 50, 1, 100]);
        let sent: Vec<JobId> = ids_in(&requests, &messages).concat();
        let asked: Vec<JobId> = requests.iter().map(|r| r.id.clone()).collect();
        assert_eq!(sent, asked, "every job once, in order");
        // Sent without the environment, which is stored apart.
        let Message::Tasks { payload, .. } = &messages[0] else {
            panic!("not a batch");
        };
        let tasks = mgpu_protocol::submit::submissions_in(payload).unwrap_or_default();
        assert!(
            tasks
                .iter()
                .all(|t| t.spec.env.is_empty() && t.spec.private_env)
        );
    }

    #[test]
    fn a_batch_stays_within_the_size_a_submission_may_have() {
        let array = JobId::random();
        let long = "x".repeat(20 * 1024);
        let requests: Vec<SubmitRequest> = (0..40)
            .map(|i| {
                let mut request = task(&array, i, "/a");
                request.spec.command = vec![long.clone()];
                request
            })
            .collect();
        let ready: Vec<usize> = (0..requests.len()).collect();
        let messages = messages_of(&requests, &ready).unwrap_or_else(|e| panic!("{e:?}"));
        assert!(messages.len() >= 4, "{} messages", messages.len());
        for message in &messages {
            if let Message::Tasks { payload, .. } = message {
                assert!(payload.len() <= MAX_SUBMIT_BYTES, "{}", payload.len());
            }
        }
        assert_eq!(ids_in(&requests, &messages).concat().len(), 40);
    }

    #[test]
    fn a_batch_sent_again_has_the_same_id_and_other_tasks_another() {
        let array = JobId::random();
        let requests: Vec<SubmitRequest> = (0..3).map(|i| task(&array, i, "/a")).collect();
        let all = batch_msg_id(&requests, &[0, 1, 2]);
        assert_eq!(all, batch_msg_id(&requests, &[0, 1, 2]));
        assert!(all.starts_with(BATCH_MSG_ID_PREFIX));
        assert_ne!(all, batch_msg_id(&requests, &[0, 1]));
        assert_ne!(
            batch_msg_id(&requests, &[0, 1]),
            batch_msg_id(&requests, &[0, 2])
        );
    }
}
