//! What makes this replica exclusive and visible, apart from the event loop:
//!
//! - **The lease.** The active scheduler holds the key `scheduler` in the `mgpu-leader` KV
//!   bucket, whose entries expire after a few seconds. It renews the lease every second with
//!   compare-and-set; a standby tries to create the key every half second and becomes active
//!   as soon as the key has expired. A replica that fails to renew because someone else holds
//!   the key now stops acting at once; one whose key merely expired while NATS could not
//!   answer (a server lost, the bucket electing a leader) takes it again if nobody else did,
//!   and goes on. Each renewal tells the event loop until when it may act
//!   ([`crate::lease`]); a replica that was stopped past that moment writes nothing until a
//!   renewal succeeds again or it learns another replica holds the key ([`LeaseGate`]).
//! - **The status micro service.** `$SRV.PING` / `$SRV.INFO` answer with `mgpu-scheduler`,
//!   `mgpu.scheduler.status` with the pass statistics ([`crate::status`]), `$SRV.STATS` with
//!   how many status requests were answered, refused and how long they took; registered
//!   while this replica acts.
//! - **The metrics endpoint** (`--metrics-listen`): the tally counted as things happen, and
//!   the gauges asked of the event loop at each scrape (only the active scheduler has the
//!   tables, and they can be large, so they are not copied after every pass).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use anyhow::{Result, anyhow};
use async_nats::jetstream::{self, kv};
use async_nats::service::ServiceExt;
use async_nats::service::error::Error as ServiceError;
use bytes::Bytes;
use futures::StreamExt;
use tokio::sync::{mpsc, oneshot, watch};

use mgpu_protocol::subjects;

use crate::lease::{self, may_act};
use crate::metrics::{Gauges, Tally, render};
use crate::status::Status;

/// How long a scrape waits for the event loop to count the gauges: a pass over a huge queue
/// may be under way. After that the scrape is answered without them.
const GAUGES_WITHIN: Duration = Duration::from_secs(5);

const RENEW_EVERY: Duration = Duration::from_secs(1);
const RETRY_EVERY: Duration = Duration::from_millis(500);

/// A held lease. Dropping it stops renewal (the key then expires).
pub struct Lease {
    /// Turns true when the lease is lost.
    pub lost: watch::Receiver<bool>,
    /// Until when the last confirmed renewal lets this replica act.
    acts_until: watch::Receiver<Instant>,
    renewer: tokio::task::JoinHandle<()>,
}

impl Lease {
    /// What the event loop checks before each write, acknowledgement or assignment.
    pub fn gate(&self) -> LeaseGate {
        LeaseGate {
            acts_until: self.acts_until.clone(),
            lost: self.lost.clone(),
        }
    }
}

/// Whether this replica may act now: its last confirmed renewal still covers this moment
/// ([`crate::lease::may_act`]).
#[derive(Clone)]
pub struct LeaseGate {
    acts_until: watch::Receiver<Instant>,
    lost: watch::Receiver<bool>,
}

/// How often a replica waiting for its lease to be confirmed says so.
const STILL_WAITING_EVERY: Duration = Duration::from_secs(5);

impl LeaseGate {
    /// Turns true when the lease is lost.
    pub fn lost(&self) -> watch::Receiver<bool> {
        self.lost.clone()
    }

    /// Whether the lease is confirmed now (not waiting).
    pub fn current(&self) -> bool {
        !*self.lost.borrow() && may_act(*self.acts_until.borrow(), Instant::now())
    }

