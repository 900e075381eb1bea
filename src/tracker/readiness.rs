//! Whether a tracker has caught up: the value behind `/readyz`.

use std::sync::Arc;

use tokio::sync::watch;

/// True once every markers partition the tracker owns has caught up (replayed up to its own
/// Tick) and none waits for its snapshot; false again while it stops. Cheap to clone and to
/// read from any thread.
///
/// ```no_run
/// # async fn demo() {
/// use kafka_redelivery::tracker::{Tracker, TrackerConfig};
/// let tracker = Tracker::new(TrackerConfig::new("localhost:9092", "orders.markers"));
/// let readiness = tracker.readiness();
/// tokio::spawn(tracker.run(std::future::pending()));
/// readiness.wait().await;
/// assert!(readiness.is_ready());
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Readiness(Arc<watch::Sender<bool>>);

impl Default for Readiness {
    fn default() -> Self {
        Readiness(Arc::new(watch::Sender::new(false)))
    }
}

impl Readiness {
    /// Whether the tracker is ready now.
    pub fn is_ready(&self) -> bool {
        *self.0.borrow()
    }

    /// Waits until the tracker is ready.
    pub async fn wait(&self) {
        let mut rx = self.0.subscribe();
        // The sender lives as long as `self`, so the wait ends only by becoming ready.
        let _ = rx.wait_for(|ready| *ready).await;
    }

    /// Every change from now on.
    pub(crate) fn subscribe(&self) -> watch::Receiver<bool> {
        self.0.subscribe()
    }

    pub(crate) fn set(&self, ready: bool) {
        self.0
            .send_if_modified(|r| std::mem::replace(r, ready) != ready);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn waiters_wake_when_it_becomes_ready() {
        let r = Readiness::default();
        assert!(!r.is_ready());
        let waiter = tokio::spawn({
            let r = r.clone();
            async move { r.wait().await }
        });
        r.set(true);
        waiter.await.unwrap();
        assert!(r.is_ready());
        r.set(false);
        assert!(!r.is_ready());
    }
}
