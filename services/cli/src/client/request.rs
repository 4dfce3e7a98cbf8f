//! The one way a request reaches the scheduler, whatever it asks (a submission, a cancellation,
//! a hold or release, node administration, a reservation): signed with the user's key,
//! published to the request stream under a `Nats-Msg-Id`, and done once JetStream acknowledged
//! storing it.
//! What fails for a passing reason is published again.
//!
//! In a NATS cluster a request stream whose leader's server died has no leader until the
//! others elect one (about 5 s, measured with nats-server 2.14): meanwhile a publish gets "no
//! responders" or no acknowledgement. Publishing again under the same message id is safe:
//! JetStream drops a copy it already stored (the stream's dedup window is 2 minutes, far longer
//! than [`RetryPolicy::ELECTION`] retries), so a request is applied once however often it was
//! sent. Each try is signed afresh (a new time and nonce), so the copy that is stored never
//! reads as a replay.
//!
//! Many requests (an array, a job file) go pipelined ([`pipelined`]), and are retried in rounds
//! ([`retried`]): the next round sends only those that failed for a passing reason.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow};
use async_nats::HeaderMap;
use async_nats::header;
use async_nats::jetstream::ErrorCode;
use async_nats::jetstream::context::{GetStreamErrorKind, PublishAckFuture, PublishErrorKind};
use bytes::Bytes;
use mgpu_nats::error::StateError;
use mgpu_protocol::subjects;
use serde::Serialize;

use super::session::Session;
use crate::errors::plain;

/// Requests awaiting their acknowledgement at once. async-nats holds one permit per
/// unawaited acknowledgement (5 000 by default) and blocks the next publish when they run out,
/// so "publish everything, then await" would hang past that many; a window keeps the pipeline
/// full without ever reaching the limit.
pub const WINDOW: usize = 512;

/// How long, and how often, requests that failed for a passing reason are tried again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// From the first try: past this, a failure is final.
    pub retry_for: Duration,
    /// Between two rounds.
    pub pause: Duration,
}

impl RetryPolicy {
    /// Long enough to outlast a leader election (about 5 s) on a loaded machine.
    pub const ELECTION: RetryPolicy = RetryPolicy {
        retry_for: Duration::from_secs(20),
        pause: Duration::from_millis(250),
    };
}

/// A request as it is published: its subject, its body encoded, and the message id JetStream
/// drops a second copy by.
#[derive(Clone, Debug)]
pub struct Request {
    subject: String,
    payload: Bytes,
    msg_id: String,
    /// Where the scheduler's verdict on a submission or a reservation request is awaited
    /// (`Mgpu-Verdict-To`).
    verdict_to: Option<String>,
    /// The oldest protocol that reads it (`Mgpu-Protocol`): [`version::BASELINE`] unless it
    /// says something newer.
    ///
    /// [`version::BASELINE`]: mgpu_protocol::version::BASELINE
    protocol: u32,
}

impl Request {
    /// `body` for `subject`, encoded, under `msg_id` (a submission's is its job id).
    pub fn new(
        subject: impl Into<String>,
        body: &impl Serialize,
        msg_id: impl Into<String>,
    ) -> Result<Request> {
        let payload = serde_json::to_vec(body)?;
        Ok(Request::encoded(subject, payload, msg_id))
    }

    /// A request made once, under a fresh message id: retrying it cannot apply it twice, and no
    /// later request (a hold after a release of the same job) is taken for a copy of it.
    pub fn fresh(subject: impl Into<String>, body: &impl Serialize) -> Result<Request> {
        Request::new(subject, body, uuid::Uuid::new_v4().simple().to_string())
    }

    /// A request whose body is already encoded (a submission, whose size is checked first).
    pub fn encoded(
        subject: impl Into<String>,
        payload: Vec<u8>,
        msg_id: impl Into<String>,
    ) -> Request {
        Request {
            subject: subject.into(),
            payload: payload.into(),
            msg_id: msg_id.into(),
            verdict_to: None,
            protocol: mgpu_protocol::version::BASELINE,
        }
    }

    /// The request, marked as needing `protocol` to be read (a scheduler of an older one
    /// refuses it, saying to upgrade, rather than acting on it wrongly).
    pub fn needing_protocol(mut self, protocol: u32) -> Request {
        self.protocol = protocol;
        self
    }

