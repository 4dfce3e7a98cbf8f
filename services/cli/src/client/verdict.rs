//! The scheduler's verdicts on requests: before sending, the CLI listens on a subject under
//! its own inbox and names it in each request (`Mgpu-Verdict-To`); the scheduler says there
//! what came of each. For a submission ([`SubmitVerdict`]) that is, as it takes the job in,
//! whether it will run it or why never: a job the scheduler refuses is reported by
//! `mgpu submit` itself, as `sbatch` does. For a booking or cancel of a reservation
//! ([`ReservationVerdict`]) it is whether it was stored, or why not (`mgpu reserve`).
//!
//! The verdict costs one message, sent as soon as the record is stored (what it says is what
//! the record says). Where no scheduler runs, or verdicts stop coming for a few seconds (a
//! scheduler busy through a NATS leader election), the requests are stored all the same and
//! the wait ends: they are reported as not checked yet.

use std::collections::{HashMap, HashSet};
use std::hash::Hash;
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow};
use futures::StreamExt;
use mgpu_protocol::ids::JobId;
use mgpu_protocol::principals::inbox_prefix;
use mgpu_protocol::reservation::ReservationVerdict;
use mgpu_protocol::submit::SubmitVerdict;
use serde::de::DeserializeOwned;

use super::session::Session;
use crate::console;

/// How long the first verdict is awaited before asking whether a scheduler runs at all.
const FIRST_WITHIN: Duration = Duration::from_secs(2);
/// How long verdicts may stop coming before the rest are left unchecked: a scheduler busy
/// through a NATS leader election must not hold a submission for the election's length (the
/// jobs are stored; their records say the verdict later).
const STALL_WITHIN: Duration = Duration::from_secs(5);
/// How long verdicts are awaited at most, however many jobs were sent and however steadily
/// they come.
const ALL_WITHIN: Duration = Duration::from_secs(300);
/// How often a long wait says how far it got.
const PROGRESS_EVERY: Duration = Duration::from_secs(3);

/// A verdict as the scheduler sends it: about one thing asked, named by its key.
pub trait Answer: DeserializeOwned {
    type Key: Clone + Eq + Hash;
    /// What it is about: the job, or the reservation.
    fn key(&self) -> &Self::Key;
}

impl Answer for SubmitVerdict {
    type Key = JobId;
    fn key(&self) -> &JobId {
        &self.job
    }
}

impl Answer for ReservationVerdict {
    type Key = String;
    fn key(&self) -> &String {
        &self.name
    }
}

/// What the scheduler said about one job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Queued,
    /// It will never run, and why.
    Refused(String),
    /// No scheduler answered in time (none runs, or it is busy): stored, not checked yet.
    Unchecked,
}

/// A subscription for the verdicts of the requests about to be sent.
pub struct Verdicts {
    subject: String,
    subscriber: async_nats::Subscriber,
}

impl Verdicts {
    /// Listens, before anything is sent.
    pub async fn listen(session: &Session) -> Result<Verdicts> {
        let subject = format!(
            "{}.verdict.{}",
            inbox_prefix(&session.key.public_key()),
            uuid::Uuid::new_v4().simple()
        );
        // No flush: the subscription goes out on the connection before the submissions, and
        // the server takes a client's messages in order, so it is in place before any
        // verdict can come (a round trip saved on every submit).
        let subscriber = session
            .client
            .subscribe(subject.clone())
            .await
            .map_err(|e| anyhow!("listening for the scheduler's verdicts: {e}"))?;
        Ok(Verdicts {
            subject,
            subscriber,
        })
    }

    /// Where the requests ask for their verdict.
    pub fn subject(&self) -> &str {
        &self.subject
    }

    /// The verdicts on `ids` (the jobs stored), each `Unchecked` where none came in time.
    pub async fn collect(self, session: &Session, ids: &[JobId]) -> HashMap<JobId, Verdict> {
        let total = ids.len();
        let progress = |checked: usize| {
            format!("waiting for the scheduler to check the jobs: {checked} of {total} checked")
        };
        let mut heard = self.answers::<SubmitVerdict>(session, ids, progress).await;
        ids.iter()
            .map(|id| {
                let verdict = match heard.remove(id) {
                    Some(SubmitVerdict {
                        refused: Some(why), ..
                    }) => Verdict::Refused(why),
                    Some(_) => Verdict::Queued,
                    None => Verdict::Unchecked,
                };
                (id.clone(), verdict)
            })
            .collect()
    }

    /// The scheduler's answers about `keys` (the requests stored), by key; those it did not
    /// answer in time are missing. A long wait says on stderr how far it got (`progress`,
    /// given how many were answered).
    pub async fn answers<A: Answer>(
        mut self,
        session: &Session,
        keys: &[A::Key],
        progress: impl Fn(usize) -> String,
    ) -> HashMap<A::Key, A> {
        let mut waiting: HashSet<&A::Key> = keys.iter().collect();
        let mut said = HashMap::with_capacity(keys.len());
        let started = Instant::now();
        let mut last_heard = started;
        let mut asked_for_scheduler = false;
        let mut progress_at = started + PROGRESS_EVERY;
        while !waiting.is_empty()
            && started.elapsed() < ALL_WITHIN
            && last_heard.elapsed() < STALL_WITHIN
        {
            let wait = match asked_for_scheduler {
                true => PROGRESS_EVERY.min(STALL_WITHIN.saturating_sub(last_heard.elapsed())),
                false => FIRST_WITHIN,
            };
            match tokio::time::timeout(wait, self.subscriber.next()).await {
                Ok(Some(message)) => {
                    let Ok(answer) = serde_json::from_slice::<A>(&message.payload) else {
                        continue;
                    };
                    if waiting.remove(answer.key()) {
                        last_heard = Instant::now();
                        said.insert(answer.key().clone(), answer);
                    }
                }
                Ok(None) => break,
                Err(_) if !asked_for_scheduler && said.is_empty() => {
                    asked_for_scheduler = true;
                    if !scheduler_runs(session).await {
                        break;
                    }
                }
                Err(_) => {}
            }
            if Instant::now() >= progress_at {
                progress_at = Instant::now() + PROGRESS_EVERY;
                console::stderr_line(&progress(said.len()));
            }
        }
        said
    }
}

/// Whether an active scheduler answers its micro service's ping.
async fn scheduler_runs(session: &Session) -> bool {
    let subject = format!("$SRV.PING.{}", mgpu_protocol::subjects::SCHEDULER_SERVICE);
    let ping = session.client.request(subject, bytes::Bytes::new());
    matches!(
        tokio::time::timeout(Duration::from_secs(1), ping).await,
        Ok(Ok(_))
    )
}
