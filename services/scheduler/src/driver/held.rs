//! The messages the driver holds until the machine says to acknowledge them, each under a
//! token. A message that carries several submissions (a batch of an array's tasks) is held
//! under one token per task and acknowledged once every one of them is: a task the machine
//! did not acknowledge (its record not stored) leaves the whole message to be delivered
//! again, and the tasks already recorded are then known by their ids.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_nats::jetstream;

use crate::machine::messages::Token;

/// One message and how many of its tokens are still to be acknowledged.
struct Shared {
    message: jetstream::Message,
    unacknowledged: AtomicUsize,
}

/// The held messages, by token.
#[derive(Default)]
pub(super) struct Held {
    next_token: Token,
    parts: HashMap<Token, Arc<Shared>>,
}

impl Held {
    /// Holds `message` under one token per part (at least one); the tokens, in order.
    pub(super) fn hold(&mut self, message: jetstream::Message, parts: usize) -> Vec<Token> {
        let parts = parts.max(1);
        let shared = Arc::new(Shared {
            message,
            unacknowledged: AtomicUsize::new(parts),
        });
        (0..parts)
            .map(|_| {
                self.next_token += 1;
                self.parts.insert(self.next_token, Arc::clone(&shared));
                self.next_token
            })
            .collect()
    }

    /// The machine acknowledged `token`: the message to acknowledge now, when that was the
    /// last of its parts still held; None otherwise (or for a token not held).
    pub(super) fn acknowledged(&mut self, token: Token) -> Option<jetstream::Message> {
        let shared = self.parts.remove(&token)?;
        let left = shared.unacknowledged.fetch_sub(1, Ordering::AcqRel);
        (left == 1).then(|| shared.message.clone())
    }

    /// Lets `token` go unacknowledged: its message is delivered again.
    pub(super) fn release(&mut self, token: Token) {
        self.parts.remove(&token);
    }

    /// Keeps the tokens `keep` says to keep; the others go unacknowledged.
    pub(super) fn retain(&mut self, mut keep: impl FnMut(Token) -> bool) {
        self.parts.retain(|token, _| keep(*token));
    }

    /// Lets every message go unacknowledged.
    pub(super) fn clear(&mut self) {
        self.parts.clear();
    }
}