    /// The request, asking for the scheduler's verdict on `to` (see `client::verdict`).
    pub fn with_verdict_to(mut self, to: Option<&str>) -> Request {
        self.verdict_to = to.map(str::to_owned);
        self
    }

    /// The id JetStream drops a second copy by.
    pub fn msg_id(&self) -> &str {
        &self.msg_id
    }

    /// The headers of one try: a signature by `key` made now (see `mgpu_nats::signing`), the
    /// protocol version, and the message id.
    pub fn headers(&self, key: &nkeys::KeyPair) -> Result<HeaderMap> {
        let mut headers = HeaderMap::new();
        mgpu_nats::signing::sign(
            key,
            &self.subject,
            &self.payload,
            mgpu_protocol::now(),
            &mut headers,
        )
        .map_err(|e| anyhow!(e))?;
        // Read by the scheduler before anything else: another release's request is refused
        // with a sentence, never decoded wrongly.
        headers.insert(
            mgpu_protocol::version::HEADER,
            self.protocol.to_string().as_str(),
        );
        headers.insert(header::NATS_MESSAGE_ID, self.msg_id.as_str());
        if let Some(to) = &self.verdict_to {
            headers.insert(mgpu_protocol::submit::VERDICT_HEADER, to.as_str());
        }
        Ok(headers)
    }
}

/// A failed publish, with what JetStream said, so that a passing failure can be retried.
#[derive(Debug)]
pub struct Failure {
    kind: PublishErrorKind,
    error: anyhow::Error,
}

impl Failure {
    /// A failure JetStream reported, as advice ([`publish_error`]).
    pub fn new(kind: PublishErrorKind, err: &dyn std::fmt::Display) -> Failure {
        Failure {
            kind,
            error: publish_error(kind, err),
        }
    }

    /// A failure that is ours, not the server's (the request cannot be encoded or signed, or is
    /// too large): `kind` says which, and none of them passes by retrying.
    pub fn local(kind: PublishErrorKind) -> impl FnOnce(anyhow::Error) -> Failure {
        move |error| Failure { kind, error }
    }

    /// No stream answered, or it did not acknowledge: a leader election, or a server that is
    /// gone and a reconnect under way. Anything else (too big, refused) will not change.
    pub fn may_pass(&self) -> bool {
        matches!(
            self.kind,
            PublishErrorKind::StreamNotFound
                | PublishErrorKind::TimedOut
                | PublishErrorKind::BrokenPipe
        )
    }

    pub fn into_error(self) -> anyhow::Error {
        self.error
    }

    /// The same failure, for another request that waited on the same write (the tasks of an
    /// array whose environment is stored once).
    pub fn again(&self) -> Failure {
        Failure {
            kind: self.kind,
            error: anyhow!("{:#}", self.error),
        }
    }
}

/// What became of one try of one request.
pub type Tried = std::result::Result<(), Failure>;

/// The outcome of each request a round tried, by its index.
pub type Outcomes = Vec<(usize, Tried)>;

/// Publishes one request and waits for JetStream to store it, retried through leader
/// elections ([`RetryPolicy::ELECTION`]).
pub async fn publish(session: &Session, request: &Request) -> Result<()> {
    publish_all(session, std::slice::from_ref(request))
        .await
        .pop()
        .unwrap_or_else(|| Err(anyhow!("the request was not published")))
}

/// Publishes the requests pipelined and waits until JetStream stored each, retried through
/// leader elections. One result per request, in order. Where the server's permissions refuse
/// the publish (a viewer's key sending a request), every request fails at once with that
/// refusal, instead of after the acknowledgements' timeouts and the retries.
pub async fn publish_all(session: &Session, requests: &[Request]) -> Vec<Result<()>> {
    let mut subjects: Vec<&str> = requests.iter().map(|r| r.subject.as_str()).collect();
    subjects.dedup();
    tokio::select! {
        results = publish_all_stored(session, requests) => results,
        refusal = session.publish_refused(&subjects) => requests
            .iter()
            .map(|request| {
                let what = format!("publish to {}", request.subject);
                Err(refused_error(&what, &refusal))
            })
            .collect(),
    }
}

