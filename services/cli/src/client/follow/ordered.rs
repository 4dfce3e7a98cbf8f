//! A job's output messages in the order its processes wrote them. The agent numbers each
//! process's chunks (`Mgpu-Seq`, per attempt and rank) and offers a chunk JetStream did not
//! confirm again, so a chunk stored on its second offer may come after chunks numbered after
//! it, and one whose confirmation alone was lost may be stored twice. [`Ordered`] holds a
//! chunk back until those before it came, and drops a second copy. It lets the held chunks go,
//! in order, when their process's end-of-output marker comes (the agent sends it once every
//! chunk was stored or given up on, so nothing more can come), and when the reader caught up
//! with what was stored (a gap then is a chunk still on its way or lost: what came is shown,
//! and the missing chunk still is when it comes). Messages without a number (an older agent)
//! pass at once.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::pin::Pin;
use std::task::{Context, Poll};

use async_nats::jetstream;
use futures::{Stream, StreamExt};
use mgpu_protocol::output;

/// One output message as an ordered consumer yields it.
pub type Received = Result<jetstream::Message, jetstream::consumer::pull::OrderedError>;

/// A job's output messages, as they come from one ordered consumer or several merged.
pub type OutputMessages = futures::stream::BoxStream<'static, Received>;

/// One process's numbering: the next number due, the chunks held back, and the numbers let go
/// past without their chunk.
struct Process<T> {
    next: u64,
    held: BTreeMap<u64, T>,
    missing: BTreeSet<u64>,
}

/// Where a chunk belongs: its process (attempt, rank), its number, and whether it is the
/// process's end-of-output marker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Place {
    process: (u32, u32),
    seq: u64,
    end: bool,
}

/// The reordering itself, over any items (the tests use plain ones).
struct Reorder<T> {
    ready: VecDeque<T>,
    processes: HashMap<(u32, u32), Process<T>>,
}

impl<T> Reorder<T> {
    fn new() -> Self {
        Reorder {
            ready: VecDeque::new(),
            processes: HashMap::new(),
        }
    }

    /// Takes an item (at `place`, None: unnumbered); `caught_up`: nothing stored is left
    /// unread after it.
    fn take(&mut self, item: T, place: Option<Place>, caught_up: bool) {
        match place {
            None => self.ready.push_back(item),
            Some(Place { process, seq, end }) => {
                let state = self.processes.entry(process).or_insert_with(|| Process {
                    next: 1,
                    held: BTreeMap::new(),
                    missing: BTreeSet::new(),
                });
                if seq == state.next {
                    self.ready.push_back(item);
                    state.next += 1;
                    while let Some(held) = state.held.remove(&state.next) {
                        self.ready.push_back(held);
                        state.next += 1;
                    }
                } else if seq > state.next {
                    state.held.insert(seq, item);
                    if end {
                        release(state, &mut self.ready);
                    }
                } else if state.missing.remove(&seq) {
                    // Let go past before, it came at last: shown late rather than never.
                    self.ready.push_back(item);
                }
                // Otherwise a second copy of a chunk shown already.
            }
        }
        if caught_up {
            self.release_all();
        }
    }

    fn release_all(&mut self) {
        for state in self.processes.values_mut() {
            release(state, &mut self.ready);
        }
    }
}

/// Lets every held chunk of a process go, in order, noting the numbers skipped.
fn release<T>(state: &mut Process<T>, ready: &mut VecDeque<T>) {
    for (seq, item) in std::mem::take(&mut state.held) {
        state.missing.extend(state.next..seq);
        ready.push_back(item);
        state.next = seq + 1;
    }
}

/// The output messages of [`super::output::open_output`], in order.
pub struct Ordered {
    inner: OutputMessages,
    reorder: Reorder<jetstream::Message>,
    /// The stream had no message left at some point.
    inner_caught_up: bool,
}

impl Ordered {
    pub fn new(inner: OutputMessages) -> Ordered {
        Ordered {
            inner,
            reorder: Reorder::new(),
            inner_caught_up: false,
        }
    }

