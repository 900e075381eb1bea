//! Delivery events an application can watch: a message's life, as it happens.
//!
//! The consumer ([`crate::client::RedeliveryConsumer::events`]), the scheduler
//! ([`crate::client::Scheduler::events`]) and the tracker ([`crate::tracker::Tracker::events`])
//! each publish what they see on a broadcast channel. Watching is for monitoring and tests,
//! not for correctness: a subscriber that falls more than [`CAPACITY`] events behind misses
//! the oldest (its receiver reports `Lagged(n)`), and publishing never waits for a subscriber,
//! so a slow one cannot slow message handling down. With no subscriber, no event is built.
//!
//! ```
//! use kafka_redelivery::events::{Event, EventBus, EventKind};
//! use kafka_redelivery::marker::SourceRef;
//! let bus = EventBus::default();
//! let mut events = bus.subscribe();
//! bus.emit(|| Event::new(EventKind::Acked, SourceRef::new("orders", 0, 7), 1));
//! let e = events.try_recv().unwrap();
//! assert_eq!((e.kind, e.record.offset), (EventKind::Acked, 7));
//! ```

use std::time::{SystemTime, UNIX_EPOCH};

use tokio::sync::broadcast;

use crate::marker::SourceRef;

/// Events a subscriber may fall behind by before it misses some.
pub const CAPACITY: usize = 4096;

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventKind {
    /// A record was scheduled for later (scheduler: written; tracker: read and tracked).
    Scheduled,
    /// A scheduled record fell due and was published to its target topic (tracker).
    Ready,
    /// A record was made ready for the application (consumer); `attempt` says which delivery.
    Delivered,
    /// The application acked it; the End marker is durable (consumer).
    Acked,
    /// The application gave it back for redelivery; the Nack marker is durable (consumer).
    Nacked,
    /// A timed-out or nacked record was redelivered as a copy (tracker).
    Retried,
    /// The record was rejected (consumer) or produced to a dead-letter topic (tracker).
    DeadLettered,
    /// A pending schedule was cancelled (scheduler: End written; tracker: End read in time).
    Cancelled,
    /// A delivery's timeout passed while it waited in the consumer for the application to
    /// take it, so it was not handed over; the tracker redelivers the record (consumer).
    Expired,
}

impl EventKind {
    /// Lower-case name, for logs and labels.
    pub fn name(self) -> &'static str {
        match self {
            EventKind::Scheduled => "scheduled",
            EventKind::Ready => "ready",
            EventKind::Delivered => "delivered",
            EventKind::Acked => "acked",
            EventKind::Nacked => "nacked",
            EventKind::Retried => "retried",
            EventKind::DeadLettered => "dead_lettered",
            EventKind::Cancelled => "cancelled",
            EventKind::Expired => "expired",
        }
    }
}

/// One event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// What happened.
    pub kind: EventKind,
    /// Which record: a delivery's source record, or a schedule's marker coordinates (its id).
    pub record: SourceRef,
    /// The delivery attempt (1 for the first); 0 for schedules.
    pub attempt: u32,
    /// Detail in words: a reject reason, a target topic, a delay.
    pub detail: String,
    /// When, in Unix epoch milliseconds of the local clock.
    pub at_ms: i64,
}

impl Event {
    /// An event happening now, with no detail.
    pub fn new(kind: EventKind, record: SourceRef, attempt: u32) -> Self {
        let at_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        Event {
            kind,
            record,
            attempt,
            detail: String::new(),
            at_ms,
        }
    }

    /// Adds detail.
    pub fn detail(mut self, detail: impl Into<String>) -> Self {
        self.detail = detail.into();
        self
    }
}

/// The sending side, shared by the parts of one consumer, scheduler or tracker.
#[derive(Debug, Clone)]
pub struct EventBus {
    tx: broadcast::Sender<Event>,
}

impl Default for EventBus {
    fn default() -> Self {
        EventBus {
            tx: broadcast::channel(CAPACITY).0,
        }
    }
}

impl EventBus {
    /// A new receiver of every event emitted from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.tx.subscribe()
    }

    /// Whether anyone is listening now.
    pub fn has_listeners(&self) -> bool {
        self.tx.receiver_count() > 0
    }

    /// Publishes the event `make` builds, if anyone is listening. Never blocks.
    pub fn emit(&self, make: impl FnOnce() -> Event) {
        if self.tx.receiver_count() > 0 {
            // Fails only when the last receiver went away meanwhile: nobody to tell.
            let _ = self.tx.send(make());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_is_built_without_a_subscriber() {
        let bus = EventBus::default();
        bus.emit(|| panic!("built an event nobody listens to"));
    }

    #[test]
    fn a_slow_subscriber_misses_the_oldest_and_is_told() {
        let bus = EventBus::default();
        let mut rx = bus.subscribe();
        for i in 0..(CAPACITY as i64 + 10) {
            bus.emit(|| Event::new(EventKind::Acked, SourceRef::new("t", 0, i), 1));
        }
        assert!(matches!(
            rx.try_recv(),
            Err(broadcast::error::TryRecvError::Lagged(10))
        ));
        assert_eq!(rx.try_recv().unwrap().record.offset, 10);
    }
}
