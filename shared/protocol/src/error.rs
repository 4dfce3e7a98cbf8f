//! The protocol's one error: input that a person or a message got wrong. The binaries wrap it
//! with context (anyhow).

use thiserror::Error;

/// Input that a person or a message got wrong; the text says what and how to fix it.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{0}")]
pub struct InvalidInput(pub String);

impl InvalidInput {
    pub fn new(message: impl Into<String>) -> Self {
        InvalidInput(message.into())
    }
}
