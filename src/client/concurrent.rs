//! Processing up to N deliveries at once: the async counterpart of delayqueue's
//! `WithConcurrent`, bounded by a number of tasks rather than by a queue.

use std::future::Future;

use tokio::task::JoinSet;

use super::{Delivery, RedeliveryConsumer};

impl RedeliveryConsumer {
    /// Runs `handler` on each delivery, at most `limit` at a time, until `shutdown` completes
    /// or the consumer stops; then waits for the handlers still running. An error says the
    /// consumer stopped because its poll thread died ([`RedeliveryConsumer::failure`]).
    ///
    /// Each handler gets the delivery and settles it. One that returns (or panics) without
    /// settling drops the delivery, which releases it for redelivery, so nothing is lost. At
    /// `limit` running handlers no new delivery is taken: the deliveries wait in the client,
    /// and past `max_unsettled` fetching pauses, so memory stays bounded however slow the
    /// handlers are.
    ///
    /// ```no_run
    /// # use kafka_redelivery::client::{ConsumerConfig, RedeliveryConsumer};
    /// # async fn run(mut consumer: RedeliveryConsumer) -> Result<(), kafka_redelivery::client::ClientError> {
    /// consumer
    ///     .process_concurrently(16, tokio::signal::ctrl_c(), |delivery| async move {
    ///         // ... the work ...
    ///         if let Err(e) = delivery.ack().await {
    ///             eprintln!("ack failed, the record will be redelivered: {e}");
    ///         }
    ///     })
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub async fn process_concurrently<S, F, Fut>(
        &mut self,
        limit: usize,
        shutdown: S,
        mut handler: F,
    ) -> Result<(), super::ClientError>
    where
        S: Future,
        F: FnMut(Delivery) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let limit = limit.max(1);
        let mut running = JoinSet::new();
        tokio::pin!(shutdown);
        loop {
            while running.len() >= limit {
                finished(running.join_next().await);
            }
            tokio::select! {
                next = self.recv() => match next {
                    Some(d) => {
                        running.spawn(handler(d));
                    }
                    None => break,
                },
                Some(done) = running.join_next(), if !running.is_empty() => finished(Some(done)),
                _ = &mut shutdown => break,
            }
        }
        while let Some(done) = running.join_next().await {
            finished(Some(done));
        }
        self.failure().map_or(Ok(()), Err)
    }
}

/// Logs a handler that panicked; its delivery was dropped, and so released.
fn finished(done: Option<Result<(), tokio::task::JoinError>>) {
    if let Some(Err(e)) = done {
        tracing::error!(error = %e, "a delivery handler failed; its delivery is released for redelivery");
    }
}
