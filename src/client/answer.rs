//! The one answer every settlement gathered into a Settle marker waits for: the marker is
//! durable, or why not.
//!
//! A one-shot channel per settlement did this before, and in the client's profile it was an
//! allocation made on the application's thread and freed on whichever thread dropped last
//! (glibc's slow path when that was another thread), plus the channel's own bookkeeping.
//! Replacing it, together with sizing the poll batch up front, took about 700 instructions
//! off a record's 9,200 (BENCHMARKS.md, "One answer per Settle marker"). Here the
//! settlements of one marker share one allocation, made when their gathering opens. A
//! settlement holds a reference to it and, while it waits, one place in its list of wakers.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll, Waker};

use rdkafka::error::KafkaError;

struct Answer {
    result: OnceLock<Result<(), KafkaError>>,
    /// The tasks waiting; taken (and woken) once the result is set.
    wakers: Mutex<Vec<Waker>>,
}

impl Answer {
    fn wakers(&self) -> std::sync::MutexGuard<'_, Vec<Waker>> {
        // Nothing panics while holding it; a poisoned list is still a list of wakers.
        self.wakers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sets the result unless one is set, and wakes everyone waiting.
    fn set(&self, result: Result<(), KafkaError>) {
        if self.result.set(result).is_err() {
            return;
        }
        // Taken under the lock, woken outside it. A waiter polling now either finds the
        // result (it looks again under the lock) or left its waker here to be woken.
        let waiting = std::mem::take(&mut *self.wakers());
        for w in waiting {
            w.wake();
        }
    }
}

/// The answering side of one marker: kept by its gathering, then by the task that waits for
/// the marker's delivery report. Dropped without answering (the consumer closed with it
/// unwritten, or the task went down with its runtime), it answers "cancelled", so no
/// settlement waits for ever.
pub(crate) struct Answering(Arc<Answer>);

impl Answering {
    /// Room for `waiting` wakers up front: a gathering knows how many settlements it takes.
    pub(crate) fn new(waiting: usize) -> Self {
        Answering(Arc::new(Answer {
            result: OnceLock::new(),
            wakers: Mutex::new(Vec::with_capacity(waiting)),
        }))
    }

    /// A waiter for this answer.
    pub(crate) fn waiter(&self) -> Durable {
        Durable {
            answer: self.0.clone(),
            registered: None,
        }
    }

    /// Answers every waiter.
    pub(crate) fn send(self, result: Result<(), KafkaError>) {
        self.0.set(result);
    }
}

impl Drop for Answering {
    fn drop(&mut self) {
        // A no-op after `send`.
        self.0.set(Err(KafkaError::Canceled));
    }
}

/// What a settlement waits for: resolves once its marker is durable, or with why not
/// (`KafkaError::Canceled` if the marker was never written).
pub(crate) struct Durable {
    answer: Arc<Answer>,
    /// Where this waiter's waker is in the list, once it has waited.
    registered: Option<usize>,
}

impl Durable {
    /// A waiter answered "cancelled" at once: for a settlement made after the consumer closed.
    pub(crate) fn cancelled() -> Self {
        Answering::new(0).waiter()
    }
}

impl Future for Durable {
    type Output = Result<(), KafkaError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        if let Some(result) = this.answer.result.get() {
            return Poll::Ready(result.clone());
        }
        let mut wakers = this.answer.wakers();
        if let Some(result) = this.answer.result.get() {
            return Poll::Ready(result.clone());
        }
        match this.registered.and_then(|i| wakers.get_mut(i)) {
            Some(w) if w.will_wake(cx.waker()) => {}
            Some(w) => w.clone_from(cx.waker()),
            None => {
                this.registered = Some(wakers.len());
                wakers.push(cx.waker().clone());
            }
        }
        Poll::Pending
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use futures::FutureExt;

    #[tokio::test]
    async fn every_waiter_hears_the_one_answer() {
        let answering = Answering::new(2);
        let waiters: Vec<_> = (0..3).map(|_| answering.waiter()).collect();
        let joined = tokio::spawn(futures::future::join_all(waiters));
        tokio::task::yield_now().await;
        answering.send(Ok(()));
        // Bounded, so that a waker lost on the way fails the test instead of hanging it.
        let results = tokio::time::timeout(std::time::Duration::from_secs(30), joined)
            .await
            .expect("every waiter was woken")
            .unwrap();
        assert_eq!(results.len(), 3);
        assert!(results.iter().all(Result::is_ok), "{results:?}");
    }

    #[test]
    fn a_waiter_polled_again_keeps_one_place_and_is_woken() {
        let answering = Answering::new(1);
        let mut w = answering.waiter();
        let (waker, woken) = counting_waker();
        let mut cx = Context::from_waker(&waker);
        assert!(Pin::new(&mut w).poll(&mut cx).is_pending());
        assert!(Pin::new(&mut w).poll(&mut cx).is_pending());
        assert_eq!(answering.0.wakers().len(), 1, "registered once");
        answering.send(Err(KafkaError::Canceled));
        assert_eq!(woken.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert!(matches!(
            Pin::new(&mut w).poll(&mut cx),
            Poll::Ready(Err(KafkaError::Canceled))
        ));
    }

    #[test]
    fn dropped_unanswered_is_cancelled_not_silent() {
        let answering = Answering::new(1);
        let w = answering.waiter();
        drop(answering);
        assert!(matches!(w.now_or_never(), Some(Err(KafkaError::Canceled))));
        assert!(matches!(
            Durable::cancelled().now_or_never(),
            Some(Err(KafkaError::Canceled))
        ));
    }

    #[test]
    fn answered_once_the_first_answer_stays() {
        let answering = Answering::new(0);
        let w = answering.waiter();
        answering.send(Ok(()));
        assert!(matches!(w.now_or_never(), Some(Ok(()))));
    }

    fn counting_waker() -> (Waker, Arc<std::sync::atomic::AtomicUsize>) {
        struct Count(Arc<std::sync::atomic::AtomicUsize>);
        impl std::task::Wake for Count {
            fn wake(self: Arc<Self>) {
                self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        }
        let n = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        (Waker::from(Arc::new(Count(n.clone()))), n)
    }
}
