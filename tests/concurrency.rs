//! `process_concurrently`: up to N handlers at once, never more, and nothing lost when a
//! handler panics.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handlers_run_concurrently_within_the_limit_and_a_panic_loses_nothing() {
    let t = topics(2, 1).await;
    let tracker = TrackerGuard::start(tracker_config(&t, 5));
    tracker.wait_ready().await;
    produce_many(&t.source, 2, "c", 60).await;
    let mut c = consumer(&t, Duration::from_secs(30)).await;
    let limit = 4;
    let running = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let acked = Arc::new(Mutex::new(BTreeSet::new()));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let mut stop = Some(stop);
    let watched = acked.clone();
    let watcher = tokio::spawn(async move {
        while watched.lock().unwrap().len() < 60 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    let (r, m, a) = (running.clone(), most.clone(), acked.clone());
    let run = c.process_concurrently(
        limit,
        async {
            let _ = stopped.await;
        },
        move |d| {
            let (r, m, a) = (r.clone(), m.clone(), a.clone());
            async move {
                let now = r.fetch_add(1, Ordering::SeqCst) + 1;
                m.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(50)).await;
                let key = String::from_utf8_lossy(d.key().unwrap()).into_owned();
                // The first delivery of c-7 panics mid-work: it must come back, not vanish.
                if key == "c-7" && d.attempt() == 1 {
                    r.fetch_sub(1, Ordering::SeqCst);
                    panic!("handler failed on purpose");
                }
                d.ack().await.unwrap();
                a.lock().unwrap().insert(key);
                r.fetch_sub(1, Ordering::SeqCst);
            }
        },
    );
    tokio::select! {
        r = run => panic!("stopped before every record was acked: {r:?}"),
        _ = watcher => {}
    }
    if let Some(s) = stop.take() {
        let _ = s.send(());
    }
    assert!(
        most.load(Ordering::SeqCst) <= limit,
        "more than {limit} at once"
    );
    assert!(most.load(Ordering::SeqCst) > 1, "never concurrent");
    assert_eq!(acked.lock().unwrap().len(), 60);
    c.close().await.unwrap();
    tracker.stop().await;
}
