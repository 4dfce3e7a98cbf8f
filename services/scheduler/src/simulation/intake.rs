//! The simulator's request and report intake, kept to what `crate::driver`'s intake does:
//! requests published and replayed, delivered in stream order and again after the
//! acknowledgement wait; each through the gate (its nonce kept; a batch's tasks each under a
//! token of their own), the unknown dependencies looked up in history, handed over in steps,
//! then one pass; a batch's message acknowledged once every task in it is, and delivered
//! again when one of them was let go.

use std::collections::{BTreeMap, BTreeSet};

use mgpu_protocol::ids::JobId;
use mgpu_protocol::job::{JobSpec, JobState};
use mgpu_protocol::request::Request;

use super::gate::StoredRequest;
use super::world::{ACK_WAIT_MS, Event, Source, World};
use crate::lifecycle::StreamOrder;
use crate::machine::messages::{
    Admitted, Identity, Input, Refused, Step, Token, steps, submitted_specs,
};
use crate::metrics::RefusalReason;

impl World {
    /// As the driver does before taking submissions (and on starting): the dependencies the
    /// machine does not know looked up in history, and how those ended handed back.
    pub(super) fn learn_archived<'a>(&mut self, specs: impl IntoIterator<Item = &'a JobSpec>) {
        let Some(scheduler) = self.scheduler.as_ref() else {
            return;
        };
        let found: Vec<(JobId, JobState)> = scheduler
            .machine
            .unknown_dependencies(specs)
            .into_iter()
            .filter_map(|id| {
                let ended = self.store.history.get(&id)?.state.clone();
                Some((id, ended))
            })
            .collect();
        if !found.is_empty() {
            self.feed_only(Input::HistoryStates(found));
        }
    }

    /// Publishes a request: JetStream stores it, the scheduler's consumer delivers it.
    pub fn publish_request(&mut self, identity: Identity, request: Request) {
        self.publish_batch(identity, request, Vec::new());
    }

    /// Publishes `first` and the further tasks of its batch in one message (as `mgpu submit
    /// --array` sends an array's tasks).
    pub fn publish_batch(&mut self, identity: Identity, first: Request, batch: Vec<Request>) {
        self.next_nonce += 1;
        let stored = StoredRequest {
            identity,
            request: first,
            batch,
            stored_at: self.wall(),
            nonce: format!("nonce-{}", self.next_nonce),
            signed_at: self.wall(),
            copy_of: None,
        };
        self.store_request(stored);
    }

    /// Someone publishes a copy of the request stored at `index` again (a replay).
    pub fn replay_request(&mut self, index: usize) -> bool {
        let Some(original) = self.requests.messages().nth(index).cloned() else {
            return false;
        };
        let copy = StoredRequest {
            stored_at: self.wall(),
            copy_of: Some(index),
            ..original
        };
        self.store_request(copy);
        true
    }

    pub(super) fn store_request(&mut self, stored: StoredRequest) {
        let delay = self.rng.between(1, 50);
        self.requests.publish(stored, self.now + delay);
        self.at(delay, Event::Pump);
    }

    pub(super) fn redeliver_later(&mut self, source: Source, index: usize) {
        let at = self.now + ACK_WAIT_MS;
        match source {
            Source::Report => self.reports.redeliver_at(index, at),
            Source::Request => self.requests.redeliver_at(index, at),
        }
        self.last_at(at, Event::Pump);
    }

    /// Delivers what the streams have ready: requests as the driver would (admitted, in
    /// steps, then a pass), then reports one at a time.
    pub fn pump(&mut self) {
        if self.scheduler.is_none() {
            return;
        }
        let ready = self.requests.take_ready(self.now, 512);
        if !ready.is_empty() {
            let admitted: Vec<Admitted> = ready
                .into_iter()
                .flat_map(|(index, stored)| self.through_the_gate(index, stored))
                .collect();
            self.learn_archived(submitted_specs(&admitted));
            for step in steps(admitted, |a| &a.request) {
                let input = match step {
                    Step::Record(batch) => Input::Submissions(batch),
                    Step::CarryOut(one) => Input::Request(Box::new(one)),
                };
                self.feed_only(input);
            }
            self.run_pass();
            self.release_unacked();
        }
        self.pump_reports();
    }

    /// The gate's nonce step: the request admitted (its nonce kept in the store; a batch's
    /// tasks each under a token of their own), or refused (the machine hears of it, and
    /// acknowledges it).
    pub(super) fn through_the_gate(
        &mut self,
        index: usize,
        stored: StoredRequest,
    ) -> Vec<Admitted> {
        let sequence = index as u64 + 1;
        let (verdict, broken) = self.gate.check(&stored, sequence);
        if let Some(broken) = broken {
            self.ledger.broken.push(broken);
        }
        match verdict {
            Ok(()) => {
                let kept = (stored.nonce.clone(), stored.signed_at, sequence);
                self.store.nonces.push(kept);
                let verdict_to = matches!(stored.request, Request::Submit(_) | Request::Reserve(_))
                    .then(|| format!("_INBOX.{}.verdict", stored.identity.key));
                let order = Some(StreamOrder {
                    sequence,
                    redelivered: self.requests.redelivered(index),
                    stored_at: stored.stored_at,
                });
                std::iter::once(stored.request)
                    .chain(stored.batch)
                    .map(|request| Admitted {
                        token: self.hold(Source::Request, index),
                        identity: stored.identity.clone(),
                        order,
                        verdict_to: verdict_to.clone(),
                        request,
                    })
                    .collect()
            }
            Err(err) => {
                let token = self.hold(Source::Request, index);
                self.note(format!("the gate refuses message {sequence}: {err}"));
                let refused = Refused {
                    token,
                    action: stored.request.action(),
                    about: stored.request.job().cloned(),
                    key: Some(stored.identity.key),
                    why: RefusalReason::of_signature(&err),
                    reason: err.to_string(),
                };
                self.feed_only(Input::Refused(refused));
                Vec::new()
            }
        }
    }

    pub(super) fn pump_reports(&mut self) {
        while self.scheduler.is_some() {
            let Some((index, report)) = self.reports.take_ready(self.now, 1).pop() else {
                return;
            };
            let token = self.hold(Source::Report, index);
            self.feed(Input::Report { token, report });
            self.release_unacked();
        }
    }

    pub(super) fn hold(&mut self, source: Source, index: usize) -> Token {
        let Some(scheduler) = self.scheduler.as_mut() else {
            return 0;
        };
        let token = scheduler.next_token;
        scheduler.next_token += 1;
        scheduler.held.insert(token, (source, index));
        token
    }

    /// Messages handled but not acknowledged are delivered again after the ack wait.
    pub(super) fn release_unacked(&mut self) {
        let Some(scheduler) = self.scheduler.as_mut() else {
            return;
        };
        let (kept, held): (BTreeMap<_, _>, BTreeMap<_, _>) = std::mem::take(&mut scheduler.held)
            .into_iter()
            .partition(|(token, _)| scheduler.machine.keeps_token(*token));
        scheduler.held = kept;
        let released: BTreeSet<(Source, usize)> = held.into_values().collect();
        for (source, index) in released {
            // A batch whose other tasks are still kept comes again once they are settled.
            if self.other_parts_held(source, index) {
                if let Some(scheduler) = self.scheduler.as_mut() {
                    scheduler.released_batches.insert(index);
                }
            } else {
                self.redeliver_later(source, index);
            }
        }
    }

    /// Whether a token is still held for the message at `index` of `source` (a batch's
    /// other tasks).
    pub(super) fn other_parts_held(&self, source: Source, index: usize) -> bool {
        self.scheduler
            .as_ref()
            .is_some_and(|s| s.held.values().any(|held| *held == (source, index)))
    }
}
