//! Why a delivery failed, and whether trying again later can help: a receiver that is down or
//! busy (retried with backoff), or one that refused the notice for good (a 404, an address
//! the relay does not take), which is logged and not retried.

/// A failed delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryError {
    pub text: String,
    /// Trying again later may succeed.
    pub retry: bool,
}

impl DeliveryError {
    pub fn retry(text: String) -> DeliveryError {
        DeliveryError { text, retry: true }
    }

    pub fn permanent(text: String) -> DeliveryError {
        DeliveryError { text, retry: false }
    }
}

impl std::fmt::Display for DeliveryError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl std::error::Error for DeliveryError {}