/// The error of a request the server's permissions refused: `what` the key may not do
/// ("publish to jobs.1a2b….cancel", "submit jobs"), and the server's words.
pub fn refused_error(what: &str, refusal: &str) -> anyhow::Error {
    anyhow!(
        "permission denied: the server does not let your key {what} ({}); a viewer's key reads \
         the cluster but sends no request",
        refusal.trim()
    )
}

async fn publish_all_stored(session: &Session, requests: &[Request]) -> Vec<Result<()>> {
    retried(
        requests.len(),
        RetryPolicy::ELECTION,
        async |indices: &[usize]| {
            pipelined(
                indices.iter().copied(),
                async |index: usize| match requests.get(index) {
                    Some(request) => send(session, request).await.map(Some),
                    None => Ok(None),
                },
            )
            .await
        },
        async || streams_exist(session).await,
    )
    .await
}

/// Signs and publishes one try of `request`; the acknowledgement to await.
pub async fn send(
    session: &Session,
    request: &Request,
) -> std::result::Result<PublishAckFuture, Failure> {
    let headers = request
        .headers(&session.key)
        .map_err(Failure::local(PublishErrorKind::Other))?;
    session
        .js
        .publish_with_headers(request.subject.clone(), headers, request.payload.clone())
        .await
        .map_err(|err| Failure::new(err.kind(), &err))
}

/// Waits for JetStream's acknowledgement of one publish.
pub async fn acknowledged(ack: PublishAckFuture) -> Tried {
    ack.await
        .map(|_| ())
        .map_err(|err| Failure::new(err.kind(), &err))
}

/// Publishes, for each of `indices` in order, what `publish` sends (None: nothing to store for
/// it, which counts as stored), with at most [`WINDOW`] acknowledgements awaited at once; the
/// outcome of each.
pub async fn pipelined(
    indices: impl IntoIterator<Item = usize>,
    mut publish: impl AsyncFnMut(usize) -> std::result::Result<Option<PublishAckFuture>, Failure>,
) -> Outcomes {
    let mut outcomes = Vec::new();
    let mut in_flight: VecDeque<(usize, PublishAckFuture)> = VecDeque::new();
    for index in indices {
        if in_flight.len() >= WINDOW
            && let Some((done, ack)) = in_flight.pop_front()
        {
            outcomes.push((done, acknowledged(ack).await));
        }
        match publish(index).await {
            Ok(Some(ack)) => in_flight.push_back((index, ack)),
            Ok(None) => outcomes.push((index, Ok(()))),
            Err(failure) => outcomes.push((index, Err(failure))),
        }
    }
    while let Some((done, ack)) = in_flight.pop_front() {
        outcomes.push((done, acknowledged(ack).await));
    }
    outcomes
}

/// Tries the requests `0..count` in rounds until each one is stored or failed for good:
/// `round` tries those at the indices it is given and returns each one's outcome; those that
/// failed for a passing reason ([`Failure::may_pass`]) go into the next round, after
/// `policy.pause`, while `policy.retry_for` has not passed since the start and `set_up` says
/// there is something to wait for. One result per request, in order.
pub async fn retried(
    count: usize,
    policy: RetryPolicy,
    mut round: impl AsyncFnMut(&[usize]) -> Outcomes,
    mut set_up: impl AsyncFnMut() -> bool,
) -> Vec<Result<()>> {
    let deadline = Instant::now() + policy.retry_for;
    let mut results: Vec<Result<()>> = (0..count).map(|_| Ok(())).collect();
    let mut pending: Vec<usize> = (0..count).collect();
    while !pending.is_empty() {
        let mut again = Vec::new();
        let mut settle = |index: usize, result: Result<()>| {
            if let Some(slot) = results.get_mut(index) {
                *slot = result;
            }
        };
        for (index, outcome) in round(&pending).await {
            match outcome {
                Ok(()) => settle(index, Ok(())),
                Err(failure) if failure.may_pass() => again.push((index, failure)),
                Err(failure) => settle(index, Err(failure.error)),
            }
        }
        let retry = !again.is_empty() && Instant::now() < deadline && set_up().await;
        pending = again.iter().map(|(index, _)| *index).collect();
        if !retry {
            for (index, failure) in again {
                settle(index, Err(failure.error));
            }
            break;
        }
        tokio::time::sleep(policy.pause).await;
    }
    results
}

