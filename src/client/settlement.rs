//! The future that [`Delivery::ack`], [`Delivery::nack_after`] and [`Delivery::reject`]
//! return.
//!
//! Written by hand rather than as an `async fn` for its size. An `async fn` keeps the whole
//! delivery (body, headers, both sources) alive until the marker is durable, next to every
//! nested future's own copy of the settlement: 848 bytes per `ack()` in the profile
//! (BENCHMARKS.md, "Acking a batch at once"), each moved into the application's
//! `FuturesUnordered` or task. This one holds the delivery only until its first poll, then
//! only what waiting and the error need. The record's body is released as soon as its
//! settlement is queued, not when it is durable.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use crate::events::{Event, EventKind};
use crate::marker::SourceRef;

use super::coalesce::Op;
use super::delivery::Delivery;
use super::error::ClientError;
use super::settler::{Queued, Settler};

/// A settlement of one delivery (ack, nack or reject): resolves once its marker is durable.
///
/// Like every settlement it does nothing until awaited: dropped unawaited, its delivery is
/// dropped unsettled and released for redelivery at once.
#[must_use = "a settlement does nothing until awaited; dropped, its delivery is released"]
pub struct Settlement {
    state: State,
}

enum State {
    /// Not polled yet: the delivery and what to do with it.
    Unpolled {
        delivery: Delivery,
        op: Op,
        name: &'static str,
    },
    /// Queued; waiting for the marker's delivery report.
    Waiting(Waiting),
    /// Resolved (or polled after resolving).
    Done,
}

struct Waiting {
    queued: Queued,
    settler: Arc<Settler>,
    source: SourceRef,
    attempt: u32,
    name: &'static str,
    /// The event to announce once durable, taken only if someone listens.
    said: Option<(EventKind, String)>,
}

impl Settlement {
    pub(crate) fn new(delivery: Delivery, op: Op, name: &'static str) -> Self {
        Settlement {
            state: State::Unpolled { delivery, op, name },
        }
    }

    /// Queues the settlement: the delivery is finished (its place under the bound freed,
    /// keep-alives stopped) and dropped; what is left waits for the answer. Done in place:
    /// moving the delivery out first copied its 200-odd bytes once more per record.
    fn queue(&mut self) {
        let State::Unpolled { delivery, op, name } = &mut self.state else {
            return;
        };
        let (op, name) = (std::mem::replace(op, Op::End), *name);
        delivery.finish();
        // What the event says, taken before `op` moves into the queue (cheap: only a
        // reject's reason is cloned, and only if someone listens).
        let said = delivery.settler.events.has_listeners().then(|| match &op {
            Op::Nack(delay_ms) => (EventKind::Nacked, format!("{delay_ms}ms")),
            Op::Reject(reason) => (EventKind::DeadLettered, reason.clone()),
            _ => (EventKind::Acked, String::new()),
        });
        let waiting = Waiting {
            queued: delivery.settler.queue(&delivery.source, op),
            settler: delivery.settler.clone(),
            source: delivery.source.clone(),
            attempt: delivery.attempt,
            name,
            said,
        };
        // Drops the finished delivery where it lies.
        self.state = State::Waiting(waiting);
    }
}

impl Future for Settlement {
    type Output = Result<(), ClientError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // Every field is `Unpin`: the state can be moved in and out.
        let this = self.get_mut();
        if matches!(this.state, State::Unpolled { .. }) {
            this.queue();
        }
        let State::Waiting(waiting) = &mut this.state else {
            return Poll::Ready(Err(ClientError::PolledAfterDone));
        };
        let result = std::task::ready!(Pin::new(&mut waiting.queued).poll(cx));
        let State::Waiting(w) = std::mem::replace(&mut this.state, State::Done) else {
            return Poll::Ready(Err(ClientError::PolledAfterDone));
        };
        Poll::Ready(match result {
            Ok(()) => {
                if let Some((kind, detail)) = w.said {
                    w.settler
                        .events
                        .emit(|| Event::new(kind, w.source, w.attempt).detail(detail));
                }
                Ok(())
            }
            Err(error) => Err(ClientError::Marker {
                marker: w.name,
                record: w.source,
                error,
            }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The point of writing it by hand: far below the 848 bytes of the `async fn` it
    /// replaces, and no bigger than a delivery and its operation.
    #[test]
    fn a_settlement_is_about_the_size_of_its_delivery() {
        let size = std::mem::size_of::<Settlement>();
        let delivery = std::mem::size_of::<Delivery>() + std::mem::size_of::<Op>();
        assert!(
            size <= delivery + 16,
            "{size} bytes, delivery and op {delivery}"
        );
    }
}