    /// True at once while the lease is confirmed; otherwise waits until a renewal confirms it
    /// again (true) or the lease is lost (false). Only a replica that was stopped, or could
    /// not reach NATS, for longer than [`crate::lease::ACTS_FOR`] ever waits here.
    pub async fn confirmed(&mut self) -> bool {
        let mut announced = false;
        loop {
            if *self.lost.borrow() {
                return false;
            }
            if may_act(*self.acts_until.borrow(), Instant::now()) {
                if announced {
                    tracing::info!("the scheduler lease is confirmed again: acting");
                }
                return true;
            }
            if !announced {
                tracing::warn!(
                    "the scheduler lease was last confirmed too long ago (this replica was stalled or cut off): acting again only once a renewal succeeds"
                );
                announced = true;
            }
            tokio::select! {
                changed = self.acts_until.changed() => if changed.is_err() { return false },
                changed = self.lost.changed() => if changed.is_err() { return false },
                () = tokio::time::sleep(STILL_WAITING_EVERY) => {
                    tracing::warn!("still waiting for the scheduler lease to be confirmed");
                }
            }
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.renewer.abort();
    }
}

/// Waits until this replica holds the lease (or `shutdown` turns true: None).
pub async fn acquire(
    js: &jetstream::Context,
    holder: &str,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<Option<Lease>> {
    let bucket = js
        .get_key_value(subjects::LEADER_BUCKET)
        .await
        .map_err(|e| anyhow!("opening the leader bucket: {e}"))?;
    let mut announced = false;
    loop {
        let sent = Instant::now();
        match bucket
            .create(subjects::LEADER_KEY, holder.to_owned().into())
            .await
        {
            Ok(revision) => {
                tracing::info!(holder, "holding the scheduler lease: active");
                let renewing = start_renewing(bucket, holder.to_owned(), (revision, sent));
                return Ok(Some(renewing));
            }
            Err(err) if err.kind() == kv::CreateErrorKind::AlreadyExists => {
                if !announced {
                    let current = bucket
                        .get(subjects::LEADER_KEY)
                        .await
                        .ok()
                        .flatten()
                        .map(|v| String::from_utf8_lossy(&v).into_owned())
                        .unwrap_or_default();
                    tracing::info!(active = %current, "another scheduler is active: standing by");
                    announced = true;
                }
            }
            Err(err) => tracing::warn!(%err, "trying to take the scheduler lease"),
        }
        tokio::select! {
            _ = shutdown.changed() => return Ok(None),
            _ = tokio::time::sleep(RETRY_EVERY) => {}
        }
    }
}

/// Renews the lease taken at `revision` by a request sent at `sent`, every second.
fn start_renewing(bucket: kv::Store, holder: String, (revision, sent): (u64, Instant)) -> Lease {
    let (lost_tx, lost) = watch::channel(false);
    let (confirmed, acts_until) = watch::channel(lease::acts_until(sent));
    let mut revision = revision;
    let renewer = tokio::spawn(async move {
        loop {
            tokio::time::sleep(RENEW_EVERY).await;
            // Whatever answer comes, the key was stored no earlier than this.
            let sent = Instant::now();
            match bucket
                .update(subjects::LEADER_KEY, holder.clone().into(), revision)
                .await
            {
                Ok(next) => {
                    revision = next;
                    confirmed.send_replace(lease::acts_until(sent));
                }
                Err(err) if err.kind() == kv::UpdateErrorKind::WrongLastRevision => {
                    match take_again(&bucket, &holder).await {
                        Retaken::Held(next) => {
                            revision = next;
                            confirmed.send_replace(lease::acts_until(sent));
                        }
                        // Stored by an earlier renewal whose answer was lost, at a moment not
                        // known: the next renewal, at this revision, confirms the lease.
                        Retaken::Found(next) => revision = next,
                        Retaken::ByAnother => {
                            tracing::error!("the scheduler lease was taken over: stepping down");
                            let _ = lost_tx.send(true);
                            return;
                        }
                        // The next renewal finds out.
                        Retaken::Unknown => {}
                    }
                }
                // A passing NATS error: try again; the lease outlives a few missed renewals.
                Err(err) => tracing::warn!(%err, "renewing the scheduler lease"),
            }
        }
    });
    Lease {
        lost,
        acts_until,
        renewer,
    }
}

/// Who holds the lease after a renewal found the key changed or gone.
enum Retaken {
    /// This replica, at this revision, created just now.
    Held(u64),
    /// This replica, at this revision, written by an earlier renewal whose answer was lost.
    Found(u64),
    /// Another replica.
    ByAnother,
    /// NATS did not answer.
    Unknown,
}

/// After a renewal found the key changed or gone. Gone: it expired while NATS could not renew
/// it (the bucket's stream electing a leader takes longer than the lease); creating it again
/// succeeds only if no other replica has taken it since, and then this one simply goes on,
/// where stepping down would restart the scheduler for nothing. Changed but still naming this
/// replica: a renewal landed and its answer was lost.
async fn take_again(bucket: &kv::Store, holder: &str) -> Retaken {
    match bucket
        .create(subjects::LEADER_KEY, holder.to_owned().into())
        .await
    {
        Ok(revision) => {
            tracing::warn!(
                "the scheduler lease expired while it could not be renewed; no other replica had taken it: holding it again"
            );
            return Retaken::Held(revision);
        }
        Err(err) if err.kind() == kv::CreateErrorKind::AlreadyExists => {}
        Err(err) => {
            tracing::warn!(%err, "taking the expired scheduler lease again");
            return Retaken::Unknown;
        }
    }
    match bucket.entry(subjects::LEADER_KEY).await {
        Ok(Some(entry))
            if entry.operation == kv::Operation::Put
                && entry.value.as_ref() == holder.as_bytes() =>
        {
            Retaken::Found(entry.revision)
        }
        Ok(Some(entry)) if entry.operation == kv::Operation::Put => Retaken::ByAnother,
        // Gone again in between: the next renewal finds out.
        Ok(_) => Retaken::Unknown,
        Err(err) => {
            tracing::warn!(%err, "reading the scheduler lease");
            Retaken::Unknown
        }
    }
}

/// Registers the service and answers status requests until `term_over` resolves (the sender
/// is dropped when this replica stops acting; a replica that acts again registers anew),
/// then deregisters, so that `$SRV.PING`, `$SRV.INFO` and `$SRV.STATS` list active
/// schedulers only.
///
/// Each request is answered through the endpoint's own request object, refused ones with an
/// error: that is what makes `$SRV.STATS` count requests, errors and processing time.
pub(crate) async fn serve_status(
    client: async_nats::Client,
    status: watch::Receiver<Status>,
    why_asks: mpsc::Sender<WhyAsk>,
    term_over: oneshot::Receiver<()>,
) -> Result<()> {
    let service = client
        .service_builder()
        .description("mgpu scheduler: places queued GPU jobs on nodes")
        .start(subjects::SCHEDULER_SERVICE, env!("CARGO_PKG_VERSION"))
        .await
        .map_err(|e| anyhow!("registering the micro service: {e}"))?;
    let mut endpoint = service
        .endpoint(subjects::SCHEDULER_STATUS)
        .await
        .map_err(|e| anyhow!("adding the status endpoint: {e}"))?;
    let mut why = service
        .endpoint(subjects::SCHEDULER_WHY)
        .await
        .map_err(|e| anyhow!("adding the why endpoint: {e}"))?;
    tokio::pin!(term_over);
    loop {
        let request = tokio::select! {
            _ = &mut term_over => break,
            request = why.next() => match request {
                Some(request) => {
                    // Answered on its own task: the event loop may be in a long pass.
                    tokio::spawn(answer_why(request, why_asks.clone()));
                    continue;
                }
                None => break,
            },
            request = endpoint.next() => match request {
                Some(request) => request,
                None => break,
            },
        };
        let answer = crate::status::answer(&request.message.payload, &status.borrow())
            .map(Bytes::from)
            .map_err(|(status, code)| ServiceError { status, code });
        if let Err(err) = &answer {
            tracing::debug!(%err, "refusing a status request");
        }
        if let Err(err) = request.respond(answer).await {
            tracing::warn!(%err, "answering a status request");
        }
    }
    service
        .stop()
        .await
        .map_err(|e| anyhow!("deregistering the micro service: {e}"))
}

/// A `mgpu why` question for the event loop: the job, who asks (a verified public key), and
/// where the answer goes.
pub struct WhyAsk {
    pub job: mgpu_protocol::ids::JobId,
    pub asker: String,
    pub reply: oneshot::Sender<std::result::Result<mgpu_protocol::why::WhyAnswer, String>>,
}

/// How long a `mgpu why` waits for the event loop (a pass over a huge queue may be under way).
const WHY_WITHIN: Duration = Duration::from_secs(10);

/// Answers one `mgpu why` request: its signature checked (who asks decides what may be
/// asked), the question handed to the event loop, its answer or refusal sent back.
async fn answer_why(request: async_nats::service::Request, asks: mpsc::Sender<WhyAsk>) {
    let message = &request.message;
    let refuse = |status: String, code: usize| Err(ServiceError { status, code });
    let answer = match mgpu_nats::signing::verify(
        message.headers.as_ref(),
        subjects::SCHEDULER_WHY,
        &message.payload,
        mgpu_protocol::now(),
    ) {
        Err(err) => refuse(format!("refused: {err}"), 401),
        Ok(signed) => {
            match serde_json::from_slice::<mgpu_protocol::why::WhyRequest>(&message.payload) {
                Err(err) => refuse(format!("a why request is {{\"job\": ID}}: {err}"), 400),
                Ok(asked) => {
                    let (reply, answered) = oneshot::channel();
                    let ask = WhyAsk {
                        job: asked.job,
                        asker: signed.signer,
                        reply,
                    };
                    let waited = tokio::time::timeout(WHY_WITHIN, async {
                        asks.send(ask).await.ok()?;
                        answered.await.ok()
                    })
                    .await;
                    match waited {
                        Ok(Some(Ok(why))) => serde_json::to_vec(&why)
                            .map(Bytes::from)
                            .or_else(|err| refuse(format!("encoding the answer: {err}"), 500)),
                        Ok(Some(Err(refusal))) => refuse(refusal, 403),
                        _ => refuse(
                            "the scheduler is busy or stopping; ask again".to_owned(),
                            503,
                        ),
                    }
                }
            }
        }
    };
    if let Err(err) = request.respond(answer).await {
        tracing::warn!(%err, "answering a why request");
    }
}

/// Where the event loop hears a scrape's request for the gauges.
pub(crate) type GaugeRequests = mpsc::Receiver<oneshot::Sender<Gauges>>;

/// The scheduler's metrics, shared by the metrics endpoint and the active scheduler.
#[derive(Default)]
pub struct SchedulerMetrics {
    /// Whether this replica holds the lease and acts.
    leader: AtomicBool,
    tally: Mutex<Tally>,
    /// Asks the active scheduler's event loop for the gauges; None while standing by.
    gauges: Mutex<Option<mpsc::Sender<oneshot::Sender<Gauges>>>>,
}

/// A leadership term: this replica acts until it is dropped.
pub(crate) struct Term {
    metrics: Arc<SchedulerMetrics>,
}

impl Drop for Term {
    fn drop(&mut self) {
        self.metrics.leader.store(false, Ordering::SeqCst);
        *lock(&self.metrics.gauges) = None;
    }
}

impl SchedulerMetrics {
    /// The counters and histograms, to count something.
    pub(crate) fn tally(&self) -> MutexGuard<'_, Tally> {
        lock(&self.tally)
    }

    /// This replica starts acting: it is the leader until the [`Term`] is dropped, and its
    /// event loop answers the gauge requests that arrive on the receiver.
    pub(crate) fn begin_term(self: &Arc<Self>) -> (Term, GaugeRequests) {
        let (asks, requests) = mpsc::channel(4);
        *lock(&self.gauges) = Some(asks);
        self.leader.store(true, Ordering::SeqCst);
        let term = Term {
            metrics: Arc::clone(self),
        };
        (term, requests)
    }

    /// The exposition as of now (what a scrape gets).
    pub async fn render(&self) -> String {
        let leader = self.leader.load(Ordering::SeqCst);
        let asks = lock(&self.gauges).clone();
        let gauges = match asks {
            Some(asks) => tokio::time::timeout(GAUGES_WITHIN, ask_gauges(asks))
                .await
                .ok()
                .flatten(),
            None => None,
        };
        if leader && gauges.is_none() {
            tracing::debug!("a scrape got no gauges: the event loop was busy or stopping");
        }
        let tally = self.tally().clone();
        render(leader, gauges.as_ref(), &tally)
    }
}

async fn ask_gauges(asks: mpsc::Sender<oneshot::Sender<Gauges>>) -> Option<Gauges> {
    let (reply, answer) = oneshot::channel();
    asks.send(reply).await.ok()?;
    answer.await.ok()
}

/// The lock, also when a panic poisoned it: every update leaves the tally consistent.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Listens on `--metrics-listen` (a taken address stops the scheduler at once) and serves
/// the metrics from then on, through standby and leadership alike.
pub async fn serve_metrics(
    listen: Option<std::net::SocketAddr>,
    metrics: &std::sync::Arc<SchedulerMetrics>,
) -> anyhow::Result<()> {
    let Some(address) = listen else {
        return Ok(());
    };
    let listener = mgpu_metrics::http::bind(address)
        .await
        .map_err(|err| anyhow::anyhow!("--metrics-listen {address}: {err}"))?;
    tracing::info!(%address, "serving Prometheus metrics on /metrics");
    let metrics = std::sync::Arc::clone(metrics);
    tokio::spawn(mgpu_metrics::http::serve(listener, move || {
        let metrics = std::sync::Arc::clone(&metrics);
        async move { metrics.render().await }
    }));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_scrape_asks_the_event_loop_while_a_term_lasts() {
        let metrics = Arc::new(SchedulerMetrics::default());
        let (term, mut requests) = metrics.begin_term();
        let answering = tokio::spawn(async move {
            while let Some(reply) = requests.recv().await {
                let mut gauges = Gauges::default();
                gauges.nodes.insert("online", 7);
                let _ = reply.send(gauges);
            }
        });
        let text = metrics.render().await;
        assert!(text.contains("mgpu_scheduler_leader 1\n"), "{text}");
        assert!(text.contains("mgpu_nodes{state=\"online\"} 7\n"), "{text}");
        drop(term);
        let text = metrics.render().await;
        assert!(text.contains("mgpu_scheduler_leader 0\n"), "{text}");
        assert!(!text.contains("mgpu_nodes"), "{text}");
        answering.abort();
    }
}
