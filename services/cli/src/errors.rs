//! Turning library errors into the one-line messages `mgpu` prints.
//!
//! async-nats errors include their cause in their text *and* expose it as `source()`; wrapped
//! as they are, `{:#}` would print the cause twice. So they enter anyhow as plain text.

use std::fmt::Display;

use mgpu_nats::records;

/// An error as its display text only, without a source chain.
pub fn plain(err: impl Display) -> anyhow::Error {
    anyhow::anyhow!("{err}")
}

/// A failed stream or bucket lookup, naming the missing setup when that is the cause.
pub fn lookup(err: impl Display) -> anyhow::Error {
    plain(records::stream_lookup_error(err))
}