    /// Whether every message stored when reading began has been handed out.
    pub fn caught_up(&self) -> bool {
        self.inner_caught_up && self.reorder.ready.is_empty()
    }
}

/// Where a message's chunk belongs; None without a number.
fn place_of(message: &jetstream::Message) -> Option<Place> {
    let headers = message.headers.as_ref()?;
    let value = |name: &str| headers.get(name).map(|v| v.as_str().trim().to_owned());
    let seq = value(output::SEQ)?.parse().ok()?;
    let attempt = value(output::ATTEMPT)
        .and_then(|a| a.parse().ok())
        .unwrap_or(0);
    let rank = value(output::RANK)
        .and_then(|r| r.parse().ok())
        .unwrap_or(0);
    let end = value(output::STREAM).as_deref() == Some(output::EOF);
    Some(Place {
        process: (attempt, rank),
        seq,
        end,
    })
}

impl Stream for Ordered {
    type Item = Received;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Received>> {
        loop {
            if let Some(message) = self.reorder.ready.pop_front() {
                return Poll::Ready(Some(Ok(message)));
            }
            match self.inner.poll_next_unpin(cx) {
                Poll::Ready(Some(Ok(message))) => {
                    let caught_up = message.info().is_ok_and(|info| info.pending == 0);
                    self.inner_caught_up |= caught_up;
                    let place = place_of(&message);
                    self.reorder.take(message, place, caught_up);
                }
                Poll::Ready(Some(Err(err))) => return Poll::Ready(Some(Err(err))),
                Poll::Ready(None) => {
                    self.reorder.release_all();
                    if self.reorder.ready.is_empty() {
                        return Poll::Ready(None);
                    }
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seq: u64, end: bool) -> Option<Place> {
        Some(Place {
            process: (1, 0),
            seq,
            end,
        })
    }

    fn drain(reorder: &mut Reorder<&'static str>) -> Vec<&'static str> {
        reorder.ready.drain(..).collect()
    }

    #[test]
    fn a_chunk_stored_late_is_put_back_in_its_place_and_a_second_copy_dropped() {
        let mut reorder = Reorder::new();
        reorder.take("one", at(1, false), false);
        reorder.take("three", at(3, false), false);
        reorder.take("four", at(4, false), false);
        assert_eq!(drain(&mut reorder), ["one"]);
        reorder.take("two", at(2, false), false);
        assert_eq!(drain(&mut reorder), ["two", "three", "four"]);
        reorder.take("three again", at(3, false), false);
        reorder.take("end", at(5, true), false);
        assert_eq!(drain(&mut reorder), ["end"]);
    }

    #[test]
    fn the_end_marker_or_catching_up_lets_held_chunks_go_and_a_late_one_still_shows() {
        let mut reorder = Reorder::new();
        reorder.take("one", at(1, false), false);
        reorder.take("three", at(3, false), false);
        reorder.take("end", at(4, true), false);
        assert_eq!(drain(&mut reorder), ["one", "three", "end"]);

        let mut reorder = Reorder::new();
        reorder.take("two", at(2, false), true);
        assert_eq!(drain(&mut reorder), ["two"]);
        reorder.take("one", at(1, false), false);
        reorder.take("one again", at(1, false), false);
        assert_eq!(drain(&mut reorder), ["one"]);
    }

    #[test]
    fn processes_are_numbered_apart_and_unnumbered_messages_pass() {
        let mut reorder = Reorder::new();
        let rank = |rank: u32, seq: u64| {
            Some(Place {
                process: (1, rank),
                seq,
                end: false,
            })
        };
        reorder.take("r1 one", rank(1, 1), false);
        reorder.take("r0 two", rank(0, 2), false);
        reorder.take("plain", None, false);
        reorder.take("r0 one", rank(0, 1), false);
        assert_eq!(drain(&mut reorder), ["r1 one", "plain", "r0 one", "r0 two"]);
    }
}