/// False only when the server says mgpu's job bucket does not exist: then "no responders" means
/// mgpu was never set up here, and waiting would not help. A bucket that does not answer (its
/// leader is being elected too) may well exist.
pub async fn streams_exist(session: &Session) -> bool {
    match session.js.get_stream(subjects::JOBS_BUCKET_STREAM).await {
        Ok(_) => true,
        Err(err) => !matches!(
            err.kind(),
            GetStreamErrorKind::JetStream(js) if js.error_code() == ErrorCode::STREAM_NOT_FOUND
        ),
    }
}

/// Turns a JetStream publish failure into advice. "No responders" means no stream listens on
/// the subject: mgpu's streams were never created on this server.
pub fn publish_error(kind: PublishErrorKind, err: &dyn std::fmt::Display) -> anyhow::Error {
    match kind {
        PublishErrorKind::StreamNotFound => plain(StateError::NotSetUp),
        PublishErrorKind::TimedOut => anyhow!(
            "JetStream did not acknowledge the request in time: the server may be overloaded, \
             or your credentials may not allow this request"
        ),
        _ => anyhow!("JetStream refused the request: {err}"),
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::rc::Rc;

    use super::*;

    const QUICK: RetryPolicy = RetryPolicy {
        retry_for: Duration::from_secs(5),
        pause: Duration::from_millis(1),
    };

    fn failed(kind: PublishErrorKind) -> Tried {
        Err(Failure::new(kind, &"no"))
    }

    #[test]
    fn only_what_a_leader_election_explains_is_retried() {
        for kind in [
            PublishErrorKind::StreamNotFound,
            PublishErrorKind::TimedOut,
            PublishErrorKind::BrokenPipe,
        ] {
            assert!(Failure::new(kind, &"no").may_pass(), "{kind:?}");
        }
        for kind in [
            PublishErrorKind::MaxPayloadExceeded,
            PublishErrorKind::WrongLastMessageId,
            PublishErrorKind::WrongLastSequence,
            PublishErrorKind::MaxAckPending,
            PublishErrorKind::Other,
        ] {
            assert!(!Failure::new(kind, &"no").may_pass(), "{kind:?}");
        }
        // A request we could not even make is ours to fix, whatever it is filed under.
        let local = Failure::local(PublishErrorKind::Other)(anyhow!("cannot sign"));
        assert!(!local.may_pass());
        assert_eq!(local.into_error().to_string(), "cannot sign");
    }

    #[test]
    fn publish_failures_read_as_advice() {
        let says = |kind| publish_error(kind, &"maximum payload exceeded").to_string();
        assert_eq!(
            says(PublishErrorKind::StreamNotFound),
            StateError::NotSetUp.to_string()
        );
        assert!(says(PublishErrorKind::TimedOut).starts_with("JetStream did not acknowledge"));
        assert_eq!(
            says(PublishErrorKind::MaxPayloadExceeded),
            "JetStream refused the request: maximum payload exceeded"
        );
    }

    /// The indices of each round, as recorded by [`scripted`].
    type Rounds = Rc<RefCell<Vec<Vec<usize>>>>;

    /// A round that answers from a script: for each try of a request, the next of its failures
    /// (stored once its script runs out); the indices of every round are recorded.
    fn scripted(
        script: Vec<Vec<PublishErrorKind>>,
    ) -> (Rounds, impl AsyncFnMut(&[usize]) -> Outcomes) {
        let script = RefCell::new(script);
        let rounds = Rounds::default();
        let log = Rc::clone(&rounds);
        let round = async move |indices: &[usize]| {
            log.borrow_mut().push(indices.to_vec());
            let mut script = script.borrow_mut();
            indices
                .iter()
                .map(
                    |&index| match script.get_mut(index).filter(|s| !s.is_empty()) {
                        Some(kinds) => (index, failed(kinds.remove(0))),
                        None => (index, Ok(())),
                    },
                )
                .collect::<Outcomes>()
        };
        (rounds, round)
    }

    #[tokio::test]
    async fn passing_failures_are_tried_again_and_the_rest_are_final() {
        let (rounds, round) = scripted(vec![
            vec![],
            vec![PublishErrorKind::TimedOut, PublishErrorKind::StreamNotFound],
            vec![PublishErrorKind::MaxPayloadExceeded],
        ]);
        let results = retried(3, QUICK, round, async || true).await;
        assert_eq!(*rounds.borrow(), [vec![0, 1, 2], vec![1], vec![1]]);
        assert!(results[0].is_ok());
        assert!(results[1].is_ok());
        let err = results[2].as_ref().err().map(ToString::to_string);
        assert_eq!(err.as_deref(), Some("JetStream refused the request: no"));
    }

    #[tokio::test]
    async fn nothing_is_retried_where_mgpu_was_never_set_up() {
        let (rounds, round) = scripted(vec![vec![PublishErrorKind::StreamNotFound]]);
        let results = retried(1, QUICK, round, async || false).await;
        assert_eq!(rounds.borrow().len(), 1);
        let err = results[0].as_ref().err().map(ToString::to_string);
        assert_eq!(err, Some(StateError::NotSetUp.to_string()));
    }

    #[tokio::test]
    async fn retrying_ends_when_its_time_is_up() {
        let (rounds, round) = scripted(vec![vec![PublishErrorKind::TimedOut; 1000]]);
        let policy = RetryPolicy {
            retry_for: Duration::from_millis(30),
            pause: Duration::from_millis(5),
        };
        let started = Instant::now();
        let results = retried(1, policy, round, async || true).await;
        assert!(started.elapsed() < Duration::from_secs(2));
        let tries = rounds.borrow().len();
        assert!((2..100).contains(&tries), "{tries} tries");
        let err = results[0].as_ref().err().map(ToString::to_string);
        assert!(
            err.is_some_and(|e| e.starts_with("JetStream did not acknowledge")),
            "{results:?}"
        );
    }

    #[test]
    fn every_try_is_signed_and_carries_the_same_message_id() {
        let key = nkeys::KeyPair::new_user();
        let body = serde_json::json!({"user": "alice"});
        let request = Request::new("jobs.1a2b.cancel", &body, "m-1").ok();
        let request = request.as_ref();
        let first = request.and_then(|r| r.headers(&key).ok());
        let second = request.and_then(|r| r.headers(&key).ok());
        let id = |headers: &Option<HeaderMap>| {
            headers
                .as_ref()
                .and_then(|h| h.get(header::NATS_MESSAGE_ID))
                .map(|v| v.as_str().to_owned())
        };
        assert_eq!(id(&first).as_deref(), Some("m-1"));
        assert_eq!(id(&second), id(&first));
        let payload = serde_json::to_vec(&body).unwrap_or_default();
        let signer = mgpu_nats::signing::verify(
            first.as_ref(),
            "jobs.1a2b.cancel",
            &payload,
            mgpu_protocol::now(),
        )
        .map(|signed| signed.signer);
        assert_eq!(signer, Ok(key.public_key()));
        let version = first
            .as_ref()
            .and_then(|h| h.get(mgpu_protocol::version::HEADER))
            .map(|v| v.as_str().to_owned());
        assert_eq!(version, Some(mgpu_protocol::version::BASELINE.to_string()));
        // A request that needs a newer protocol says so, for an older scheduler to refuse.
        let newer = request
            .cloned()
            .map(|r| r.needing_protocol(mgpu_protocol::version::ARRAY_BATCHES))
            .and_then(|r| r.headers(&key).ok());
        let version = newer
            .as_ref()
            .and_then(|h| h.get(mgpu_protocol::version::HEADER))
            .map(|v| v.as_str().to_owned());
        assert_eq!(version, Some("2".to_owned()));
    }

    #[test]
    fn requests_made_once_get_ids_of_their_own() {
        let body = serde_json::json!({});
        let one = Request::fresh("jobs.x.hold", &body).map(|r| r.msg_id().to_owned());
        let two = Request::fresh("jobs.x.hold", &body).map(|r| r.msg_id().to_owned());
        assert!(one.is_ok() && two.is_ok());
        assert_ne!(one.ok(), two.ok());
    }
}
