//! One-way signals the agent's loops select on: "shut down" (stop taking work), "stop
//! heartbeats", and "give up" (stop retrying reports at the end of shutdown).
//!
//! A [`Trigger`] fires once; every clone of its [`Signal`] sees it, including clones made later.

use tokio::sync::watch;

/// The side that fires a [`Signal`]. Firing twice is harmless.
#[derive(Debug)]
pub struct Trigger(watch::Sender<bool>);

/// A cheap, cloneable handle that resolves once its [`Trigger`] fired.
#[derive(Clone, Debug)]
pub struct Signal(watch::Receiver<bool>);

/// A new, unfired signal.
pub fn signal() -> (Trigger, Signal) {
    let (tx, rx) = watch::channel(false);
    (Trigger(tx), Signal(rx))
}

impl Trigger {
    pub fn fire(&self) {
        self.0.send_replace(true);
    }
}

impl Signal {
    /// Resolves once the trigger fired (at once if it already has). A trigger dropped without
    /// firing counts as fired: whoever owned it is gone, so nobody would ever fire it.
    pub async fn fired(&self) {
        let mut rx = self.0.clone();
        let _ = rx.wait_for(|fired| *fired).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn every_clone_sees_the_trigger_even_late_ones() {
        let (trigger, signal) = signal();
        let early = signal.clone();
        let waited =
            tokio::time::timeout(std::time::Duration::from_millis(20), early.fired()).await;
        assert!(waited.is_err(), "fired before the trigger");
        trigger.fire();
        early.fired().await;
        let late = signal.clone();
        late.fired().await;
    }

    #[tokio::test]
    async fn a_dropped_trigger_releases_waiters() {
        let (trigger, signal) = signal();
        drop(trigger);
        signal.fired().await;
    }
}
